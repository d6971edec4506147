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

import orjson

from draftgen.store.columns import ROW, id_hash, read_rows, sync_columns
from draftgen.store.index_entry import IndexEntry, entry_for
from draftgen.store.layout import COLUMNS
from draftgen.store.nofollow import dataset_run, open_file, truncate

log = logging.getLogger("draftgen.store")


def read_index(index_path: Path, data_path: Path, *, repair: bool
               ) -> tuple[list[IndexEntry], int]:
    """The index entries of a data file, caught up with the data, and the number of lines in
    the rebuilt part that are not records. With `repair`, the index file is rewritten or
    extended to match (the writer's side), and so is its binary copy (`store.columns`);
    without, nothing is written (readers such as status on a live run)."""
    data_size = data_path.stat().st_size if data_path.exists() else 0
    index_size = _index_size(index_path)
    behind = catch_up(index_path, data_path, index_size, data_size)
    # Stale: entries past the data, or bytes after the last entry (a torn index line).
    stale = behind.index_end != index_size
    entries, line_ends, tail = behind.entries, behind.line_ends, behind.from_data
    entries.extend(tail)
    if repair:
        if stale or tail:
            if stale:
                line_ends = _rewrite(index_path, entries)
            else:
                line_ends.extend(append_entries(index_path, tail))
            log.info("%s: index rebuilt for %d records", index_path.parent.name, len(tail))
        sync_columns(index_path.with_name(COLUMNS), entries, line_ends)
    return entries, behind.bad_lines


@dataclass(slots=True)
class IndexTail:
    """An index caught up with its data from a point where the two are known to agree: the
    index's entries from there that describe the data, and the data's records after them."""

    entries: list[IndexEntry]
    line_ends: list[int]
    """Where each entry's line ends in the index file."""
    index_end: int
    """Where the kept entries end in the index file: bytes after it are stale (entries past
    the data, a torn line)."""
    from_data: list[IndexEntry]
    """Records of the data file after the last kept entry, with no index line yet."""
    bad_lines: int
    """Complete lines of the data file after the last kept entry that are not records."""


def catch_up(index_path: Path, data_path: Path, index_size: int, data_size: int,
             index_start: int = 0, data_start: int = 0) -> IndexTail:
    """The index from `index_start` (where the line of the record ending at `data_start` in
    the data ends), as far as it describes the data's first `data_size` bytes, then what the
    data holds after it. Writes nothing."""
    entries, line_ends = parse_index_lines(read_span(index_path, index_start, index_size),
                                           index_start)
    kept = valid_prefix(entries, data_size, start=data_start)
    if kept and not ends_a_line(data_path, entries[kept - 1].end):
        kept = 0  # not this data file's index (the file was replaced): rebuild it all
    del entries[kept:], line_ends[kept:]
    skipped: list[int] = []
    start = entries[-1].end if entries else data_start
    tail = list(entries_from_data(data_path, start, data_size, skipped))
    return IndexTail(entries, line_ends, line_ends[-1] if line_ends else index_start, tail,
                     len(skipped))


def valid_prefix(entries: list[IndexEntry], data_size: int, start: int = 0) -> int:
    """How many leading entries describe the data: ends increasing, within the file."""
    valid_end = start
    for kept, entry in enumerate(entries):
        if not isinstance(entry.end, int) or entry.end > data_size or entry.end <= valid_end:
            return kept
        valid_end = entry.end
    return len(entries)


def ends_a_line(path: Path, offset: int) -> bool:
    """Whether the byte before `offset` in the file is a newline."""
    try:
        with open(path, "rb") as f:
            return offset > 0 and os.pread(f.fileno(), 1, offset - 1) == b"\n"
    except (OSError, ValueError):
        return False


def in_step(columns_path: Path, index_path: Path) -> bool:
    """Whether the binary copy holds exactly the JSON index's entries (checked at its ends)."""
    rows = read_rows(columns_path)
    size = _index_size(index_path)
    if len(rows) == 0:
        return size == 0
    last = rows[-1]
    if int(last["iend"]) != size or columns_path.stat().st_size != len(rows) * ROW.itemsize:
        return False
    start = int(rows[-2]["iend"]) if len(rows) > 1 else 0
    entries, _ = parse_index_lines(read_span(index_path, start, size), start)
    return (len(entries) == 1 and entries[0].end == int(last["end"])
            and id_hash(entries[0].id) == int(last["idh"]))


def sync_from_index(index_path: Path) -> None:
    """Rebuild the binary copy from the JSON index as it is (the writer's side, before it
    appends to a dataset whose copy is missing or out of step)."""
    columns_path = index_path.with_name(COLUMNS)
    if not in_step(columns_path, index_path):
        sync_columns(columns_path, *_load_entries(index_path))


def read_span(path: Path, start: int, stop: int) -> bytes:
    """Bytes `start` to `stop` of the file; empty when it is missing."""
    try:
        with open(path, "rb") as f:
            return os.pread(f.fileno(), max(0, stop - start), start)
    except FileNotFoundError:
        return b""


def cut_index(index_path: Path, size: int) -> None:
    """Cut the index file to its first `size` bytes (no-op when it has exactly that many)."""
    if _index_size(index_path) != size:
        truncate(index_path, size, root=dataset_run(index_path))


def _index_size(index_path: Path) -> int:
    try:
        return index_path.stat().st_size
    except FileNotFoundError:
        return 0


def _load_entries(index_path: Path) -> tuple[list[IndexEntry], list[int]]:
    """The entries of the index file and where each one's line ends in it."""
    try:
        raw = index_path.read_bytes()
    except FileNotFoundError:
        return [], []
    return parse_index_lines(raw, 0)


def parse_index_lines(raw: bytes, base: int) -> tuple[list[IndexEntry], list[int]]:
    """Entries of index bytes read from offset `base`, up to the first line that is not an
    entry (a torn index line: everything after it is rebuilt from the data)."""
    entries: list[IndexEntry] = []
    line_ends: list[int] = []
    pos = 0
    while True:
        nl = raw.find(b"\n", pos)
        if nl < 0:
            break
        try:
            entry = IndexEntry.from_json(orjson.loads(raw[pos:nl]))
        except (orjson.JSONDecodeError, TypeError, AttributeError):
            break
        if not isinstance(entry.id, str):
            break
        entries.append(entry)
        pos = nl + 1
        line_ends.append(base + pos)
    return entries, line_ends


def entries_from_data(data_path: Path, start: int, end: int, skipped: list[int]
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


def _line_ends(lines: list[bytes], start: int) -> list[int]:
    ends = []
    for line in lines:
        start += len(line)
        ends.append(start)
    return ends


def append_entries(index_path: Path, entries: list[IndexEntry]) -> list[int]:
    """Append the entries' lines to the index file; where each line ends in it."""
    if not entries:
        return []
    lines = [e.to_json() for e in entries]
    with open_file(index_path, "ab", root=dataset_run(index_path)) as f:
        start = f.tell()
        f.write(b"".join(lines))
    return _line_ends(lines, start)


def _rewrite(index_path: Path, entries: list[IndexEntry]) -> list[int]:
    lines = [e.to_json() for e in entries]
    tmp = index_path.with_suffix(".tmp")
    with open_file(tmp, "wb", root=dataset_run(index_path)) as f:
        f.write(b"".join(lines))
    os.replace(tmp, index_path)
    return _line_ends(lines, 0)


def rewrite_index(index_path: Path, entries: list[IndexEntry]) -> None:
    """Replace the index and its binary copy (after the data file was rewritten)."""
    sync_columns(index_path.with_name(COLUMNS), entries, _rewrite(index_path, entries))
