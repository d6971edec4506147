"""2. Server faults: every fault kind of the test server, mixed at realistic rates, and each
kind on its own until retries run out. Every prompt ends answered or recorded as failed with
its kind; nothing crashes, retries are bounded, no answer is recorded twice; a backend out of
credits is taken out of the run (saying why) while the others carry on."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from draftgen.testing.fake_engine import (
    BAD_IDS,
    BAD_TOOL_CALLS,
    FAULT_KINDS,
    IGNORES_MAX_TOKENS,
    SHIFTED_IDS,
    TOO_MANY_IDS,
    TestServer,
)
from tests.e2e_helpers import fast_backend, run_config, write_config
from tests.reliability.helpers import (
    ServerProcess,
    check_folder,
    draftgen,
    no_probe,
    prompt_rows,
    write_jsonl,
)

RATES = {  # per request; about one request in five fails
    "429": 0.03, "429ra": 0.02, "retry_after_hour": 0.004, "402budget": 0.02,
    "500": 0.01, "502": 0.02, "503": 0.01, "408": 0.01, "reset": 0.01, "reset_stream": 0.01,
    "no_done": 0.01, "error_body": 0.01, "sse_error": 0.01, "malformed": 0.01, "empty": 0.01,
    "slow": 0.004,
}
"""Every transient fault kind. 402 out of credits is on the paid server only (below)."""

FAILURE_KINDS = {  # fault kind -> the kind a request failing with it is recorded under
    "429": "rate_limited", "429ra": "rate_limited", "retry_after_hour": "rate_limited",
    "402budget": "in_flight_budget", "500": "server_error", "502": "provider_error",
    "503": "unavailable", "408": "timeout", "reset": "connection",
    "reset_stream": "connection", "no_done": "incomplete_stream",
    "error_body": "provider_error", "sse_error": "provider_error", "malformed": "bad_response",
    "empty": "empty_answer", "slow": "timeout", "400": "bad_request", "403": "moderation",
    **dict.fromkeys(BAD_TOOL_CALLS, "bad_response"),
    # An answer of megabytes for a short max_tokens passes what those tokens can spell first
    # (`backends.base.answer_byte_bound`); test_bad_answers meets the cap with a roomy one.
    **dict.fromkeys(("huge_body", "gzip_bomb", "huge_chunked"), "bad_response"),
}
N_PROMPTS = 1500
TIMEOUT_S = 1.5
MAX_RETRIES = 3


def _fault_args(rates: dict[str, float]) -> list[str]:
    return [a for kind, p in rates.items() for a in ("--fault-rate", f"{kind}={p}")]


def test_every_fault_kind_is_mapped(reliability) -> None:
    """The table below covers every kind the test server can inject."""
    case = reliability("2. Server faults", "every fault kind of the test server has an expected "
                       "outcome in the suite")
    case.runs = 1
    assert set(FAULT_KINDS) - set(FAILURE_KINDS) == {  # backend-level; engine IDs: scenario 9
        "401", "402credits", *BAD_IDS, TOO_MANY_IDS, SHIFTED_IDS, IGNORES_MAX_TOKENS}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mixed_faults_at_realistic_rates(tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability("2. Server faults", "all fault kinds mixed at realistic rates (~1 in 5 "
                       "requests), 1,500 prompts, 3 backends (JSON, SSE, SGLang); the paid SSE "
                       "backend then runs out of credits (402); run twice")
    rows = prompt_rows(N_PROMPTS)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    run_dir = tmp_path / "run"
    credits = {"402credits": 0.01}  # the paid backend is out of credits after ~100 requests
    with ServerProcess("--mode", "openrouter", "--prices", "0.5,2.5", "--latency", "0.05",
                       "--reasoning-tokens", "5,40", "--content-tokens", "5,40",
                       *_fault_args(RATES | credits), "--seed", "1") as paid, \
         ServerProcess("--latency", "0.05", "--reasoning-tokens", "5,40",
                       "--content-tokens", "5,40", *_fault_args(RATES), "--seed", "2") as local:
        retry = {"max_retries": MAX_RETRIES, "timeout_s": TIMEOUT_S, "backoff_max_s": 2.0,
                 "cooldown_after": 1000}
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("paid", "openrouter", paid.url, concurrency=64, stream=True,
                         price={"prompt": 0.5, "completion": 2.5}, **retry),
            fast_backend("json", "openai", local.url, concurrency=64, **retry),
            fast_backend("engine", "sglang", local.url, concurrency=32, **retry)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 128},
            max_attempts=3)
        sessions = []
        for _ in range(2):
            t0 = time.monotonic()
            proc = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=240)
            sessions.append((proc, time.monotonic() - t0))
            check = check_folder(run_dir)
            answered = check.ids("d")
            failed_now = {f["id"] for f in check.failed.get("d", [])}
            case.runs += 1
            case.crashed += proc.returncode != 0 or "Traceback" in proc.stderr
            case.duplicated += check.duplicated
            case.corrupt += len(check.corrupt)
            # every prompt answered or recorded as failed (this session or an earlier one)
            case.lost += len({f"d/{r['id']}" for r in rows} - answered - failed_now)
        faults = Counter(paid.stats()["faults"]) + Counter(local.stats()["faults"])
        requests = sum(paid.stats()["requests"].get(k, 0) + local.stats()["requests"].get(k, 0)
                       for k in ("chat", "generate"))
    failures = check.failed["d"]
    kinds = Counter(f["kind"] for f in failures)
    faults.pop("noncanonical", None)
    case.extra.update(faults=dict(faults), failure_kinds=dict(kinds), requests=requests,
                      wall_s=[round(s, 1) for _, s in sessions])
    case.note(f"{sum(faults.values()):,} faults injected over {requests:,} requests "
              f"({len(faults)} kinds); {len(check.ids('d')):,}/{N_PROMPTS:,} answered after 2 "
              f"runs, {len(failures)} failures recorded with their kind "
              f"({', '.join(f'{k} {n}' for k, n in kinds.most_common())}); paid backend out "
              f"of credits → taken out of the run, the others carried on; "
              f"runs took {', '.join(f'{s:.0f}s' for _, s in sessions)}")
    for proc, wall in sessions:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        assert wall < 120  # bounded: no retry loops, no hour-long Retry-After waits
    first = sessions[0][0].stderr
    assert "backend paid taken out of the run" in first and "Insufficient credits" in first
    assert set(faults) >= set(RATES) | set(credits), set(RATES) - set(faults)
    assert not check.corrupt and check.duplicated == 0
    assert case.lost == 0
    assert set(kinds) <= set(FAILURE_KINDS.values()), kinds
    assert all(f["message"] and f["backend"] for f in failures)
    # bounded retries: no request was tried more than 1 + max_retries times per attempt
    per_prompt = N_PROMPTS * 2 * (1 + MAX_RETRIES)
    assert requests < per_prompt
    assert len(check.ids("d")) >= N_PROMPTS * 0.97
    journal = [orjson.loads(x) for x in (run_dir / "journal.jsonl").read_bytes().splitlines()]
    assert any(e["ev"] == "dropped" and e.get("reason") == "payment" for e in journal)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_each_fault_until_retries_run_out(tmp_path: Path, qwen3_dir: Path, reliability,
                                          stream: bool) -> None:
    """Each kind, every time: the prompt is recorded as failed with the expected kind, after a
    bounded number of tries, in bounded time (a Retry-After of an hour is not waited out)."""
    wire = "SSE" if stream else "JSON"
    case = reliability("2. Server faults", f"each fault kind on every try ({wire}): recorded "
                       "as failed with its kind after bounded retries")
    kinds = [k for k in FAILURE_KINDS if stream or k != "no_done"]
    rows = [{"id": k, "messages": [{"role": "user", "content": f"Say {k} [[fault:{k}]]"}]}
            for k in kinds] + prompt_rows(20)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    with TestServer(mode="openrouter", latency_s=0.01, huge_body_mb=24) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("or", "openrouter", server.url, stream=stream, timeout_s=1.0,
                         max_retries=2, backoff_max_s=1.5, concurrency=32, cooldown_after=1000,
                         max_response_mb=8)],
            datasets=[{"name": "d", "path": str(data)}])
        t0 = time.monotonic()
        outcome = run_config(cfg)
        wall = time.monotonic() - t0
        per_prompt = server.stats["per_prompt"]
    check = check_folder(tmp_path / "run")
    got = {f["id"].split("/", 1)[1]: f["kind"] for f in check.failed["d"]}
    case.runs = len(kinds)
    case.duplicated = check.duplicated
    case.corrupt = len(check.corrupt)
    case.crashed = int(outcome.status != "completed")
    case.lost = len({r["id"] for r in rows} - set(got)
                    - {i.split("/", 1)[1] for i in check.ids("d")})
    tries = {k: n for label, n in per_prompt.items() for k in kinds if f"[[fault:{k}]]" in label}
    case.note(f"{len(kinds)} kinds, each failing every try: recorded as "
              f"{len(set(got.values()))} failure kinds; at most "
              f"{max(tries.values())} tries a prompt; {wall:.1f}s in all")
    assert outcome.status == "completed", outcome.message
    assert {k: got.get(k) for k in kinds} == {k: FAILURE_KINDS[k] for k in kinds}
    assert len(check.ids("d")) == 20
    assert all(n <= 3 for n in tries.values()), tries  # 1 try + max_retries 2
    assert tries["400"] == 1 and tries["retry_after_hour"] == 1  # not retried
    assert wall < 30
