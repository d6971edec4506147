"""A `turns: all` turn's prompt stored as the earlier turn it extends plus what it adds, so that
a conversation's records grow with its length, not with its square (each turn's prompt holds
every earlier turn).

The writer (`PromptRefs`, inside `Store.append_record`) keeps, per conversation, what it needs
of the last turn it wrote: where its line lies, a digest of its messages, its tools, and its
prompt + answer IDs. The next turn of the conversation is written as a `TurnLine` when

- that turn is the one before it, in the same file (written by this session, or by an earlier
  one and handed over on resume: `continue_turn`), and its line is durable: an fsync covered
  it (`JsonlAppender.durable_size`), so that no crash can keep the new line and lose the one
  it names;
- its messages start with that turn's messages and its tools are that turn's (always so for
  `formats.trajectory.turn_messages`, checked all the same);
- its IDs start with at least one of that turn's prompt + answer IDs (`keep`: all of them where
  the template renders the answer back as sampled, the prompt part where it drops the
  reasoning).

Anything else is written whole, as before. The reader (`LineReader`) expands a `TurnLine` into
the whole `Record` from the line it names (read at its offset, itself expanded the same way),
keeping the last expanded turn of each conversation so that reading a file in order reads each
line once. A reference that names no such line (a file edited by hand) makes the line a
`Damaged` record naming it. Rewriting a file (`store.quarantine_move`) re-points or expands the
lines that name moved lines.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec
import numpy as np

from draftgen.store.record import (
    Damaged,
    Extends,
    Record,
    RecordError,
    damaged,
    decode_line,
    encode_record,
    encode_turn_line,
    extended,
)

CACHE_IDS = 1 << 24
"""How many token IDs a reader keeps in the turns it remembers (each conversation's last)."""
_ENCODE = msgspec.json.Encoder().encode


@dataclass(slots=True)
class _Turn:
    """What the writer keeps of a conversation's last turn written."""

    id: str
    turn: int
    messages: int
    messages_digest: bytes
    tools: Any
    ids: np.ndarray
    """Its prompt + answer IDs."""
    at: int = 0
    end: int = 0
    """Where its line starts and ends in the file."""


@dataclass(slots=True)
class Prepared:
    """A record's line as the writer will write it, and what it keeps of the turn after."""

    line: bytes
    key: tuple[str, str] | None = None
    turn: _Turn | None = None


class PromptRefs:
    """The writer's side: which turn each conversation's next turn may extend."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], _Turn] = {}

    def prepare(self, dataset: str, record: Record, durable: int) -> Prepared:
        """The record's line (with its newline): a `TurnLine` where it extends the last turn
        written of its conversation, whose line ends within the `durable` bytes of the file."""
        conversation, turn = record.conversation, record.turn
        if not isinstance(conversation, str) or not isinstance(turn, int):
            return Prepared(encode_record(record) + b"\n")
        key = (dataset, conversation)
        base = self._last.get(key)
        if base is not None and (base.turn != turn - 1 or base.end > durable):
            base = None
        prefix, digest = _messages_digests(record.messages, base.messages if base else None)
        after = _turn_after(record, turn, digest)
        extends = _extends(base, record, prefix, after.ids) if base is not None else None
        line = encode_record(record) if extends is None else encode_turn_line(record, extends)
        return Prepared(line + b"\n", key, None if isinstance(record.end, str) else after)

    def continue_turn(self, dataset: str, record: Record, at: int, end: int) -> None:
        """A turn an earlier session wrote at bytes `at` to `end` (durable), which the next
        turn of its conversation may extend."""
        if not isinstance(record.conversation, str) or not isinstance(record.turn, int) \
                or isinstance(record.end, str):
            return
        turn = _turn_after(record, record.turn, _messages_digests(record.messages, None)[1])
        turn.at, turn.end = at, end
        self._last[dataset, record.conversation] = turn

    def written(self, prepared: Prepared, at: int, end: int) -> None:
        """The prepared line is in the file at bytes `at` to `end`."""
        if prepared.key is None:
            return
        if prepared.turn is None:  # the conversation ended: no turn extends this one
            self._last.pop(prepared.key, None)
            return
        prepared.turn.at, prepared.turn.end = at, end
        self._last[prepared.key] = prepared.turn


def _turn_after(record: Record, turn: int, digest: bytes) -> _Turn:
    """What the writer keeps of `record` for the turn after it."""
    ids = np.array([*record.input_ids, *record.output_ids], dtype=np.int64)
    return _Turn(record.id, turn, len(record.messages), digest, record.tools, ids)


def _messages_digests(messages: list[dict[str, Any]], upto: int | None
                      ) -> tuple[bytes | None, bytes]:
    """The digest of the first `upto` messages (None when there are fewer) and of all."""
    h = hashlib.blake2b(digest_size=16)
    prefix = None
    for i, message in enumerate(messages):
        if i == upto:
            prefix = h.digest()
        h.update(_ENCODE(message))
        h.update(b"\n")
    full = h.digest()
    return (full if upto == len(messages) else prefix), full


def _extends(base: _Turn, record: Record, messages_prefix: bytes | None, ids: np.ndarray
             ) -> Extends | None:
    """The record's prompt as `base` plus what it adds, where it starts with base's."""
    if messages_prefix != base.messages_digest or record.tools != base.tools:
        return None
    n = min(len(base.ids), len(record.input_ids))
    differ = np.flatnonzero(base.ids[:n] != ids[:n])
    keep = int(differ[0]) if len(differ) else n
    if keep == 0:
        return None
    return Extends(id=base.id, at=base.at, keep=keep, messages=record.messages[base.messages:],
                   input_ids=record.input_ids[keep:])


class LineReader:
    """The reader's side: the lines of one responses file as records, a `TurnLine` expanded
    into its whole `Record`. Use as a context manager (it opens the file to read the lines a
    turn names)."""

    def __init__(self, path: Path, cache_ids: int = CACHE_IDS) -> None:
        self.path = path
        self._fd: int | None = None
        self._recent: OrderedDict[int, Record] = OrderedDict()
        """Line start -> the last expanded turn of a conversation not ended."""
        self._cached_ids = 0
        self._cache_ids = cache_ids

    def __enter__(self) -> LineReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, line: bytes, at: int) -> Record | Damaged | None:
        """The record of the line that starts at byte `at`; a `Damaged` for a JSON object that
        is not one (a field missing, a reference to no such turn); None for a line that is not
        a JSON object."""
        try:
            decoded = decode_line(line)
            record = decoded if isinstance(decoded, Record) else self._expand(decoded, at)
        except RecordError as e:
            return damaged(line, str(e))
        self._remember(at, record)
        return record

    def _expand(self, line: Any, at: int) -> Record:
        chain = [line]
        where = at
        while True:
            ext: Extends = chain[-1].extends
            if ext.at >= where:
                raise RecordError(f"extends: byte {ext.at} is not before its line (byte {where})")
            found = self._recent.get(ext.at)
            if found is None:
                found = decode_line(self._line_at(ext.at))
            if found.id != ext.id or found.conversation != chain[-1].conversation:
                raise RecordError(f"extends: no turn {ext.id!r} of its conversation at byte "
                                  f"{ext.at} of {self.path} (found {found.id!r})")
            if isinstance(found, Record):
                break
            chain.append(found)
            where = ext.at
        self._forget(chain[0].extends.at)
        record: Record = found
        for link in reversed(chain):
            if link.extends.keep > len(record.input_ids) + len(record.output_ids):
                raise RecordError(f"extends: keeps {link.extends.keep} IDs of turn "
                                  f"{record.id!r}, which has fewer")
            record = extended(record, link)
        return record

    def _line_at(self, at: int) -> bytes:
        """The complete line that starts at byte `at` of the file."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        if at > 0 and os.pread(self._fd, 1, at - 1) != b"\n":
            raise RecordError(f"extends: byte {at} of {self.path} is not where a line starts")
        size = 1 << 16
        while True:
            chunk = os.pread(self._fd, size, at)
            nl = chunk.find(b"\n")
            if nl >= 0:
                return chunk[:nl]
            if len(chunk) < size:
                raise RecordError(f"extends: no complete line at byte {at} of {self.path}")
            size *= 4

    def _remember(self, at: int, record: Record) -> None:
        """Keep the turn a later line of its conversation may extend (evicting the oldest
        kept turns past `cache_ids` IDs)."""
        if not isinstance(record.conversation, str) or isinstance(record.end, str):
            return
        self._forget(at)
        self._recent[at] = record
        self._cached_ids += len(record.input_ids) + len(record.output_ids)
        while self._cached_ids > self._cache_ids and len(self._recent) > 1:
            self._forget(next(iter(self._recent)))

    def _forget(self, at: int) -> None:
        record = self._recent.pop(at, None)
        if record is not None:
            self._cached_ids -= len(record.input_ids) + len(record.output_ids)
