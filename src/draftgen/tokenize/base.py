"""The `Tokenizer` interface every implementation sits behind, `TokenizerError`, and the
vocabulary's bytes: each token's bytes ↔ its ID (byte-level BPE or SentencePiece pieces), which
the logprob recovery (`logprobs`) and the fast text of an answer (`Tokenizer.text_of`) read.

The implementations: `hf` (a `tokenizer.json` through HF `tokenizers`, a folder through
transformers), `gguf` (a GGUF model's own vocabulary); `load` chooses among them.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from functools import cache, cached_property
from pathlib import Path

from draftgen.errors import DraftgenError


class TokenizerError(DraftgenError):
    """The tokenizer cannot be loaded or fails its self-check."""


def vocabulary_problem(ids: Sequence[object], vocab_size: int | None) -> str | None:
    """Why `ids`, as an engine reported them, are not token IDs: one that is no integer (a
    boolean included), or outside 0 <= id < `vocab_size` (any int64 when None); None if
    they are all tokens. An ID outside the vocabulary would be stored as a token that decodes
    to nothing, or break the decoding of the batch it is in."""
    if not ids:
        return None
    # Whole-list C loops, not a Python loop per ID: this runs for every answer.
    if set(map(type, ids)) != {int}:
        at = next(i for i, t in enumerate(ids) if type(t) is not int)
        return f"[{at}] is {_shown(ids[at])}, not an integer"
    top = vocab_size if vocab_size is not None else 2**63
    if min(ids) < 0 or max(ids) >= top:  # type: ignore[type-var]  # all ints, checked above
        at = next(i for i, t in enumerate(ids) if not 0 <= t < top)  # type: ignore[operator]
        vocabulary = f"the vocabulary's {vocab_size} tokens" if vocab_size else "any vocabulary"
        return f"[{at}] is {ids[at]}, outside {vocabulary}"
    return None


def _shown(value: object) -> str:
    # Imported here, on this error path alone: scripts/gguf_to_hf.py imports this module in
    # vLLM's venv, which has no orjson; what it imports of draftgen must run on the standard
    # library and `tokenizers` (tests/test_gguf_to_hf.py checks it).
    import orjson

    return orjson.dumps(value).decode()[:40] if value is None or isinstance(
        value, str | float | bool) else type(value).__name__


# ---- byte-level BPE: token strings ↔ bytes ---------------------------------------------------


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level table, inverted: the printable character that stands for each byte
    in a byte-level BPE vocabulary → that byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>\Z")


@cache
def _to_latin1() -> dict[int, int]:
    """str.translate table: each byte-level character → the character of its byte value;
    any other character below 256 → U+FFFF, so that encoding to latin-1 fails on it."""
    table = {ord(c): b for c, b in byte_decoder().items()}
    table.update({x: 0xFFFF for x in range(256) if x not in table})
    return table


def _sentencepiece_bytes(token: str) -> bytes:
    m = _BYTE_FALLBACK.match(token)
    if m:
        return bytes([int(m[1], 16)])
    return token.replace("▁", " ").encode("utf-8")


def _byte_level_table(base_vocab: Mapping[str, int]) -> dict[bytes, int] | None:
    """Each entry's bytes → its ID (the first ID of equal bytes) when every entry is a
    byte-level BPE string, else None. The entries are translated in one call, joined by a
    character that is no byte-level character (a fifth of the time of a call per entry)."""
    tokens = list(base_vocab)
    pieces = _JOIN.join(tokens).translate(_to_latin1()).split(_JOIN)
    if len(pieces) != len(tokens):
        return None  # an entry held the joining character: not a byte-level string
    try:
        spelled = [piece.encode("latin-1") for piece in pieces]
    except UnicodeEncodeError:
        return None
    ids = list(base_vocab.values())
    return dict(zip(reversed(spelled), reversed(ids), strict=True))


_JOIN = "\U0010ffff"


def build_bytes_to_id(base_vocab: Mapping[str, int], added: Mapping[str, int]) -> dict[bytes, int]:
    """Each vocabulary entry's bytes → its ID.

    Base entries are byte-level BPE strings (GPT-2 table) when every one of them decodes
    through that table, else SentencePiece pieces ("▁" for a space, "<0xNN>" byte fallback).
    Added tokens are their own UTF-8 text and win over a base entry with the same bytes
    (engines report an added token by its text).
    """
    out = _byte_level_table(base_vocab)
    if out is None:
        out = {}
        for tok, tid in base_vocab.items():
            out.setdefault(_sentencepiece_bytes(tok), tid)
    for tok, tid in added.items():
        out[tok.encode("utf-8")] = tid
    return out


# ---- the interface -------------------------------------------------------------------------


_JOIN_CHECKS = (" Hello world . , ! ? n't 'm 's", "Hello  world\n\n  x = [1, 2] ;",
                "\u00e9t\u00e9 \u4f60\u597d \U0001f600 \u00a0 tab\there")
"""Texts whose decoding tells a plain byte join from decoders that strip or clean up."""


class Tokenizer(ABC):
    """What formats and the runner need from a tokenizer. `encode` adds no special tokens, and
    added-token strings ("<|im_end|>", "</think>") in the text map to their single IDs."""

    path: Path
    """The tokenizer.json file, or the HF folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sha256: str | None = None
        self._bytes_to_id: dict[bytes, int] | None = None
        self._id_to_bytes: dict[int, bytes] | None = None
        self._spelling_to_id: dict[bytes, int] | None = None
        self._join_checked: bool | None = None
        self._added_ids: list[int] = []
        """The added tokens' IDs, noted when `bytes_to_id` reads the vocabulary."""

    @property
    def sha256(self) -> str:
        """Of the file, or of a folder's tokenizer files (names and contents)."""
        if self._sha256 is None:
            self._sha256 = _hash_path(self.path)
        return self._sha256

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    @abstractmethod
    def id_to_token(self, token_id: int) -> str | None: ...

    @abstractmethod
    def _vocab_parts(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """(base vocabulary, added tokens): token string → ID."""

    @property
    def batches_gain_from_a_thread(self) -> bool:
        """Whether `encode_batch` is best run in a worker thread: only when it releases the
        GIL for the whole batch (see `OffLoopBatcher`). Encoders that release it per text, or
        not at all, are run on the caller's thread."""
        return False

    def warm_up(self, wait: bool = True) -> None:
        """Build now what the first encodes would otherwise build on the side (a run calls
        this before it starts: see `FastTokenizer.warm_up`); `wait=False` only starts it."""
        return None

    def bytes_to_id(self) -> dict[bytes, int]:
        """Token bytes → vocabulary ID, built once (see `build_bytes_to_id`)."""
        if self._bytes_to_id is None:
            return self._build_bytes_to_id(*self._vocab_parts())
        return self._bytes_to_id

    def _build_bytes_to_id(self, base: Mapping[str, int], added: Mapping[str, int]
                           ) -> dict[bytes, int]:
        self._added_ids = sorted(added.values())
        self._bytes_to_id = table = build_bytes_to_id(base, added)
        return table

    @cached_property
    def longest_token_bytes(self) -> int:
        """The longest spelling of a token, in bytes (128 for Qwen3): `max_tokens` of them are
        the most text an answer can have."""
        return max(map(len, self.bytes_to_id()), default=1)

    def id_to_bytes(self, token_id: int) -> bytes | None:
        """A vocabulary ID's bytes (the inverse of `bytes_to_id`), built once."""
        return self._bytes_of_ids().get(token_id)

    def _bytes_of_ids(self) -> dict[int, bytes]:
        if self._id_to_bytes is None:
            self._id_to_bytes = {v: k for k, v in self.bytes_to_id().items()}
        return self._id_to_bytes

    def spelling_to_id(self) -> dict[bytes, int]:
        """Each token's byte values as compact JSON (`b"[60,116]"`) → its ID (`bytes_to_id`),
        built on first use (0.15 s and 14 MB for Qwen3's 151k tokens). Two threads may both
        build it: the same table."""
        if self._spelling_to_id is None:
            self._spelling_to_id = {f"[{','.join(map(str, data))}]".encode(): tid
                                    for data, tid in self.bytes_to_id().items()}
        return self._spelling_to_id

    def text_of(self, ids: Sequence[int]) -> str:
        """`decode(ids)`, read from the byte table when that gives the same text (checked once
        per tokenizer, see `_joins_like_decode`): 4x faster for an answer, as it joins bytes
        instead of running the tokenizer's decoder. IDs whose bytes are not whole UTF-8 text
        (a cut character) or are not in the table go through `decode`."""
        if self._joins_like_decode():
            try:
                return self.text_of_bytes(ids, self.bytes_of(ids))
            except KeyError:
                pass
        return self.decode(ids)

    def text_of_bytes(self, ids: Sequence[int], data: bytes) -> str:
        """`text_of(ids)` when the IDs' bytes (`bytes_of(ids)`) are at hand: the logprob check
        computed them (`logprob_ids`), and an answer's bytes cost as much as the rest of it."""
        if self._joins_like_decode():
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return self.decode(ids)

    def bytes_of(self, ids: Sequence[int]) -> bytes:
        """The IDs' bytes end to end (`id_to_bytes` of each); KeyError for an ID without."""
        return b"".join(map(self._bytes_of_ids().__getitem__, ids))

    def _joins_like_decode(self) -> bool:
        """Whether the decoder is a plain join of the tokens' bytes (byte-level BPE): checked
        on every added token, every 97th base token, and sentences where a SentencePiece
        decoder would drop a leading space or a clean-up would join punctuation."""
        if self._join_checked is None:
            self._join_checked = self._check_join()
        return self._join_checked

    def _check_join(self) -> bool:
        table = self._bytes_of_ids()  # builds the byte table, noting the added tokens
        samples = [[i] for i in sorted(table)[::97]]
        samples += [[i] for i in self._added_ids]
        samples += [self.encode(text) for text in _JOIN_CHECKS]
        for ids in samples:
            try:
                joined = self.bytes_of(ids).decode("utf-8")
            except (KeyError, UnicodeDecodeError):
                continue  # a token that is part of a character: nothing to compare
            if joined != self.decode(ids):
                return False
        return True


# ---- the hash (`Tokenizer.sha256`) ------------------------------------------------------------

_TOKENIZER_FILE_HINTS = ("tokenizer", "vocab", "merges", "tiktoken", "special_tokens",
                         "chat_template", ".py")


def _hash_path(path: Path) -> str:
    h = hashlib.sha256()
    if path.is_file():
        h.update(path.read_bytes())
        return h.hexdigest()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        if any(hint in f.name for hint in _TOKENIZER_FILE_HINTS):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
