"""Tokenizer loading, the start-up self-check, byte → ID recovery, and batched encoding off the
event loop.

Two kinds of tokenizer sit behind one `Tokenizer` interface:

- `FastTokenizer`: a `tokenizer.json` loaded with HF `tokenizers` (Qwen3, DeepSeek, gpt-oss...).
- `TransformersTokenizer`: a HF folder without `tokenizer.json`, loaded through
  `transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=True)` (Kimi's tiktoken
  tokenizer). transformers is the optional extra `hf`, imported only then.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import logging
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

from tokenizers import Tokenizer as HFTokenizer

from draftgen.errors import DraftgenError
from draftgen.tokenize_fast import FastEncoder
from draftgen.tokenize_fastokens import fastokens_encoder
from draftgen.tokenize_tiktoken import tiktoken_encoder
from draftgen.types import LogprobToken, LogprobTokens, SentBytes


class TokenizerError(DraftgenError):
    """The tokenizer cannot be loaded or fails its self-check."""


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


class FastTokenizer(Tokenizer):
    """A `tokenizer.json` through HF `tokenizers`."""

    def __init__(self, backend: HFTokenizer, path: Path) -> None:
        super().__init__(path)
        self._tok = backend
        self._encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
        self._fast: FastEncoder | None = None
        self._fast_build: threading.Thread | None = None

    @cached_property
    def vocab_size(self) -> int:
        # Computed once: tokenizers 0.22 builds the whole vocabulary on every call (~50 ms).
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        fast = self._fast_encoder()
        if fast is not None and fast.takes(text):
            return fast.encode(text)
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Through the fast encoder where it gives the same IDs (see `_fast_encoder`), the
        rest in one HF batch."""
        fast = self._fast_encoder()
        if fast is None:
            return self._hf_encode_batch(texts)
        out = [fast.encode(t) if fast.takes(t) else None for t in texts]
        rest = [i for i, ids in enumerate(out) if ids is None]
        for i, ids in zip(rest, self._hf_encode_batch([texts[i] for i in rest]), strict=True):
            out[i] = ids
        return out  # type: ignore[return-value]  # every None replaced above

    @property
    def batches_gain_from_a_thread(self) -> bool:
        """Until the fast encoder is ready, and where there is none, batches go to HF's
        `encode_batch`, which releases the GIL for the whole batch."""
        return self._fast is None

    def _hf_encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # `tokenizers` releases the GIL inside encode_batch: a batch runs across cores.
        # encode_batch_fast (tokenizers >= 0.20) gives the same IDs without computing character
        # offsets: about 1.4x faster (bench/tokenization.py).
        if not texts:
            return []
        return [e.ids for e in self._encode_batch(list(texts), add_special_tokens=False)]

    def warm_up(self, wait: bool = True) -> None:
        """Build the fast encoder here and now, or (`wait=False`) start building it. A run
        starts it first thing, and waits for it before its first request: fastokens' load
        (~1.5 s of CPU) releases the interpreter lock, so the run's start (prompts, resume
        scan, backends) goes on beside it. tiktoken's build (~0.4 s, where fastokens cannot be
        used) holds the lock for long stretches: beside the start it slows the start's file
        operations by about its own length (docs/benchmarks.md)."""
        self._fast_encoder(wait=wait)

    def _fast_encoder(self, wait: bool = False) -> FastEncoder | None:
        """The fast encoder: `fastokens` (`draftgen.tokenize_fastokens`), else `tiktoken`
        (`draftgen.tokenize_tiktoken`), whichever gives HF's IDs for this tokenizer first;
        None while it is being built and when neither can. Built once per file and process, on
        a background thread started by `warm_up` or the first encode (HF encodes meanwhile,
        with the same IDs); `wait` waits for it."""
        if self._fast_build is None:
            # Not a daemon: the interpreter joins it before it shuts down. A daemon thread still
            # inside fastokens then (its calls release the interpreter lock) is ended by
            # pthread_exit when it takes the lock back, and the forced unwind through the
            # extension's frames aborts the process ("FATAL: exception not rethrown", rc 134)
            # after a command that did its job. The wait is the rest of a build: ~1.5 s at most.
            self._fast_build = threading.Thread(
                target=self._build_fast_encoder, name="draftgen-fast-encoder", daemon=False)
            self._fast_build.start()
        if wait:
            self._fast_build.join()
        return self._fast

    def _build_fast_encoder(self) -> None:
        reference = self._hf_encode_batch
        self._fast = (fastokens_encoder(self._tok, self.path, reference)
                      or tiktoken_encoder(self._tok, self.path, self._bytes_to_id_from_file,
                                          reference))

    def _bytes_to_id_from_file(self, file_vocab: Mapping[str, int]) -> dict[bytes, int]:
        """`bytes_to_id`, from the base vocabulary as the tiktoken build read it from the file
        (the entries `get_vocab` gives, without its 0.2 s)."""
        if self._bytes_to_id is None:
            return self._build_bytes_to_id(*self._vocab_parts(file_vocab))
        return self._bytes_to_id

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def _vocab_parts(self, file_vocab: Mapping[str, int] | None = None
                     ) -> tuple[Mapping[str, int], Mapping[str, int]]:
        added = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}
        vocab = self._tok.get_vocab(with_added_tokens=False) if file_vocab is None else file_vocab
        return {t: i for t, i in vocab.items() if t not in added}, added


_KIMI_ENCODE_LOG = "Calling super().encode with"


class _DropKimiEncodeWarning(logging.Filter):
    """Kimi's `tokenization_kimi.py` logs this at WARNING on every encode() with keyword
    arguments (SGLang filters it the same way)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_KIMI_ENCODE_LOG)


class TransformersTokenizer(Tokenizer):
    """A transformers tokenizer (slow or remote code) behind the same interface.

    `encode` calls the backend with no keyword arguments when that adds no special tokens
    (Kimi's tiktoken tokenizer: the keyword path is slower and logs a warning per call);
    otherwise with `add_special_tokens=False`. Which one is decided once, at load.
    """

    def __init__(self, backend: Any, path: Path) -> None:
        super().__init__(path)
        self._tok = backend
        module = type(backend).__module__
        if "tokenization_kimi" in module:
            logging.getLogger(module).addFilter(_DropKimiEncodeWarning())
        self._added: dict[str, int] = dict(getattr(backend, "added_tokens_encoder", {}) or {})
        self._vocab: dict[str, int] = dict(backend.get_vocab())
        probe = "Hello, world"
        self._plain_encode = list(backend.encode(probe)) == list(
            backend.encode(probe, add_special_tokens=False)
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        if self._plain_encode:
            return list(self._tok.encode(text))
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if skip_special_tokens:
            return str(self._tok.decode(list(ids), skip_special_tokens=True))
        return str(self._tok.decode(list(ids)))  # no keyword: Kimi's fast path

    def token_to_id(self, token: str) -> int | None:
        if token in self._added:
            return self._added[token]
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        tok = self._tok.convert_ids_to_tokens(token_id)
        return tok if isinstance(tok, str) else None

    def _vocab_parts(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        base = {t: i for t, i in self._vocab.items() if t not in self._added}
        return base, self._added


_TOKEN_ID_FORM = re.compile(r"token_id:(\d+)\Z")
"""vLLM's `return_tokens_as_token_ids` spelling of a logprob token."""


class TokenSpellings:
    """A vocabulary's tokens as the compact JSON text of their byte values (`b"[60,116]"`), both
    ways: what a chat backend reads logprob entries' bytes through (`openai_chat`), one lookup
    per entry, where parsing them costs ~40 µs of the event loop per answer. Built when made
    (`Tokenizer.spelling_to_id`, ~0.2 s for Qwen3's 151k tokens): before a run's first request,
    not on its first answer, where it held up every answer in flight."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._by_id = {tid: text for text, tid in tokenizer.spelling_to_id().items()}

    def spelled_ids(self, spelled: bytes, reported: list[int | None]) -> list[int] | None:
        """The IDs whose spellings, joined by "|", are `spelled` (each entry's bytes as sent,
        joined by "|"), one per entry: the `reported` IDs when every entry reports one, else
        when none does, each entry's by its spelling. None otherwise: an entry spelled another
        way (spaces, not byte values, no such token), IDs reported by some entries only."""
        if None not in reported:
            try:
                own = b"|".join(map(self._by_id.__getitem__, reported))
            except KeyError:
                return None
            return reported if own == spelled else None  # type: ignore[return-value]  # no None
        if reported.count(None) != len(reported):
            return None
        ids = _ids_of_spellings(self._tokenizer, spelled)
        return None if ids is None or len(ids) != len(reported) else ids

    def joined(self, ids: list[int]) -> bytes:
        """The IDs' bytes end to end (`Tokenizer.bytes_of`)."""
        return self._tokenizer.bytes_of(ids)


def logprob_token_id(tokenizer: Tokenizer, entry: LogprobToken) -> int | None:
    """One sampled token's vocabulary ID: its reported `id`, else its bytes (or its text, when
    the endpoint gave no bytes) through the tokenizer's inverted byte table."""
    if entry.id is not None:
        return entry.id
    return _unreported_id(tokenizer.bytes_to_id(), entry.token, entry.bytes)


def _unreported_id(table: Mapping[bytes, int], token: str, raw: bytes | list[int] | None
                   ) -> int | None:
    """The ID of an entry without `id`: vLLM's `token_id:N` spelling, else the entry's bytes
    (its text when it has none) through the inverted byte table."""
    m = _TOKEN_ID_FORM.match(token)
    if m:
        return int(m[1])
    return table.get(bytes(raw) if raw is not None else token.encode("utf-8"))


def last_logprob_id(tokenizer: Tokenizer, entries: Sequence[LogprobToken]) -> int | None:
    """`logprob_token_id` of the last entry (None when there is none), reading only its ID,
    or its bytes as sent (see `_ids_by_spelling`): no column of bytes or logprob values is
    built for one entry."""
    if not entries:
        return None
    if not isinstance(entries, LogprobTokens):
        return logprob_token_id(tokenizer, entries[-1])
    if entries.ids[-1] is not None:
        return entries.ids[-1]
    sent = entries.sent_bytes()
    if sent is not None and not (sent.may_name_ids and _TOKEN_ID_FORM.match(entries.tokens[-1])):
        if sent.ids is not None:
            return sent.ids[-1]
        tid = tokenizer.spelling_to_id().get(sent.spelled.rpartition(b"|")[2])
        if tid is not None:
            return tid
    return _unreported_id(tokenizer.bytes_to_id(), entries.tokens[-1], entries.bytes[-1])


class LogprobIds(NamedTuple):
    """The IDs recovered from an answer's logprob entries (`logprob_ids`)."""

    ids: list[int]
    data: bytes | None
    """The IDs' bytes end to end (`Tokenizer.bytes_of(ids)`) when recovering them computed
    those, else None: the answer's text is read from them (`Tokenizer.text_of_bytes`)."""


def ids_from_logprobs(tokenizer: Tokenizer, entries: Sequence[LogprobToken],
                      completion_tokens: int | None = None) -> list[int] | None:
    """`logprob_ids`, the IDs only."""
    found = logprob_ids(tokenizer, entries, completion_tokens)
    return None if found is None else found.ids


def logprob_ids(tokenizer: Tokenizer, entries: Sequence[LogprobToken],
                completion_tokens: int | None = None) -> LogprobIds | None:
    """Every entry's ID, or None when one of them maps to no vocabulary entry.

    llama-server holds back a token that ends inside a multi-byte UTF-8 character and reports
    it in the next entry: that entry's `id` is the last token's, its `bytes` cover the tokens
    held back too (tools/server/server-context.cpp `process_token`, `validate_utf8`). Such an
    entry stands for several IDs: the split of its extra bytes into vocabulary tokens, each
    leaving the text cut inside a character (else the server would have sent it). When a split
    is not unique, the engine's token count (`completion_tokens`) must single out one
    combination over the whole answer; otherwise None.

    Reads the entries' columns (`LogprobTokens`; any other sequence is copied into columns):
    in the worker threads, once per answer token, an object per entry cost more than the
    lookups themselves."""
    columns = entries if isinstance(entries, LogprobTokens) else LogprobTokens.of(entries)
    sent = columns.sent_bytes()
    if sent is not None and sent.ids is not None and (
            None not in columns.ids or not _may_name_ids(columns, sent)):
        return LogprobIds(list(sent.ids), sent.joined)  # each entry's bytes spell its ID
    if sent is not None and columns.ids.count(None) == len(columns.ids):
        by_spelling = _ids_by_spelling(tokenizer, columns, sent)
        if by_spelling is not None:  # each entry's bytes are its ID's: no join to compare
            return LogprobIds(by_spelling, sent.joined)
    ids = _entry_ids(tokenizer, columns)
    if ids is None:
        return None
    data = _matching_bytes(tokenizer, columns, ids)
    if data is not None:
        return LogprobIds(ids, data)
    merged = _merged_entries(tokenizer, columns)
    if merged is None:
        return None
    if not merged:
        return LogprobIds(ids, None)
    options = [merged.get(i) or [[tid]] for i, tid in enumerate(ids)]
    if all(len(o) == 1 for o in options):
        return LogprobIds([t for o in options for t in o[0]], None)
    unique = _unique_total(options, completion_tokens)
    return None if unique is None else LogprobIds(unique, None)


def _entry_ids(tokenizer: Tokenizer, columns: LogprobTokens) -> list[int] | None:
    """Each entry's own ID (see `logprob_token_id`); None when one maps to none."""
    if None not in columns.ids:  # every endpoint that reports IDs reports them all
        return list(columns.ids)  # type: ignore[arg-type]  # no None in it
    table = tokenizer.bytes_to_id()
    out: list[int] = []
    for reported, token, raw in zip(columns.ids, columns.tokens, columns.bytes, strict=True):
        tid = reported if reported is not None else _unreported_id(table, token, raw)
        if tid is None:
            return None
        out.append(tid)
    return out


def _ids_by_spelling(tokenizer: Tokenizer, columns: LogprobTokens, sent: SentBytes
                     ) -> list[int] | None:
    """The IDs of entries that report none (OpenRouter's), read from their byte values as
    the JSON text sent (`SentBytes.spelled`) through a table of each token's compact spelling:
    what their bytes give (`_unreported_id`), at a split and a lookup per entry, where reading
    the bytes costs a list and a `bytes` per entry. None when an entry's spelling is not in
    the table (spaces, or no such token), or a token might be vLLM's `token_id:N` (its text
    names the ID): the caller reads the bytes then."""
    if _may_name_ids(columns, sent):
        return None
    return _ids_of_spellings(tokenizer, sent.spelled)


def _ids_of_spellings(tokenizer: Tokenizer, spelled: bytes) -> list[int] | None:
    """The ID of each "|"-separated compact spelling (`Tokenizer.spelling_to_id`); None when
    one is no token's."""
    ids = list(map(tokenizer.spelling_to_id().get, spelled.split(b"|")))
    return None if None in ids else ids  # type: ignore[return-value]  # no None in ids


def _may_name_ids(columns: LogprobTokens, sent: SentBytes) -> bool:
    """Whether an entry's token may be vLLM's `token_id:N` (which names the ID to use)."""
    return sent.may_name_ids and "token_id:" in "".join(columns.tokens)


def _matching_bytes(tokenizer: Tokenizer, columns: LogprobTokens, ids: list[int]
                    ) -> bytes | None:
    """The common case, in two joins: the entries' bytes, end to end, are the IDs' own bytes
    end to end, so no entry carries bytes of a token it does not name (nothing held back;
    whatever the entries' split, the IDs account for every byte). Those bytes when so, else
    None. The entries' join is the one the backend made (`LogprobTokens.sent_bytes`) when it
    kept one: then no entry's bytes are read."""
    kept = columns.sent_bytes()
    sent = kept.joined if kept is not None else None
    if sent is None:
        column = columns.bytes
        if None in column:
            return None
        try:
            sent = b"".join(column)  # type: ignore[arg-type]  # byte lists: TypeError
        except TypeError:
            return None
    try:
        own = tokenizer.bytes_of(ids)
    except KeyError:
        return None
    return sent if sent == own else None


_MAX_SPLITS = 64


def _cut_inside_char(text: bytes) -> bool:
    """llama-server's `validate_utf8`: the text ends inside a multi-byte character."""
    n = len(text)
    for i in range(1, min(4, n) + 1):
        c = text[n - i]
        if ((c & 0xE0) == 0xC0 and i < 2) or ((c & 0xF0) == 0xE0 and i < 3) or (
                (c & 0xF8) == 0xF0 and i < 4):
            return True
    return False


def _merged_entries(tokenizer: Tokenizer, columns: LogprobTokens
                    ) -> dict[int, list[list[int]]] | None:
    """The entries that stand for several IDs (position → the ID sequences each can stand
    for): those with a reported `id` whose bytes are longer than that token's and end with
    them (held-back tokens before it; see `ids_from_logprobs`). None when one's extra bytes
    split no way, or too many ways to list."""
    own_bytes = tokenizer.id_to_bytes
    out: dict[int, list[list[int]]] = {}
    for i, (tid, raw) in enumerate(zip(columns.ids, columns.bytes, strict=True)):
        if tid is None or raw is None:
            continue
        own = own_bytes(tid)
        if own is None or len(raw) <= len(own):
            continue
        raw = bytes(raw)
        if not raw.endswith(own):
            continue
        splits = _held_back_splits(tokenizer, raw[: -len(own)], tid,
                                   _tail_before(columns.bytes, i))
        if splits is None:
            return None
        out[i] = splits
    return out


def _tail_before(column: list[bytes | list[int] | None], index: int) -> bytes:
    """The last 3 bytes (at most) of the entries before `index` (entries without bytes add
    none): what a held-back token's check needs of the text before it."""
    tail = b""
    for i in range(index - 1, -1, -1):
        raw = column[i]
        if raw is not None:
            tail = bytes(raw) + tail
            if len(tail) >= 3:
                break
    return tail[-3:]


def _held_back_splits(tokenizer: Tokenizer, prefix: bytes, tid: int, before: bytes
                      ) -> list[list[int]] | None:
    """The ID sequences an entry with extra bytes `prefix` before its token `tid` can stand
    for: splits of `prefix` into vocabulary tokens, each leaving the text (after `before`) cut
    inside a character, then `tid`. None when it splits no way, or too many ways to list."""
    table = tokenizer.bytes_to_id()
    found: list[list[int]] = []

    def walk(pos: int, acc: list[int]) -> bool:
        if pos == len(prefix):
            found.append([*acc, tid])
            return len(found) <= _MAX_SPLITS
        for end in range(pos + 1, len(prefix) + 1):
            piece = table.get(prefix[pos:end])
            if piece is not None and _cut_inside_char(before + prefix[:end]) \
                    and not walk(end, [*acc, piece]):
                return False
        return True

    if not walk(0, []) or not found:
        return None
    return found


def _unique_total(options: list[list[list[int]]], total: int | None) -> list[int] | None:
    """The one combination of per-entry options whose length is `total`, or None (no total,
    none, or more than one)."""
    if total is None:
        return None
    # ways[length] = (number of combinations reaching it, capped at 2; back-pointer)
    layers: list[dict[int, tuple[int, tuple[int, int] | None]]] = []
    ways: dict[int, tuple[int, tuple[int, int] | None]] = {0: (1, None)}
    for opts in options:
        nxt: dict[int, tuple[int, tuple[int, int] | None]] = {}
        for length, (count, _) in ways.items():
            for k, o in enumerate(opts):
                reach = length + len(o)
                if reach <= total:
                    before = nxt.get(reach, (0, None))[0]
                    nxt[reach] = (min(2, before + count), (length, k))
        layers.append(nxt)
        ways = nxt
    if ways.get(total, (0, None))[0] != 1:
        return None
    out: list[list[int]] = []
    length = total
    for opts, layer in zip(reversed(options), reversed(layers), strict=True):
        back = layer[length][1]
        assert back is not None
        length, k = back
        out.append(opts[k])
    return [t for o in reversed(out) for t in o]


# ---- loading --------------------------------------------------------------------------------

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
    """A `tokenizer.json` (or a folder holding one) through `tokenizers`; a GGUF model file
    through its own vocabulary (see tokenize_gguf); any other HF tokenizer folder through
    transformers with `trust_remote_code=True`."""
    from draftgen.tokenize_gguf import is_gguf, load_gguf_tokenizer  # lazy: import cycle

    if is_gguf(path):
        return load_gguf_tokenizer(path)
    p = Path(path).expanduser()
    if p.is_dir() and not (p / "tokenizer.json").is_file():
        if not (p / "tokenizer_config.json").is_file():
            raise TokenizerError(
                f"tokenizer not found: {path} (a folder needs tokenizer.json, or "
                "tokenizer_config.json for a transformers tokenizer)"
            )
        return _load_transformers(p)
    file = find_tokenizer_file(p)
    try:
        return FastTokenizer(HFTokenizer.from_file(str(file)), file)
    except Exception as e:  # the Rust side raises plain Exception subclasses
        raise TokenizerError(f"{file}: cannot load tokenizer: {e}") from None


def _load_transformers(folder: Path) -> Tokenizer:
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise TokenizerError(
            f"{folder} has no tokenizer.json: loading it needs transformers "
            "(pip install 'draftgen[hf]'; Kimi's tokenizer also needs tiktoken)"
        ) from None
    try:
        backend = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
    except Exception as e:  # remote code can raise anything
        raise TokenizerError(f"{folder}: cannot load tokenizer through transformers: {e}") from None
    return TransformersTokenizer(backend, folder)


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
            f"tokenizer self-check failed for {tokenizer.path} (a wrong tokenizer for this "
            "model format, or a mis-loaded one: check the transformers version):\n  "
            + "\n  ".join(problems)
        )


# ---- batching off the event loop ------------------------------------------------------------

T = TypeVar("T")
R = TypeVar("R")


class OffLoopBatcher(Generic[T, R]):
    """Collects single calls from many coroutines into batches and runs `fn(batch)` in an
    executor thread, or on the event loop itself where a thread would only cost more.

    `tokenizers` releases the GIL once for a whole `encode_batch`: in a thread, a batch runs
    in parallel with the loop and across cores. The fast encoders (`fastokens`, `tiktoken`) and
    Python code release it for each text at most: in a thread, each text then waits for the
    busy loop to hand the GIL back (up to the 5 ms switch interval), so a batch of 128 answers
    could wait longer than the loop takes to encode them, and the hand-offs cost CPU of their
    own. `in_thread()`, asked for each batch, chooses; on the loop a batch blocks it for a few
    ms at most (128 answers at ~15 µs with fastokens, ~80 µs with tiktoken), and the loop runs
    between batches.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int = 256,
        executor: Executor | None = None,
        in_thread: Callable[[], bool] = lambda: True,
    ) -> None:
        self._fn = fn
        self._max_batch = max_batch
        self._executor = executor
        self._in_thread = in_thread
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
                    results = await self._run(loop, items)
                except Exception:  # one bad item must not fail its neighbours
                    await self._run_alone(loop, batch)
                    continue
                for (_, fut), res in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(res)
        finally:
            self._running = False

    async def _run_alone(self, loop: asyncio.AbstractEventLoop,
                         batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        """A batch that failed, run again one item at a time: each caller gets its own item's
        result or error."""
        for item, fut in batch:
            try:
                result = (await self._run(loop, [item]))[0]
            except Exception as e:
                if not fut.done():
                    fut.set_exception(e)
                continue
            if not fut.done():
                fut.set_result(result)

    async def _run(self, loop: asyncio.AbstractEventLoop, items: list[T]) -> Sequence[R]:
        if self._in_thread():
            return await loop.run_in_executor(self._executor, self._fn, items)
        await asyncio.sleep(0)  # the loop runs between batches run on it
        return self._fn(items)


def chunked(items: Iterable[T], size: int) -> Iterable[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
