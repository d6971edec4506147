"""Reading a dataset's index fast: without writing anything for `draftgen status` and
`draftgen audit` on a run that may be live, stopped or killed (`load_index_columns`), and for
the resume of a run, writing only what is behind (`catch_up_index`).

The rows of the binary copy (`store.columns`) are used as far as they agree with the JSON index
and the data file; the JSON index lines after them, then the data records after those, are
parsed (`index.catch_up`, the same catching-up as `read_index`). The result is one array of
`columns.ROW` rows plus the strings behind the hashed columns.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from draftgen.store.columns import (
    CODED,
    append_rows,
    concat_rows,
    id_hash,
    keep_rows,
    read_rows,
    rows_for,
    str_code,
)
from draftgen.store.index import (
    IndexEntry,
    IndexTail,
    append_entries,
    catch_up,
    cut_index,
    ends_a_line,
    parse_index_lines,
    read_span,
)
from draftgen.store.layout import RunLayout

log = logging.getLogger("draftgen.store")


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
    caught_up: list[IndexEntry] = field(default_factory=list)
    """The entries of the rows after the binary ones (from the JSON index, then the data)."""

    def name(self, code: int) -> str | None:
        return self.names.get(int(code), f"#{int(code):08x}")


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


def _entry_of_row(rows: np.ndarray, i: int, index_path: Path) -> IndexEntry | None:
    """The entry on row i's JSON index line (None when that span is not one entry)."""
    start = int(rows["iend"][i - 1]) if i else 0
    entries, _ = parse_index_lines(read_span(index_path, start, int(rows["iend"][i])), start)
    return entries[0] if len(entries) == 1 else None


def _row_matches(rows: np.ndarray, i: int, index_path: Path) -> bool:
    """Whether row i is the entry on its JSON index line."""
    entry = _entry_of_row(rows, i, index_path)
    return (entry is not None and entry.end == int(rows["end"][i])
            and id_hash(entry.id) == int(rows["idh"][i]))


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
            entry = _entry_of_row(rows, int(np.argmax(column == code)), index_path)
            names[code] = getattr(entry, col) if entry else None


def _add_names(entries: list[IndexEntry], names: dict[int, str | None]) -> None:
    values = {v for e in entries for v in (e.backend, e.provider, e.quant, e.finish, e.check)}
    for value in values:
        names.setdefault(str_code(value), value)


def load_index_columns(layout: RunLayout, dataset: str, data_size: int | None = None
                       ) -> IndexColumns:
    """The index of one dataset, caught up with its data file as it was at `data_size` bytes
    (default: its size now). Writes nothing."""
    files = _DatasetFiles.of(layout, dataset, data_size)
    trusted = files.trusted_rows()
    behind = files.behind(trusted)
    return _index_columns(trusted, behind, [0] * len(behind.from_data), files.index)


def catch_up_index(layout: RunLayout, dataset: str) -> IndexColumns | None:
    """The writer's `load_index_columns` (under the run lock, after `cut_torn_tail`): what
    the binary copy and the JSON index lack, or hold past the data, is put right on disk at
    the cost of that part alone (rows and lines past the kept ones cut, the missing ones
    appended), so that the data, the index and its copy are in step. None, writing nothing,
    when the copy is missing or disagrees from its first row (a run from before the copy):
    then `read_index(repair=True)` rebuilds both from the whole JSON index."""
    files = _DatasetFiles.of(layout, dataset)
    trusted = files.trusted_rows()
    if len(trusted) == 0:
        return None
    behind = files.behind(trusted)
    keep_rows(files.columns, len(trusted))  # first: no row may outlive the lines it names
    cut_index(files.index, behind.index_end)
    data_line_ends = append_entries(files.index, behind.from_data)
    out = _index_columns(trusted, behind, data_line_ends, files.index)
    append_rows(files.columns, out.rows[len(trusted):])
    if len(out.rows) > len(trusted) or behind.index_end != files.index_size:
        log.info("%s: index caught up: %d rows from the index, %d records from the data",
                 dataset, len(behind.entries), len(behind.from_data))
    return out


@dataclass(frozen=True, slots=True)
class _DatasetFiles:
    data: Path
    index: Path
    columns: Path
    data_size: int
    index_size: int

    @classmethod
    def of(cls, layout: RunLayout, dataset: str, data_size: int | None = None
           ) -> _DatasetFiles:
        data, index = layout.responses(dataset), layout.index(dataset)
        if data_size is None:
            data_size = data.stat().st_size if data.exists() else 0
        return cls(data, index, layout.columns(dataset), data_size,
                   index.stat().st_size if index.exists() else 0)

    def trusted_rows(self) -> np.ndarray:
        return _trusted_rows(self.columns, self.index, self.index_size, self.data,
                             self.data_size)

    def behind(self, trusted: np.ndarray) -> IndexTail:
        """The JSON index lines after the trusted rows, then the data records after them."""
        start = (int(trusted["iend"][-1]), int(trusted["end"][-1])) if len(trusted) else (0, 0)
        return catch_up(self.index, self.data, self.index_size, self.data_size, *start)


def _index_columns(trusted: np.ndarray, behind: IndexTail, data_line_ends: list[int],
                   index_path: Path) -> IndexColumns:
    """The trusted rows, then rows for what was behind them (`data_line_ends`: where the
    records from the data have their index lines, 0 for none)."""
    out = IndexColumns(rows=trusted, bad_lines=behind.bad_lines, from_binary=len(trusted),
                       from_json=len(behind.entries), from_data=len(behind.from_data))
    _resolve_names(trusted, index_path, out.names)
    extra = out.caught_up = behind.entries + behind.from_data
    if extra:
        _add_names(extra, out.names)
        out.rows = concat_rows(trusted, rows_for(extra, behind.line_ends + data_line_ends))
    return out


def index_entries(index_path: Path, cols: IndexColumns) -> list[IndexEntry] | None:
    """The entries behind the rows of `cols`, in order: the binary rows' from their JSON index
    lines, then those caught up; None when the JSON lines are not one per binary row."""
    n = cols.from_binary
    entries: list[IndexEntry] = []
    if n:
        stop = int(cols.rows["iend"][n - 1])
        entries, _ = parse_index_lines(read_span(index_path, 0, stop), 0)
        if len(entries) != n:
            return None
    return entries + cols.caught_up


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

