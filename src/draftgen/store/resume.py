"""Reading back what a run folder already holds: completed IDs, failed attempts, torn tails.

The data files are the truth; no count of lines is trusted. Completed IDs come from the
compact index beside the data, which is caught up with the data before it is used.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from draftgen.store.index import read_index
from draftgen.store.layout import RunLayout

log = logging.getLogger("draftgen.store")

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
    output_tokens: int = 0
    cost: float = 0.0


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


def completed(layout: RunLayout, dataset: str, into: DatasetOnDisk) -> None:
    """IDs, output tokens and cost of the records on disk, through the dataset's index
    (caught up with the data first)."""
    entries, into.bad_lines = read_index(layout.index(dataset), layout.responses(dataset),
                                         repair=True)
    for entry in entries:
        if entry.id in into.done:
            into.duplicates += 1
            continue
        into.done.add(entry.id)
        into.output_tokens += entry.out
        into.cost += entry.cost


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
    completed(layout, dataset, on_disk)
    failed_attempts(layout.failures(dataset), on_disk)
    if on_disk.duplicates:
        log.warning("%s: %d duplicate answer lines", layout.responses(dataset), on_disk.duplicates)
    if on_disk.bad_lines:
        log.warning("%s: %d lines are not records", layout.dataset_dir(dataset), on_disk.bad_lines)
    return on_disk, torn
