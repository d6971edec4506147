"""Budgets that hold, local-first routing, cool-downs, and stops that lose nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from draftgen.budget import Ledger, PriceWatch
from draftgen.config import ConfigError, load_config
from draftgen.config.backends import Price
from draftgen.run import Runner, prepare
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import (
    fast_backend,
    mixed_rows,
    read_failures,
    read_records,
    run_config,
    wait_for_lines,
    write_config,
    write_jsonl,
)

PRICE = (0.5, 2.5)  # USD per million tokens, prompt / completion


def _journal(run_dir: Path) -> list[dict]:
    return [orjson.loads(x) for x in (run_dir / "journal.jsonl").read_bytes().splitlines()]


# ---- the ledger on its own -------------------------------------------------------------


def _per_prompt_token(usd_per_million: float) -> PriceWatch:
    return PriceWatch(Price(prompt=usd_per_million, completion=0))


def test_ledger_reserves_worst_case_and_settles_real_usage() -> None:
    ledger = Ledger(usd=1.0)
    ledger.add_dataset("d", max_output_tokens=None, spent_tokens=0)
    price = PriceWatch(Price(prompt=1_000_000, completion=1_000_000))  # $1 a token: easy sums
    first = ledger.admit("d", max_tokens=0, prompt_tokens=0, price=price)  # free request
    assert first.reservation is not None and first.reservation.usd == 0
    a = ledger.admit("d", max_tokens=0, prompt_tokens=1, price=_per_prompt_token(600_000))
    assert a.reservation is not None and ledger.reserved_usd == pytest.approx(0.6)
    b = ledger.admit("d", max_tokens=0, prompt_tokens=1, price=_per_prompt_token(500_000))
    assert b.reservation is None and b.exhausted and b.settling  # 0.6 + 0.5 > 1, wait
    ledger.settle(a.reservation, output_tokens=0, cost=0.3)
    b = ledger.admit("d", max_tokens=0, prompt_tokens=1, price=_per_prompt_token(500_000))
    assert b.reservation is not None
    ledger.settle(b.reservation, 0, 0.5)
    c = ledger.admit("d", max_tokens=0, prompt_tokens=1, price=_per_prompt_token(500_000))
    assert c.exhausted and not c.settling  # nothing in flight: the budget is spent


def test_ledger_token_budget_cuts_max_tokens() -> None:
    ledger = Ledger()
    ledger.add_dataset("d", max_output_tokens=1000, spent_tokens=700)
    assert ledger.max_tokens_for("d", 512) == 300
    r = ledger.admit("d", 300, 10, None).reservation
    assert r is not None and ledger.max_tokens_for("d", 512) is None
    assert not ledger.token_budget_done("d")  # in flight: may leave room
    ledger.settle(r, output_tokens=200, cost=0)
    assert ledger.max_tokens_for("d", 512) == 100 and ledger.max_tokens_for("d", 40) == 40
    ledger.settle(ledger.admit("d", 100, 10, None).reservation, 50, 0)
    # 50 left: below a useful answer (min_request_tokens) unless the run asks for less
    assert ledger.max_tokens_for("d", 512) is None and ledger.max_tokens_for("d", 40) == 40
    assert ledger.token_budget_done("d")


# ---- budgets end to end ------------------------------------------------------------------


@pytest.mark.slow
def test_dollar_budget_holds_with_1000_requests_in_flight(tmp_path: Path, qwen3_dir: Path) -> None:
    rows = mixed_rows(3000)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    budget = 1.0
    with TestServer(mode="openrouter", prices=PRICE, latency_s=2.5,
                    reasoning_tokens=(20, 120), content_tokens=(20, 120)) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("or", "openrouter", server.url, concurrency=2000, logprobs=False)],
            datasets=[{"name": "d", "path": str(data)}], budget={"usd": budget},
            sampling={"temperature": 0.6, "max_tokens": 300})
        outcome = run_config(cfg)
        peak = server.stats["max_in_flight"]
    records = read_records(tmp_path / "run", "d")
    spent = sum(r["usage"]["cost"] for r in records)
    worst_case = (60 * PRICE[0] + 300 * PRICE[1]) / 1e6
    assert outcome.status == "budget", outcome.message
    assert peak >= 1000, peak
    assert spent <= budget + 1e-9  # the documented bound: no overshoot when billed as priced
    assert spent >= budget - 300 * worst_case  # and the budget was actually used
    t = outcome.counters.total()
    assert t.skipped == 3000 - len(records) > 0
    assert abs(t.cost - spent) < 1e-6


def test_token_budget_per_dataset_and_max_prompts(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(200))
    small = write_jsonl(tmp_path / "s.jsonl", mixed_rows(50, tag="s"))
    with TestServer(latency_s=0.01) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url, concurrency=16)],
            datasets=[{"name": "d", "path": str(data), "max_output_tokens": 6000},
                      {"name": "s", "path": str(small), "max_prompts": 20}],
            sampling={"max_tokens": 512})
        outcome = run_config(cfg)
        bodies = list(server.stats["bodies"])
    assert outcome.status == "completed"
    d = read_records(tmp_path / "run", "d")
    assert sum(len(r["output_ids"]) for r in d) <= 6000
    assert 0 < len(d) < 200
    assert outcome.counters.datasets["d"].skipped == 200 - len(d)
    assert len(read_records(tmp_path / "run", "s")) == 20
    assert outcome.counters.datasets["s"].skipped == 30
    assert all(b["sampling_params"]["max_new_tokens"] <= 512 for b in bodies)
    assert any(b["sampling_params"]["max_new_tokens"] < 512 for b in bodies)  # cut to what's left
    # resume: the budget counts what earlier sessions spent
    outcome = run_config(cfg)
    assert outcome.counters.datasets["d"].done == 0
    assert outcome.counters.datasets["s"].done == 0


def test_spend_rate_is_throttled(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(400))
    rate = 0.03  # USD per minute
    with TestServer(mode="openrouter", prices=PRICE, latency_s=0.01) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("or", "openrouter", server.url, concurrency=64, logprobs=False)],
            datasets=[{"name": "d", "path": str(data)}], budget={"usd_per_minute": rate},
            sampling={"max_tokens": 512})
        runner = Runner(prepare(load_config(cfg)), live_display=False)

        async def run_for(seconds: float):
            asyncio.get_running_loop().call_later(seconds, runner.request_stop)
            return await runner.execute()

        started = time.monotonic()
        outcome = asyncio.run(run_for(4.0))
        elapsed = time.monotonic() - started
    assert outcome.status == "stopped"
    spent = sum(r["usage"]["cost"] for r in read_records(tmp_path / "run", "d"))
    worst = (80 * PRICE[0] + 512 * PRICE[1]) / 1e6
    # one minute's worth to start with, then the rate; in flight at the stop finish
    assert spent <= rate + rate * elapsed / 60 + 64 * worst
    assert len(read_records(tmp_path / "run", "d")) < 400


def test_paid_backend_without_a_price_is_refused_under_a_budget(
    tmp_path: Path, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOME_KEY", "k")
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(5))
    with TestServer() as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("api", "openai", server.url, api_key_env="SOME_KEY")],
            datasets=[{"name": "d", "path": str(data)}], budget={"usd": 1.0})
        with pytest.raises(ConfigError, match="no price known"):
            run_config(cfg)
        assert sum(server.stats["requests"].values()) == 0


def test_openrouter_price_comes_from_its_model_listing(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(20))
    with TestServer(mode="openrouter", prices=PRICE) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("or", "openrouter", server.url, logprobs=False)],
            datasets=[{"name": "d", "path": str(data)}], budget={"usd": 10.0})
        runner = Runner(prepare(load_config(cfg)), live_display=False)
        outcome = asyncio.run(runner.execute())
    assert outcome.status == "completed"
    assert runner.prices["or"].listed == Price(prompt=0.5, completion=2.5)


# ---- routing -------------------------------------------------------------------------------


def test_paid_overflow_idles_while_local_has_room(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(40))
    with TestServer() as local, TestServer(mode="openrouter", prices=PRICE) as paid:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", local.url, concurrency=64),
            fast_backend("paid", "openrouter", paid.url, concurrency=64, priority=1)],
            datasets=[{"name": "d", "path": str(data)}])
        assert run_config(cfg).status == "completed"
        paid_requests = paid.stats["requests"]
    assert paid_requests == {"models": 1}  # its price was looked up; nothing was sent
    assert Counter(r["backend"] for r in read_records(tmp_path / "run", "d")) == {"local": 40}


def test_answers_from_excluded_providers_are_flagged(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(10))
    with TestServer(mode="openrouter", providers=["Fireworks", "DeepInfra"]) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("or", "openrouter", server.url,
                         provider={"ignore": ["fireworks"], "allow_fallbacks": True})],
            datasets=[{"name": "d", "path": str(data)}])
        assert run_config(cfg).status == "completed"
    for r in read_records(tmp_path / "run", "d"):
        excluded = "provider_excluded_by_config" in r["flags"]
        assert excluded == (r["provider"] == "Fireworks")


def test_a_failing_backend_cools_down_and_others_take_its_share(
    tmp_path: Path, qwen3_dir: Path
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(120))
    with TestServer(fault_rates={"500": 1.0}) as bad, TestServer(latency_s=0.02) as good:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("bad", "openai", bad.url, concurrency=2, max_retries=0,
                         cooldown_after=3, cooldown_s=600, logprobs=False),
            fast_backend("good", "sglang", good.url, concurrency=2)],
            datasets=[{"name": "d", "path": str(data)}])
        outcome = run_config(cfg)
        bad_requests = sum(bad.stats["requests"].values())
    assert outcome.status == "completed"
    assert bad_requests <= 3 + 2  # cool-down after 3 in a row; at most 2 more in flight
    assert len(read_failures(tmp_path / "run", "d")) == bad_requests
    assert len(read_records(tmp_path / "run", "d")) == 120 - bad_requests


# ---- stopping --------------------------------------------------------------------------------


def _start_run(cfg: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "draftgen", "run", str(cfg), "--no-live"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["graceful", "now", "kill"])
def test_stop_then_resume_loses_and_duplicates_nothing(
    tmp_path: Path, qwen3_dir: Path, how: str
) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(600))
    run_dir = tmp_path / "run"
    responses = run_dir / "d" / "responses.jsonl"
    with TestServer(latency_s=0.5) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url, concurrency=40)],
            datasets=[{"name": "d", "path": str(data)}])
        proc = _start_run(cfg)
        wait_for_lines(responses, 50)
        if how == "kill":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            args = ["--now"] if how == "now" else []
            stop = subprocess.run([sys.executable, "-m", "draftgen", "stop", str(run_dir), *args],
                                  capture_output=True, text=True, timeout=30)
            assert stop.returncode == 0, stop.stderr
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == {"graceful": 0, "now": 130, "kill": -9}[how], out
        before = {r["id"] for r in read_records(run_dir, "d")}
        journal = _journal(run_dir)
        sent = {e["id"] for e in journal if e["ev"] == "sent"}
        ended = {e["id"] for e in journal if e["ev"] in ("ok", "failed", "dropped")}
        if how == "graceful":  # requests in flight were waited for and saved
            assert sent == ended == before
            assert b"stopped" in out
        elif how == "now":  # dropped at once, and journaled as such
            assert sent == ended and before < sent
        else:  # kill -9: in flight = sent, neither answered (in the data) nor ended
            in_flight = sent - before - ended
            assert before <= sent and ended <= before and in_flight
        outcome = run_config(cfg)
    assert outcome.status == "completed"
    ids = [r["id"] for r in read_records(run_dir, "d")]
    assert len(ids) == len(set(ids)) == 600 and before <= set(ids)


@pytest.mark.slow
def test_a_second_run_on_a_live_folder_is_refused(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(100))
    with TestServer(latency_s=0.5) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url, concurrency=4)],
            datasets=[{"name": "d", "path": str(data)}])
        first = _start_run(cfg)
        try:
            wait_for_lines(tmp_path / "run" / "d" / "responses.jsonl", 1)
            second = subprocess.run([sys.executable, "-m", "draftgen", "run", str(cfg)],
                                    capture_output=True, text=True, timeout=60)
            assert second.returncode == 2
            assert f"pid {first.pid}" in second.stderr and "in use" in second.stderr
        finally:
            first.kill()
            first.wait()
