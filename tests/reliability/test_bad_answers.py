"""2. Server faults: answers no model format can take, and answers too big to hold.

A malformed tool call (a name that is null, "" or a number; `tool_calls` an object, a string or
`[null]`; a call with no function) fails its own request as `bad_response`, with the reason, and
the answers rebuilt beside it are written. A body of hundreds of MB (or a gzip bomb, or a stream
that never stops growing) fails its own request at `max_response_mb`, and the process never holds
it."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from draftgen.testing.fake_engine import BAD_TOOL_CALLS
from tests.e2e_helpers import fast_backend, write_config
from tests.reliability.helpers import (
    ServerProcess,
    check_folder,
    draftgen,
    no_probe,
    prompt_rows,
    write_jsonl,
)

SCENARIO = "2. Server faults"
COPIES = 2
"""Prompts per malformed kind (on each wire)."""


def _fault_rows(kinds: list[str], copies: int = 1) -> list[dict[str, object]]:
    return [{"id": f"{kind}-{n}", "messages": [
        {"role": "user", "content": f"Question {n} [[fault:{kind}]]"}]}
        for kind in kinds for n in range(copies)]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_malformed_tool_call_fails_alone(tmp_path: Path, qwen3_dir: Path, reliability,
                                           stream: bool) -> None:
    wire = "SSE" if stream else "JSON"
    case = reliability(SCENARIO, f"malformed tool calls ({', '.join(BAD_TOOL_CALLS)}; {wire}) "
                       "among good answers arriving together: each fails alone as "
                       "`bad_response` with its reason, its neighbours are written")
    bad = _fault_rows(list(BAD_TOOL_CALLS), COPIES)
    good = prompt_rows(30)
    data = write_jsonl(tmp_path / "d.jsonl", good + bad)
    with ServerProcess("--mode", "openrouter", "--prices", "0.5,2.5", "--latency", "0.2",
                       "--reasoning-tokens", "5,30", "--content-tokens", "5,30") as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("or", "openrouter", server.url, stream=stream, max_retries=0,
                         concurrency=64, price={"prompt": 0.5, "completion": 2.5})],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64})
        proc = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=240)
    said = proc.stdout + proc.stderr
    check = check_folder(tmp_path / "run")
    failed = {f["id"].split("/", 1)[1]: f for f in check.failed.get("d", [])}
    answered = {i.split("/", 1)[1] for i in check.ids("d")}
    case.runs = 1
    case.lost = len({r["id"] for r in good} - answered) + len({r["id"] for r in bad} - set(failed))
    case.duplicated = check.duplicated
    case.corrupt = len(check.corrupt)
    case.crashed = said.count("Traceback") + int(proc.returncode != 0)
    kinds = sorted({f["kind"] for f in failed.values()})
    example = next((f["message"] for f in failed.values()), "")
    case.note(f"{len(bad)} malformed answers among {len(good)} good ones: {len(answered)} "
              f"answers written, failures recorded as {kinds}, e.g. `{example}`; "
              f"{said.count('Traceback')} tracebacks; exit {proc.returncode}")
    assert proc.returncode == 0, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert answered == {r["id"] for r in good}
    assert {i: f["kind"] for i, f in failed.items()} == dict.fromkeys(
        (r["id"] for r in bad), "bad_response")
    for row_id, failure in failed.items():
        assert "tool_calls" in failure["message"], (row_id, failure)
    assert not check.corrupt and not check.duplicated


RSS_PROBE = """
import atexit, re, sys
def peak_kb():
    with open("/proc/self/status") as f:
        return re.search(r"VmHWM:\\s+(\\d+) kB", f.read())[1]
atexit.register(lambda: print("PEAK_RSS_KB", peak_kb(), file=sys.stderr))
from draftgen.cli import app
sys.argv = ["draftgen", *sys.argv[1:]]
app()
"""
"""`draftgen` with its peak RSS printed on stderr at exit: this process's own high-water mark
(VmHWM), not `ru_maxrss`, which Linux carries over from the parent across fork and exec (an
xdist worker holding 900 MB would be counted)."""
HUGE_MB = 1024
CAP_MB = 8
PEAK_MB = 768
"""A run of the test's prompts peaks at about 450 MB of RSS (the tokenizer, the Python heap):
this leaves room for that, and none for a body of HUGE_MB (read, then parsed)."""
ROOMY_MAX_TOKENS = 16384
"""A `max_tokens` whose own bound on an answer's bytes (`backends.base.answer_byte_bound`, about
43 MB for Qwen3) lets a body of tens of MB through, so that the bound under test (the cap, the
bound on answers in flight) is what stops it."""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_huge_answer_fails_alone_at_the_cap(tmp_path: Path, qwen3_dir: Path, reliability,
                                              stream: bool) -> None:
    wire = "SSE" if stream else "JSON"
    case = reliability(SCENARIO, f"a {HUGE_MB} MB answer and a gzip bomb inflating to "
                       f"{HUGE_MB} MB ({wire}; max_response_mb {CAP_MB}): each fails alone as "
                       "`response_too_large`, the process never holds it")
    bad = _fault_rows(["huge_body", "gzip_bomb"])
    good = prompt_rows(20)
    data = write_jsonl(tmp_path / "d.jsonl", good + bad)
    with ServerProcess("--latency", "0.05", "--huge-body-mb", str(HUGE_MB),
                       "--reasoning-tokens", "5,30", "--content-tokens", "5,30") as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "openai", server.url, stream=stream, max_retries=1,
                         concurrency=16, max_response_mb=CAP_MB)],
            datasets=[{"name": "d", "path": str(data)}],
            sampling={"max_tokens": ROOMY_MAX_TOKENS})
        proc = subprocess.run([sys.executable, "-c", RSS_PROBE, "run", str(cfg), "--no-live",
                               *no_probe()], capture_output=True, text=True, timeout=240)
    said = proc.stdout + proc.stderr
    peak = re.search(r"PEAK_RSS_KB (\d+)", said)
    peak_mb = int(peak[1]) / 1024 if peak else math.inf  # no line: the process was killed
    check = check_folder(tmp_path / "run")
    failed = {f["id"].split("/", 1)[1]: f for f in check.failed.get("d", [])}
    answered = {i.split("/", 1)[1] for i in check.ids("d")}
    case.runs = 1
    case.lost = len({r["id"] for r in good} - answered) + len({r["id"] for r in bad} - set(failed))
    case.crashed = said.count("Traceback") + int(proc.returncode != 0)
    case.corrupt = len(check.corrupt)
    example = next((f["message"] for f in failed.values()), "")
    case.note(f"exit {proc.returncode}; {len(answered)}/{len(good)} good answers written; "
              f"{sorted(failed)} failed as {sorted({f['kind'] for f in failed.values()})}, "
              f"e.g. `{example}`; peak RSS {peak_mb:.0f} MB")
    assert proc.returncode == 0, said[-3000:]
    assert answered == {r["id"] for r in good}
    assert {i: f["kind"] for i, f in failed.items()} == dict.fromkeys(
        (r["id"] for r in bad), "response_too_large")
    assert all("max_response_mb" in f["message"] for f in failed.values()), failed
    assert peak_mb < PEAK_MB, f"peak RSS {peak_mb:.0f} MB"
    records = (tmp_path / "run" / "d" / "responses.jsonl").read_bytes().splitlines()
    assert max(len(orjson.loads(r)["output_ids"]) for r in records) <= 100  # the good ones
