"""9. Engine IDs at the wire: the token IDs an engine reports (SGLang's `output_ids`, vLLM's
`token_ids`) are checked as they arrive. One that is no integer, negative, outside the target's
vocabulary, or one too many for `max_tokens` fails its own answer as `bad_response` (its cost
counted, the prompt asked again by a later run), in a run and in the probe alike: never a crash,
never an answer written as `exact`. And the answers a backend is reading hold at most
`max_in_flight_response_mb` together, whatever its provider sends to how many requests."""

from __future__ import annotations

import asyncio
import math
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from draftgen.backends import make_backend
from draftgen.backends.base import BackendError, check_engine_ids, engine_ids_problem
from draftgen.config import load_config
from draftgen.formats import Format, get_format
from draftgen.probe import ProbeOptions
from draftgen.probe.command import probe_config
from draftgen.probe.exchange import exchange, probe_requests
from draftgen.testing.fake_engine import BAD_IDS, TOO_MANY_IDS, TestServer
from draftgen.tokenize import Tokenizer
from draftgen.types import RawAnswer, Usage
from tests.e2e_helpers import fast_backend, read_records, run_config, write_config
from tests.reliability.helpers import (
    ServerProcess,
    check_folder,
    no_probe,
    prompt_rows,
    write_jsonl,
)
from tests.reliability.test_bad_answers import PEAK_MB, ROOMY_MAX_TOKENS, RSS_PROBE

SCENARIO = "9. Engine IDs at the wire"
MAX_TOKENS = 64
PRICE = {"prompt": 1.0, "completion": 2.0}
SHORT = {"reasoning_tokens": (5, 30), "content_tokens": (5, 30)}
ROUTES = {
    "sglang": ({"mode": "openai"}, {"type": "sglang"}),
    "vllm_json": ({"mode": "vllm"}, {"type": "vllm"}),
    "vllm_sse": ({"mode": "vllm"}, {"type": "vllm", "stream": True}),
}
"""Each wire that reports engine IDs: (test server settings, backend settings)."""
CASES = {
    "malformed": ["ids_negative", "ids_not_int", "ids_huge"],
    "out_of_vocab": ["ids_out_of_vocab"],
    "too_many": [TOO_MANY_IDS],
}
"""Fault kinds by the issue's case: IDs that are no token at all (-5, "x", 1.5, true, null,
10**12), a plausible integer past the vocabulary (999999), more IDs than `max_tokens` allows."""
assert {k for kinds in CASES.values() for k in kinds} == {*BAD_IDS, TOO_MANY_IDS}


@pytest.fixture(scope="module")
def qwen3(qwen3_tok: Tokenizer) -> Format:
    return get_format("qwen3", qwen3_tok)


def _fault_rows(kinds: list[str], copies: int = 2) -> list[dict[str, Any]]:
    return [{"id": f"{kind}-{n}", "messages": [
        {"role": "user", "content": f"Question {n} [[fault:{kind}]]"}]}
        for kind in kinds for n in range(copies)]


def _backend(route: str, url: str, **kw: Any) -> dict[str, Any]:
    settings = ROUTES[route][1]
    return fast_backend("engine", settings["type"], url, paid=True, price=PRICE,
                        **{k: v for k, v in settings.items() if k != "type"}, **kw)


def _run(tmp_path: Path, qwen3_dir: Path, backend: dict[str, Any], rows: list[dict[str, Any]]
         ) -> tuple[str, str]:
    """One run in this process: its status, and the exception that ended it, if any."""
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    cfg = write_config(tmp_path, qwen3_dir, backends=[backend],
                       datasets=[{"name": "d", "path": str(data)}],
                       sampling={"max_tokens": MAX_TOKENS})
    try:
        return run_config(cfg).status, ""
    except Exception as e:  # what the issue saw: the whole run ended by one answer
        return "crashed", f"{type(e).__name__}: {e}"


def _bad_records(records: list[dict[str, Any]], vocab_size: int) -> list[str]:
    """Records whose IDs could not be the answer's tokens."""
    return [r["id"] for r in records
            if len(r["output_ids"]) > MAX_TOKENS + 1
            or not all(type(t) is int and 0 <= t < vocab_size for t in r["output_ids"])]


@pytest.mark.parametrize(("ids", "problem"), [
    ([0, 9, 3], None),
    ([9] * 5, None),  # max_tokens 4 and the stop token
    ([9] * 6, "6 of them for max_tokens 4"),
    ([0, 10], "[1] is 10, outside the vocabulary's 10 tokens"),
    ([0, -1], "[1] is -1, outside"),
    ([1, True], "[1] is true, not an integer"),
    ([1, 2.0], "[1] is 2.0, not an integer"),
    ([None], "[0] is null, not an integer"),
    ([[1]], "[0] is list, not an integer"),
    ({"0": 1}, "not a list but dict"),
])
def test_engine_ids_are_checked_at_their_bounds(ids: Any, problem: str | None) -> None:
    found = engine_ids_problem(ids, vocab_size=10, max_tokens=4)
    assert found == problem if problem is None else (found or "").startswith(problem), found


@pytest.mark.parametrize("prompt_ids", [[1, 10], [-1], [1, True]])
def test_prompt_ids_an_engine_reports_are_checked_before_they_are_stored(
        prompt_ids: list[Any]) -> None:
    """vLLM's `prompt_token_ids` are written as the record's prompt where they differ from the
    rendered one: an ID that is no token fails the answer as `bad_response`, as an output ID
    does; a long prompt is no problem (only the answer is bound by `max_tokens`)."""
    usage = Usage(prompt_tokens=2, completion_tokens=1)
    check_engine_ids(RawAnswer(output_ids=[3], prompt_ids=[1] * 50, usage=usage), 10, 4)
    with pytest.raises(BackendError, match="engine prompt token IDs") as e:
        check_engine_ids(RawAnswer(output_ids=[3], prompt_ids=prompt_ids, usage=usage), 10, 4)
    assert e.value.kind == "bad_response" and e.value.usage == usage


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("route", list(ROUTES))
def test_bad_engine_ids_fail_their_answer_alone(tmp_path: Path, qwen3_dir: Path,
                                                qwen3_tok: Tokenizer, reliability,
                                                route: str, case_name: str) -> None:
    kinds = CASES[case_name]
    case = reliability(SCENARIO, f"{route}: engine IDs {case_name} ({', '.join(kinds)}) among "
                       f"good answers (max_tokens {MAX_TOKENS}): each fails alone as "
                       "`bad_response`, its cost counted; the others are written")
    good, bad = prompt_rows(20), _fault_rows(kinds)
    with TestServer(**ROUTES[route][0], **SHORT) as server:
        status, error = _run(tmp_path, qwen3_dir,
                             _backend(route, server.url, max_retries=0, concurrency=16),
                             good + bad)
    check = check_folder(tmp_path / "run")
    failed = {f["id"].split("/", 1)[1]: f for f in check.failed.get("d", [])}
    records = read_records(tmp_path / "run", "d")
    answered = {r["id"].split("/", 1)[1] for r in records}
    wrong = _bad_records(records, qwen3_tok.vocab_size)
    case.runs = 1
    case.lost = len({r["id"] for r in good} - answered) + len({r["id"] for r in bad} - set(failed))
    case.corrupt = len(check.corrupt) + len(wrong)
    case.crashed = int(status == "crashed")
    example = next((f["message"] for f in failed.values()), "")
    good_written = len(answered & {r["id"] for r in good})
    case.note(f"run {status} {error[:200]}; {good_written}/{len(good)} good answers written, "
              f"{len(wrong)} records with IDs no token has; failures "
              f"{sorted({f['kind'] for f in failed.values()})}, e.g. `{example}`")
    assert status == "completed", error
    assert not wrong, wrong
    assert answered == {r["id"] for r in good}
    assert {i: f["kind"] for i, f in failed.items()} == dict.fromkeys(
        (r["id"] for r in bad), "bad_response")
    for row_id, failure in failed.items():
        assert "engine token IDs" in failure["message"], (row_id, failure)
        assert failure.get("cost_usd", 0) > 0, (row_id, failure)  # the engine was paid


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_answer_failed_for_its_ids_is_asked_again(tmp_path: Path, qwen3_dir: Path,
                                                     qwen3_tok: Tokenizer, reliability) -> None:
    case = reliability(SCENARIO, "vLLM answers one prompt with an ID outside the vocabulary "
                       "once: that answer is not counted done; the next run asks again and "
                       "writes the good answer")
    flaky = {"id": "flaky", "messages": [
        {"role": "user", "content": "Question flaky [[fault:ids_out_of_vocab*1]]"}]}
    good = prompt_rows(5)
    with TestServer(mode="vllm", **SHORT) as server:
        backend = _backend("vllm_json", server.url, max_retries=0)
        runs = [_run(tmp_path, qwen3_dir, backend, [*good, flaky]) for _ in range(2)]
        asked = dict(server.stats["per_prompt"])
    records = read_records(tmp_path / "run", "d")
    check = check_folder(tmp_path / "run")
    flaky_asked = sum(n for label, n in asked.items() if "flaky" in label)
    case.runs = 2
    case.lost = int("d/flaky" not in {r["id"] for r in records})
    case.corrupt = len(_bad_records(records, qwen3_tok.vocab_size)) + len(check.corrupt)
    case.duplicated = check.duplicated
    case.crashed = sum(status == "crashed" for status, _ in runs)
    case.note(f"runs {[s for s, _ in runs]}; the prompt asked {flaky_asked} times; failures "
              f"{dict(check.failed_kinds('d'))}")
    assert [s for s, _ in runs] == ["completed", "completed"], runs
    assert flaky_asked == 2
    assert check.failed_kinds("d") == {"bad_response": 1}
    assert not _bad_records(records, qwen3_tok.vocab_size)
    assert check.ids("d") == {f"d/{r['id']}" for r in [*good, flaky]}
    assert not check.duplicated


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["ids_not_int", "ids_out_of_vocab", TOO_MANY_IDS])
@pytest.mark.parametrize("route", ["sglang", "vllm_json"])
def test_the_probe_fails_a_request_with_bad_engine_ids(tmp_path: Path, qwen3_dir: Path,
                                                       qwen3: Format, reliability,
                                                       route: str, kind: str) -> None:
    case = reliability(SCENARIO, f"probe of {route}, every answer's engine IDs {kind}: each "
                       "request fails as `bad_response`, the verdict is unsafe")
    with TestServer(**ROUTES[route][0], **SHORT, fault_rates={kind: 1.0}) as server:
        data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(1))
        cfg = load_config(write_config(
            tmp_path, qwen3_dir, backends=[_backend(route, server.url, max_retries=0)],
            datasets=[{"name": "d", "path": str(data)}]))
        try:
            [result] = asyncio.run(probe_config(cfg, qwen3, ProbeOptions(max_tokens=MAX_TOKENS)))
            error = ""
        except Exception as e:
            result, error = None, f"{type(e).__name__}: {e}"
    case.runs = 1
    case.crashed = int(result is None)
    if result is not None:
        case.corrupt = sum(a.token_check == "exact" for a in result.answers)
        case.note(f"verdict {result.verdict}; {[p.message for p in result.problems][:1]}")
    else:
        case.note(f"probe ended by {error[:200]}")
    assert result is not None, error
    assert result.verdict == "unsafe"
    assert {p.code for p in result.problems} == {"request_failed"}
    assert all(a.error and "bad_response" in a.error and "engine token IDs" in a.error
               for a in result.answers), [a.error for a in result.answers]
    assert all(a.cost_usd > 0 for a in result.answers)  # each answer was paid for


HUGE_MB = 24
CAP_MB = 16
BOUND_MB = 32
HUGE_PROMPTS = 32


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("stream", "fault"), [(False, "huge_chunked"), (True, "huge_body")],
                         ids=["json", "sse"])
def test_answers_in_flight_hold_at_most_the_bound(tmp_path: Path, qwen3_dir: Path,
                                                  reliability, stream: bool, fault: str) -> None:
    case = reliability(SCENARIO, f"{HUGE_PROMPTS} answers of {HUGE_MB} MB at once ({fault}, "
                       f"{'SSE' if stream else 'JSON'}; max_response_mb {CAP_MB}, "
                       f"max_in_flight_response_mb {BOUND_MB}): the process holds no more than "
                       "the bound, each fails alone, the good answers are written")
    bad = [{"id": f"huge-{n}", "messages": [
        {"role": "user", "content": f"Question {n} [[fault:{fault}]]"}]}
        for n in range(HUGE_PROMPTS)]
    good = prompt_rows(10)
    data = write_jsonl(tmp_path / "d.jsonl", good + bad)
    with ServerProcess("--latency", "0.3", "--huge-body-mb", str(HUGE_MB),
                       "--reasoning-tokens", "5,30", "--content-tokens", "5,30") as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "openai", server.url, stream=stream, max_retries=6,
                         concurrency=64, max_response_mb=CAP_MB,
                         max_in_flight_response_mb=BOUND_MB)],
            datasets=[{"name": "d", "path": str(data)}],
            sampling={"max_tokens": ROOMY_MAX_TOKENS})
        proc = subprocess.run([sys.executable, "-c", RSS_PROBE, "run", str(cfg), "--no-live",
                               *no_probe()], capture_output=True, text=True, timeout=240)
    said = proc.stdout + proc.stderr
    peak = re.search(r"PEAK_RSS_KB (\d+)", said)
    peak_mb = int(peak[1]) / 1024 if peak else math.inf
    check = check_folder(tmp_path / "run")
    failed = {f["id"].split("/", 1)[1]: f for f in check.failed.get("d", [])}
    answered = {i.split("/", 1)[1] for i in check.ids("d")}
    kinds = sorted({f["kind"] for f in failed.values()})
    case.runs = 1
    case.lost = len({r["id"] for r in good} - answered) + len({r["id"] for r in bad} - set(failed))
    case.crashed = said.count("Traceback") + int(proc.returncode != 0)
    case.corrupt = len(check.corrupt)
    case.note(f"exit {proc.returncode}; {len(answered)}/{len(good)} good answers written; "
              f"{len(failed)} huge ones failed as {kinds}; peak RSS {peak_mb:.0f} MB (without "
              f"the bound: up to {HUGE_PROMPTS} × {CAP_MB} MB read at once)")
    assert proc.returncode == 0, said[-3000:]
    assert answered == {r["id"] for r in good}
    assert set(failed) == {r["id"] for r in bad}
    assert set(kinds) <= {"response_too_large", "memory_bound"}, kinds
    assert peak_mb < PEAK_MB, f"peak RSS {peak_mb:.0f} MB"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_probes_answers_hold_at_most_the_bound(tmp_path: Path, qwen3_dir: Path,
                                                   qwen3: Format, reliability) -> None:
    case = reliability(SCENARIO, f"the probe's five requests all answered {HUGE_MB} MB at once "
                       f"(max_response_mb {CAP_MB}, max_in_flight_response_mb {BOUND_MB}): "
                       "what they hold together stays under the bound")
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(1))
    requests, _ = probe_requests(qwen3)
    with ServerProcess("--latency", "0.3", "--huge-body-mb", str(HUGE_MB),
                       "--fault-rate", "huge_chunked=1") as server:
        cfg = load_config(write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("b", "openai", server.url, max_retries=0, max_response_mb=CAP_MB,
                         max_in_flight_response_mb=BOUND_MB)],
            datasets=[{"name": "d", "path": str(data)}]))
        backend = make_backend(cfg.backends[0], cfg.model, cfg.sampling)

        async def probe() -> list[Any]:
            await backend.start()
            try:
                return await asyncio.gather(*(exchange(backend, r, MAX_TOKENS)
                                              for r in requests))
            finally:
                await backend.close()

        tracemalloc.start()
        try:
            exchanges = asyncio.run(probe())
            peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
    kinds = sorted({ex.error.kind for ex in exchanges if ex.error is not None})
    case.runs = 1
    case.note(f"{len(requests)} requests, errors {kinds}; peak of memory allocated while they "
              f"were read: {peak_mb:.0f} MB (without the bound: {len(requests)} × {CAP_MB} MB)")
    assert all(ex.error is not None for ex in exchanges)
    assert set(kinds) <= {"response_too_large", "memory_bound"}, kinds
    assert peak_mb < BOUND_MB + 8, f"{peak_mb:.0f} MB held at once"
