"""Status of `turns: all` datasets (docs/trajectories.md): conversations done (a turn with an
`end` written), pending, in flight and stopped by a budget, turns written, turns per
conversation, where the trajectories ended and why.

A turn's `conversation`, `turn` and `end` are its index entry's (`store.index_entry.IndexEntry`).
An index written before the entries held them is read as before: from the records, cheaply,
since a record's trajectory fields are the last keys of its line (`store.record.Record`'s
field order: ... `conversation`, `turn`, `end`, `sampling`), so only the last bytes before each
line end are read (a memory map: one page per turn, not the token IDs); a line whose tail does
not hold them (a very long conversation ID or sampling) is read whole.
"""

from __future__ import annotations

import mmap
import re
from collections import Counter
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from draftgen.store.index_entry import IndexEntry

TAIL_BYTES = 1024
"""How much of each line's end is read for its trajectory fields."""
_FIELDS = re.compile(rb'"conversation":("(?:[^"\\]|\\.)*"),"turn":(\d+),"end":'
                     rb'(null|"(?:[^"\\]|\\.)*")')


@dataclass
class TrajectoryStatus:
    """One `turns: all` dataset's conversations."""

    conversations: int = 0
    """Conversations with a turn written."""
    done: int = 0
    """Conversations with a turn that has an `end`."""
    in_flight: int = 0
    """Conversations not done with a request in flight."""
    turns: int = 0
    """Distinct turns written."""
    max_turns: int = 0
    ends: Counter[str] = field(default_factory=Counter)
    """Conversations done, per end reason."""
    total: int | None = None
    """The dataset's conversations, where run.json records its `total`."""
    stopped_by_budget: int = 0
    """Conversations started, not done, that a budget stopped (the run is not live; a later
    run with more budget continues them)."""
    ended: set[str] = field(default_factory=set, repr=False)
    """The conversations done (to tell the in-flight ones)."""
    next_turn: dict[str, int] = field(default_factory=dict, repr=False)
    """Each conversation not done: the turn after its last one written."""
    flying: set[str] = field(default_factory=set, repr=False)
    """The conversations not done with a request in flight."""

    @property
    def pending(self) -> int:
        """Conversations not done, not in flight and not stopped by a budget (with the total
        known, those not started too; without it, the started ones only)."""
        base = self.total if self.total is not None else self.conversations
        return max(0, base - self.done - self.in_flight - self.stopped_by_budget)

    def merge(self, other: TrajectoryStatus) -> None:
        for name in ("conversations", "done", "in_flight", "turns", "stopped_by_budget"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_turns = max(self.max_turns, other.max_turns)
        self.ends.update(other.ends)
        self.ended |= other.ended
        if other.total is not None:
            self.total = (self.total or 0) + other.total

    def as_json(self) -> dict[str, Any]:
        mean = self.turns / self.conversations if self.conversations else None
        return {"conversations": self.conversations, "done": self.done,
                "pending": self.pending, "in_flight": self.in_flight,
                "stopped_by_budget": self.stopped_by_budget, "turns_written": self.turns,
                "turns_per_conversation": {"mean": None if mean is None else round(mean, 3),
                                           "max": self.max_turns},
                "ends": dict(self.ends.most_common())}


Turn = tuple[str, int, str | None]
"""(conversation, turn, end) of one record."""


def index_turns(entries: list[IndexEntry] | None, path: Path, line_ends: np.ndarray
                ) -> list[Turn]:
    """The trajectory fields of a dataset's records: their index entries' (`entries`, one per
    line end), read from the records' lines where an entry lacks them (an older index) or
    the entries are not to be had (None)."""
    if entries is None:
        return read_turns(path, line_ends)
    turns: list[Turn] = []
    older: list[int] = []
    for entry in entries:
        if entry.has_turn:
            assert entry.conversation is not None and entry.turn is not None
            turns.append((entry.conversation, entry.turn, entry.end_reason))
        else:
            older.append(entry.end)
    return turns + read_turns(path, np.array(older, dtype=np.int64)) if older else turns


def read_turns(path: Path, line_ends: np.ndarray) -> list[Turn]:
    """The trajectory fields of the records whose lines end at `line_ends` (from the index);
    a record without them (not a `turns: all` record) is left out."""
    if not len(line_ends):
        return []
    out: list[Turn] = []
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        previous = 0
        for end in line_ends.tolist():
            turn = _tail_fields(data[max(previous, end - TAIL_BYTES):end])
            if turn is None:
                turn = _line_fields(data[previous:end])
            if turn is not None:
                out.append(turn)
            previous = end
    return out


def _tail_fields(tail: bytes) -> Turn | None:
    matches = list(_FIELDS.finditer(tail))  # the last one: the record's own fields
    if not matches:
        return None
    conversation, turn, end = matches[-1].groups()
    end_value = orjson.loads(end)
    return orjson.loads(conversation), int(turn), end_value if isinstance(end_value, str) else None


def _line_fields(line: bytes) -> Turn | None:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    conversation, turn, end = record.get("conversation"), record.get("turn"), record.get("end")
    if not isinstance(conversation, str) or not isinstance(turn, int):
        return None
    return conversation, turn, end if isinstance(end, str) else None


def trajectory_status(turns: Iterable[Turn], total: int | None = None) -> TrajectoryStatus:
    st = TrajectoryStatus(total=total)
    written: dict[str, set[int]] = {}
    ended: dict[str, str] = {}
    for conversation, turn, end in turns:
        written.setdefault(conversation, set()).add(turn)
        if end is not None:
            ended[conversation] = end
    st.conversations = len(written)
    st.turns = sum(len(t) for t in written.values())
    st.max_turns = max((len(t) for t in written.values()), default=0)
    st.done = len(ended)
    st.ends = Counter(ended.values())
    st.ended = set(ended)
    st.next_turn = {c: max(t) + 1 for c, t in written.items() if c not in ended}
    return st


def count_in_flight(st: TrajectoryStatus, request_ids: Iterable[str]) -> None:
    """The conversations not done among the requests in flight."""
    st.flying = {conversation_of(r) for r in request_ids} - st.ended
    st.in_flight = len(st.flying)


def count_stopped_by_budget(st: TrajectoryStatus, failed: Container[str]) -> None:
    """The run is not live and a budget left turns of the dataset unsent: its conversations
    started, not done, not in flight at the stop, whose next turn did not fail (`failed`: the
    request IDs of failures not answered since), were stopped by the budget."""
    st.stopped_by_budget = sum(
        1 for conversation, turn in st.next_turn.items()
        if conversation not in st.flying and f"{conversation}#{turn}" not in failed)


def conversation_of(request_id: str) -> str:
    """The conversation of a turn's request ID (`{conversation}#{turn}`)."""
    return request_id.rpartition("#")[0] or request_id
