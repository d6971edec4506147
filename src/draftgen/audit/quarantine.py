"""`draftgen audit --quarantine`: move the answers that failed the audit out of each
`responses.jsonl` into `quarantine.jsonl` beside it, so that the next `draftgen run` (which
counts as done only what responses.jsonl holds) generates them again.

No answer is ever lost, whatever moment a kill lands at: the kept lines are written to a temp
file and fsynced, the failing ones are appended to quarantine.jsonl and fsynced, the index is
removed, and only then does the temp file replace responses.jsonl (one rename); the index is
rebuilt last. A kill before the rename leaves every answer in responses.jsonl (some perhaps also
in quarantine.jsonl: quarantining again does not copy them twice); after it, each answer is in
exactly one of the two files. A missing index is rebuilt from the data by the next reader.
Refused while a run is live on the folder; the run's lock is held throughout. In a sharded run
each folder's files are moved within that folder, under that folder's lock.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson

from draftgen.audit.engine import problems_of
from draftgen.audit.report import AuditReport, DatasetAudit
from draftgen.errors import DraftgenError
from draftgen.store.appender import StoreError
from draftgen.store.index import IndexEntry, read_index, rewrite_index
from draftgen.store.layout import RunLayout
from draftgen.store.lock import RunLock, RunLocked, lock_holder
from draftgen.store.resume import cut_torn_tail

_COPY = 1 << 22


class QuarantineError(DraftgenError):
    """Quarantine refused (a live run, files changed since the audit); nothing was moved."""


@dataclass
class QuarantineResult:
    moved: dict[str, int] = field(default_factory=dict)
    """Lines moved out of each dataset's responses.jsonl."""
    already: dict[str, int] = field(default_factory=dict)
    """Of those, lines quarantine.jsonl already held (from an interrupted quarantine)."""


def quarantine(report: AuditReport) -> QuarantineResult:
    """Move the failing lines of every audited file (each in its own run folder); the result
    is keyed as `report.datasets` is."""
    failing = {key: d for key, d in report.datasets.items() if len(d.failing)}
    folders = list(dict.fromkeys(d.folder for d in failing.values()))
    for folder in folders:
        holder = lock_holder(RunLayout(folder).lock)
        if holder:
            raise QuarantineError(
                f"{folder}: a draftgen run is live on this folder (pid {holder.get('pid', '?')} "
                f"on {holder.get('host', '?')}); stop it first (draftgen stop {report.root}), "
                "then audit and quarantine again")
    result = QuarantineResult()
    with contextlib.ExitStack() as held:
        for folder in folders:
            held.enter_context(_locked(RunLayout(folder)))
        for d in failing.values():
            _check_unchanged(RunLayout(d.folder), d.name, d)
        for key, d in failing.items():
            result.moved[key], result.already[key] = _move(RunLayout(d.folder), d.name, d)
    return result


@contextlib.contextmanager
def _locked(layout: RunLayout) -> Iterator[None]:
    lock = RunLock(layout.lock)
    try:
        lock.acquire()
    except (RunLocked, StoreError) as e:
        raise QuarantineError(str(e)) from None
    try:
        yield
    finally:
        lock.release()


def _check_unchanged(layout: RunLayout, name: str, d: DatasetAudit) -> None:
    """The failing lines must still be where the audit saw them: the file may only have grown
    (answers appended after the audit are kept), and each range must be whole lines."""
    path = layout.responses(name)
    size = path.stat().st_size if path.exists() else 0
    if size < d.snapshot_size:
        raise QuarantineError(f"{path}: shorter than when it was audited ({size} < "
                              f"{d.snapshot_size} bytes); audit again")
    with open(path, "rb") as f:
        for start, end in zip(d.failing.starts, d.failing.ends, strict=True):
            before = os.pread(f.fileno(), 1, start - 1) if start else b"\n"
            if before != b"\n" or os.pread(f.fileno(), 1, end - 1) != b"\n":
                raise QuarantineError(f"{path}: changed since it was audited; audit again")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _key(record: Any) -> tuple[Any, ...] | None:
    """What identifies a quarantined line: an answer's ID, time and request ID; for a line that
    was not a record, its text."""
    if not isinstance(record, dict):
        return None
    if record.get("id") is None and isinstance(record.get("line"), str):
        return ("line", record["line"])
    return (record.get("id"), record.get("created_at"), record.get("request_id"))


def _known_keys(path: Path) -> set[tuple[Any, ...]]:
    """Answers quarantine.jsonl already holds (quarantining again after a kill)."""
    keys: set[tuple[Any, ...]] = set()
    if not path.exists():
        return keys
    with open(path, "rb") as f:
        for line in f:
            try:
                key = _key(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
            if key is not None:
                keys.add(key)
    return keys


def _quarantine_line(line: bytes, mask: int, now: float) -> tuple[bytes, tuple[Any, ...] | None]:
    meta = {"problems": problems_of(mask), "at": round(now, 3)}
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        wrapped = {"id": None, "quarantine": meta,
                   "line": line.rstrip(b"\n").decode("utf-8", "replace")}
        return orjson.dumps(wrapped, option=orjson.OPT_APPEND_NEWLINE), _key(wrapped)
    key = _key(record)
    record["quarantine"] = meta
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE), key


def _copy(src: BinaryIO, dst: BinaryIO, start: int, stop: int | None) -> None:
    src.seek(start)
    left = None if stop is None else stop - start
    while left is None or left > 0:
        chunk = src.read(_COPY if left is None else min(_COPY, left))
        if not chunk:
            break
        dst.write(chunk)
        if left is not None:
            left -= len(chunk)


def _ranges(d: DatasetAudit) -> Iterator[tuple[int, int, int]]:
    order = np.argsort(np.frombuffer(d.failing.starts, dtype=np.int64), kind="stable")
    for i in order.tolist():
        yield d.failing.starts[i], d.failing.ends[i], d.failing.masks[i]


def _move(layout: RunLayout, name: str, d: DatasetAudit) -> tuple[int, int]:
    path = layout.responses(name)
    qpath = layout.quarantine(name)
    entries, _ = read_index(layout.index(name), path, repair=False)
    # A kill inside an earlier quarantine's write leaves a partial last line: cut it (kept in
    # torn_tail.bin) so the lines appended now do not glue onto it. Its answer is still in
    # responses.jsonl (the rename had not happened) and is moved again below.
    cut_torn_tail(qpath, layout.torn(name))
    known = _known_keys(qpath)
    tmp = path.with_name(path.name + ".quarantine.tmp")
    now = time.time()
    moved = already = 0
    removed: list[tuple[int, int]] = []
    with open(path, "rb") as src, open(tmp, "wb") as kept, open(qpath, "ab") as quar:
        pos = 0
        for start, end, mask in _ranges(d):
            _copy(src, kept, pos, start)
            src.seek(start)
            line, key = _quarantine_line(src.read(end - start), mask, now)
            if key is None or key not in known:
                quar.write(line)
            else:
                already += 1
            removed.append((start, end))
            moved += 1
            pos = end
        _copy(src, kept, pos, None)
        for f in (kept, quar):
            f.flush()
            os.fsync(f.fileno())
    new_entries = _shift(entries, removed)
    for p in (layout.index(name), layout.columns(name)):
        p.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    rewrite_index(layout.index(name), new_entries)
    return moved, already


def _shift(entries: list[IndexEntry], removed: list[tuple[int, int]]) -> list[IndexEntry]:
    """The index entries of the kept records, with their ends moved back by the bytes removed
    before them."""
    if not removed:
        return entries
    ends = np.array([e for _, e in removed], dtype=np.int64)
    lengths = np.concatenate([[0], np.cumsum([e - s for s, e in removed], dtype=np.int64)])
    entry_ends = np.array([e.end for e in entries], dtype=np.int64)
    shifts = lengths[np.searchsorted(ends, entry_ends, side="right")]
    gone = np.isin(entry_ends, ends)
    out = []
    for entry, shift, drop in zip(entries, shifts.tolist(), gone.tolist(), strict=True):
        if not drop:
            entry.end -= shift
            out.append(entry)
    return out
