"""A compact index beside each responses.jsonl: one small line per record with what status,
budgets and resume need (no token lists), plus the byte offset where the record ends.

The data file stays the truth. The index is fresh when its last entry ends where the data
file ends; otherwise the missing tail is rebuilt from the data (after a kill between the two
writes, or when the index was deleted), and entries past the end (a cut torn line) are dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("draftgen.store")


@dataclass(slots=True)
class IndexEntry:
    id: str
    end: int
    """Byte offset just past this record's line in responses.jsonl."""
    backend: str | None
    provider: str | None
    out: int
    """Output tokens stored (len(output_ids))."""
    reasoning: int | None
    cost: float
    finish: str | None
    check: str | None
    t: float | None
    lat: float | None

    def to_json(self) -> bytes:
        return orjson.dumps({
            "id": self.id, "end": self.end, "backend": self.backend, "provider": self.provider,
            "out": self.out, "reasoning": self.reasoning, "cost": self.cost,
            "finish": self.finish, "check": self.check, "t": self.t, "lat": self.lat,
        }, option=orjson.OPT_APPEND_NEWLINE)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IndexEntry:
        return cls(**{k: data.get(k) for k in cls.__slots__})  # type: ignore[attr-defined]


def entry_for(record: dict[str, Any], end: int) -> IndexEntry:
    usage = record.get("usage") or {}
    return IndexEntry(
        id=record["id"], end=end, backend=record.get("backend"),
        provider=record.get("provider"), out=len(record.get("output_ids") or ()),
        reasoning=usage.get("reasoning_tokens"), cost=float(record.get("cost_usd") or 0.0),
        finish=record.get("finish_reason"), check=record.get("token_check"),
        t=record.get("created_at"), lat=record.get("latency_s"),
    )


def read_index(index_path: Path, data_path: Path, *, repair: bool
               ) -> tuple[list[IndexEntry], int]:
    """The index entries of a data file, caught up with the data, and the number of lines in
    the rebuilt part that are not records. With `repair`, the index file is rewritten or
    extended to match (the writer's side); without, nothing is written (readers such as status
    on a live run)."""
    data_size = data_path.stat().st_size if data_path.exists() else 0
    entries = _load_entries(index_path)
    valid_end = 0
    kept = 0
    for entry in entries:
        if entry.end > data_size or entry.end <= valid_end:
            break
        valid_end = entry.end
        kept += 1
    stale = kept != len(entries)
    del entries[kept:]
    skipped: list[int] = []
    tail = list(_entries_from_data(data_path, valid_end, data_size, skipped))
    entries.extend(tail)
    if repair and (stale or tail):
        if stale:
            _rewrite(index_path, entries)
        else:
            with open(index_path, "ab") as f:
                f.write(b"".join(e.to_json() for e in tail))
        log.info("%s: index rebuilt for %d records", index_path.parent.name, len(tail))
    return entries, len(skipped)


def _load_entries(index_path: Path) -> list[IndexEntry]:
    try:
        raw = index_path.read_bytes()
    except FileNotFoundError:
        return []
    entries = []
    for line in raw.splitlines():
        try:
            entries.append(IndexEntry.from_json(orjson.loads(line)))
        except (orjson.JSONDecodeError, TypeError):
            break  # a torn index line: everything after it is rebuilt from the data
    return entries


def _entries_from_data(data_path: Path, start: int, end: int, skipped: list[int]
                       ) -> Iterator[IndexEntry]:
    if end <= start:
        return
    with open(data_path, "rb") as f:
        f.seek(start)
        offset = start
        for line in f:
            offset += len(line)
            if offset > end or not line.endswith(b"\n"):
                break
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                record = None
            if isinstance(record, dict) and isinstance(record.get("id"), str):
                yield entry_for(record, offset)
            else:
                skipped.append(offset)


def _rewrite(index_path: Path, entries: list[IndexEntry]) -> None:
    tmp = index_path.with_suffix(".tmp")
    tmp.write_bytes(b"".join(e.to_json() for e in entries))
    os.replace(tmp, index_path)
