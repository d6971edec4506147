"""2. Server faults: the probe's tool check. A model that answers a tool request without calling
the tool (its own choice) does not make a sound endpoint unsafe; an endpoint that drops the calls
(finish_reason tool_calls, no call) is unsafe for prompts with tools only, and still serves the
prompts without tools, each prompt routed by what it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.probe.exchange import WEATHER_TOOL
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, write_config
from tests.reliability.helpers import check_folder, draftgen, prompt_rows, write_jsonl

SCENARIO = "2. Server faults"
SHORT = {"reasoning_tokens": (5, 20), "content_tokens": (5, 20)}


def _tool_rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": f"What is the weather in town {i}? [[tool_call]]"}]}
        for i in range(n)]


def _run(tmp_path: Path, qwen3_dir: Path, servers: dict[str, TestServer]
         ) -> tuple[Any, dict[str, str], dict[str, Any]]:
    """`draftgen run` (probing first) of 8 prompts with tools and 8 without on `servers`:
    its process, which backend answered each prompt, and run.json's probe record."""
    data = write_jsonl(tmp_path / "d.jsonl", _tool_rows(8) + prompt_rows(8))
    cfg = write_config(tmp_path, qwen3_dir, backends=[
        fast_backend(name, "openai", server.url, logprobs=False, priority=n)
        for n, (name, server) in enumerate(servers.items())],
        datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 256})
    proc = draftgen("run", str(cfg), "--no-live", timeout=240)
    answers = tmp_path / "run" / "d" / "responses.jsonl"
    records = [orjson.loads(x) for x in
               (answers.read_bytes().splitlines() if answers.exists() else [])]
    by_id = {r["id"].split("/", 1)[1]: r["backend"] for r in records}
    probe = orjson.loads((tmp_path / "run" / "run.json").read_bytes()).get("probe", {})
    return proc, by_id, probe


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_model_declining_one_tool_request_leaves_the_endpoint_sound(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability(SCENARIO, "probe: the model answers the weather prompt without calling "
                       "the tool (the others call it): the backend is not unsafe and serves "
                       "the run's prompts with tools")
    with TestServer(**SHORT, declines_tool_for="Paris") as server:
        proc, by_id, probe = _run(tmp_path, qwen3_dir, {"declines": server})
    said = proc.stdout + proc.stderr
    check = check_folder(tmp_path / "run")
    case.runs = 1
    case.lost = 16 - len(by_id)
    case.crashed = int(proc.returncode != 0) + said.count("Traceback")
    verdict = probe.get("backends", {}).get("declines", {}).get("verdict")
    warning = next((w for w in probe.get("backends", {}).get("declines", {}).get("warnings", [])
                    if "without a tool call" in w), "")
    case.note(f"exit {proc.returncode}; verdict {verdict}; {len(by_id)}/16 answered; "
              f"warning: `{warning}`")
    assert proc.returncode == 0, said[-3000:]
    assert verdict in ("exact", "reconstructable"), probe
    assert "1 of 3 tool requests" in warning
    assert len(by_id) == 16 and not check.corrupt


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_endpoint_dropping_calls_serves_only_prompts_without_tools(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability(SCENARIO, "probe: an endpoint whose tool parser drops the calls "
                       "(finish_reason tool_calls, no call) is unsafe for prompts with tools "
                       "only: it serves the prompts without tools, another backend those with; "
                       "alone, it leaves the prompts with tools unsent")
    with TestServer(**SHORT, tool_parser_drops=True) as dropping, TestServer(**SHORT) as good:
        proc, by_id, probe = _run(tmp_path / "both", qwen3_dir,
                                  {"dropping": dropping, "good": good})
        alone, alone_by_id, alone_probe = _run(tmp_path / "alone", qwen3_dir,
                                               {"dropping": dropping})
    said = proc.stdout + proc.stderr
    tool_ids = {f"t{i}" for i in range(8)}
    plain_ids = {f"p{i}" for i in range(8)}
    problems = probe.get("backends", {}).get("dropping", {}).get("problems", [])
    to_dropping = {i for i, b in by_id.items() if b == "dropping"}
    case.runs = 2
    case.lost = len((tool_ids | plain_ids) - set(by_id)) + len(plain_ids - set(alone_by_id))
    case.crashed = int(proc.returncode != 0) + int(alone.returncode != 0)
    case.note(f"problems {[(p['code'], p['scope']) for p in problems]}; with a second backend: "
              f"{len(by_id)}/16 answered, {len(to_dropping)} plain prompts by the dropping one, "
              f"tool prompts all by the good one; alone: {len(alone_by_id)}/16 answered, the 8 "
              "with tools left unsent")
    assert proc.returncode == 0, said[-3000:]
    assert ("tool_calls_dropped", "tools") in [(p["code"], p["scope"]) for p in problems]
    assert {p["scope"] for p in problems} == {"tools"}  # (its lengths are off too)
    assert probe["last_gate"]["unfit"] == {"dropping": ["tools"]}
    assert set(by_id) == tool_ids | plain_ids
    assert to_dropping and to_dropping <= plain_ids  # priority 0: it takes what it may
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-3000:]
    assert set(alone_by_id) == plain_ids
    assert "left unsent for a later run" in alone.stderr
    assert alone_probe["last_gate"]["dropped"] == {}
