"""The prompt-row cache and the lazy prompt table (draftgen.datasets.table/cache): a cache hit
gives exactly what a full parse gives, and anything that could make it wrong rebuilds it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgen.config import DatasetConfig
from draftgen.datasets import DatasetError, PromptTable, load_prompt_table, load_prompts
from draftgen.datasets import table as table_mod
from draftgen.store.columns import id_hash
from tests.e2e_helpers import mixed_rows, write_jsonl


def awkward_lines() -> list[bytes]:
    """Bad rows, a duplicate, an own-ID clash and a blank line, after the good rows."""
    return [
        b"not json",
        b"",
        orjson.dumps({"id": "r0", "messages": [{"role": "user", "content": "other text"}]}),
        orjson.dumps({"problem": "Question 1: explain topic number 1 briefly."}),
        orjson.dumps({"messages": [{"role": "user", "content": "   "}]}),
        "{\"prompt\": \"caf\u00e9 \u2603 unicode\"}".encode(),
    ]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = write_jsonl(tmp_path / "data.jsonl", mixed_rows(40), awkward_lines())
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # a BOM shifts every offset
    return path


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the full, located parses of a JSONL source (a cache miss)."""
    calls: list[int] = []
    real = table_mod.located_jsonl_rows

    def counted(files: list[Path]) -> Iterator[Any]:
        calls.append(1)
        return real(files)

    monkeypatch.setattr(table_mod, "located_jsonl_rows", counted)
    return calls


def cfg_for(path: Path, **options: Any) -> DatasetConfig:
    return DatasetConfig(name="ds", path=str(path), **options)


def load_and_save(cfg: DatasetConfig, cache: Path) -> PromptTable:
    table, _ = load_prompt_table(cfg, cache)
    table.save_cache()
    return table


def test_a_cache_hit_gives_the_prompts_ids_and_stats_of_a_full_parse(
        tmp_path: Path, data: Path, parses: list[int]) -> None:
    cfg, cache = cfg_for(data), tmp_path / "cache" / "ds.npz"
    expected, expected_stats = load_prompts(cfg)
    assert expected_stats.bad_rows == 2 and expected_stats.duplicates == 1
    assert expected_stats.id_collisions == 1

    first, first_stats = load_prompt_table(cfg, cache)
    assert not cache.exists(), "reading a dataset writes nothing until save_cache"
    first.save_cache()
    assert cache.exists() and parses == [1]
    table, stats = load_prompt_table(cfg, cache)
    assert parses == [1], "the second load read the cache, not the file"

    assert stats == expected_stats == first_stats
    assert list(table) == expected == list(first)
    assert table.ids == [p.id for p in expected]
    assert table.id_hashes.tolist() == [id_hash(p.id) for p in expected]
    assert table.has_tools
    rows = [len(expected) - 1, 0, 7, 3]
    assert table.load(rows) == [expected[i] for i in rows]


def test_a_folder_of_files_is_cached_with_each_row_in_its_file(
        tmp_path: Path, parses: list[int]) -> None:
    folder = tmp_path / "set"
    write_jsonl(folder / "a.jsonl", mixed_rows(7, "a"))
    write_jsonl(folder / "sub" / "b.ndjson", mixed_rows(9, "b"), [b"{broken"])
    cfg, cache = cfg_for(folder), tmp_path / "c.npz"
    load_and_save(cfg, cache)
    table, stats = load_prompt_table(cfg, cache)
    assert parses == [1]
    expected, expected_stats = load_prompts(cfg)
    assert (list(table), stats) == (expected, expected_stats)
    assert {p.source.rsplit(":", 1)[0] for p in table} == {str(folder / "a.jsonl"),
                                                          str(folder / "sub" / "b.ndjson")}


def test_editing_the_file_rebuilds_the_cache(tmp_path: Path, data: Path,
                                             parses: list[int]) -> None:
    cfg, cache = cfg_for(data), tmp_path / "c.npz"
    before = list(load_and_save(cfg, cache))
    with open(data, "ab") as f:  # a new row: the size changes
        f.write(orjson.dumps({"prompt": "a new question"}) + b"\n")
    table = load_and_save(cfg, cache)
    assert parses == [1, 1]
    assert [p.id for p in table] == [p.id for p in before] + [p.id for p in table][-1:]
    assert list(table)[-1].messages == [{"role": "user", "content": "a new question"}]

    # Same size, new content, new mtime: rebuilt too (the old offsets would still parse).
    raw = data.read_bytes().replace(b"a new question", b"a NEW question")
    stat = data.stat()
    data.write_bytes(raw)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    table, _ = load_prompt_table(cfg, cache)
    assert parses == [1, 1, 1]
    assert list(table)[-1].messages == [{"role": "user", "content": "a NEW question"}]


@pytest.mark.parametrize("option", [{"limit": 5}, {"turns": "last"}, {"name": "other"}])
def test_a_dataset_option_that_changes_the_prompts_rebuilds_the_cache(
        tmp_path: Path, data: Path, parses: list[int], option: dict[str, Any]) -> None:
    cache = tmp_path / "c.npz"
    load_and_save(cfg_for(data), cache)
    cfg = DatasetConfig(**{"name": "ds", "path": str(data), **option})
    table, stats = load_prompt_table(cfg, cache)
    assert parses == [1, 1]
    assert (list(table), stats) == load_prompts(cfg)


def test_a_budget_option_keeps_the_cache(tmp_path: Path, data: Path, parses: list[int]) -> None:
    cache = tmp_path / "c.npz"
    load_and_save(cfg_for(data), cache)
    table, _ = load_prompt_table(cfg_for(data, max_prompts=3, max_output_tokens=10), cache)
    assert parses == [1]
    assert len(table) == len(load_prompts(cfg_for(data))[0])


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte_in_the_ids(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    at = raw.index(b"ds/r0")  # inside the stored id blob
    raw[at + 3] ^= 0x01
    path.write_bytes(bytes(raw))


def _foreign(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, meta=np.frombuffer(b'{"key": "somebody else"}', dtype=np.uint8))


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte_in_the_ids, _foreign,
                                    lambda p: p.write_bytes(b"garbage")])
def test_a_damaged_cache_is_rebuilt_never_trusted(tmp_path: Path, data: Path,
                                                 parses: list[int], damage: Any) -> None:
    cfg, cache = cfg_for(data), tmp_path / "c.npz"
    expected = load_prompts(cfg)
    load_and_save(cfg, cache)
    damage(cache)
    table = load_and_save(cfg, cache)
    assert parses == [1, 1]
    assert (list(table), load_prompt_table(cfg, cache)[1]) == expected
    assert parses == [1, 1], "the rebuilt cache is used again"


def test_a_row_changed_behind_the_cache_is_a_clear_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", mixed_rows(5))
    cfg, cache = cfg_for(path), tmp_path / "c.npz"
    load_and_save(cfg, cache)
    table, _ = load_prompt_table(cfg, cache)
    stat = path.stat()
    path.write_bytes(path.read_bytes().replace(b'"r0"', b'"x0"'))  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(DatasetError, match=rf"{path}:1: the dataset file changed.*'ds/x0'"):
        table.load([0])


def test_a_file_reordered_behind_the_cache_is_read_in_full_at_load(
        tmp_path: Path, parses: list[int]) -> None:
    """Same size, same mtime, rows in another order: the cache's key cannot tell, the spot
    check at load does; the dataset is read in full and the cache written again."""
    rows = mixed_rows(200)
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    cfg, cache = cfg_for(path), tmp_path / "c.npz"
    load_and_save(cfg, cache)
    stat = path.stat()
    write_jsonl(path, rows[::-1])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    table = load_and_save(cfg, cache)
    assert parses == [1, 1]
    assert [p.id for p in table] == [p.id for p in load_prompts(cfg)[0]]
    assert [p.id for p in load_and_save(cfg, cache)] == table.ids and parses == [1, 1]


def test_sources_without_row_access_are_read_in_full_and_not_cached(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": f"question {i}"} for i in range(6)]), path)
    cfg, cache = cfg_for(path), tmp_path / "c.npz"
    table = load_and_save(cfg, cache)
    assert not cache.exists()
    assert (list(table), load_prompt_table(cfg, cache)[1]) == load_prompts(cfg)


def test_where_keeps_dataset_positions_and_loads_the_kept_rows(tmp_path: Path, data: Path
                                                               ) -> None:
    cfg, cache = cfg_for(data), tmp_path / "c.npz"
    load_and_save(cfg, cache)
    table, _ = load_prompt_table(cfg, cache)
    keep = np.arange(len(table)) % 3 == 1
    part = table.where(keep)
    everything = list(table)
    assert part.positions.tolist() == np.flatnonzero(keep).tolist()
    assert list(part) == [p for p, k in zip(everything, keep, strict=True) if k]
    assert part.ids == [p.id for p in part]


def _read_back(places: list[Any]) -> list[tuple[Any, ...]]:
    from draftgen.datasets.readers import Row, rows_at

    return [(r.data, r.source, r.at) if isinstance(r, Row) else (r.source, r.reason)
            for r in rows_at(places)]


@pytest.mark.parametrize(("gap", "most"), [(64 * 1024, 8 * 1024 * 1024), (0, 10**9), (0, 300)])
def test_rows_read_by_span_are_the_rows_read_one_by_one(
        tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch, gap: int, most: int) -> None:
    """Rows in any order, from two files, some twice: read in spans (one `pread` each), they
    are the rows the located parse gave, in the order asked."""
    from draftgen.datasets import readers

    other = write_jsonl(tmp_path / "other.jsonl", mixed_rows(7))
    located = [r for r in readers.located_jsonl_rows([data, other])
               if isinstance(r, readers.Row)]
    rng = np.random.default_rng(3)
    picks = [int(i) for i in rng.permutation(len(located))] + [0, 5, 5, len(located) - 1]
    places = [located[i].at for i in picks]
    expected = [(located[i].data, located[i].source, located[i].at) for i in picks]
    monkeypatch.setattr(readers, "SPAN_GAP", gap)
    monkeypatch.setattr(readers, "SPAN_MAX", most)
    reads: list[int] = []
    real = os.pread

    def counted(fd: int, length: int, offset: int) -> bytes:
        reads.append(length)
        return real(fd, length, offset)

    monkeypatch.setattr(readers.os, "pread", counted)
    assert _read_back(places) == expected
    if gap:
        assert len(reads) == 2, "rows a few bytes apart: one read per file"
    else:  # the bad rows between good ones are gaps; spans of at most `most` bytes
        assert 2 < len(reads) < len(places)
        assert max(reads) <= max(most, max(p.length for p in places))


def test_a_row_cut_short_by_a_changed_file_reads_as_a_bad_row(tmp_path: Path) -> None:
    from draftgen.datasets import readers

    path = write_jsonl(tmp_path / "data.jsonl", mixed_rows(5))
    located = [r for r in readers.located_jsonl_rows([path]) if isinstance(r, readers.Row)]
    path.write_bytes(path.read_bytes()[:located[3].at.offset + 5])
    rows = readers.rows_at([r.at for r in located])
    assert [isinstance(r, readers.Row) for r in rows] == [True, True, True, False, False]
