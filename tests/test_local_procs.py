"""`draftgen run CONFIG --procs N`: one run as N shard processes on this machine, started by the
real command line (a subprocess) against one loopback test server.

What is checked: every prompt answered once over the shard folders and read back as one run;
the backends' concurrency and the dollar budget shared by the processes; the processes dying
with a launcher killed by SIGKILL, and stopping gracefully on its SIGINT, with a second run
answering the rest; the option combinations `--procs` refuses before starting anything."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson
import pytest
import yaml

from draftgen.audit import audit_run
from draftgen.budget import USD, FilePool
from draftgen.config import load_config
from draftgen.scale.local import share_concurrency
from draftgen.status import collect_status
from draftgen.store.shards import ShardSpec, live_parts, run_parts, shard_of
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, wait_for_lines, write_config, write_jsonl
from tests.shard_helpers import (
    SERVER,
    assert_each_answered_once,
    run_records,
    sharded_config,
    spend,
    uneven_rows,
    worst_case_usd,
)

_ENV = {**os.environ, "COLUMNS": "200"}
"""The final table printed on one line per row, whatever the path of the run folder."""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG and /proc are Linux's")


def _run_cmd(config: Path, procs: int | str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "draftgen", "run", str(config), "--procs", str(procs),
            "--no-probe", "--no-live", *extra]


def _run_procs(config: Path, procs: int, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_run_cmd(config, procs), capture_output=True, text=True,
                          timeout=timeout, env=_ENV)


def _start_procs(config: Path, procs: int, env: dict[str, str] | None = None
                 ) -> subprocess.Popen[str]:
    return subprocess.Popen(_run_cmd(config, procs), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or _ENV)


@contextlib.contextmanager
def _launched(config: Path, procs: int, env: dict[str, str] | None = None
              ) -> Iterator[subprocess.Popen[str]]:
    """`_start_procs`, killed on the way out if a failed check left it running."""
    launcher = _start_procs(config, procs, env)
    try:
        yield launcher
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _requests(server: TestServer) -> int:
    return sum(server.stats["requests"].values())


def _status_json(root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "draftgen", "status", str(root), "--json"],
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return orjson.loads(proc.stdout)


def _wait_for_answers(root: Path, procs: int, n: int, timeout: float = 60) -> None:
    for i in range(procs):
        wait_for_lines(ShardSpec(i, procs).folder(root) / "d" / "responses.jsonl", n, timeout)


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (dead, not yet reaped by its new parent)."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _shard_lines(stdout: str, procs: int, status: str) -> list[str]:
    """The launcher's line for each shard's end, checked to say `status`."""
    lines = [line for line in stdout.splitlines() if line.startswith("shard ")]
    for i in range(procs):
        assert any(line.startswith(f"shard {i}/{procs}: {status} after ") for line in lines), (
            i, stdout)
    return lines


# ---- what each process runs ----------------------------------------------------------------


def test_each_process_gets_its_share_of_the_concurrency(tmp_path: Path, qwen3_dir: Path) -> None:
    config = write_config(tmp_path, qwen3_dir, backends=[
        fast_backend("eight", "sglang", "http://127.0.0.1:9", concurrency=8),
        fast_backend("five", "sglang", "http://127.0.0.1:9", concurrency=5),
        fast_backend("fleet", "sglang", "http://127.0.0.1:9",
                     fleet={"workers": 2, "slots_per_worker": 5}),
    ], datasets=[{"name": "d", "path": str(tmp_path / "d.jsonl")}])
    cfg = load_config(config)
    halves = [share_concurrency(cfg, ShardSpec(i, 2)) for i in range(2)]
    assert [(h.backends[0].concurrency, h.backends[1].concurrency) for h in halves] == [
        (4, 3), (4, 2)]  # 5 over 2: the first shard takes the odd one, 5 in all
    for h in halves:
        fleet = h.backends[2].fleet
        assert fleet is not None and fleet.workers == 2
    assert [h.backends[2].fleet.slots_per_worker for h in halves] == [3, 2]  # type: ignore[union-attr]
    thirds = [share_concurrency(cfg, ShardSpec(i, 3)).backends[1].concurrency for i in range(3)]
    assert thirds == [2, 2, 1]
    assert share_concurrency(cfg, ShardSpec(0, 1)).backends[1].concurrency == 5
    # never below one in flight per process
    assert [share_concurrency(cfg, ShardSpec(i, 8)).backends[1].concurrency
            for i in range(8)] == [1] * 8
    # the run's config is left as it was; everything else is the same
    assert [b.concurrency for b in cfg.backends[:2]] == [8, 5]
    assert cfg.backends[2].fleet is not None and cfg.backends[2].fleet.slots_per_worker == 5
    half = halves[0]
    assert half.model_dump(exclude={"backends"}) == cfg.model_dump(exclude={"backends"})
    assert [b.model_dump(exclude={"concurrency", "fleet"}) for b in half.backends] == [
        b.model_dump(exclude={"concurrency", "fleet"}) for b in cfg.backends]


# ---- whole runs ------------------------------------------------------------------------------


def test_three_procs_answer_every_prompt_once_as_one_run(tmp_path: Path, qwen3_dir: Path
                                                         ) -> None:
    rows = uneven_rows([15, 15, 15])
    root = tmp_path / "run"
    with TestServer(latency_s=0.02, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=None,
                                concurrency=6)
        proc = _run_procs(config, 3)
        requests, most = _requests(server), server.stats["max_in_flight"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 shards" in proc.stdout, proc.stdout
    _shard_lines(proc.stdout, 3, "completed")
    assert sorted(p.name for p in (root / "shards").iterdir()) == [
        "0-of-3", "1-of-3", "2-of-3"]
    assert not (root / "d").exists()  # nothing written outside the shard folders
    records = run_records(root)
    assert_each_answered_once(records, rows)
    for i in range(3):
        folder = ShardSpec(i, 3).folder(root)
        mine = [orjson.loads(line)["id"]
                for line in (folder / "d" / "responses.jsonl").read_bytes().splitlines()]
        assert len(mine) == 15 and all(shard_of(pid, 3) == i for pid in mine)
    assert requests == len(rows)  # nothing sent twice
    assert most <= 6

    data = _status_json(root)
    assert data["total"]["done"] == len(rows) and not data["live"]
    d = data["datasets"]["d"]
    assert (d["total"], d["done"], d["pending"], d["failed"]) == (len(rows), len(rows), 0, 0)
    assert [s["shard"] for s in data["shards"]] == ["0/3", "1/3", "2/3"]
    assert {(s["state"], s["last_outcome"]) for s in data["shards"]} == {
        ("stopped", "completed")}
    assert [s["done"] for s in data["shards"]] == [15, 15, 15]
    assert data["total"]["cost_usd"] == pytest.approx(spend(records), abs=1e-5)


def test_the_processes_share_the_backend_concurrency(tmp_path: Path, qwen3_dir: Path) -> None:
    """concurrency 8 over 2 processes: 4 each, so the server sees at most 8 in flight (and
    more than one process's 4: both ran at once)."""
    rows = uneven_rows([24, 24])
    root = tmp_path / "run"
    # 1 s per request until both processes have answers: each keeps its share in flight
    with TestServer(latency_s=1.0, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=None,
                                concurrency=8)
        with _launched(config, 2) as launcher:
            _wait_for_answers(root, 2, 4)
            server.config.latency_s = 0.01  # read per request: the rest need not be slow
            out, err = launcher.communicate(timeout=120)
        most, requests = server.stats["max_in_flight"], _requests(server)
    assert launcher.returncode == 0, out[-3000:] + err[-3000:]
    _shard_lines(out, 2, "completed")
    assert requests == len(rows)
    assert 4 < most <= 8, most
    assert_each_answered_once(run_records(root), rows)


@pytest.mark.slow
def test_the_processes_share_one_dollar_budget(tmp_path: Path, qwen3_dir: Path) -> None:
    rows = uneven_rows([40, 40, 40])
    budget = 0.02  # ~50 answers of ~$0.0004 out of 120; one request's worst case ~$0.0008
    root = tmp_path / "run"
    with TestServer(latency_s=0.2, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=budget,
                                concurrency=6)
        proc = _run_procs(config, 3)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 shards" in proc.stdout and "budget" in proc.stdout, proc.stdout
    records = run_records(root)
    spent, worst = spend(records), worst_case_usd(records)
    assert spent <= budget + 1e-9  # billed as priced: no overshoot over the processes
    assert spent >= budget - worst  # and less than one request's worst case left unspent
    assert len({r["id"] for r in records}) == len(records) < len(rows)
    st = collect_status(root)
    assert st.total.sums.cost == pytest.approx(spent, abs=1e-9)
    for shard in st.shards:  # stopped by the budget (unless it answered all of its share)
        d = shard.status.datasets["d"]
        assert shard.status.last_outcome == "budget" or d.sums.answers == d.total == 40, (
            shard.part.label, shard.status.last_outcome, d.sums.answers)
    assert sum(s.status.last_outcome == "budget" for s in st.shards) >= 2
    state = FilePool(root).read()
    assert sorted(state.leases) == ["0-of-3", "1-of-3", "2-of-3"]
    assert all(lease.done for lease in state.leases.values())
    assert state.free(USD) == pytest.approx(budget - spent, abs=1e-9)
    # the launcher's summary ends with the pool's line
    held = f"budget.usd: ${budget - state.free(USD):.4f} of ${budget:.4f} held by shards"
    assert held in " ".join(proc.stdout.split()), proc.stdout


# ---- signals ---------------------------------------------------------------------------------


@linux_only
@pytest.mark.slow
def test_killing_the_launcher_kills_its_processes_and_a_rerun_loses_nothing(
    tmp_path: Path, qwen3_dir: Path
) -> None:
    rows = uneven_rows([40, 40, 40])
    root = tmp_path / "run"
    # 2 in flight per process, 0.5 s each: a process alone would run ~10 s after the kill
    with TestServer(latency_s=0.5, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=None,
                                concurrency=6)
        scratch = tmp_path / "tmp"  # the launcher's temporary folder, left by the kill
        scratch.mkdir()
        with _launched(config, 3, env={**_ENV, "TMPDIR": str(scratch)}) as launcher:
            _wait_for_answers(root, 3, 2)
            live = live_parts(run_parts(root))
            pids = [int(holder["pid"]) for _, holder in live]
            assert [p.label for p, _ in live] == ["0/3", "1/3", "2/3"]
            for pid in pids:  # the lock holders are the launcher's own children
                stat = _proc_stat(pid)
                assert stat is not None and int(stat[1]) == launcher.pid, (pid, stat)
            os.kill(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
                any(_running(pid) for pid in pids) or live_parts(run_parts(root))):
            time.sleep(0.05)
        survivors = [pid for pid in pids if _running(pid)]
        for pid in survivors:  # leave no orphan behind when this fails
            os.kill(pid, signal.SIGKILL)
        assert survivors == []
        assert live_parts(run_parts(root)) == []
        st = collect_status(root)
        assert [s.state for s in st.shards] == ["killed"] * 3
        before = st.datasets["d"].sums.answers
        assert 6 <= before < len(rows)

        server.config.latency_s = 0.01  # read per request: the rerun need not be slow
        again = _run_procs(config, 3)
        requests = _requests(server)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    _shard_lines(again.stdout, 3, "completed")
    assert_each_answered_once(run_records(root), rows)
    # at most the requests in flight at the kill (2 per process) were sent again
    assert requests <= len(rows) + 6, requests
    st = collect_status(root)
    d = st.datasets["d"]
    assert (d.total, d.sums.answers, d.pending, d.duplicates) == (len(rows), len(rows), 0, 0)
    assert {s.state for s in st.shards} == {"stopped"}


@pytest.mark.slow
def test_sigint_to_the_launcher_stops_every_process_gracefully(tmp_path: Path, qwen3_dir: Path
                                                              ) -> None:
    rows = uneven_rows([40, 40])
    root = tmp_path / "run"
    with TestServer(latency_s=0.3, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=None,
                                concurrency=4)
        with _launched(config, 2) as launcher:
            _wait_for_answers(root, 2, 2)
            os.kill(launcher.pid, signal.SIGINT)
            out, err = launcher.communicate(timeout=60)
        sent_before = _requests(server)
        assert launcher.returncode == 0, out[-3000:] + err[-3000:]
        assert "2 shards" in out and "stopped" in out, out
        _shard_lines(out, 2, "stopped")
        st = collect_status(root)
        assert [(s.state, s.status.last_outcome) for s in st.shards] == [
            ("stopped", "stopped")] * 2
        d = st.datasets["d"]
        assert d.in_flight == 0 and d.bad_lines == 0 and not d.torn_tail_bytes
        records = run_records(root)  # every line whole
        assert 4 <= len(records) < len(rows)
        assert len({r["id"] for r in records}) == len(records)
        assert sent_before == len(records)  # the answers in flight landed and were kept
        report = audit_run(root, workers=1)
        assert report.ok and report.answers == len(records), report.as_json()

        server.config.latency_s = 0.01  # read per request: the rerun need not be slow
        again = _run_procs(config, 2)
        requests = _requests(server)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    _shard_lines(again.stdout, 2, "completed")
    assert_each_answered_once(run_records(root), rows)
    assert requests == len(rows)  # only what the first run had not answered was sent
    assert collect_status(root).datasets["d"].pending == 0


# ---- what --procs refuses --------------------------------------------------------------------


def _refused(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_ENV)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize(("extra", "message"), [
    (("--shard", "0/2"), "--procs runs every shard itself: drop --shard"),
    (("--ray", "2"), "--procs runs every shard itself: drop --shard and --ray"),
    (("--dry-run",), "--dry-run sends nothing: drop --procs"),
])
def test_procs_with_another_way_to_shard_is_refused(tmp_path: Path, qwen3_dir: Path,
                                                    extra: tuple[str, ...], message: str) -> None:
    rows = uneven_rows([3, 3])
    with TestServer(**SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=None,
                                concurrency=2)
        proc = _refused(_run_cmd(config, 2, *extra))
        assert _requests(server) == 0
    assert proc.returncode == 2
    assert message in " ".join(proc.stderr.split()), proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started


def test_procs_below_one_is_refused(tmp_path: Path) -> None:
    proc = _refused(_run_cmd(tmp_path / "run.yaml", 0))
    assert "--procs" in proc.stderr, proc.stderr


def test_procs_with_a_managed_llama_server_is_refused(tmp_path: Path, qwen3_dir: Path) -> None:
    """Each process would start its own llama-server for the same model."""
    data = write_jsonl(tmp_path / "d.jsonl", uneven_rows([2, 2]))
    config = write_config(tmp_path, qwen3_dir, backends=[
        {"name": "local", "type": "llamacpp", "model": str(tmp_path / "model.gguf")}],
        datasets=[{"name": "d", "path": str(data)}])
    load_config(config)  # a valid config: --procs is what is refused
    proc = _refused(_run_cmd(config, 2))
    assert proc.returncode == 2
    text = " ".join(proc.stderr.split())
    assert "--procs 2: backend(s) local start their own llama-server" in text, proc.stderr
    assert not (tmp_path / "run").exists()


def test_procs_with_an_unset_api_key_is_refused_before_starting(tmp_path: Path,
                                                                qwen3_dir: Path) -> None:
    """As `draftgen run` without --procs: the variable named, nothing started."""
    config = sharded_config(tmp_path, qwen3_dir, "http://127.0.0.1:9", uneven_rows([2, 2]),
                            budget_usd=None, concurrency=2)
    cfg = yaml.safe_load(config.read_text())
    cfg["backends"][0]["api_key_env"] = "DRAFTGEN_TEST_UNSET_KEY"
    config.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in _ENV.items() if k != "DRAFTGEN_TEST_UNSET_KEY"}
    proc = subprocess.run(_run_cmd(config, 2), capture_output=True, text=True, timeout=60,
                          env=env)
    assert "environment variable DRAFTGEN_TEST_UNSET_KEY (api_key_env) is not set" in " ".join(
        proc.stderr.split()), proc.stdout + proc.stderr
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists()  # no process was started


def test_sigint_during_the_probe_stops_the_run(tmp_path: Path, qwen3_dir: Path) -> None:
    """Ctrl-C while shard 0 probes (the others wait for its probe gate): no prompt answered."""
    rows = uneven_rows([10, 10])
    root = tmp_path / "run"
    with TestServer(latency_s=1.0, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=None,
                                concurrency=10)
        cmd = [c for c in _run_cmd(config, 2) if c != "--no-probe"]  # with the probe
        launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=_ENV)
        try:
            deadline = time.monotonic() + 60
            while not server.stats["requests"].get("chat") and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.stats["requests"].get("chat"), "shard 0 never probed"
            os.kill(launcher.pid, signal.SIGINT)  # shard 0 waits on its first probe request
            out, err = launcher.communicate(timeout=60)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    assert run_records(root) == [], out + err[-3000:]
    assert "completed" not in out, out
    assert launcher.returncode == 0, out + err[-3000:]  # stopped, as `draftgen run` is
    assert "shard 0/2: stopped" in out and "1/2" not in out.split("shards →")[0], out
    assert "Traceback" not in err, err[-3000:]
