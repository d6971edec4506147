"""9. Engine IDs at the wire, an answer that cannot be an answer: an engine that ignores
`max_tokens` (on every route, text and IDs alike), bodies of 100 MiB on two backends, and vLLM IDs
in range that are not the answer's. Each is refused at the wire: never kept, never counted
against the budget as less than it is, never grown into gigabytes."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from draftgen.backends import make_backend
from draftgen.backends.base import answer_byte_bound, share_answer_bytes
from draftgen.config import load_config
from draftgen.status import collect_status
from draftgen.testing.fake_engine import IGNORES_MAX_TOKENS, SHIFTED_IDS, TestServer
from draftgen.tokenize import Tokenizer
from tests.e2e_helpers import fast_backend, read_records, run_config, write_config
from tests.reliability.helpers import (
    ServerProcess,
    check_folder,
    no_probe,
    prompt_rows,
    write_jsonl,
)
from tests.reliability.test_bad_answers import PEAK_MB, RSS_PROBE

SCENARIO = "9. Engine IDs at the wire"
PRICE = {"prompt": 1.0, "completion": 2.0}
LONG = {"reasoning_tokens": (1500, 1500), "content_tokens": (1500, 1500)}
"""Answers of about 3,000 tokens, whatever `max_tokens` asks."""
ROUTES = {
    "chat_logprobs": ({"mode": "openai"}, {"type": "openai"}),
    "chat_text": ({"mode": "openai"}, {"type": "openai", "logprobs": False}),
    "chat_sse": ({"mode": "openai"}, {"type": "openai", "stream": True, "logprobs": False}),
    "vllm": ({"mode": "vllm"}, {"type": "vllm"}),
    "sglang": ({"mode": "openai"}, {"type": "sglang"}),
}
"""Each way an answer arrives: IDs from logprobs, IDs rebuilt from text (JSON and SSE), the
engine's own IDs (vLLM, SGLang)."""

pytestmark = pytest.mark.slow


def _rows(kind: str, n: int) -> list[dict[str, Any]]:
    return [{"id": f"{kind}-{i}", "messages": [
        {"role": "user", "content": f"Question {i} [[fault:{kind}]]"}]} for i in range(n)]


def _of(record: dict[str, Any], kind: str) -> bool:
    """Whether a record or failure (ID `dataset/row`) is of a row asking for fault `kind`."""
    return record["id"].split("/", 1)[1].startswith(kind)


def _backend(route: str, url: str, name: str = "engine", **kw: Any) -> dict[str, Any]:
    settings = dict(ROUTES[route][1])
    return fast_backend(name, settings.pop("type"), url, paid=True, price=PRICE, **settings,
                        **kw)


@pytest.mark.parametrize("route", list(ROUTES))
def test_an_engine_that_ignores_max_tokens_keeps_nothing(
        tmp_path: Path, qwen3_dir: Path, reliability, route: str) -> None:
    """`max_tokens: 64`, `max_output_tokens: 1000`: five answers of ~3,000 tokens were kept
    (15,172 tokens) as `length_mismatch`. Each fails as `bad_response` now, counted at no less
    than its worst case with the margin; the good answers are written."""
    max_tokens, limit = 64, 1000
    case = reliability(SCENARIO, f"{route}: an engine that ignores max_tokens {max_tokens} "
                       f"(answers of ~3,000 tokens; max_output_tokens {limit})")
    bad, good = _rows(IGNORES_MAX_TOKENS, 5), prompt_rows(5)
    data = write_jsonl(tmp_path / "d.jsonl", bad + good)
    with TestServer(**ROUTES[route][0], **LONG) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[_backend(route, server.url)],
                           datasets=[{"name": "d", "path": str(data),
                                      "max_output_tokens": limit}],
                           sampling={"max_tokens": max_tokens})
        outcome = run_config(cfg)
    records = read_records(tmp_path / "run", "d")
    failed = check_folder(tmp_path / "run").failed.get("d", [])
    kept = sum(len(r["output_ids"]) for r in records)
    st = collect_status(tmp_path / "run")
    case.runs = 1
    case.note(f"{outcome.status}; {len(records)} answers kept ({kept:,} tokens), "
              f"{len(failed)} failed as {sorted({f['kind'] for f in failed})}, e.g. "
              f"`{failed[0]['message'] if failed else ''}`; counted ${st.total.sums.cost:.5f}")
    assert len(records) == 5 and not [r for r in records if _of(r, IGNORES_MAX_TOKENS)]
    assert all(len(r["output_ids"]) <= max_tokens + 1 for r in records)
    assert kept <= limit
    bad_failures = [f for f in failed if _of(f, IGNORES_MAX_TOKENS)]
    assert len(bad_failures) == 5 and {f["kind"] for f in bad_failures} == {"bad_response"}
    assert all(f.get("cost_usd", 0) > 0 for f in bad_failures)  # paid for, counted


def test_answers_of_100_mib_on_two_backends_are_refused_while_read(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    """Two backends with `max_in_flight_response_mb: 200` each, answers of 100 MiB for a
    `max_tokens` of 256: peak RSS was 5.8-6.0 GB and answers of 13,107,204 IDs were stored.
    What 256 tokens can take on the wire is a megabyte or two: each body is refused as it
    arrives, and the process stays under the bound the suite holds every run to."""
    case = reliability(SCENARIO, "answers of 100 MiB (huge_body, huge_chunked) on two backends "
                       "with max_response_mb and max_in_flight_response_mb 200 each, "
                       "max_tokens 256")
    bad = _rows("huge_body", 4) + _rows("huge_chunked", 4)
    good = prompt_rows(10)
    data = write_jsonl(tmp_path / "d.jsonl", good + bad)
    roomy = {"max_response_mb": 200, "max_in_flight_response_mb": 200, "max_retries": 0,
             "concurrency": 8}
    with ServerProcess("--huge-body-mb", "100", "--reasoning-tokens", "5,30",
                       "--content-tokens", "5,30") as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("a", "openai", server.url, **roomy),
            fast_backend("b", "openai", server.url, stream=True, **roomy)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 256})
        proc = subprocess.run([sys.executable, "-c", RSS_PROBE, "run", str(cfg), "--no-live",
                               *no_probe()], capture_output=True, text=True, timeout=240)
    said = proc.stdout + proc.stderr
    peak = re.search(r"PEAK_RSS_KB (\d+)", said)
    peak_mb = int(peak[1]) / 1024 if peak else math.inf
    check = check_folder(tmp_path / "run")
    failed = {f["id"].split("/", 1)[1]: f for f in check.failed.get("d", [])}
    records = read_records(tmp_path / "run", "d")
    case.runs = 1
    case.crashed = said.count("Traceback") + int(proc.returncode != 0)
    case.note(f"exit {proc.returncode}; {len(records)}/{len(good)} good answers written; "
              f"{len(failed)} huge ones failed as {sorted({f['kind'] for f in failed.values()})}"
              f"; peak RSS {peak_mb:.0f} MB (was 5.8-6.0 GB)")
    assert proc.returncode == 0, said[-3000:]
    assert {r["id"].split("/", 1)[1] for r in records} == {r["id"] for r in good}
    assert set(failed) == {r["id"] for r in bad}
    assert {f["kind"] for f in failed.values()} == {"bad_response"}
    assert all(len(r["output_ids"]) <= 257 for r in records)
    assert peak_mb < PEAK_MB, f"peak RSS {peak_mb:.0f} MB"


def test_one_bound_for_the_run_not_one_per_backend(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(1))
    cfg = load_config(write_config(tmp_path, qwen3_dir, backends=[
        fast_backend("a", "openai", "http://127.0.0.1:9", max_in_flight_response_mb=200),
        fast_backend("b", "openai", "http://127.0.0.1:9", max_in_flight_response_mb=50)],
        datasets=[{"name": "d", "path": str(data)}]))
    backends = [make_backend(b, cfg.model, cfg.sampling) for b in cfg.backends]
    share_answer_bytes(backends)
    assert backends[0].answer_bytes is backends[1].answer_bytes
    assert backends[0].answer_bytes.limit == 200 * 2**20


def test_the_byte_bound_of_an_answer_grows_with_max_tokens_and_the_prompt(
        qwen3_tok: Tokenizer) -> None:
    longest = qwen3_tok.longest_token_bytes
    assert longest == 128
    small, big = answer_byte_bound(256, 0, longest), answer_byte_bound(4096, 0, longest)
    assert 2**20 < small < 2 * 2**20 < big
    assert answer_byte_bound(256, 100_000, longest) > small + 100_000 * 16  # vLLM echoes it
    assert answer_byte_bound(256, 0, longest, alternatives=5) > 3 * (small - 2**20)


@pytest.mark.parametrize("logprobs", [False, True], ids=["text", "logprobs"])
def test_vllm_ids_that_are_not_the_answer_are_not_kept(
        tmp_path: Path, qwen3_dir: Path, reliability, logprobs: bool) -> None:
    """`token_ids` each moved to the vocabulary's neighbouring ID, the text true: 10 of 10
    records were `exact`, and only `audit` caught them. The run asks the audit's question of
    every answer with both: such IDs are not the answer's, so they are set aside (flagged) for
    the next witness: the logprobs' IDs where they prove the whole text (`exact`), else IDs
    rebuilt from the text (not `exact`)."""
    case = reliability(SCENARIO, "vLLM: token_ids in range but each moved to the neighbouring "
                       f"ID, the text true (logprobs {'on' if logprobs else 'off'})")
    rows = _rows(SHIFTED_IDS, 10) + prompt_rows(5)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    with TestServer(mode="vllm", reasoning_tokens=(5, 30), content_tokens=(5, 30)) as server:
        cfg = write_config(tmp_path, qwen3_dir,
                           backends=[_backend("vllm", server.url, logprobs=logprobs)],
                           datasets=[{"name": "d", "path": str(data)}],
                           sampling={"max_tokens": 256})
        outcome = run_config(cfg)
    records = read_records(tmp_path / "run", "d")
    shifted = [r for r in records if _of(r, SHIFTED_IDS)]
    good = [r for r in records if not _of(r, SHIFTED_IDS)]
    audit = subprocess.run([sys.executable, "-m", "draftgen", "audit", str(tmp_path / "run")],
                           capture_output=True, text=True, timeout=120)
    case.runs = 1
    case.note(f"{outcome.status}; {len(shifted)} shifted answers written as "
              f"{sorted({r['token_check'] for r in shifted})}, flagged "
              f"{sorted({f for r in shifted for f in r['flags']})}; the good ones "
              f"{sorted({r['token_check'] for r in good})}; audit exit {audit.returncode}")
    assert len(shifted) == 10 and len(good) == 5
    assert all("engine_ids_not_text" in r["flags"] for r in shifted)
    assert {r["token_check"] for r in shifted} == ({"exact"} if logprobs else {"length_ok"})
    assert {r["token_check"] for r in good} == {"exact"}
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]
