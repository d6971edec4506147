"""`draftgen run --ray N` on a local Ray: shards as tasks, the budget pool as an actor, a killed
shard re-run by Ray."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from draftgen.budget import USD, FilePool
from draftgen.probe import ProbeOptions
from draftgen.store.lock import lock_holder
from draftgen.store.runjson_writer import read_probe
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import wait_for_lines
from tests.shard_helpers import (
    SERVER,
    assert_each_answered_once,
    run_records,
    sharded_config,
    spend,
    uneven_rows,
    worst_case_usd,
)

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()


def _run_on_ray(config: Path, shards: int, probe: ProbeOptions | None = None) -> int:
    from draftgen.scale.ray_run import run_on_ray

    return run_on_ray(config, shards=shards, probe=probe)


def test_the_shards_on_ray_probe_once(local_ray: None, tmp_path: Path, qwen3_dir: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Shard 0 probes; the others start after it and reuse its stored result."""
    rows = uneven_rows([5, 5, 5])
    with TestServer(latency_s=0.05, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=None,
                                concurrency=4)
        config.write_text(config.read_text().replace(str(tmp_path / "run"), "run"))
        monkeypatch.chdir(tmp_path)
        assert _run_on_ray(config, 3, ProbeOptions()) == 0
        sent = server.stats["requests"].get("chat", 0)
    records = run_records(tmp_path / "run")
    assert_each_answered_once(records, rows)
    gates = {i: read_probe(tmp_path / "run" / "shards" / f"{i}-of-3" / "run.json").last_gate
             for i in range(3)}
    assert gates[0]["reused"] == [] and list(gates[0]["verdicts"]) == ["or"], gates[0]
    assert gates[1]["reused"] == gates[2]["reused"] == ["or"], gates
    assert sent > len(rows)  # the probe's own requests: once, see the gates above


def test_four_shards_on_ray_answer_every_prompt_once(local_ray: None, tmp_path: Path,
                                                     qwen3_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    rows = uneven_rows([10, 10, 10, 10])
    monkeypatch.setattr("draftgen.scale.ray_run.PROGRESS_EVERY_S", 0.2)
    with TestServer(latency_s=0.05, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=1.0,
                                concurrency=4)
        # relative paths in the config mean the same in the workers as here
        config.write_text(config.read_text().replace(str(tmp_path / "run"), "run"))
        monkeypatch.chdir(tmp_path)
        assert _run_on_ray(config, 4) == 0
    records = run_records(tmp_path / "run")
    assert_each_answered_once(records, rows)
    # the actor kept the run folder's pool: every lease given back down to its spend
    state = FilePool(tmp_path / "run").read()
    assert sorted(state.leases) == [f"{i}-of-4" for i in range(4)]
    assert state.free(USD) == pytest.approx(1.0 - spend(records), abs=1e-9)
    # while the shards ran, the driver printed the whole run's progress
    progress = [line for line in capsys.readouterr().out.splitlines() if " answered · " in line]
    assert progress, "no progress line"
    assert all(" failed · " in line and " in flight · " in line for line in progress)


def test_a_shared_budget_on_ray_is_spent_to_within_one_request(local_ray: None, tmp_path: Path,
                                                               qwen3_dir: Path) -> None:
    rows = uneven_rows([3, 40, 40, 40])
    budget = 0.015
    with TestServer(latency_s=0.05, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=budget,
                                concurrency=4)
        assert _run_on_ray(config, 4) == 0  # stopped by the budget is a normal end
    records = run_records(tmp_path / "run")
    spent, worst = spend(records), worst_case_usd(records)
    print(f"\nray pool: budget ${budget}, spent ${spent:.6f} in {len(records)} answers, "
          f"unspent {(budget - spent) / worst:.2f} × one request's worst case (${worst:.6f})")
    assert budget - worst <= spent <= budget + 1e-9
    assert len({r["id"] for r in records}) == len(records) < len(rows)


def test_a_killed_shard_is_rerun_by_ray_without_loss(local_ray: None, tmp_path: Path,
                                                     qwen3_dir: Path) -> None:
    rows = uneven_rows([30, 30, 30, 30])
    victim = tmp_path / "run" / "shards" / "0-of-4"
    with TestServer(latency_s=0.1, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=1.0,
                                concurrency=2)
        exit_codes: list[int] = []
        driver = threading.Thread(target=lambda: exit_codes.append(_run_on_ray(config, 4)))
        driver.start()
        wait_for_lines(victim / "d" / "responses.jsonl", 4, timeout=120)
        holder = lock_holder(victim / "lock")
        assert holder is not None and holder["pid"] != os.getpid()
        os.kill(holder["pid"], signal.SIGKILL)  # the worker process dies mid-run
        driver.join(timeout=180)
        assert not driver.is_alive()
    assert exit_codes == [0]
    sessions = orjson.loads((victim / "run.json").read_bytes())["sessions"]
    assert len(sessions) == 2 and sessions[0]["outcome"] is None  # killed, then re-run
    assert sessions[1]["outcome"] == "completed" and sessions[1]["pid"] != holder["pid"]
    assert_each_answered_once(run_records(tmp_path / "run"), rows)
    lease = FilePool(tmp_path / "run").read().leases["0-of-4"]
    assert lease.done  # the re-run re-adopted the dead session's lease and gave it back
