"""7. Money: a server's own bill never passes `budget.usd`, whatever it reports, however its
answers break, whatever the user does to the run folder between runs. Each case runs against
the loopback test server, which bills every answer it sends at its prices (what OpenRouter
would charge), and compares that bill with the budget."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.audit import audit_run
from draftgen.audit.quarantine import quarantine
from draftgen.config import ConfigError, load_config
from draftgen.run import Runner, prepare
from draftgen.status import collect_status
from draftgen.store import RunLocked
from draftgen.store.shards import ShardSpec
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, read_failures, read_records, run_config, write_config
from tests.reliability.helpers import (
    check_folder,
    draftgen,
    no_probe,
    prompt_rows,
    start_run,
    wait_until,
    write_jsonl,
)

SCENARIO = "8. Money"
PRICE = {"prompt": 1000.0, "completion": 1000.0}
"""USD per million tokens: $0.001 a token, so a few answers spend a small budget."""
BUDGET = 0.3
SHORT = {"reasoning_tokens": (5, 20), "content_tokens": (5, 20)}


def _priced(usage: dict[str, Any]) -> float:
    tokens = usage["prompt_tokens"] + usage["completion_tokens"]
    return tokens * PRICE["prompt"] / 1e6


def _paid_config(tmp_path: Path, qwen3_dir: Path, server: TestServer, n: int,
                 backend: dict[str, Any] | None = None, **top: Any) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(n))
    backend = backend or fast_backend("or", "openrouter", server.url + "/api/v1",
                                      concurrency=2, price=PRICE)
    return write_config(tmp_path, qwen3_dir, backends=[backend],
                        datasets=[{"name": "d", "path": str(data)}],
                        sampling={"max_tokens": 64}, budget={"usd": BUDGET}, **top)


def _journal(run_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (run_dir / "journal.jsonl").read_bytes().splitlines()]


def _generation_cost(server: TestServer, gen: str) -> float:
    url = f"{server.url}/api/v1/generation?id={gen}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return float(orjson.loads(resp.read())["data"]["total_cost"])


# ---- 5. reported cost: tests/reliability/test_bill_truth.py ------------------------------------


# ---- 4. a billed 200 that cannot be read -------------------------------------------------------


def test_unreadable_200_is_billed_as_openrouter_says(tmp_path: Path, qwen3_dir: Path,
                                                     reliability) -> None:
    case = reliability(SCENARIO, "every answer is a 200 with a broken JSON body (billed); "
                       "OpenRouter's generation lookup tells each bill")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    fault_rates={"malformed": 1.0}, **SHORT) as server:
        cfg = _paid_config(tmp_path, qwen3_dir, server, 20, backend=fast_backend(
            "or", "openrouter", server.url + "/api/v1", concurrency=2, price=PRICE,
            max_retries=2))
        outcome = run_config(cfg)
        gens = [e["gen"] for e in _journal(tmp_path / "run") if e["ev"] == "gen"]
        bill = sum(_generation_cost(server, g) for g in gens)
    case.runs = 1
    counted = sum(f.get("cost_usd", 0.0) for f in read_failures(tmp_path / "run", "d"))
    case.note(f"{len(gens)} attempts billed ${bill:.4f} of ${BUDGET}; counted ${counted:.4f}; "
              f"outcome {outcome.status}")
    assert gens and outcome.status == "budget"
    assert bill <= BUDGET
    assert counted == pytest.approx(bill)


def test_unreadable_200_counts_at_worst_case(tmp_path: Path, qwen3_dir: Path,
                                             reliability) -> None:
    case = reliability(SCENARIO, "every answer is a 200 with a broken JSON body (billed); no "
                       "generation lookup: each attempt counts at its worst case")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    fault_rates={"malformed": 1.0}, **SHORT) as server:
        cfg = _paid_config(tmp_path, qwen3_dir, server, 20, backend=fast_backend(
            "paid", "openai", server.url, concurrency=2, price=PRICE, paid=True,
            max_retries=2))
        outcome = run_config(cfg)
        attempts = server.stats.snapshot(bodies=False)["per_prompt"]
    case.runs = 1
    worst = {e["id"]: e["usd"] for e in _journal(tmp_path / "run") if e["ev"] == "sent"}
    labels = {r["id"]: r["messages"][0]["content"] for r in prompt_rows(20)}
    at_worst = sum(attempts.get(labels[i.split("/", 1)[-1]], 0) * usd
                   for i, usd in worst.items())
    counted = sum(f.get("cost_usd", 0.0) for f in read_failures(tmp_path / "run", "d"))
    case.note(f"{sum(attempts.values())} attempts, each billed at most its worst case: "
              f"${at_worst:.4f} in all, counted ${counted:.4f}, outcome {outcome.status}")
    assert outcome.status == "budget"
    assert counted == pytest.approx(at_worst)
    assert at_worst <= BUDGET  # each attempt's bill <= its worst case: the bill <= budget


# ---- 3. quarantined answers --------------------------------------------------------------------


def _break_every_answer(run_dir: Path) -> None:
    """Cut each answer's last output token, as a careless edit or a bad write would: every
    answer then fails the audit."""
    path = run_dir / "d" / "responses.jsonl"
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for record in records:
        record["output_ids"] = record["output_ids"][:-1]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    for name in ("index.jsonl", "index.v1.bin"):
        (run_dir / "d" / name).unlink(missing_ok=True)


def test_quarantined_answers_keep_counting(tmp_path: Path, qwen3_dir: Path,
                                           reliability) -> None:
    case = reliability(SCENARIO, "run, `audit --quarantine` every answer, run again: three "
                       "rounds under one budget.usd")
    run_dir = tmp_path / "run"
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    **SHORT) as server:
        cfg = _paid_config(tmp_path, qwen3_dir, server, 40)
        for _ in range(3):
            assert run_config(cfg).status == "budget"
            _break_every_answer(run_dir)
            report = audit_run(run_dir, workers=1)
            if not report.ok:  # later rounds may find the budget spent: nothing new
                quarantine(report)
            case.runs += 1
    kept = read_records(run_dir, "d")
    moved = [orjson.loads(line)
             for line in (run_dir / "d" / "quarantine.jsonl").read_bytes().splitlines()]
    bill = sum(_priced(r["usage"]) for r in kept + moved)
    st = collect_status(run_dir)
    shown = st.total.sums.cost + st.total.cost_not_kept_usd
    case.note(f"{len(moved)} answers quarantined over 3 rounds, billed ${bill:.4f} of "
              f"${BUDGET}; status shows ${shown:.4f}")
    assert not kept and moved
    assert bill <= BUDGET
    assert shown == pytest.approx(bill)


# ---- 6. keys draftgen manages ------------------------------------------------------------------


@pytest.mark.parametrize(("where", "key", "value"), [
    ("sampling.extra", "max_tokens", 4000),
    ("extra_body", "max_tokens", 4000),
    ("extra_body", "max_completion_tokens", 4000),
    ("extra_body", "stream", True),
])
def test_managed_keys_are_refused_in_extra(tmp_path: Path, qwen3_dir: Path, reliability,
                                           where: str, key: str, value: Any) -> None:
    case = reliability(SCENARIO, f"{where}: {{{key}: {value}}} overriding what draftgen sets, "
                       "with max_output_tokens 300")
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(20))
    with TestServer(reasoning_tokens=(100, 300), content_tokens=(100, 300)) as server:
        backend = fast_backend("local", "openai", server.url, concurrency=4)
        sampling: dict[str, Any] = {"max_tokens": 64}
        if where == "extra_body":
            backend["extra_body"] = {key: value}
        else:
            sampling["extra"] = {key: value}
        cfg = write_config(tmp_path, qwen3_dir, backends=[backend], sampling=sampling,
                           datasets=[{"name": "d", "path": str(data),
                                      "max_output_tokens": 300}])
        with pytest.raises(ConfigError) as refused:
            run_config(cfg)
        sent = sum(server.stats.snapshot(bodies=False)["requests"].values())
    case.runs = 1
    case.note(f"refused before any request: {str(refused.value).splitlines()[-1].strip()}")
    assert key in str(refused.value) and str(cfg) in str(refused.value)
    assert sent == 0


# ---- 7. one layout at a time -------------------------------------------------------------------


def _run_shard(cfg: Path, shard: str) -> str:
    plan = prepare(load_config(cfg), ShardSpec.parse(shard))
    return asyncio.run(Runner(plan, live_display=False).execute()).status


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_layouts_do_not_run_side_by_side(tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability(SCENARIO, "an unsharded run live, then `--shard 0/2` on the same "
                       "output_dir; shard 0/2 live, then an unsharded run and `--shard 1/3`")
    run_dir = tmp_path / "run"
    with TestServer(latency_s=0.3, **SHORT) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url, concurrency=2)],
            datasets=[{"name": "d", "path": str(write_jsonl(tmp_path / "d.jsonl",
                                                             prompt_rows(60)))}],
            sampling={"max_tokens": 64})
        refusals = []
        for live_args, others in (((), ["0/2"]), (("--shard", "0/2"), [None, "1/3"])):
            proc = start_run(cfg, *live_args, *no_probe())
            try:
                lock = run_dir / ("shards/0-of-2/lock" if live_args else "lock")
                wait_until(lambda lk=lock: lk.exists() and lk.stat().st_size > 0, 60,
                           "the first run live")
                for other in others:
                    with pytest.raises(RunLocked, match="one output_dir has one layout") as refused:
                        if other is None:
                            run_config(cfg)
                        else:
                            _run_shard(cfg, other)
                    refusals.append(str(refused.value))
                    case.runs += 1
                assert proc.poll() is None, "the live run ended before the others tried"
            finally:
                draftgen("stop", str(run_dir))
                proc.wait(timeout=60)
            case.runs += 1
        assert _run_shard(cfg, "1/2") == "completed"  # the same count: side by side
        assert _run_shard(cfg, "0/2") == "completed"
    answered = [i for folder in (run_dir, *run_dir.glob("shards/*"))
                for i in check_folder(folder).answered.get("d", [])]
    case.duplicated += len(answered) - len(set(answered))
    case.note(f"refused: {refusals[0]}")
    assert len(refusals) == 3
    assert sorted(answered) == sorted(f"d/{r['id']}" for r in prompt_rows(60))
    assert not (run_dir / "shards" / "1-of-3").exists()

