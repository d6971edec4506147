"""Resume from the binary index (draftgen.store.scan) and shards in the runner: the done set
read from the columns equals the JSON path's, a kill's leftovers are still repaired, shards
split a dataset exactly, and answers in sibling run folders count as done."""

from __future__ import annotations

from itertools import chain
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.config import load_config
from draftgen.run import Plan, Runner, prepare
from draftgen.store import RunLayout, Store, scan_dataset
from draftgen.store.columns import read_rows
from draftgen.store.scan import DatasetOnDisk
from draftgen.store.shards import ShardSpec
from tests.e2e_helpers import fast_backend, mixed_rows, write_config, write_jsonl


def record(i: int, *, out: int = 3, cost: float = 0.25) -> dict[str, Any]:
    return {"id": f"ds/{i}", "dataset": "ds", "output_ids": list(range(out)),
            "cost_usd": cost, "backend": "b", "finish_reason": "stop"}


def write_run(root: Path, ids: list[int]) -> RunLayout:
    store = Store(root, fsync_interval_s=0)
    for i in ids:
        store.append_record("ds", record(i, out=i % 5, cost=i / 100))
    store.close()
    return RunLayout(root)


def summary(on_disk: DatasetOnDisk) -> tuple[Any, ...]:
    return (on_disk.done, on_disk.duplicates, on_disk.output_tokens,
            pytest.approx(on_disk.cost), on_disk.bad_lines)


def test_done_ids_from_the_columns_equal_the_json_path(tmp_path: Path) -> None:
    layout = write_run(tmp_path, [*range(40), 7, 12])  # two duplicate answers
    with open(layout.responses("ds"), "ab") as f:
        f.write(b'{"not_a_record": true}\n')
    fast, _ = scan_dataset(layout, "ds")
    assert fast.from_columns
    layout.columns("ds").unlink()
    slow, _ = scan_dataset(layout, "ds")
    assert not slow.from_columns
    assert summary(fast) == summary(slow)
    assert fast.done == {f"ds/{i}" for i in range(40)}
    assert (fast.duplicates, fast.bad_lines) == (2, 1)
    assert fast.output_tokens == sum(i % 5 for i in range(40))
    assert "ds/3" in fast.done and "ds/40" not in fast.done
    assert scan_dataset(layout, "ds")[0].from_columns, "the JSON path rebuilt the copy"


def test_a_kill_that_left_the_index_behind_is_repaired_before_use(tmp_path: Path) -> None:
    layout = write_run(tmp_path, list(range(10)))
    with open(layout.responses("ds"), "ab") as f:  # killed after the data, before the index
        f.write(orjson.dumps(record(10)) + b"\n")
        f.write(b'{"id": "ds/11", "dataset": "ds", "outp')  # and a torn line
    on_disk, torn = scan_dataset(layout, "ds")
    assert len(torn) == 1
    assert on_disk.from_columns, "only what is behind is repaired (test_resume_after_kill.py)"
    assert on_disk.done == {f"ds/{i}" for i in range(11)}
    again, _ = scan_dataset(layout, "ds")
    assert again.from_columns
    assert summary(again) == summary(on_disk)
    assert layout.index("ds").read_bytes().count(b"\n") == 11


def test_index_entries_past_the_data_are_not_trusted(tmp_path: Path) -> None:
    layout = write_run(tmp_path, list(range(6)))
    data = layout.responses("ds")
    lines = data.read_bytes().splitlines(keepends=True)
    data.write_bytes(b"".join(lines[:4]))  # the data lost its last two records
    on_disk, _ = scan_dataset(layout, "ds")
    assert on_disk.done == {f"ds/{i}" for i in range(4)}
    assert len(read_rows(layout.columns("ds"))) == 4, "rows past the data are cut"
    assert scan_dataset(layout, "ds")[0].done == on_disk.done


# ---- shards and sibling folders in the runner ------------------------------------------------


@pytest.fixture
def config(tmp_path: Path, qwen3_dir: Path) -> Path:
    def make(**dataset: Any) -> Path:
        data = write_jsonl(tmp_path / "prompts.jsonl", mixed_rows(60))
        return write_config(
            tmp_path, qwen3_dir, [fast_backend("b", "sglang", "http://127.0.0.1:9")],
            [{"name": "ds", "path": str(data), **dataset}])
    return make  # type: ignore[return-value]


def queued_ids(runner: Runner) -> list[str]:
    table = runner.plan.prompts_of("ds")
    return [table.id_at(item.row) for item in runner.queues["ds"]]


def resumed(plan: Plan) -> Runner:
    runner = Runner(plan, live_display=False)
    runner._resume()
    return runner


def test_shards_split_the_prompts_exactly(config: Any) -> None:
    cfg = load_config(config())
    whole = prepare(cfg)
    ids = whole.prompts_of("ds").ids
    shards = [prepare(cfg, ShardSpec(i, 3)) for i in range(3)]
    parts = [s.prompts_of("ds").ids for s in shards]
    assert sorted(chain.from_iterable(parts)) == sorted(ids)
    assert all(p for p in parts), "60 prompts: every shard gets some"
    assert [s.run_dir for s in shards] == [Path(cfg.output_dir) / "shards" / f"{i}-of-3"
                                           for i in range(3)]
    assert whole.run_dir == Path(cfg.output_dir)
    assert [p.id for p in shards[1].prompts_of("ds")] == parts[1]


def test_sharded_max_prompts_takes_the_datasets_first_prompts(config: Any) -> None:
    cfg = load_config(config(max_prompts=25))
    first = prepare(cfg).prompts_of("ds").ids[:25]
    queued = [queued_ids(resumed(prepare(cfg, ShardSpec(i, 4)))) for i in range(4)]
    assert sorted(chain.from_iterable(queued)) == sorted(first)


def test_answers_in_sibling_folders_count_as_done(config: Any) -> None:
    cfg = load_config(config())
    root = Path(cfg.output_dir)
    ids = prepare(cfg).prompts_of("ds").ids
    plan = prepare(cfg, ShardSpec(0, 2))
    mine = plan.prompts_of("ds").ids
    # Answered by an earlier sharding of the run (2 of them in this shard's share), one of
    # them still being written: a torn last line.
    sibling = root / "shards" / "1-of-3"
    store = Store(sibling)
    for rid in mine[:2]:
        store.append_record("ds", {"id": rid, "dataset": "ds", "output_ids": [1]})
    store.close()
    data = RunLayout(sibling).responses("ds")
    with open(data, "ab") as f:
        f.write(b'{"id": "' + mine[2].encode() + b'", "dataset": "ds", "outp')
    before = data.read_bytes()
    runner = resumed(plan)
    assert runner.counters.datasets["ds"].done_before == 2
    assert queued_ids(runner) == mine[2:]
    assert data.read_bytes() == before, "a sibling's files are never repaired"
    assert not RunLayout(sibling).lock.exists()
    # The unsharded root counts shard answers too.
    assert resumed(prepare(cfg)).counters.datasets["ds"].done_before == 2
    assert len(ids) == 60


def test_the_prompt_cache_is_written_by_the_run_not_by_prepare(config: Any) -> None:
    cfg = load_config(config())
    plan = prepare(cfg)
    cache = RunLayout(Path(cfg.output_dir)).prompt_cache("ds")
    assert not cache.exists()
    resumed(plan)
    assert cache.exists()
    again = prepare(cfg)
    assert list(again.prompts_of("ds")) == list(plan.prompts_of("ds"))
