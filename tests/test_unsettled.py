"""Paid requests in flight at a kill: their worst case is journaled when they are sent, shown
by `status`, and counted as spent when the run resumes (their bills are unknown)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.status import collect_status
from draftgen.store import Store
from draftgen.store.journal import read_journal
from draftgen.testing.fake_engine import TestServer
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


def test_generation_ids_are_read_through_checkpoints_and_backwards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("draftgen.store.journal.CHECKPOINT_EVERY", 5)
    store = Store(tmp_path)
    for i in range(120):  # every 25th left open; every 3rd gets two generation IDs (a retry)
        event = {"id": f"p{i}", "dataset": "ds", "t": float(i), "session": 0}
        store.journal({"ev": "sent", **event, "usd": 0.5})
        for attempt in ("a", "b") if i % 3 == 0 else ():
            store.journal({"ev": "gen", **event, "gen": f"gen-{i}-{attempt}"})
        if i % 25:
            store.journal({"ev": "ok", **event})
    store.close()
    expected = {f"p{i}": f"gen-{i}-b" if i % 3 == 0 else None for i in range(0, 120, 25)}
    path = tmp_path / "journal.jsonl"
    tail = read_journal(path)
    assert tail.from_checkpoint and {r.id: r.gen for r in tail.open} == expected
    plain = tmp_path / "plain.jsonl"  # no checkpoints: read backwards
    plain.write_bytes(b"".join(x + b"\n" for x in path.read_bytes().splitlines()
                               if b'"ev":"open"' not in x))
    assert {r.id: r.gen for r in read_journal(plain).open} == expected


def _config(tmp_path: Path, qwen3_dir: Path, url: str, usd: float, **backend: Any) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(40))
    return write_config(tmp_path, qwen3_dir,
                        backends=[fast_backend("or", "openrouter", url, concurrency=IN_FLIGHT,
                                               price=PRICE, **backend)],
                        datasets=[{"name": "d", "path": str(data)}],
                        sampling={"max_tokens": 64}, budget={"usd": usd})


def _stop_with_requests_in_flight(cfg: Path, server: TestServer, how: str,
                                  ready: Callable[[], bool] | None = None) -> None:
    """`kill -9` the run, or `draftgen stop --now` it, once IN_FLIGHT requests are in flight
    (and `ready()`)."""
    proc = subprocess.Popen([sys.executable, "-m", "draftgen", "run", str(cfg), "--no-live",
                             *no_probe()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while server.stats["in_flight"] < IN_FLIGHT or (ready is not None and not ready()):
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


def _billed(server: TestServer, generation: str) -> float:
    """The test server's own record of what it billed (OpenRouter's `GET /generation`)."""
    url = f"{server.url}/api/v1/generation?id={generation}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return float(orjson.loads(resp.read())["data"]["total_cost"])


@pytest.mark.slow
def test_bills_of_requests_killed_in_flight_are_asked_of_openrouter(
        tmp_path: Path, qwen3_dir: Path) -> None:
    """A streamed answer's generation ID is journaled when its headers arrive; after a kill,
    the next session asks OpenRouter what each cost instead of counting its worst case."""
    run_dir = tmp_path / "run"
    journal = run_dir / "journal.jsonl"
    with TestServer(mode="openrouter", prices=(0.0, 1000.0), stream_interval_s=30.0,
                    reasoning_tokens=(3, 5), content_tokens=(3, 5)) as server:
        url = server.url + "/api/v1"
        cfg = _config(tmp_path, qwen3_dir, url, usd=100.0, stream=True)
        _stop_with_requests_in_flight(
            cfg, server, "kill",
            ready=lambda: journal.exists() and journal.read_bytes().count(b'"ev":"gen"')
            >= IN_FLIGHT)
        left = read_journal(journal).open
        assert len(left) == IN_FLIGHT and all(r.gen for r in left), left
        bills = sum(_billed(server, r.gen or "") for r in left)
        assert 0 < bills < IN_FLIGHT * WORST * 0.7

        # Less budget than their worst cases: sent nothing before; now they count as billed.
        server.config.stream_interval_s = 0.0
        sent_before = sum(server.stats["per_prompt"].values())
        outcome = run_config(_config(tmp_path, qwen3_dir, url, usd=IN_FLIGHT * WORST * 0.9,
                                     stream=True))
        assert sum(server.stats["per_prompt"].values()) > sent_before, outcome.message
    sessions = orjson.loads((run_dir / "run.json").read_bytes())["sessions"]
    assert sessions[0]["unsettled_usd"] == pytest.approx(bills, abs=1e-6)
    assert collect_status(run_dir).unsettled_usd == pytest.approx(bills, abs=1e-6)
