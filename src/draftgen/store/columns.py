"""A binary copy of each dataset's index, RUN/<dataset>/index.v1.bin: one fixed-width row per
index line, so that `draftgen status` reads a million answers' numbers with one `fromfile`
instead of parsing a million JSON lines.

The JSON index stays the reference; this file is derived from it and kept in step by the
writer (`Store.append_record` appends a row after each index line; at resume,
`fast_index.catch_up_index` cuts the rows it cannot trust at the end and appends the missing
ones, and `read_index(repair=True)` rebuilds the file when it disagrees from its first row).
Readers trust a row only as far as it agrees with the JSON index and the data (see
`store.fast_index`); anything else is read from JSON.

Each row holds the data end offset and the index end offset of its record (so a reader can find
the JSON line of any row), a 64-bit hash of the ID, the numbers, and a 32-bit hash of each short
string (backend, provider, quantization, finish reason, token check; 0 for none). A reader maps a
hash back to its string by reading one JSON line that has it.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from draftgen.store.index_entry import IndexEntry
from draftgen.store.nofollow import dataset_run, open_file, truncate

ROW = np.dtype([
    ("end", "<i8"), ("iend", "<i8"), ("idh", "<u8"), ("t", "<f8"), ("cost", "<f8"),
    ("lat", "<f4"), ("out", "<i4"), ("reasoning", "<i4"),
    ("backend", "<u4"), ("provider", "<u4"), ("quant", "<u4"), ("finish", "<u4"),
    ("check", "<u4"),
])
"""One row per record. `reasoning` is -1 and `t`/`lat` NaN where the record has none."""
_PACK = struct.Struct("<qqQddfiiIIIII")
assert _PACK.size == ROW.itemsize
CODED = ("backend", "provider", "quant", "finish", "check")
"""The string fields, stored as `str_code` hashes."""


def id_hash(rid: str) -> int:
    return int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=8).digest(), "little")


def union_of_sorted(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The union of sorted arrays of unique values (ID hashes), sorted and unique: one sort and
    a compare of neighbours, faster than `np.unique`."""
    if len(arrays) == 1:
        return arrays[0]
    both = np.sort(np.concatenate(arrays))
    keep = np.ones(len(both), dtype=bool)
    keep[1:] = both[1:] != both[:-1]
    return both[keep]


@lru_cache(maxsize=4096)
def str_code(value: str | None) -> int:
    """0 for None; otherwise a 32-bit hash that is never 0."""
    if value is None:
        return 0
    code = int.from_bytes(hashlib.blake2b(value.encode(), digest_size=4).digest(), "little")
    return code or 1


def _values(entry: IndexEntry, iend: int) -> tuple[int | float, ...]:
    return (
        entry.end, iend, id_hash(entry.id),
        float("nan") if entry.t is None else float(entry.t), float(entry.cost or 0.0),
        float("nan") if entry.lat is None else float(entry.lat),
        int(entry.out or 0), -1 if entry.reasoning is None else int(entry.reasoning),
        str_code(entry.backend), str_code(entry.provider), str_code(entry.quant),
        str_code(entry.finish), str_code(entry.check),
    )


def row_bytes(entry: IndexEntry, iend: int) -> bytes:
    """The row of one index entry whose JSON line ends at `iend` in the index file."""
    return _PACK.pack(*_values(entry, iend))


def rows_for(entries: Sequence[IndexEntry], line_ends: Sequence[int]) -> np.ndarray:
    """The rows of index entries whose JSON lines end at `line_ends` in the index file."""
    return np.array([_values(e, i) for e, i in zip(entries, line_ends, strict=True)],
                    dtype=ROW)


def concat_rows(*parts: np.ndarray) -> np.ndarray:
    """The rows of each part, one after the other. Copied as bytes: concatenating the
    structured arrays themselves goes field by field, ~18x slower (70 ms for 600,000 rows)."""
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in parts]).view(ROW)


def read_rows(path: Path) -> np.ndarray:
    """Every whole row of the file (a torn last row is left out); empty when missing."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return np.fromfile(f, dtype=ROW, count=size // ROW.itemsize)
    except FileNotFoundError:
        return np.empty(0, dtype=ROW)


def write_rows(path: Path, rows: np.ndarray) -> None:
    """Replace the file atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with open_file(tmp, "wb", root=dataset_run(path)) as f:
        rows.tofile(f)
    os.replace(tmp, path)


def keep_rows(path: Path, count: int) -> None:
    """Cut the file to its first `count` rows (rows past them, a torn last row); no-op when it
    holds exactly those."""
    size = count * ROW.itemsize
    if (path.stat().st_size if path.exists() else 0) != size:
        truncate(path, size, root=dataset_run(path))


def append_rows(path: Path, rows: np.ndarray) -> None:
    if len(rows):
        with open_file(path, "ab", root=dataset_run(path)) as f:
            f.write(rows.tobytes())


def sync_columns(path: Path, entries: Sequence[IndexEntry], line_ends: Sequence[int]) -> None:
    """Make the file hold exactly one row per entry (entries as the JSON index now holds them,
    `line_ends[i]` the end of entry i's line in it): append the missing rows when the file is
    a prefix of what it should be, else rebuild it."""
    if not entries and not path.exists():
        return
    rows = read_rows(path)
    n = len(rows)
    if n <= len(entries) and _is_prefix(rows, entries, line_ends):
        if n == len(entries) and path.stat().st_size == n * ROW.itemsize:
            return
        if path.exists() and path.stat().st_size == n * ROW.itemsize:
            append_rows(path, rows_for(entries[n:], line_ends[n:]))
            return
    write_rows(path, rows_for(entries, line_ends))


def _is_prefix(rows: np.ndarray, entries: Sequence[IndexEntry], line_ends: Sequence[int]
               ) -> bool:
    n = len(rows)
    if n == 0:
        return True
    ends = np.fromiter((e.end for e in entries[:n]), dtype=np.int64, count=n)
    iends = np.asarray(line_ends[:n], dtype=np.int64)
    if not (np.array_equal(rows["end"], ends) and np.array_equal(rows["iend"], iends)):
        return False
    return all(int(rows["idh"][i]) == id_hash(entries[i].id) for i in (0, n - 1))
