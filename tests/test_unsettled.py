"""Paid requests in flight at a kill: their worst case is journaled when they are sent, shown
by `status`, and counted as spent when the run resumes (their bills are unknown)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from draftgen.status import collect_status
from draftgen.store import Store
from draftgen.store.journal import read_journal
from draftgen.testing.server import TestServer
from tests.e2e_helpers import fast_backend, read_records, run_config, write_config, write_jsonl
from tests.reliability.helpers import no_probe, prompt_rows

PRICE = {"prompt": 0.0, "completion": 1000.0}
"""USD per million tokens: a request of max_tokens 64 is worth $0.064 at its worst."""
WORST = 64 * 1000.0 / 1e6
IN_FLIGHT = 8


def test_open_requests_carry_their_worst_case_through_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("draftgen.store.journal.CHECKPOINT_EVERY", 5)
    store = Store(tmp_path)
    for i in range(300):  # every 50th left open (a checkpoint waits 20 events per open one)
        event = {"ev": "sent", "id": f"p{i}", "dataset": "ds", "t": float(i), "session": 0}
        store.journal({**event, **({"usd": 0.25 * (i % 3)} if i % 3 else {})})
        if i % 50:
            store.journal({"ev": "ok", "id": f"p{i}", "dataset": "ds", "t": float(i),
                           "session": 0})
    store.close()
    expected = {f"p{i}": 0.25 * (i % 3) for i in range(0, 300, 50)}
    path = tmp_path / "journal.jsonl"
    lines = path.read_bytes().splitlines()
    tail = read_journal(path)
    assert tail.from_checkpoint and {r.id: r.usd for r in tail.open} == expected

    plain = tmp_path / "plain.jsonl"  # no checkpoints: read backwards
    plain.write_bytes(b"".join(x + b"\n" for x in lines if b'"ev":"open"' not in x))
    assert {r.id: r.usd for r in read_journal(plain).open} == expected

    older = tmp_path / "older.jsonl"  # an older writer's: four-field entries, no usd
    rows = [orjson.loads(x) for x in lines]
    for row in rows:
        row.pop("usd", None)
        if row["ev"] == "open":
            row["open"] = [entry[:4] for entry in row["open"]]
    older.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    assert {r.id: r.usd for r in read_journal(older).open} == dict.fromkeys(expected, 0.0)


def _config(tmp_path: Path, qwen3_dir: Path, url: str, usd: float) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(40))
    return write_config(tmp_path, qwen3_dir,
                        backends=[fast_backend("or", "openrouter", url, concurrency=IN_FLIGHT,
                                               price=PRICE)],
                        datasets=[{"name": "d", "path": str(data)}],
                        sampling={"max_tokens": 64}, budget={"usd": usd})


def _stop_with_requests_in_flight(cfg: Path, server: TestServer, how: str) -> None:
    """`kill -9` the run, or `draftgen stop --now` it, once IN_FLIGHT requests are in flight."""
    proc = subprocess.Popen([sys.executable, "-m", "draftgen", "run", str(cfg), "--no-live",
                             *no_probe()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while server.stats["in_flight"] < IN_FLIGHT:
            assert time.monotonic() < deadline, "the requests never got in flight"
            assert proc.poll() is None, "the run ended before the stop"
            time.sleep(0.02)
        if how == "now":
            subprocess.run([sys.executable, "-m", "draftgen", "stop", "--now",
                            str(Path(cfg).parent / "run")], check=True, capture_output=True,
                           timeout=30)
            assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "now"])
def test_requests_billed_unknown_count_against_the_budget_of_later_sessions(
        tmp_path: Path, qwen3_dir: Path, how: str) -> None:
    run_dir = tmp_path / "run"
    with TestServer(latency_s=5.0, reasoning_tokens=(5, 10), content_tokens=(5, 10)) as slow:
        cfg = _config(tmp_path, qwen3_dir, slow.url, usd=100.0)
        _stop_with_requests_in_flight(cfg, slow, how)
    assert not read_records(run_dir, "d")
    status = collect_status(run_dir)
    if how == "kill":  # in flight at the stop, from the journal
        assert status.total.in_flight == IN_FLIGHT
        assert f"at most ${IN_FLIGHT * WORST:,.4f}" in " ".join(status.notes)
        assert status.as_json()["in_flight_worst_usd"] == pytest.approx(IN_FLIGHT * WORST)
    else:  # aborted: ended, counted by the session itself
        assert status.total.in_flight == 0
        first = orjson.loads((run_dir / "run.json").read_bytes())["sessions"][0]
        assert first["summary"]["unsettled_usd"] == pytest.approx(IN_FLIGHT * WORST)

    with TestServer(reasoning_tokens=(5, 10), content_tokens=(5, 10)) as server:
        # Less left than those requests may have cost: the resumed run must send nothing.
        outcome = run_config(_config(tmp_path, qwen3_dir, server.url,
                                     usd=IN_FLIGHT * WORST * 0.9))
        assert not server.stats["per_prompt"], "sent past the budget"
        assert outcome.status == "budget", outcome.message
        sessions = orjson.loads((run_dir / "run.json").read_bytes())["sessions"]
        killed = IN_FLIGHT * WORST if how == "kill" else None
        assert sessions[0].get("unsettled_usd") == (pytest.approx(killed) if killed else None)
        assert sessions[1]["summary"]["unsettled_usd"] == 0

        # With room beyond them, the run goes on, and counts them once, not once a session.
        outcome = run_config(_config(tmp_path, qwen3_dir, server.url, usd=100.0))
        assert outcome.status == "completed", outcome.message
        assert len(read_records(run_dir, "d")) == 40
        sessions = orjson.loads((run_dir / "run.json").read_bytes())["sessions"]
        assert [s.get("unsettled_usd") for s in sessions][1:] == [None, None]
    after = collect_status(run_dir)
    assert after.unsettled_usd == pytest.approx(IN_FLIGHT * WORST)
    assert after.as_json()["unsettled_usd"] == pytest.approx(IN_FLIGHT * WORST)
    assert f"at most ${IN_FLIGHT * WORST:,.4f}, not in the $ above" in (
        " ".join(after.notes))
