"""Reading a dataset's index fast and without writing anything: for `draftgen status` and
`draftgen audit` on a run that may be live, stopped or killed.

The rows of the binary copy (`store.columns`) are used as far as they agree with the JSON index
and the data file; the JSON index lines after them, then the data records after those, are
parsed (the same catching-up as `read_index`, in memory only). The result is one array of
`columns.ROW` rows plus the strings behind the hashed columns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from draftgen.store.columns import CODED, id_hash, read_rows, rows_for, str_code
from draftgen.store.index import (
    IndexEntry,
    ends_a_line,
    entries_from_data,
    parse_index_lines,
    valid_prefix,
)
from draftgen.store.layout import RunLayout


@dataclass
class IndexColumns:
    rows: np.ndarray
    """One `columns.ROW` per record in the data file, in file order."""
    names: dict[int, str | None] = field(default_factory=lambda: {0: None})
    """The string behind each code of the `CODED` columns."""
    bad_lines: int = 0
    """Complete lines of the data file past the index that are not records."""
    from_binary: int = 0
    from_json: int = 0
    from_data: int = 0

    def name(self, code: int) -> str | None:
        return self.names.get(int(code), f"#{int(code):08x}")


def _pread(path: Path, start: int, stop: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return os.pread(f.fileno(), max(0, stop - start), start)
    except FileNotFoundError:
        return b""


def _trusted_rows(columns_path: Path, index_path: Path, index_size: int, data_path: Path,
                  data_size: int) -> np.ndarray:
    """The leading rows of the binary copy that agree with the JSON index and the data."""
    rows = read_rows(columns_path)
    if len(rows) == 0:
        return rows
    end, iend = rows["end"], rows["iend"]
    ok = (end <= data_size) & (iend <= index_size)
    ok[1:] &= (np.diff(end) > 0) & (np.diff(iend) > 0)
    ok &= end > 0
    bad = np.flatnonzero(~ok)
    rows = rows[: bad[0]] if len(bad) else rows
    for i in {0, len(rows) - 1} if len(rows) else ():
        if not _row_matches(rows, i, index_path) or not ends_a_line(data_path, int(end[i])):
            return rows[:0]
    return rows


def _row_matches(rows: np.ndarray, i: int, index_path: Path) -> bool:
    """Whether row i is the entry on its JSON index line."""
    start = int(rows["iend"][i - 1]) if i else 0
    entries, _ = parse_index_lines(_pread(index_path, start, int(rows["iend"][i])), start)
    return (len(entries) == 1 and entries[0].end == int(rows["end"][i])
            and id_hash(entries[0].id) == int(rows["idh"][i]))


def _resolve_names(rows: np.ndarray, index_path: Path, names: dict[int, str | None]) -> None:
    """Find the string of each code in the rows by reading one JSON line that has it."""
    for col in CODED:
        column = np.ascontiguousarray(rows[col])
        rest = column
        while len(rest):
            code = int(rest[0])
            rest = rest[rest != code]
            if code in names:
                continue
            i = int(np.argmax(column == code))
            start = int(rows["iend"][i - 1]) if i else 0
            entries, _ = parse_index_lines(_pread(index_path, start, int(rows["iend"][i])), start)
            names[code] = getattr(entries[0], col) if entries else None


def _add_names(entries: list[IndexEntry], names: dict[int, str | None]) -> None:
    values = {v for e in entries for v in (e.backend, e.provider, e.quant, e.finish, e.check)}
    for value in values:
        names.setdefault(str_code(value), value)


def load_index_columns(layout: RunLayout, dataset: str, data_size: int | None = None
                       ) -> IndexColumns:
    """The index of one dataset, caught up with its data file as it was at `data_size` bytes
    (default: its size now). Writes nothing."""
    data_path = layout.responses(dataset)
    index_path = layout.index(dataset)
    if data_size is None:
        data_size = data_path.stat().st_size if data_path.exists() else 0
    index_size = index_path.stat().st_size if index_path.exists() else 0
    rows = _trusted_rows(layout.columns(dataset), index_path, index_size, data_path, data_size)
    out = IndexColumns(rows=rows, from_binary=len(rows))
    _resolve_names(rows, index_path, out.names)
    last_end = int(rows["end"][-1]) if len(rows) else 0
    json_start = int(rows["iend"][-1]) if len(rows) else 0
    entries, _ = parse_index_lines(_pread(index_path, json_start, index_size), json_start)
    kept = valid_prefix(entries, data_size, start=last_end)
    if kept and not ends_a_line(data_path, entries[kept - 1].end):
        kept = 0
    del entries[kept:]
    out.from_json = len(entries)
    skipped: list[int] = []
    start = entries[-1].end if entries else last_end
    tail = list(entries_from_data(data_path, start, data_size, skipped))
    out.from_data, out.bad_lines = len(tail), len(skipped)
    extra = entries + tail
    if extra:
        _add_names(extra, out.names)
        out.rows = np.concatenate([rows, rows_for(extra, [0] * len(extra))])
    return out


def torn_tail_bytes(path: Path, size: int, block: int = 1 << 16) -> int:
    """Bytes after the last newline of the file's first `size` bytes (a torn last line)."""
    if size <= 0:
        return 0
    with open(path, "rb") as f:
        pos = size
        while pos > 0:
            start = max(0, pos - block)
            chunk = os.pread(f.fileno(), pos - start, start)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                return size - (start + idx + 1)
            pos = start
    return size

