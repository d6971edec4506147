"""Sharded runs: `draftgen run CONFIG --shard I/N`, each shard in its own folder, and the
reading commands (status, audit, export, report, stop) taking the run folder as one run.

The end-to-end tests run real shards (subprocesses and in-process runners, real Qwen3
tokenizer) against one loopback test server."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from draftgen.audit import audit_run
from draftgen.audit.quarantine import QuarantineError, quarantine
from draftgen.cli import app
from draftgen.config import DatasetConfig, load_config
from draftgen.export import ExportFormat, ExportOptions, export_run
from draftgen.report import write_report
from draftgen.run import Outcome, Runner, prepare
from draftgen.status import collect_status
from draftgen.store import RunLayout, RunLock
from draftgen.store.layout import SHARDS_DIR
from draftgen.store.shards import (
    RunPart,
    ShardError,
    ShardSpec,
    run_folders,
    run_parts,
    seen_earlier,
    shard_of,
)
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import Tokenizer
from tests.e2e_helpers import (
    fast_backend,
    mixed_rows,
    read_records,
    wait_for_lines,
    write_config,
    write_jsonl,
)
from tests.test_export import write_run

# ---- shard specs and folders ------------------------------------------------------------------


@pytest.mark.parametrize("text", ["4/4", "-1/4", "1/0", "a/b", "2", "", "1/2/3"])
def test_a_bad_shard_spec_is_a_clear_error(text: str) -> None:
    with pytest.raises(ShardError, match="--shard"):
        ShardSpec.parse(text)


def test_shard_specs_and_folders(tmp_path: Path) -> None:
    assert ShardSpec.parse(" 3 / 4 ") == ShardSpec(3, 4)
    assert ShardSpec.parse("0/1").folder(tmp_path) == tmp_path / "shards" / "0-of-1"
    ids = [f"d/{i}" for i in range(2000)]
    per_shard = Counter(shard_of(i, 4) for i in ids)
    assert set(per_shard) == {0, 1, 2, 3} and min(per_shard.values()) > 400
    assert all(sum(ShardSpec(s, 4).takes(i) for s in range(4)) == 1 for i in ids[:200])
    # no shards: the folder is its one part, whatever it holds
    assert run_parts(tmp_path) == [RunPart(tmp_path)]
    for spec in ("1/4", "0/4", "0/2"):
        ShardSpec.parse(spec).folder(tmp_path).mkdir(parents=True)
    (tmp_path / "shards" / "notes").mkdir()
    parts = run_parts(tmp_path)
    assert [p.label for p in parts] == ["0/2", "0/4", "1/4"]  # the root holds no run
    (tmp_path / "run.json").write_text("{}")
    assert [p.label for p in run_parts(tmp_path)] == ["root", "0/2", "0/4", "1/4"]
    assert run_folders(tmp_path)[0] == tmp_path


def test_no_dataset_may_be_named_like_the_shards_folder() -> None:
    with pytest.raises(ValueError, match="reserved"):
        DatasetConfig(name=SHARDS_DIR, path="prompts.jsonl")


def test_seen_earlier_names_the_answers_of_an_earlier_folder() -> None:
    h = [np.array(x, dtype=np.uint64) for x in ([5, 1, 3], [3, 4, 4], [1, 4, 9])]
    assert [x.tolist() for x in seen_earlier(h)] == [[], [3], [1, 4]]


def test_run_options_are_checked_before_anything_is_read(tmp_path: Path) -> None:
    cfg = tmp_path / "missing.yaml"  # never read: the options are refused first
    cases = {
        ("--shard", "4/4"): "I must be in 0..N-1",
        ("--shard", "x"): "expected I/N",
        ("--ray", "2", "--shard", "0/2"): "--ray runs every shard itself",
        ("--ray", "2", "--dry-run"): "--dry-run sends nothing",
        ("--ray-address", "127.0.0.1:6379"): "--ray-address needs --ray",
    }
    for args, message in cases.items():
        result = CliRunner().invoke(app, ["run", str(cfg), *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)


# ---- reading a re-sharded run (answers given twice) ------------------------------------------


def _write_shard(root: Path, spec: str, tok: Tokenizer, sizes: dict[str, int]) -> Path:
    """A shard folder as `draftgen run --shard` leaves it (see test_export.write_run)."""
    folder = ShardSpec.parse(spec).folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    return write_run(folder, tok, sizes)


def test_a_prompt_answered_in_two_folders_is_read_once(tmp_path: Path, qwen3_tok: Tokenizer
                                                        ) -> None:
    """A run re-sharded from 4 to 2 while shards of both were live answered some prompts
    twice: status counts them once, export and report keep the first folder's answer, the
    audit flags the later copy (which --quarantine then moves out of its own folder)."""
    root = tmp_path / "run"
    _write_shard(root, "0/4", qwen3_tok, {"d": 12})
    _write_shard(root, "0/2", qwen3_tok, {"d": 20})  # d-0000..d-0011 again
    st = collect_status(root)
    d = st.datasets["d"]
    assert d.sums.answers == 20 and d.duplicates == 12
    assert [s.part.label for s in st.shards] == ["0/2", "0/4"]
    assert [s.status.total.sums.answers for s in st.shards] == [20, 12]
    assert any("12 prompts answered in two shard folders" in n for n in st.notes)
    assert st.as_json()["shards"][1]["done"] == 12

    out = tmp_path / "out"
    summary = export_run(root, ExportOptions(format=ExportFormat.parquet, out=out,
                                             checks=False, text=False, shuffle=False,
                                             exclude_truncated=False))
    tally = summary.tallies["d"]
    assert tally.excluded["duplicate_across_shards"] == 12 and tally.records == 32
    ids = pq.read_table(out / "data.parquet").column("id").to_pylist()
    assert sorted(set(ids)) == sorted(ids) and len(ids) == 20 - sum(
        n for r, n in tally.excluded.items() if r != "duplicate_across_shards")

    report = write_report(root, tmp_path / "report")
    assert report.stats.answers == 20 and report.stats.datasets["d"].duplicates == 12
    assert "(shard 0/4)" in report.index.read_text()

    text = CliRunner().invoke(app, ["status", str(root), "--wide"]).output
    assert "by shard" in text and "shards/0-of-4" in text and "stopped (completed)" in text

    audit = audit_run(root, workers=1)
    later = audit.datasets["shards/0-of-4/d"]
    assert audit.datasets["shards/0-of-2/d"].problems.get("duplicate_id", 0) == 0
    assert later.problems["duplicate_id"] == 12
    assert audit.as_json()["datasets"]["d"]["answers"] == 32
    # quarantine works folder by folder, under each folder's lock
    lock = RunLock(RunLayout(ShardSpec(0, 2).folder(root)).lock)
    lock.acquire()
    with pytest.raises(QuarantineError, match="0-of-2: a draftgen run is live"):
        quarantine(audit)
    lock.release()
    moved = quarantine(audit)
    assert moved.moved["shards/0-of-4/d"] == len(later.failing) >= 12
    quarantined = (ShardSpec(0, 4).folder(root) / "d" / "quarantine.jsonl").read_bytes()
    assert quarantined.count(b"\n") == len(later.failing)
    again = audit_run(root, workers=1)
    assert again.ok and again.answers == 32 - moved.moved["shards/0-of-2/d"] - len(
        later.failing)
    assert collect_status(root).datasets["d"].duplicates == 0


# ---- real shards against one server -------------------------------------------------------------


def _config(tmp_path: Path, qwen3_dir: Path, url: str, rows: int, **backend: Any) -> Path:
    data = write_jsonl(tmp_path / "data" / "mixed.jsonl", mixed_rows(rows))
    return write_config(tmp_path, qwen3_dir, backends=[
        fast_backend("local", "sglang", url, **backend)],
        datasets=[{"name": "mixed", "path": str(data)}], fsync_interval_s=0)


def _shard_proc(cfg: Path, spec: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "draftgen", "run", str(cfg), "--shard", spec,
                             "--no-live", "--no-probe"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _run_shard(cfg: Path, spec: str) -> Outcome:
    plan = prepare(load_config(cfg), shard=ShardSpec.parse(spec))
    return asyncio.run(Runner(plan, live_display=False).execute())


def _answered(root: Path) -> Counter[str]:
    """How many times each prompt ID was answered, over every folder of the run."""
    return Counter(r["id"] for folder in run_folders(root) for r in read_records(folder,
                                                                                "mixed"))


@pytest.mark.slow
def test_four_shards_side_by_side_make_one_run(tmp_path: Path, qwen3_dir: Path) -> None:
    rows = 240
    root = tmp_path / "run"
    with TestServer(latency_s=0.05) as server:
        cfg = _config(tmp_path, qwen3_dir, server.url, rows, concurrency=2)
        procs = {i: _shard_proc(cfg, f"{i}/4") for i in range(4)}
        killed = ShardSpec(1, 4).folder(root) / "mixed" / "responses.jsonl"
        wait_for_lines(killed, 10, timeout=120)
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].wait()
        for i in (0, 2, 3):
            _, err = procs[i].communicate(timeout=120)
            assert procs[i].returncode == 0, err.decode()[-2000:]
            assert f"shard {i}/4 → {ShardSpec(i, 4).folder(root)}" in err.decode()
        before = {r["id"] for r in read_records(killed.parent.parent, "mixed")}
        st = collect_status(root)
        states = {s.part.label: s.state for s in st.shards}
        assert states == {"0/4": "stopped", "1/4": "killed", "2/4": "stopped", "3/4": "stopped"}
        assert st.datasets["mixed"].total == rows
        assert 10 <= len(before) < st.shards[1].status.datasets["mixed"].total

        outcome = _run_shard(cfg, "1/4")  # resumes in its own folder
        assert outcome.status == "completed", outcome.message
        assert outcome.counters is not None
        assert outcome.counters.total().done_before == len(before)
        requests = sum(server.stats["requests"].values())

    answered = _answered(root)
    assert len(answered) == rows and set(answered.values()) == {1}
    assert not (root / "mixed").exists()  # nothing written outside the shard folders
    assert requests <= rows + 2 * 2  # at most the killed shard's requests in flight again
    assert {r["id"] for r in read_records(killed.parent.parent, "mixed")} >= before
    for i in range(4):
        mine = {r["id"] for r in read_records(ShardSpec(i, 4).folder(root), "mixed")}
        assert all(shard_of(pid, 4) == i for pid in mine)

    st = collect_status(root)
    d = st.datasets["mixed"]
    assert (d.total, d.sums.answers, d.pending, d.duplicates) == (rows, rows, 0, 0)
    assert len(st.shards) == 4 and {s.state for s in st.shards} == {"stopped"}
    assert sum(s.status.total.sums.answers for s in st.shards) == rows
    proc = subprocess.run([sys.executable, "-m", "draftgen.status", str(root), "--json"],
                          capture_output=True, timeout=60)
    data = orjson.loads(proc.stdout)
    assert data["total"]["done"] == rows and len(data["shards"]) == 4
    assert [s["shard"] for s in data["shards"]] == ["0/4", "1/4", "2/4", "3/4"]

    out = tmp_path / "export"
    summary = export_run(root, ExportOptions(format=ExportFormat.parquet, out=out,
                                             shuffle=False, checks=True, text=False,
                                             exclude_truncated=False))
    ids = pq.read_table(out / "data.parquet").column("id").to_pylist()
    assert sorted(ids) == sorted(answered) and summary.written() == rows
    report = audit_run(root, workers=1)
    assert report.ok and report.answers == rows, report.as_json()


@pytest.mark.slow
def test_resharding_answers_only_what_is_missing(tmp_path: Path, qwen3_dir: Path) -> None:
    rows = 120
    root = tmp_path / "run"
    with TestServer(latency_s=0.0) as server:
        cfg = _config(tmp_path, qwen3_dir, server.url, rows, concurrency=8)
        for spec in ("0/4", "1/4"):  # half of a 4-shard run, then re-sharded into 2
            assert _run_shard(cfg, spec).status == "completed"
        first = _answered(root)
        sent_before = sum(server.stats["requests"].values())
        outcomes = [_run_shard(cfg, spec) for spec in ("0/2", "1/2")]
        sent = sum(server.stats["requests"].values()) - sent_before
    assert all(o.status == "completed" for o in outcomes)
    answered = _answered(root)
    assert 0 < len(first) < rows
    assert len(answered) == rows and set(answered.values()) == {1}
    assert sent == rows - len(first)
    d = collect_status(root).datasets["mixed"]
    assert (d.total, d.sums.answers, d.pending) == (rows, rows, 0)
    summary = export_run(root, ExportOptions(format=ExportFormat.parquet, out=tmp_path / "x",
                                             checks=False, text=False,
                                             exclude_truncated=False))
    assert summary.written() == rows


@pytest.mark.slow
def test_stop_signals_every_live_shard_of_the_run(tmp_path: Path, qwen3_dir: Path) -> None:
    with TestServer(latency_s=0.3) as server:
        cfg = _config(tmp_path, qwen3_dir, server.url, 80, concurrency=2)
        procs = [_shard_proc(cfg, f"{i}/2") for i in range(2)]
        root = tmp_path / "run"
        for i in range(2):
            wait_for_lines(ShardSpec(i, 2).folder(root) / "mixed" / "responses.jsonl", 1,
                           timeout=120)
        result = CliRunner().invoke(app, ["stop", str(root)])
        assert result.exit_code == 0, result.output
        assert "(shard 0/2)" in result.output and "(shard 1/2)" in result.output
        for p in procs:
            p.wait(timeout=60)
    assert [p.returncode for p in procs] == [0, 0]
    st = collect_status(root)
    assert {s.status.last_outcome for s in st.shards} == {"stopped"}
    assert st.datasets["mixed"].sums.answers < 80
    shutil.rmtree(root)
    result = CliRunner().invoke(app, ["stop", str(root)])
    assert result.exit_code == 1 and "no draftgen run is live" in result.output


def test_status_of_shards_without_all_of_them_started(tmp_path: Path, qwen3_tok: Tokenizer
                                                      ) -> None:
    """Only shard 0 of 2 has started: the run's prompt total is unknown (not shard 0's
    share) and said so; an empty shard folder (a shard starting) is listed, not refused."""
    root = tmp_path / "run"
    _write_shard(root, "0/2", qwen3_tok, {"d": 6})
    run_json = root / "shards" / "0-of-2" / "run.json"
    data = orjson.loads(run_json.read_bytes())
    data["datasets"] = {"d": {"total": 6, "skipped_budget": 0}}
    run_json.write_bytes(orjson.dumps(data))
    ShardSpec(1, 2).folder(root).mkdir()
    st = collect_status(root)
    assert st.datasets["d"].total is None and st.datasets["d"].sums.answers == 6
    assert [s.state for s in st.shards] == ["stopped", "not started"]
    assert any("prompt totals unknown for d" in n for n in st.notes)
    # with shard 1's share recorded, the total is the sum of both shares
    _write_shard(root, "1/2", qwen3_tok, {"d": 0})
    data["datasets"] = {"d": {"total": 9, "skipped_budget": 0}}
    (root / "shards" / "1-of-2" / "run.json").write_bytes(orjson.dumps(data))
    assert collect_status(root).datasets["d"].total == 15
    # a shard whose folder does not exist at all is named
    _write_shard(root, "0/3", qwen3_tok, {"d": 1})
    _write_shard(root, "2/3", qwen3_tok, {"d": 1})
    # the 2-shard set covers every shard: the totals are known, nothing is said missing
    assert not any("no folder yet" in n for n in collect_status(root).notes)
    shutil.rmtree(root / "shards" / "1-of-2")
    notes = collect_status(root).notes
    assert any("no folder yet for shard 1/2, 1/3: not started" in n for n in notes), notes
