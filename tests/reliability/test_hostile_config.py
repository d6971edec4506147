"""Hostile config values, through `draftgen` as a user runs it, against a loopback server:

- 5. Secrets: a key in the backend URL's query string (`.../api/v1?key=KEY`) is sent with every
  request (the listing, the chat calls, the bill lookups, a router's worker list) and appears
  in no file of the run folder and in no output;
- 3. Bad input: NaN and infinity in any number of run.yaml, and a `max_tokens` no answer can
  reach (over `model.context_length`, over the dataset's whole token budget, or whose one
  answer may cost more than the whole `budget.usd`), are refused at start with one line
  naming the key, exit 2, before any request."""

from __future__ import annotations

import math
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, write_config
from tests.reliability.helpers import (
    all_bytes,
    check_folder,
    draftgen,
    merge_config,
    prompt_rows,
    write_jsonl,
)

pytestmark = pytest.mark.slow  # `draftgen` subprocesses

SECRETS = "5. Secrets"
BAD_INPUT = "3. Bad input"
SHORT = {"reasoning_tokens": (3, 8), "content_tokens": (3, 8)}
MODEL_CALLS = ("chat", "generate")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


# ---- 5. a key in the URL's query string ---------------------------------------------------------


def _leaks(canary: str, outputs: dict[str, subprocess.CompletedProcess[str]],
           folders: list[Path]) -> list[str]:
    leaks = [f"output of {name}" for name, proc in outputs.items()
             if canary in proc.stdout or canary in proc.stderr]
    leaks += [str(path) for path, content in all_bytes(*folders) if canary.encode() in content]
    return leaks


@pytest.mark.timeout(300)
def test_a_key_in_the_url_query_is_sent_everywhere_and_shown_nowhere(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability(SECRETS, "url `.../api/v1?key=CANARY` (a gateway's key in the query): "
                       "listing, chat, bill lookups and a router's worker list all get the "
                       "query; the key in no file and no output (dry run, run -v, status, "
                       "report, a startup error)")
    canary = "QCANARY" + secrets.token_hex(8)
    rows = prompt_rows(12) + [
        {"id": f"fault-{k}", "messages": [{"role": "user", "content": f"[[fault:{k}]] {k}"}]}
        for k in ("400", "malformed", "502")]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    run_dir = tmp_path / "run"
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    with TestServer(mode="openrouter", prices=(0.5, 2.5), **SHORT) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[fast_backend(
            "or", "openrouter", f"{server.url}/api/v1/?key={canary}", concurrency=4,
            max_retries=1, timeout_s=5.0)], datasets=[{"name": "d", "path": str(data)}],
            sampling={"max_tokens": 64}, budget={"usd": 1.0})
        outputs["run --dry-run -v"] = draftgen("run", str(cfg), "--dry-run", "-v")
        outputs["run -v"] = draftgen("run", str(cfg), "--no-live", "-v", timeout=240)
        stats = server.stats.snapshot(bodies=False)
        fleet = write_config(tmp_path / "fleet", qwen3_dir, backends=[fast_backend(
            "router", "sglang", f"{server.url}?key={canary}",
            fleet={"wait_for_workers": 1, "wait_timeout_s": 5.0})],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64})
        outputs["run (a router without /workers)"] = draftgen("run", str(fleet), "--no-live")
    outputs["status"] = draftgen("status", str(run_dir))
    outputs["report"] = draftgen("report", str(run_dir), "-o", str(tmp_path / "report"))
    run = outputs["run -v"]
    check = check_folder(run_dir)
    queried = stats["query_names"]
    case.runs = len(outputs)
    case.crashed += sum("Traceback" in p.stderr for p in outputs.values())
    leaks = _leaks(canary, outputs, [run_dir, tmp_path / "report", tmp_path / "fleet" / "run"])
    case.corrupt += len(leaks)  # a leak is counted as a corrupt output
    refused = _lines(outputs["run (a router without /workers)"].stderr)[-1:]
    case.note(f"exit {run.returncode}; {len(check.ids('d'))} answered; requests with the key in "
              f"their query, by endpoint: {queried}; the router's refusal: `{refused}`; the key "
              f"appears {len(leaks)} times in {len(outputs)} outputs and the run folder")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "no price known" not in run.stderr
    assert check.ids("d") >= {f"d/p{i}" for i in range(12)}, check.ids("d")
    assert queried.get("models?key", 0) >= 1, queried
    assert queried.get("chat?key", 0) == stats["requests"].get("chat"), (queried, stats)
    assert queried.get("generation?key", 0) >= 1, queried  # the malformed answer's bill
    assert queried.get("other?key", 0) >= 1, queried  # the probe's /models/MODEL/endpoints
    assert "key=***" in outputs["run (a router without /workers)"].stderr
    assert "/workers?key=***: HTTP 404" in outputs["run (a router without /workers)"].stderr
    assert not leaks, leaks


# ---- 3. NaN and infinity ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer(mode="openrouter", prices=(0.5, 2.5), **SHORT) as server:
        yield server


def _run(server: TestServer, root: Path, qwen3_dir: Path, change: dict[str, Any],
         backend: dict[str, Any] | None = None, dataset: dict[str, Any] | None = None
         ) -> tuple[subprocess.CompletedProcess[str], Path, int]:
    """`draftgen run` on a config of one paid backend (`backend`'s keys over it), one dataset
    (`dataset`'s) and `change` over the rest; the model calls the server got meanwhile."""
    data = write_jsonl(root / "d.jsonl", prompt_rows(6))
    cfg_path = write_config(root, qwen3_dir, backends=[
        fast_backend("or", "openrouter", f"{server.url}/api/v1", concurrency=2,
                     **(backend or {}))],
        datasets=[{"name": "d", "path": str(data), **(dataset or {})}],
        sampling={"max_tokens": 64}, budget={"usd": 1.0})
    cfg = merge_config(yaml.safe_load(cfg_path.read_text()), change)
    cfg_path.write_text(yaml.safe_dump(cfg))
    before = sum(server.stats["requests"].get(e, 0) for e in MODEL_CALLS)
    proc = draftgen("run", str(cfg_path), "--no-live")
    sent = sum(server.stats["requests"].get(e, 0) for e in MODEL_CALLS) - before
    return proc, cfg_path, sent


NAN, INF = float("nan"), float("inf")


NON_FINITE: list[tuple[str, dict[str, Any], dict[str, Any] | None, str]] = [
    ("sampling.temperature", {"sampling": {"temperature": NAN}}, None, "finite number"),
    ("sampling.top_p", {"sampling": {"top_p": INF}}, None, "finite number"),
    ("sampling.max_tokens", {"sampling": {"max_tokens": INF}}, None, "valid integer"),
    ("model.context_length", {"model": {"context_length": INF}}, None, "valid integer"),
    ("sampling.extra", {"sampling": {"extra": {"min_p": NAN}}}, None, "finite"),
    ("min_free_mb", {"min_free_mb": INF}, None, "finite number"),
    ("fsync_interval_s", {"fsync_interval_s": INF}, None, "finite number"),
    ("budget.usd", {"budget": {"usd": INF}}, None, "finite number"),
    ("budget.usd_per_minute", {"budget": {"usd_per_minute": NAN}}, None, "finite number"),
    ("backends.0.backoff_max_s", {}, {"backoff_max_s": INF}, "finite number"),
    ("backends.0.timeout_s", {}, {"timeout_s": INF}, "finite number"),
    ("backends.0.price.completion", {}, {"price": {"prompt": 0.5, "completion": INF}},
     "finite number"),
]


@pytest.mark.parametrize(("key", "change", "backend", "message"), NON_FINITE,
                         ids=[c[0] for c in NON_FINITE])
def test_nan_and_infinity_are_refused_naming_the_key(
        server: TestServer, tmp_path: Path, qwen3_dir: Path, reliability, key: str,
        change: dict[str, Any], backend: dict[str, Any] | None, message: str) -> None:
    value = next(str(v) for v in _leaves(change or backend or {})
                 if isinstance(v, float) and not math.isfinite(v))
    case = reliability(BAD_INPUT, f"{key}: .{value} in run.yaml: exit 2, one line naming the "
                       "key, nothing sent")
    proc, cfg, sent = _run(server, tmp_path, qwen3_dir, change, backend)
    said = _lines(proc.stderr)
    case.runs = 1
    case.crashed += "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2)
    case.note(f"exit {proc.returncode}, {sent} requests: `{' '.join(said)[:300]}`")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert said == [f"error: {cfg}: invalid config", said[-1]], said
    assert said[-1].startswith(f"{key}: ") and message in said[-1], said
    assert sent == 0


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    else:
        yield value


# ---- 3. a max_tokens no answer can reach --------------------------------------------------------


MIX = {"turns": "all", "sampling_mix": [{"weight": 1}, {"weight": 1, "max_tokens": 100_000_000}]}


@pytest.mark.parametrize(("what", "change", "dataset", "said"), [
    ("sampling_mix max_tokens 100,000,000 under budget.usd $1 (no token budget, no context "
     "known)", {}, MIX,
     "datasets[d].sampling_mix[1].max_tokens: one answer of 100,000,000 tokens (dataset 'd') "
     "may cost $250 on the cheapest backend ('or'"),
    ("sampling_mix max_tokens 100,000,000 over model.context_length 32,768",
     {"model": {"context_length": 32768}, "budget": {"usd": 1e6}}, MIX,
     "datasets[d].sampling_mix[1].max_tokens: 100,000,000 (dataset 'd') is over "
     "model.context_length (32,768)"),
    ("sampling.max_tokens 65,536 over model.context_length 32,768",
     {"model": {"context_length": 32768}, "sampling": {"max_tokens": 65536}}, None,
     "sampling.max_tokens: 65,536 (dataset 'd') is over model.context_length (32,768)"),
    ("sampling.max_tokens 100,000 over the dataset's max_output_tokens 50,000",
     {"sampling": {"max_tokens": 100_000}}, {"max_output_tokens": 50_000},
     "sampling.max_tokens: 100,000 is over datasets[d].max_output_tokens (50,000)"),
    ("sampling.max_tokens 100,000,000 under budget.usd $1 (single-turn dataset)",
     {"sampling": {"max_tokens": 100_000_000}}, None,
     "sampling.max_tokens: one answer of 100,000,000 tokens (dataset 'd') may cost $250"),
], ids=["mix-usd", "mix-context", "sampling-context", "sampling-token-budget", "sampling-usd"])
def test_a_max_tokens_no_answer_can_reach_is_refused_at_start(
        server: TestServer, tmp_path: Path, qwen3_dir: Path, reliability, what: str,
        change: dict[str, Any], dataset: dict[str, Any] | None, said: str) -> None:
    case = reliability(BAD_INPUT, f"{what}: refused at start, exit 2, one line naming the key, "
                       "the dataset, the value and the limit; no request sent")
    proc, _, sent = _run(server, tmp_path, qwen3_dir, change, dataset=dataset)
    lines = _lines(proc.stderr)
    named = [line for line in lines if said in line]
    case.runs = 1
    case.crashed += "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2)
    case.note(f"exit {proc.returncode}, {sent} requests: `{named[0] if named else lines[-1:]}`")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(named) == 1, lines
    assert sent == 0
