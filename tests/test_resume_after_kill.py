"""Resume right after a kill -9 (draftgen.store.fast_index.catch_up_index): the data a few
records past the JSON index, the binary copy a row behind it, torn last lines. The resume reads
the done IDs from the binary copy, repairs only what is behind, gets what the full JSON repair
(`read_index(repair=True)`) gets, file for file, and leaves the three files in step."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import draftgen.store.fast_index as fast_index_mod
import draftgen.store.index as index_mod
from draftgen.store import RunLayout, Store, scan_dataset
from draftgen.store.columns import ROW, read_rows
from draftgen.store.fast_index import load_index_columns
from draftgen.store.index import in_step
from draftgen.store.scan import DatasetOnDisk

TORN_RECORD = b'{"id": "ds/torn", "dataset": "ds", "output_ids": [1, 2'


def record(i: int) -> dict[str, Any]:
    return {"id": f"ds/{i}", "dataset": "ds", "output_ids": list(range(i % 5)),
            "cost_usd": i / 100, "backend": "local" if i % 2 else "paid",
            "provider": None if i % 2 else "Alpha", "finish_reason": "stop"}


def write_run(root: Path, ids: list[int]) -> RunLayout:
    store = Store(root, fsync_interval_s=0)
    for i in ids:
        store.append_record("ds", record(i))
    store.close()
    return RunLayout(root)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def drop_rows(layout: RunLayout, count: int) -> None:
    path = layout.columns("ds")
    os.truncate(path, path.stat().st_size - count * ROW.itemsize)


def killed_after_the_data(layout: RunLayout) -> None:
    """The realistic kill -9: three records (and a line that is not one) written past the
    index, the binary copy a row behind the index, a torn last record."""
    drop_rows(layout, 1)
    append(layout.responses("ds"), orjson.dumps(record(100)) + b"\n" + b'{"not": "a record"}\n'
           + orjson.dumps(record(101)) + b"\n" + orjson.dumps(record(3)) + b"\n" + TORN_RECORD)


def killed_mid_index_line(layout: RunLayout) -> None:
    """Torn last lines everywhere: an index line and a binary row cut short, as well as the
    data's last record."""
    append(layout.responses("ds"), orjson.dumps(record(100)) + b"\n" + TORN_RECORD)
    append(layout.index("ds"), b'{"id": "ds/100", "end": 12')
    append(layout.columns("ds"), b"\x01" * (ROW.itemsize // 2))


def data_lost_its_tail(layout: RunLayout) -> None:
    """The data file lost its last two records (a cut torn line, a restored backup): index
    lines and binary rows past it are dropped, as the JSON repair drops them."""
    data = layout.responses("ds")
    lines = data.read_bytes().splitlines(keepends=True)
    data.write_bytes(b"".join(lines[:-2]))


KILLS: dict[str, Callable[[RunLayout], None]] = {
    "records past the index, copy a row behind, torn record": killed_after_the_data,
    "torn index line and binary row": killed_mid_index_line,
    "index and copy past the data": data_lost_its_tail,
}


def summary(on_disk: DatasetOnDisk) -> tuple[Any, ...]:
    return (on_disk.done, on_disk.duplicates, on_disk.output_tokens,
            pytest.approx(on_disk.cost), on_disk.bad_lines)


def files(layout: RunLayout) -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in (
        ("data", layout.responses("ds")), ("index", layout.index("ds")),
        ("copy", layout.columns("ds")))}


def scan_through_json(folder: Path) -> tuple[DatasetOnDisk, RunLayout]:
    """The same folder's scan without a binary copy: the full JSON repair."""
    layout = RunLayout(folder)
    layout.columns("ds").unlink()
    on_disk, _ = scan_dataset(layout, "ds")
    assert not on_disk.from_columns
    return on_disk, layout


@pytest.mark.parametrize("kill", list(KILLS.values()), ids=list(KILLS))
def test_resume_after_a_kill_reads_the_copy_and_repairs_as_the_json_path(
        tmp_path: Path, kill: Callable[[RunLayout], None]) -> None:
    layout = write_run(tmp_path / "fast", [*range(30), 7])  # one duplicate answer
    kill(layout)
    shutil.copytree(tmp_path / "fast", tmp_path / "json")

    fast, torn = scan_dataset(layout, "ds")
    slow, json_layout = scan_through_json(tmp_path / "json")

    assert fast.from_columns
    assert summary(fast) == summary(slow)
    assert files(layout) == files(json_layout), "the same index and copy, byte for byte"
    assert all(t.bytes_cut for t in torn)


def test_the_repaired_files_are_in_step_and_the_next_scan_writes_nothing(tmp_path: Path
                                                                          ) -> None:
    layout = write_run(tmp_path, list(range(30)))
    killed_after_the_data(layout)
    first, _ = scan_dataset(layout, "ds")
    assert first.done == {f"ds/{i}" for i in [*range(30), 100, 101]}
    assert (first.duplicates, first.bad_lines) == (1, 1)

    assert in_step(layout.columns("ds"), layout.index("ds"))
    columns = load_index_columns(layout, "ds")
    assert (columns.from_binary, columns.from_json, columns.from_data) == (33, 0, 0)
    assert len(read_rows(layout.columns("ds"))) == 33
    assert layout.index("ds").read_bytes().count(b"\n") == 33
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*")
              if p.is_file()}
    again, torn = scan_dataset(layout, "ds")
    assert torn == []
    assert summary(again)[:4] == summary(first)[:4]
    assert again.bad_lines == 0, "now between index entries: counted once, as read_index does"
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*")
            if p.is_file()} == before


def test_the_repair_parses_only_what_is_behind(tmp_path: Path, monkeypatch: Any) -> None:
    layout = write_run(tmp_path, list(range(500)))
    killed_after_the_data(layout)
    parsed: list[int] = []
    real = index_mod.parse_index_lines

    def counting(raw: bytes, base: int) -> tuple[list[Any], list[int]]:
        out = real(raw, base)
        parsed.append(len(out[0]))
        return out

    monkeypatch.setattr(index_mod, "parse_index_lines", counting)
    monkeypatch.setattr(fast_index_mod, "parse_index_lines", counting)
    on_disk, _ = scan_dataset(layout, "ds")
    assert on_disk.from_columns and on_disk.done == {f"ds/{i}" for i in range(500)}
    assert sum(parsed) < 20, f"{sum(parsed)} JSON index lines parsed for 4 behind"


def test_a_copy_that_disagrees_from_its_first_row_falls_back_to_the_json_repair(
        tmp_path: Path) -> None:
    layout = write_run(tmp_path, list(range(12)))
    rows = read_rows(layout.columns("ds"))
    rows["idh"] += 1  # the copy of another index
    layout.columns("ds").write_bytes(rows.tobytes())
    append(layout.responses("ds"), orjson.dumps(record(12)) + b"\n")
    on_disk, _ = scan_dataset(layout, "ds")
    assert not on_disk.from_columns
    assert on_disk.done == {f"ds/{i}" for i in range(13)}
    assert in_step(layout.columns("ds"), layout.index("ds")), "rebuilt by the JSON repair"
    assert scan_dataset(layout, "ds")[0].from_columns
