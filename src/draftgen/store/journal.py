"""The request journal, RUN/journal.jsonl: which requests of the last session were sent and
never ended (answered, failed or dropped): in flight now on a live run, in flight at the stop on
a stopped or killed one (possibly billed, never answered).

A long run journals two lines per answer, so readers must not parse it whole. The writer
(`Store.journal`, through `OpenTracker`) therefore adds now and then a line listing the requests
open at that point::

    {"ev": "open", "session": S, "t": T,
     "open": [[ID, DATASET, SENT_AT, BACKEND, USD, GENERATION_ID], ...]}

(every `CHECKPOINT_EVERY` events, or more rarely when many requests are open, so that these
lines stay a few per cent of the journal). A reader takes the last such line of the last session
and replays the events after it. A journal without one (written before they existed) is read
by counting: lines are appended in session order, so the last session starts where a binary
search over line starts says; within it, requests still open number `sent - ok - failed -
dropped` (counted on the raw bytes), and they are found by parsing lines backwards from the end
until that many are found.

A paid request's `sent` line carries `usd`, its worst-case cost as reserved by the budget: what
a request in flight at a kill may have been billed (`unsettled_usd`). Older journals lack it
(and checkpoint entries have four fields): read as 0. A paid OpenRouter request also gets a
`gen` line with its generation ID once the answer's headers arrive (`"gen": "gen-..."`), by
which the next session asks OpenRouter what it was billed (checkpoint entries: a sixth field,
absent or null until known).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

ENDED = ("ok", "failed", "dropped")
GENERATION = "gen"
CHECKPOINT = "open"
CHECKPOINT_EVERY = 5000
"""Events between two checkpoint lines (at least; 20 per open request when more are open)."""
_BLOCK = 1 << 20


# ---- the writer's side ----------------------------------------------------------------------


class OpenTracker:
    """Follows the events a Store journals; says when to write a checkpoint line and what."""

    def __init__(self, every: int | None = None) -> None:
        self.every = CHECKPOINT_EVERY if every is None else every
        self.open: dict[str, list[list[Any]]] = {}
        self._since = 0
        self._session: Any = None

    def note(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Record one event; returns the checkpoint line to write after it, when one is due."""
        ev, rid = event.get("ev"), event.get("id")
        if ev == CHECKPOINT or not isinstance(rid, str):
            return None
        session = event.get("session", self._session)
        if session != self._session:  # only the current session's requests are listed
            self.open.clear()
            self._session = session
        if ev == "sent":
            self.open.setdefault(rid, []).append(
                [rid, event.get("dataset"), event.get("t"), event.get("backend"),
                 event.get("usd", 0.0)])
        elif ev in ENDED and rid in self.open:
            self.open[rid].pop(0)
            if not self.open[rid]:
                del self.open[rid]
        elif ev == GENERATION and rid in self.open:
            self.open[rid][-1][5:] = [event.get("gen")]
        self._since += 1
        if self._since < max(self.every, 20 * len(self.open)):
            return None
        self._since = 0
        return {"ev": CHECKPOINT, "session": self._session, "t": round(time.time(), 3),
                "open": [req for reqs in self.open.values() for req in reqs]}


# ---- the reader's side ----------------------------------------------------------------------


@dataclass
class OpenRequest:
    id: str
    dataset: str | None
    t: float | None
    backend: str | None
    usd: float = 0.0
    """Its worst-case cost, reserved when it was sent (0: free, or an older journal)."""
    gen: str | None = None
    """Its generation ID, where the backend sent one before the answer ended."""

    @classmethod
    def of_event(cls, event: dict[str, Any], gen: str | None = None) -> OpenRequest:
        """From a `sent` line (and its generation ID, where a later line gave one)."""
        return cls(event["id"], event.get("dataset"), event.get("t"), event.get("backend"),
                   as_usd(event.get("usd")), gen)

    @classmethod
    def of_entry(cls, entry: Any) -> OpenRequest | None:
        """From a checkpoint line's entry (four to six fields); None if it is not one."""
        if not (isinstance(entry, list) and 4 <= len(entry) <= 6 and isinstance(entry[0], str)):
            return None
        gen = entry[5] if len(entry) > 5 and isinstance(entry[5], str) else None
        return cls(*entry[:4], as_usd(entry[4]) if len(entry) > 4 else 0.0, gen)


def as_usd(value: Any) -> float:
    """A stored dollar amount; 0 where none (absent, or not a number)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


@dataclass
class JournalTail:
    session: int | None = None
    """The last session that journaled anything."""
    open: list[OpenRequest] = field(default_factory=list)
    """Requests of that session sent and not ended."""
    last_t: float | None = None
    torn_tail_bytes: int = 0
    from_checkpoint: bool = False
    complete: bool = True
    """False when the backward scan reached the session's start with fewer open requests than
    the counts say (a line that is not JSON, or events written by hand)."""

    @property
    def open_usd(self) -> float:
        """The open requests' worst-case cost, as reserved when they were sent."""
        return sum(r.usd for r in self.open)


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _line_at(f: BinaryIO, pos: int, size: int) -> tuple[int, dict[str, Any] | None]:
    """The start of the first line beginning at or after `pos`, and that line parsed."""
    if pos > 0:
        chunk = os.pread(f.fileno(), min(_BLOCK, size - pos + 1), pos - 1)
        nl = chunk.find(b"\n")
        if nl < 0:
            return size, None
        pos = pos - 1 + nl + 1
    chunk = os.pread(f.fileno(), min(_BLOCK, size - pos), pos)
    nl = chunk.find(b"\n")
    if nl < 0:
        return size, None
    return pos, _parse(chunk[:nl])


def _session_of(event: dict[str, Any] | None) -> int | None:
    value = (event or {}).get("session")
    return value if isinstance(value, int) else None


def _session_start(f: BinaryIO, size: int, session: int) -> int:
    """The offset of the first line of `session` (lines are in session order)."""
    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi) // 2
        start, event = _line_at(f, mid, size)
        s = _session_of(event)
        if start >= size or (s is not None and s >= session):
            hi = mid
        else:
            lo = mid + 1
    return _line_at(f, lo, size)[0]


def _last_line(f: BinaryIO, size: int) -> dict[str, Any] | None:
    pos = max(0, size - _BLOCK)
    chunk = os.pread(f.fileno(), size - pos, pos)
    return _parse(chunk.rstrip(b"\n").rsplit(b"\n", 1)[-1])


def _last_checkpoint(f: BinaryIO, start: int, end: int, session: int
                     ) -> tuple[int, dict[str, Any]] | None:
    """The session's last checkpoint line between line boundaries `start` and `end`
    (searched backwards block by block), and the offset just past it."""
    marker = b'"ev":"' + CHECKPOINT.encode() + b'"'
    pos = end
    while pos > start:
        lo = max(start, pos - _BLOCK)
        chunk = os.pread(f.fileno(), pos - lo, lo)
        if lo > start:  # drop the partial first line: the next block reads it whole
            nl = chunk.find(b"\n")
            chunk, lo = (chunk[nl + 1 :], lo + nl + 1) if nl >= 0 else (b"", pos)
        at = chunk.rfind(marker)
        while at >= 0:
            line_start = chunk.rfind(b"\n", 0, at) + 1
            line_end = chunk.find(b"\n", at)
            event = _parse(chunk[line_start:line_end])
            if event is not None and event.get("ev") == CHECKPOINT \
                    and _session_of(event) == session:
                return lo + line_end + 1, event
            at = chunk.rfind(marker, 0, line_start)
        pos = lo if lo < pos else pos - _BLOCK
    return None


def read_journal(path: Path, size: int | None = None) -> JournalTail:
    """The last session's open requests, from the journal's first `size` bytes."""
    out = JournalTail()
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return out
    with f:
        total = os.fstat(f.fileno()).st_size if size is None else size
        if not total:
            return out
        tail = os.pread(f.fileno(), min(total, _BLOCK), total - min(total, _BLOCK))
        out.torn_tail_bytes = len(tail) - (tail.rfind(b"\n") + 1)
        end = total - out.torn_tail_bytes
        last = (_last_line(f, end) if end else None) or {}
        out.session = _session_of(last)
        if out.session is None:
            return out
        if isinstance(last.get("t"), int | float):
            out.last_t = float(last["t"])
        start = _session_start(f, end, out.session)
        checkpoint = _last_checkpoint(f, start, end, out.session)
        if checkpoint is not None:
            after, event = checkpoint
            _replay(event, os.pread(f.fileno(), end - after, after), out)
        else:
            raw = os.pread(f.fileno(), end - start, start)
            _find_open(raw, _count(raw, "sent") - sum(_count(raw, ev) for ev in ENDED), out)
    return out


def _replay(checkpoint: dict[str, Any], raw: bytes, out: JournalTail) -> None:
    """The checkpoint's open requests, then the events after it, in order."""
    open_: dict[str, list[OpenRequest]] = {}
    for entry in checkpoint.get("open") or []:
        req = OpenRequest.of_entry(entry)
        if req is not None:
            open_.setdefault(req.id, []).append(req)
    for line in raw.splitlines():
        event = _parse(line)
        if event is None or not isinstance(event.get("id"), str):
            continue
        ev, rid = event.get("ev"), event["id"]
        if ev == "sent":
            open_.setdefault(rid, []).append(OpenRequest.of_event(event))
        elif ev in ENDED and open_.get(rid):
            open_[rid].pop(0)
        elif ev == GENERATION and open_.get(rid):
            open_[rid][-1].gen = _generation_of(event)
    out.open = [r for reqs in open_.values() for r in reqs]
    out.from_checkpoint = True


def _generation_of(event: dict[str, Any]) -> str | None:
    gen = event.get("gen")
    return gen if isinstance(gen, str) else None


def _count(raw: bytes, ev: str) -> int:
    return raw.count(b'"ev":"' + ev.encode() + b'"')


def _find_open(raw: bytes, wanted: int, out: JournalTail) -> None:
    """Parse lines backwards, pairing each `sent` with a later end of the same ID, until
    `wanted` unpaired `sent` lines are found."""
    if wanted <= 0:
        return
    ended: Counter[str] = Counter()
    generation: dict[str, str | None] = {}
    """Each ID's latest generation ID seen, for the `sent` line before it."""
    pos = len(raw)
    while pos > 0 and len(out.open) < wanted:
        start = raw.rfind(b"\n", 0, pos - 1) + 1
        event = _parse(raw[start:pos])
        pos = start
        if event is None or not isinstance(event.get("id"), str):
            continue
        ev, rid = event.get("ev"), event["id"]
        if ev in ENDED:
            ended[rid] += 1
        elif ev == GENERATION:
            generation.setdefault(rid, _generation_of(event))
        elif ev == "sent":
            gen = generation.pop(rid, None)
            if ended[rid]:
                ended[rid] -= 1
            else:
                out.open.append(OpenRequest.of_event(event, gen))
    out.complete = len(out.open) >= wanted
