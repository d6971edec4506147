"""The fake model: writes an answer for a prompt and a seed, deterministically, and tokenizes
it with the real tokenizer (off the event loop, in batches); answers and prompt encodings are
cached (LRU)."""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import orjson

from draftgen.testing.fake_engine.answers import Completion
from draftgen.testing.fake_engine.config import ServerConfig
from draftgen.testing.fake_engine.language import edge_whitespace, fake_text, native_text, sentence
from draftgen.testing.fake_engine.vocab import Vocab
from draftgen.tokenize import OffLoopBatcher

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)
        return value


def digest(*parts: object) -> bytes:
    return hashlib.blake2b(
        orjson.dumps(parts, option=orjson.OPT_SORT_KEYS), digest_size=16
    ).digest()


@dataclass(frozen=True)
class AnswerKey:
    seed: bytes
    """Digest of the prompt, the request's seed and the server's seed."""
    tool_call: bool


class FakeModel:
    """Writes the answers. Tokenization runs off the event loop, in batches; answers and
    prompt encodings are cached (LRU)."""

    def __init__(self, config: ServerConfig, vocab: Vocab) -> None:
        self.config = config
        self.vocab = vocab
        self._encode = OffLoopBatcher(vocab.encode_batch, max_batch=128)
        self._encodings: LRU[bytes, list[int]] = LRU(config.cache_size)
        self._answers: LRU[AnswerKey, tuple[list[int], bool]] = LRU(config.cache_size)
        self._completions: LRU[tuple[AnswerKey, int | None, frozenset[int]], Completion] = LRU(
            config.cache_size
        )

    async def encode(self, text: str) -> list[int]:
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        ids = self._encodings.get(key)
        if ids is None:
            ids = self._encodings.put(key, await self._encode(text))
        return ids

    async def completion(
        self, key: AnswerKey, max_tokens: int | None, stop_ids: frozenset[int]
    ) -> Completion:
        cache_key = (key, max_tokens, stop_ids)
        done = self._completions.get(cache_key)
        if done is not None:
            return done
        sampled = self._answers.get(key)
        if sampled is None:
            sampled = self._answers.put(key, await self._sample(key))
        ids, noncanonical = sampled
        cut, finish = _cut(ids, max_tokens, stop_ids)
        call_id = "call_" + key.seed.hex()[:24]
        config = self.config
        completion = Completion(
            self.vocab, cut, finish, config.layout, config.display, call_id, noncanonical,
            config.tool_call_display,
        )
        return self._completions.put(cache_key, completion)

    async def _sample(self, key: AnswerKey) -> tuple[list[int], bool]:
        """The answer's sampled IDs, and whether one token was split non-canonically."""
        rng = random.Random(key.seed)
        text = self._write(rng, key.tool_call)
        ids = list(await self._encode(text))
        split = rng.random() < self.config.noncanonical_rate and _split_one_token(
            self.vocab, ids, rng
        )
        return ids, split

    def _write(self, rng: random.Random, tool_call: bool) -> str:
        config = self.config
        reasoning = fake_text(rng, rng.randint(*config.reasoning_tokens))
        if tool_call:
            content = sentence(rng) if rng.random() < 0.5 else ""
        else:
            content = fake_text(rng, rng.randint(*config.content_tokens))
        if rng.random() < config.edge_whitespace_rate:
            reasoning, content = edge_whitespace(rng, reasoning, content)
        return native_text(config.layout, reasoning, content, tool_call)


def _cut(
    ids: list[int], max_tokens: int | None, stop_ids: frozenset[int]
) -> tuple[list[int], Literal["stop", "length"]]:
    stop_at = min((ids.index(i) for i in stop_ids if i in ids), default=len(ids) - 1)
    ids = ids[: stop_at + 1]
    if max_tokens is not None and len(ids) > max_tokens:
        return ids[:max_tokens], "length"
    return ids, "stop"


def _split_one_token(vocab: Vocab, ids: list[int], rng: random.Random) -> bool:
    """Replace one token by two vocabulary tokens with the same bytes (a non-canonical split,
    as an engine can sample). Returns False when no token of `ids` can be split."""
    if not ids:
        return False
    offset = rng.randrange(len(ids))
    for n in range(len(ids)):
        position = (offset + n) % len(ids)
        pair = _two_token_split(vocab, ids[position])
        if pair is not None:
            ids[position : position + 1] = pair
            return True
    return False


def _two_token_split(vocab: Vocab, token_id: int) -> list[int] | None:
    if token_id in vocab.added:
        return None
    data = vocab.token_bytes[token_id]
    for cut in range(len(data) - 1, 0, -1):
        head, tail = vocab.by_bytes.get(data[:cut]), vocab.by_bytes.get(data[cut:])
        if head is not None and tail is not None:
            return [head, tail]
    return None
