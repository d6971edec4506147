"""Reading back what a run folder already holds: completed IDs, failed attempts, torn tails.

The data files are the truth; no count of lines is trusted. Records are written with "id" as
their first key, so completed IDs are read from each line's prefix without parsing the rest.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from draftgen.store.layout import RunLayout

log = logging.getLogger("draftgen.store")

_ID_PREFIX = re.compile(rb'^\{"id":"((?:[^"\\]|\\.)*)"', re.MULTILINE)


@dataclass
class TornTail:
    path: Path
    bytes_cut: int


@dataclass
class DatasetOnDisk:
    done: set[str] = field(default_factory=set)
    duplicates: int = 0
    """Lines whose ID was already seen (should be 0; counted, never fatal)."""
    failed_attempts: Counter[str] = field(default_factory=Counter)
    failure_kinds: Counter[str] = field(default_factory=Counter)
    bad_lines: int = 0


def cut_torn_tail(path: Path, keep_in: Path) -> TornTail | None:
    """If the file does not end with a newline, its last line was torn by a kill: move the
    partial bytes to `keep_in` and cut the file at the last complete line."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        keep = _last_newline_end(f, size)
        f.seek(keep)
        partial = f.read()
        with open(keep_in, "ab") as side:
            side.write(partial + b"\n")
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return TornTail(path=path, bytes_cut=size - keep)


def _last_newline_end(f, size: int, block: int = 1 << 16) -> int:
    pos = size
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        idx = chunk.rfind(b"\n")
        if idx >= 0:
            return start + idx + 1
        pos = start
    return 0


def completed_ids(path: Path, into: DatasetOnDisk) -> None:
    """Collect the IDs of a responses.jsonl (after its torn tail was cut)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        lines = _count_newlines(f)
        found = 0
        for m in _ID_PREFIX.finditer(mm):
            found += 1
            raw = m.group(1)
            rid = raw.decode() if b"\\" not in raw else orjson.loads(b'"' + raw + b'"')
            if rid in into.done:
                into.duplicates += 1
            else:
                into.done.add(rid)
        into.bad_lines += lines - found


def _count_newlines(f, block: int = 1 << 22) -> int:
    f.seek(0)
    return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(block), b""))


def failed_attempts(path: Path, into: DatasetOnDisk) -> None:
    if not path.exists():
        return
    with open(path, "rb") as f:
        for line in f:
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                into.bad_lines += 1
                continue
            into.failed_attempts[row.get("id")] += 1
            into.failure_kinds[row.get("kind", "unknown")] += 1


def scan_dataset(layout: RunLayout, dataset: str) -> tuple[DatasetOnDisk, list[TornTail]]:
    """Make a dataset's files safe to append to, and read what they hold."""
    torn = [
        t for t in (
            cut_torn_tail(layout.responses(dataset), layout.torn(dataset)),
            cut_torn_tail(layout.failures(dataset), layout.torn(dataset)),
        ) if t
    ]
    for t in torn:
        log.warning("%s: cut a torn last line (%d bytes, kept in %s)", t.path, t.bytes_cut,
                    layout.torn(dataset).name)
    on_disk = DatasetOnDisk()
    completed_ids(layout.responses(dataset), on_disk)
    failed_attempts(layout.failures(dataset), on_disk)
    if on_disk.duplicates:
        log.warning("%s: %d duplicate answer lines", layout.responses(dataset), on_disk.duplicates)
    if on_disk.bad_lines:
        log.warning("%s: %d lines are not records", layout.dataset_dir(dataset), on_disk.bad_lines)
    return on_disk, torn
