"""Tokenizer loading, the start-up self-check, and batched encoding off the event loop."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Generic, TypeVar

from tokenizers import Tokenizer as HFTokenizer


class TokenizerError(Exception):
    """The tokenizer cannot be loaded or fails its self-check."""


class Tokenizer:
    """A thin wrapper over HF `tokenizers`: no special tokens added on encode, and added-token
    strings ("<|im_end|>", "</think>") in the text map to their single IDs."""

    def __init__(self, backend: HFTokenizer, path: Path) -> None:
        self._tok = backend
        self.path = path
        self._sha256: str | None = None

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = hashlib.sha256(self.path.read_bytes()).hexdigest()
        return self._sha256

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)


def find_tokenizer_file(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise TokenizerError(
            f"tokenizer not found: {path} (expected a tokenizer.json file or a folder with one)"
        )
    return p


def load_tokenizer(path: str | Path) -> Tokenizer:
    file = find_tokenizer_file(path)
    try:
        return Tokenizer(HFTokenizer.from_file(str(file)), file)
    except Exception as e:  # the Rust side raises plain Exception subclasses
        raise TokenizerError(f"{file}: cannot load tokenizer: {e}") from None


def self_check(tokenizer: Tokenizer, expected: dict[str, int]) -> None:
    """Each special token must encode to exactly its own single ID and decode back.

    A mis-loaded tokenizer (as some transformers releases do with Kimi's) fails here, before
    any request is sent.
    """
    problems = []
    for token, token_id in expected.items():
        ids = tokenizer.encode(token)
        if ids != [token_id]:
            problems.append(f"{token!r} encodes to {ids}, expected [{token_id}]")
            continue
        back = tokenizer.decode([token_id])
        if back != token:
            problems.append(f"ID {token_id} decodes to {back!r}, expected {token!r}")
    if problems:
        raise TokenizerError(
            f"tokenizer self-check failed for {tokenizer.path}:\n  " + "\n  ".join(problems)
        )


T = TypeVar("T")
R = TypeVar("R")


class OffLoopBatcher(Generic[T, R]):
    """Collects single calls from many coroutines into batches and runs `fn(batch)` in an
    executor thread, so that tokenization never blocks the event loop.

    `tokenizers` releases the GIL inside `encode_batch`, so a batch runs in parallel with the
    loop and across cores.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int = 256,
        executor: Executor | None = None,
    ) -> None:
        self._fn = fn
        self._max_batch = max_batch
        self._executor = executor
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._running = False
        self._drainer: asyncio.Task[None] | None = None

    async def __call__(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        if not self._running:
            self._running = True
            self._drainer = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                items = [item for item, _ in batch]
                try:
                    results = await loop.run_in_executor(self._executor, self._fn, items)
                except Exception as e:  # deliver the failure to every caller of the batch
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                for (_, fut), res in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(res)
        finally:
            self._running = False


def chunked(items: Iterable[T], size: int) -> Iterable[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
