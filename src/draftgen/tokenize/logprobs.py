"""An answer's token IDs recovered from its logprob entries (`logprob_tokens.LogprobTokens`):
reported IDs, vLLM's `token_id:N` spellings, or each entry's bytes through the vocabulary's byte
table (`Tokenizer.bytes_to_id`), with llama-server's held-back tokens split back out
(`logprob_ids`). `TokenSpellings`: the same lookups over the bytes as a chat backend receives
them, before any entry is parsed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from draftgen.tokenize.base import Tokenizer, vocabulary_problem
from draftgen.tokenize.logprob_tokens import LogprobToken, LogprobTokens, SentBytes

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
    """Each entry's own ID (see `logprob_token_id`); None when one maps to none, or to no
    token of the vocabulary (an engine may report any number: `vocabulary_problem`)."""
    if None not in columns.ids:  # every endpoint that reports IDs reports them all
        out = list(columns.ids)
    else:
        table = tokenizer.bytes_to_id()
        out = []
        for reported, token, raw in zip(columns.ids, columns.tokens, columns.bytes,
                                        strict=True):
            tid = reported if reported is not None else _unreported_id(table, token, raw)
            if tid is None:
                return None
            out.append(tid)
    if vocabulary_problem(out, tokenizer.vocab_size):
        return None
    return out  # type: ignore[return-value]  # ints, checked above


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
