"""Moving answers out of a dataset's responses.jsonl into quarantine.jsonl beside it (`draftgen
audit --quarantine`: the audit decides which lines fail), so that the next `draftgen run` (which
counts as done only what responses.jsonl holds) generates them again.

No answer is ever lost, whatever moment a kill lands at: the moved lines are appended to
quarantine.jsonl and fsynced, the kept ones are written to a temp file and fsynced, the index is
removed, and only then does the temp file replace responses.jsonl (one rename); the index is
rebuilt last. A kill before the rename leaves every answer in responses.jsonl (some perhaps also
in quarantine.jsonl: moving them again does not copy them twice); after it, each answer is in
exactly one of the two files. A missing index is rebuilt from the data by the next reader.
A full disk (any OSError) before the rename is a `QuarantineStopped` (the temp file removed,
the state that of a kill: the next quarantine finishes); after it, the index is left to be
rebuilt. The caller holds the folder's lock throughout (`locked`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np
import orjson

from draftgen.errors import DraftgenError, os_reason
from draftgen.store.appender import StoreError
from draftgen.store.index import read_index, rewrite_index
from draftgen.store.index_entry import IndexEntry
from draftgen.store.layout import QUARANTINE, RunLayout
from draftgen.store.lock import RunLock, RunLocked, lock_holder
from draftgen.store.nofollow import open_file
from draftgen.store.prompt_refs import LineReader
from draftgen.store.record import Record, RecordError, decode_line, encode_line, encode_record
from draftgen.store.scan import cut_torn_tail

_COPY = 1 << 22
log = logging.getLogger("draftgen.store")


class QuarantineError(DraftgenError):
    """Quarantine refused (a live run, files changed since the audit); nothing was moved."""


class QuarantineStopped(QuarantineError):
    """A move stopped part way (a full disk): no answer lost, some perhaps in both files until
    the quarantine is run again (`move_lines`)."""


@dataclass(frozen=True, slots=True)
class MovedLine:
    """One line to move: its byte range in responses.jsonl and why it goes."""

    start: int
    end: int
    problems: list[str]


def refuse_live(folders: Sequence[Path], run_root: Path) -> None:
    """QuarantineError naming the first folder a live run holds."""
    for folder in folders:
        holder = lock_holder(RunLayout(folder).lock)
        if holder:
            raise QuarantineError(
                f"{folder}: a draftgen run is live on this folder (pid {holder.get('pid', '?')} "
                f"on {holder.get('host', '?')}); stop it first (draftgen stop {run_root}), "
                "then audit and quarantine again")


@contextlib.contextmanager
def locked(folders: Sequence[Path]) -> Iterator[None]:
    """Every folder's run lock held (QuarantineError when a run holds one)."""
    with contextlib.ExitStack() as held:
        for folder in folders:
            held.enter_context(_locked(RunLayout(folder)))
        yield


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


def check_unchanged(folder: Path, dataset: str, snapshot_size: int,
                    lines: Sequence[MovedLine]) -> None:
    """The lines must still be where the audit saw them: the file may only have grown
    (answers appended after the audit are kept), and each range must be whole lines."""
    path = RunLayout(folder).responses(dataset)
    size = path.stat().st_size if path.exists() else 0
    if size < snapshot_size:
        raise QuarantineError(f"{path}: shorter than when it was audited ({size} < "
                              f"{snapshot_size} bytes); audit again")
    with open(path, "rb") as f:
        for line in lines:
            before = os.pread(f.fileno(), 1, line.start - 1) if line.start else b"\n"
            if before != b"\n" or os.pread(f.fileno(), 1, line.end - 1) != b"\n":
                raise QuarantineError(f"{path}: changed since it was audited; audit again")


def move_lines(folder: Path, dataset: str, lines: Sequence[MovedLine]) -> tuple[int, int]:
    """Move the lines (in file order) to quarantine.jsonl, each with its problems and the time;
    how many were moved, and how many of those quarantine.jsonl already held (from an
    interrupted move). QuarantineStopped where the folder cannot be written (a full disk)
    before responses.jsonl is replaced: every answer is still in it, those appended to
    quarantine.jsonl so far also there, and moving them again finishes."""
    layout = RunLayout(folder)
    path = layout.responses(dataset)
    tmp = path.with_name(path.name + ".quarantine.tmp")
    try:
        new_entries, already = _write_moved_and_kept(layout, dataset, lines, tmp)
        for p in (layout.index(dataset), layout.columns(dataset)):
            p.unlink(missing_ok=True)
        _fsync_dir(path.parent)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # what it holds is in responses.jsonl
        raise QuarantineStopped(
            f"{e.filename or folder}: {os_reason(e)}; {path} is as it was (the answers moved "
            f"so far are in {QUARANTINE} too, and are not copied twice by the next move)"
        ) from None
    try:
        _fsync_dir(path.parent)
        rewrite_index(layout.index(dataset), new_entries)
    except OSError as e:  # moved: a missing index is rebuilt from the data by its next reader
        _remove_index(layout, dataset)
        log.warning("%s: %s; the answers are moved, the index is rebuilt by the next draftgen "
                    "run", e.filename or folder, os_reason(e))
    return len(lines), already


def _write_moved_and_kept(layout: RunLayout, dataset: str, lines: Sequence[MovedLine],
                          tmp: Path) -> tuple[list[IndexEntry], int]:
    """Append the moved lines to quarantine.jsonl, then write the kept ones to `tmp`, each
    synced: the index entries of the kept lines, and how many moved lines quarantine.jsonl
    already held."""
    folder = layout.root
    path = layout.responses(dataset)
    qpath = layout.quarantine(dataset)
    entries, _ = read_index(layout.index(dataset), path, repair=False)
    # A kill inside an earlier quarantine's write leaves a partial last line: cut it (kept in
    # torn_tail.bin) so the lines appended now do not glue onto it. Its answer is still in
    # responses.jsonl (the rename had not happened) and is moved again below.
    cut_torn_tail(qpath, layout.torn(dataset), folder)
    # responses.jsonl too is opened without following a link: it is replaced by `tmp`
    with open_file(path, "rb", root=folder) as src, LineReader(path) as reader:
        with open_file(qpath, "ab", root=folder) as quar:
            already = _append_moved(src, quar, lines, reader, _known_keys(qpath))
            _sync(quar)
        # Turns written as the turns they extend after the first moved line: copied line by
        # line, each pointed at its turn's new place; otherwise the bytes as they are.
        relines = _KeptLines(lines[0].start) if lines and _names_lines(src, lines[0].start) \
            else None
        with open_file(tmp, "wb", root=folder) as kept:
            pos = 0
            for moved in lines:
                _copy_kept(src, kept, pos, moved.start, reader, relines)
                pos = moved.end
            _copy_kept(src, kept, pos, None, reader, relines)
            _sync(kept)
    new_entries = (_shift(entries, [(m.start, m.end) for m in lines]) if relines is None
                   else _moved_entries(entries, relines))
    return new_entries, already


def _append_moved(src: BinaryIO, quar: BinaryIO, lines: Sequence[MovedLine],
                  reader: LineReader, known: set[tuple[Any, ...]]) -> int:
    """Append each moved line that quarantine.jsonl does not hold yet; how many it held."""
    now = time.time()
    already = 0
    for moved in lines:
        src.seek(moved.start)
        whole = _whole(reader, src.read(moved.end - moved.start), moved.start)
        line, key = _quarantine_line(whole, moved.problems, now)
        if key is None or key not in known:
            quar.write(line)
        else:
            already += 1
    return already


def _sync(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())


def _remove_index(layout: RunLayout, dataset: str) -> None:
    """The index files and their temporary files gone (a half-written index never stays)."""
    index, columns = layout.index(dataset), layout.columns(dataset)
    for p in (index, columns, index.with_suffix(".tmp"), columns.with_name(columns.name + ".tmp")):
        with contextlib.suppress(OSError):
            p.unlink(missing_ok=True)


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


def _quarantine_line(line: bytes, problems: list[str], now: float
                     ) -> tuple[bytes, tuple[Any, ...] | None]:
    meta = {"problems": problems, "at": round(now, 3)}
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


@dataclass
class _KeptLines:
    """Where the kept lines after the first moved one are now (those before it stay)."""

    moved_from: int
    """Where the first moved line started."""
    starts: dict[int, int] = field(default_factory=dict)
    """Old line start -> new line start."""
    ends: dict[int, int] = field(default_factory=dict)
    """Old line end -> new line end."""


_EXTENDS = b'"extends":{'


def _names_lines(src: BinaryIO, start: int) -> bool:
    """Whether the file from `start` may hold a turn written as the turn it extends."""
    overlap = len(_EXTENDS) - 1
    pos = start
    while True:
        chunk = os.pread(src.fileno(), _COPY, pos)
        if _EXTENDS in chunk:
            return True
        if len(chunk) < _COPY:
            return False
        pos += len(chunk) - overlap


def _copy_kept(src: BinaryIO, dst: BinaryIO, start: int, stop: int | None, reader: LineReader,
               relines: _KeptLines | None) -> None:
    """Copy the kept lines from `start` to `stop` (None: the end): line by line where they
    follow a moved line and the file names lines (`relines`), else as bytes."""
    if relines is None or start < relines.moved_from:
        _copy(src, dst, start, stop)
    else:
        _copy_lines(src, dst, start, stop, reader, relines)


def _copy_lines(src: BinaryIO, dst: BinaryIO, start: int, stop: int | None,
                reader: LineReader, kept: _KeptLines) -> None:
    """Copy the lines from `start` to `stop` (None: the end), which follow a moved line,
    noting where each is now. A turn that extends an earlier line is pointed at that line's
    new place, or written whole where that line was moved."""
    src.seek(start)
    pos = start
    while stop is None or pos < stop:
        line = src.readline()
        if not line:
            break
        kept.starts[pos] = dst.tell()
        end = pos + len(line)
        if line.endswith(b"\n") and _EXTENDS in line:
            line = _repointed(reader, line, pos, kept)
        dst.write(line)
        kept.ends[end] = dst.tell()
        pos = end


def _repointed(reader: LineReader, line: bytes, at: int, kept: _KeptLines) -> bytes:
    """The line of a turn that extends an earlier line, once the lines before it moved: the
    same where that line stays before the first move, pointing at its new place where it was
    kept after it, whole where it was moved."""
    try:
        decoded = decode_line(line)
    except RecordError:
        return line  # not a record: the audit reports it
    if isinstance(decoded, Record) or decoded.extends.at < kept.moved_from:
        return line
    new_at = kept.starts.get(decoded.extends.at)
    if new_at is not None:
        extends = msgspec.structs.replace(decoded.extends, at=new_at)
        return encode_line(msgspec.structs.replace(decoded, extends=extends)) + b"\n"
    return _whole(reader, line, at)


def _whole(reader: LineReader, line: bytes, at: int) -> bytes:
    """The line as a whole record where it is a turn that extends an earlier line (one that
    cannot be expanded is kept as it is)."""
    if _EXTENDS not in line:
        return line
    record = reader.read(line, at)
    return encode_record(record) + b"\n" if isinstance(record, Record) else line


def _moved_entries(entries: list[IndexEntry], kept: _KeptLines) -> list[IndexEntry]:
    """The index entries of the kept records, with their new ends (lines copied line by
    line)."""
    out = []
    for entry in entries:
        if entry.end <= kept.moved_from:
            out.append(entry)
        elif entry.end in kept.ends:
            entry.end = kept.ends[entry.end]
            out.append(entry)
    return out


def _shift(entries: list[IndexEntry], removed: list[tuple[int, int]]) -> list[IndexEntry]:
    """The index entries of the kept records, with their ends moved back by the bytes removed
    before them (lines copied as bytes)."""
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
