"""`draftgen probe` against the loopback test server in each of its behaviours (real Qwen3
tokenizer), the verdict rules, and `draftgen run`'s use of the probe."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.config import RunConfig, load_config
from draftgen.formats import Format, get_format
from draftgen.probe import BackendProbe, ProbeOptions, backend_key
from draftgen.probe.analyze import analyze
from draftgen.probe.command import probe_config
from draftgen.probe.exchange import WEATHER_TOOL, Exchange, probe_requests
from draftgen.probe.model import AnswerReport
from draftgen.probe.show import COLUMNS, findings, print_results, row, to_json
from draftgen.probe.verdict import judge
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import Tokenizer
from draftgen.types import RawAnswer, Usage
from tests.e2e_helpers import (
    fast_backend,
    read_records,
    run_config,
    write_config,
    write_jsonl,
)

PLAIN_QUESTION = "In one short sentence: what is the capital of France?"
SHORT = {"reasoning_tokens": (10, 40), "content_tokens": (5, 30), "edge_whitespace_rate": 0.0}
"""Short answers that finish well within the probe's max_tokens."""
MAX_TOKENS = 400
KINDS = ["plain", "reasoning", "tool", "tool", "tool"]
PROBE_REQUESTS = len(KINDS)


@pytest.fixture(scope="module")
def qwen3(qwen3_tok: Tokenizer) -> Format:
    return get_format("qwen3", qwen3_tok)


pytestmark = pytest.mark.usefixtures("restore_logging")


def _config(tmp_path: Path, qwen3_dir: Path, backends: list[dict[str, Any]]) -> RunConfig:
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "Hi"}]}])
    path = write_config(tmp_path, qwen3_dir, backends=backends,
                        datasets=[{"name": "d", "path": str(data)}])
    return load_config(path)


def probe_one(tmp_path: Path, qwen3_dir: Path, fmt: Format, backend_type: str,
              server: dict[str, Any] | None = None, **backend: Any) -> BackendProbe:
    """Probe one backend of `backend_type` on a test server configured with `server`."""
    with TestServer(**{**SHORT, **(server or {})}) as s:
        cfg = _config(tmp_path, qwen3_dir, [fast_backend("b", backend_type, s.url, **backend)])
        [result] = asyncio.run(probe_config(cfg, fmt, ProbeOptions(max_tokens=MAX_TOKENS)))
    assert [a.kind for a in result.answers] == KINDS
    return result


def _all(result: BackendProbe, attr: str) -> set[Any]:
    return {getattr(a, attr) for a in result.answers}


def _codes(result: BackendProbe) -> set[str]:
    return {p.code for p in result.problems}


def _tool(result: BackendProbe) -> AnswerReport:
    return next(a for a in result.answers if a.kind == "tool")


# ---- exact ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("omits_stop", [False, True])
def test_exact_via_sglang_generate(tmp_path: Path, qwen3_dir: Path, qwen3: Format,
                                   omits_stop: bool) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "sglang", {"generate_omits_stop_id": omits_stop})
    assert r.verdict == "exact" and not r.problems
    assert _all(r, "ids") == {"native"}
    assert _all(r, "reasoning") == {"ids"}  # inside the engine's IDs, not in a field
    assert _tool(r).tool_calls == "ids"
    assert _all(r, "logprobs") == {"none"}
    assert all(a.output_tokens == a.completion_tokens for a in r.answers)


def test_exact_via_vllm_token_ids(tmp_path: Path, qwen3_dir: Path, qwen3: Format) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "vllm", {"mode": "vllm", "raw_slices": True})
    assert r.verdict == "exact"
    assert _all(r, "ids") == {"native"}
    assert _all(r, "reasoning") == {"reasoning"}
    assert _all(r, "whitespace") == {"kept"}  # raw slices, compared with the IDs' own text
    assert _tool(r).tool_calls == "structured"
    assert _all(r, "text_rebuild") == {"matches"}


def test_exact_via_complete_logprobs(tmp_path: Path, qwen3_dir: Path, qwen3: Format) -> None:
    """OpenRouter-style: no token IDs, but logprobs with bytes cover every token; a sampled
    non-canonical split is recovered (text re-encoding would miss it); who served it, at which
    quantization, and what it cost."""
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openrouter",
                  {"mode": "openrouter", "prices": (0.5, 2.5), "providers": ["Alpha"],
                   "quantizations": {"Alpha": "fp8"}, "noncanonical_rate": 1.0})
    assert r.verdict == "exact", r.problems
    assert _all(r, "ids") == {"logprobs"} and _all(r, "logprobs") == {"complete"}
    assert _all(r, "text_rebuild") == {"differs"}
    assert _all(r, "whitespace") == {"stripped"}  # the server's default display trims
    assert _all(r, "provider") == {"Alpha"} and _all(r, "quantization") == {"fp8"}
    assert r.cost_usd > 0 and all(a.cost_usd > 0 for a in r.answers)
    assert any("would not give the engine's IDs" in w for w in r.warnings)


# ---- reconstructable -----------------------------------------------------------------------------


@pytest.mark.parametrize("no_logprobs", ["backend", "server"])
def test_reconstructable_raw_slices(tmp_path: Path, qwen3_dir: Path, qwen3: Format,
                                    no_logprobs: str) -> None:
    server: dict[str, Any] = {"raw_slices": True}
    backend: dict[str, Any] = {}
    if no_logprobs == "server":
        server["logprobs_scope"] = "none"
    else:
        backend["logprobs"] = False
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openai", server, **backend)
    assert r.verdict == "reconstructable" and not r.problems
    assert _all(r, "ids") == {"text"} and _all(r, "logprobs") == {"none"}
    assert _all(r, "whitespace") == {"kept"}
    assert _all(r, "length_delta") == {0}
    assert row(r)[6] == "5/5 match"


def test_stripped_whitespace_is_restored(tmp_path: Path, qwen3_dir: Path, qwen3: Format) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openai", {"strip_whitespace": True},
                  logprobs=False)
    assert r.verdict == "reconstructable"
    assert _all(r, "whitespace") == {"restored"}
    assert all("whitespace_restored" in a.flags for a in r.answers)


def test_stripped_whitespace_seen_against_logprobs(tmp_path: Path, qwen3_dir: Path,
                                                   qwen3: Format) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openai", {"strip_whitespace": True})
    assert r.verdict == "exact"
    assert _all(r, "whitespace") == {"stripped"}


@pytest.mark.parametrize(("field", "shown"), [
    ("reasoning_content", "reasoning_content"),
    ("reasoning_details", "reasoning_details"),
    ("both", "reasoning+reasoning_content"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_field_names(tmp_path: Path, qwen3_dir: Path, qwen3: Format, field: str,
                               shown: str, stream: bool) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openai", {"reasoning_field": field},
                  logprobs=False, stream=stream)
    assert r.verdict == "reconstructable", r.problems
    assert _all(r, "reasoning") == {shown}


# ---- unsafe --------------------------------------------------------------------------------------


def test_reasoning_missing_is_unsafe(tmp_path: Path, qwen3_dir: Path, qwen3: Format) -> None:
    """The endpoint hides the reasoning but bills its tokens: IDs rebuilt from text would lack
    it, and complete logprobs do not help (they no longer match the fields)."""
    for backend in ({"logprobs": False}, {}):
        r = probe_one(tmp_path, qwen3_dir, qwen3, "openai", {"reasoning_field": "none"},
                      **backend)
        assert r.verdict == "unsafe"
        assert {"reasoning_missing", "length_mismatch"} <= _codes(r)
        assert _all(r, "reasoning") == {"none"}
        assert all(p.scope == "all" for p in r.problems)


def test_noncanonical_lengths_without_logprobs_are_unsafe(tmp_path: Path, qwen3_dir: Path,
                                                          qwen3: Format) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openai", {"noncanonical_rate": 1.0},
                  logprobs=False)
    assert r.verdict == "unsafe" and _codes(r) == {"length_mismatch"}
    assert _all(r, "length_delta") == {-1}  # the engine sampled one token more
    assert "5 of 5" in r.problems[0].message


def test_tool_calls_structured_raw_text_and_missing(tmp_path: Path, qwen3_dir: Path,
                                                    qwen3: Format) -> None:
    structured = probe_one(tmp_path, qwen3_dir, qwen3, "openai", logprobs=False)
    assert _tool(structured).tool_calls == "structured"
    assert structured.verdict == "reconstructable"

    raw = probe_one(tmp_path, qwen3_dir, qwen3, "openai", {"tool_call_display": "content"},
                    logprobs=False)
    assert _tool(raw).tool_calls == "raw_text"
    assert raw.verdict == "reconstructable", raw.problems  # kept as is, not serialized twice
    assert _tool(raw).length_delta == 0

    missing = probe_one(tmp_path, qwen3_dir, qwen3, "openai", {"tools_supported": False},
                        logprobs=False)
    assert _tool(missing).tool_calls == "missing"
    assert missing.verdict == "unsafe"
    assert [(p.code, p.scope) for p in missing.problems] == [("tool_calls_missing", "tools")]
    assert missing.blocking(set()) == [] and missing.blocking({"tools"})


def test_no_tool_call_on_an_ids_endpoint_is_the_models_choice(
    tmp_path: Path, qwen3_dir: Path, qwen3: Format
) -> None:
    """The prompt went as IDs rendered with the tools: no call is the model's own answer."""
    r = probe_one(tmp_path, qwen3_dir, qwen3, "sglang", {"tools_supported": False})
    assert r.verdict == "exact" and _tool(r).tool_calls == "missing"
    assert any("its own choice" in w for w in r.warnings)


def test_logprobs_covering_only_content(tmp_path: Path, qwen3_dir: Path, qwen3: Format) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openai",
                  {"logprobs_scope": "content", "raw_slices": True})
    assert _all(r, "logprobs") == {"partial"}
    assert _all(r, "ids") == {"text"}
    assert r.verdict == "reconstructable"
    assert any("logprobs cover only part" in w for w in r.warnings)


def test_failed_requests_are_unsafe(tmp_path: Path, qwen3_dir: Path, qwen3: Format) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openai", {"api_key": "secret"}, logprobs=False)
    assert r.verdict == "unsafe" and _codes(r) == {"request_failed"}
    assert "auth" in r.problems[0].message


# ---- the rules themselves ------------------------------------------------------------------------


def _answer(kind: str, delta: int) -> AnswerReport:
    return AnswerReport(kind=kind, finish_reason="stop", ids="text",
                        token_check="length_ok" if delta == 0 else "length_mismatch",
                        completion_tokens=100, output_tokens=100 + delta, length_delta=delta,
                        reasoning="reasoning", whitespace="kept",
                        tool_calls="structured" if kind == "tool" else None)


@pytest.mark.parametrize(("deltas", "verdict"), [
    ((0, 0, 0), "reconstructable"),
    ((0, -1, 0), "reconstructable"),  # one off-by-one answer: a sampled split, warned about
    ((0, -5, 0), "unsafe"),  # too large for a split
    ((-1, -1, 0), "unsafe"),  # systematic
])
def test_length_rule(qwen3: Format, deltas: tuple[int, int, int], verdict: str) -> None:
    answers = [_answer(k, d) for k, d in zip(("plain", "reasoning", "tool"), deltas,
                                             strict=True)]
    got, _, warnings = judge(qwen3, answers, [], prompt_as_ids=False)
    assert got == verdict
    if deltas == (0, -1, 0):
        assert any("non-canonical split" in w for w in warnings)


def test_only_the_tool_answer_off_concerns_tools(qwen3: Format) -> None:
    answers = [_answer("plain", 0), _answer("reasoning", 0), _answer("tool", 7)]
    verdict, problems, _ = judge(qwen3, answers, [], prompt_as_ids=False)
    assert verdict == "unsafe" and [(p.code, p.scope) for p in problems] == [
        ("length_mismatch", "tools")]


def test_stop_token_in_content_is_unsafe(qwen3: Format) -> None:
    """A stray `<|im_end|>` inside the content (an engine that did not stop on it, or kept
    its text): flagged by the analysis, unsafe by the rules, even with the right length."""
    content = "Paris.<|im_end|>\nMore text"
    req = probe_requests(qwen3)[0][0]
    text = qwen3.answer_text("\nThinking.\n", "\n\n" + content, None, finished=True).text
    raw = RawAnswer(reasoning="\nThinking.\n", content="\n\n" + content, finish_reason="stop",
                    usage=Usage(completion_tokens=len(qwen3.tokenizer.encode(text))))
    a = analyze(qwen3, Exchange(req, raw), None, {})
    assert "stop_token_in_text" in a.flags and a.length_delta == 0
    verdict, problems, _ = judge(qwen3, [a], [], prompt_as_ids=False)
    assert verdict == "unsafe" and problems[0].code == "stop_token_in_answer"


def test_results_round_trip_and_key(tmp_path: Path, qwen3_dir: Path, qwen3: Format) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "sglang")
    again = BackendProbe.from_dict(orjson.loads(orjson.dumps(r.as_dict())))
    assert again == r
    assert BackendProbe.from_dict({"backend": "x"}) is None
    cfg = _config(tmp_path, qwen3_dir, [fast_backend("b", "openrouter", "http://h:1")])
    key = backend_key(cfg, "b", "sha")
    busier = cfg.model_copy(update={"backends": [
        cfg.backends[0].model_copy(update={"concurrency": 999, "priority": 3})]})
    assert backend_key(busier, "b", "sha") == key
    other = cfg.model_copy(update={"backends": [
        cfg.backends[0].model_copy(update={"reasoning": {"exclude": True}})]})
    assert backend_key(other, "b", "sha") != key
    assert backend_key(cfg, "b", "other-tokenizer") != key


# ---- the table -----------------------------------------------------------------------------------


def _printed(results: list[BackendProbe], width: int, terminal: bool, wide: bool = False) -> str:
    out = io.StringIO()
    console = Console(width=width, force_terminal=terminal, color_system=None, file=out)
    if wide:
        print_results(results, console, wide=True)
    else:
        print_results(results, console)
    return out.getvalue()


def _column(text: str, index: int) -> str:
    """A table column's text, its cells' lines joined by spaces (rows in `│`)."""
    cells = [line.split("│")[index + 1].strip() for line in text.splitlines()
             if line.startswith("│")]
    return " ".join(c for c in cells if c)


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
@pytest.mark.parametrize("width", [80, 120])
def test_the_table_fits_the_width_and_cuts_no_cell(tmp_path: Path, qwen3_dir: Path,
                                                   qwen3: Format, width: int,
                                                   terminal: bool) -> None:
    r = probe_one(tmp_path, qwen3_dir, qwen3, "openrouter",
                  {"mode": "openrouter", "prices": (0.5, 2.5), "providers": ["Alpha"],
                   "quantizations": {"Alpha": "fp8"}})
    text = _printed([r], width, terminal)
    assert max(map(len, text.splitlines())) <= width, text
    assert "…" not in text, text
    assert _column(text, 0) == "b" and _column(text, 1) == "exact"
    assert _column(text, 2) == findings(r)  # every check, wrapped at its spaces
    assert "provider: Alpha (fp8)" in findings(r) and "logprobs: complete" in findings(r)
    wide = _printed([r], 80, terminal, wide=True)
    assert "…" not in wide
    header = next(line for line in wide.splitlines() if "verdict" in line)
    assert [c.strip() for c in header.strip("┃").split("┃")] == list(COLUMNS)


# ---- the command ---------------------------------------------------------------------------------


def test_probe_command_json_table_and_exit_code(tmp_path: Path, qwen3_dir: Path) -> None:
    with TestServer(**SHORT) as good, TestServer(**SHORT, tools_supported=False) as notools:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("good", "sglang", good.url),
            fast_backend("notools", "openai", notools.url, logprobs=False),
        ], datasets=[{"name": "d", "path": str(tmp_path / "unused.jsonl")}])
        cli = CliRunner()
        as_json = cli.invoke(app, ["probe", str(cfg), "--json", "--no-save",
                                   "--max-tokens", str(MAX_TOKENS)])
        saved_without_save = (tmp_path / "run" / "run.json").exists()
        only_good = cli.invoke(app, ["probe", str(cfg), "-b", "good",
                                     "--max-tokens", str(MAX_TOKENS)])
        unknown = cli.invoke(app, ["probe", str(cfg), "-b", "nope"])
    assert as_json.exit_code == 1, as_json.output
    data = orjson.loads(as_json.stdout)
    assert data["unsafe"] == ["notools"]
    assert [b["verdict"] for b in data["backends"]] == ["exact", "unsafe"]
    assert data["backends"][1]["problems"][0]["scope"] == "tools"
    assert not saved_without_save
    assert only_good.exit_code == 0, only_good.output
    assert "exact" in only_good.stdout and "probe spend" in only_good.stdout
    stored = orjson.loads((tmp_path / "run" / "run.json").read_bytes())["probe"]["backends"]
    assert list(stored) == ["good"]
    assert unknown.exit_code == 2 and "no backend named nope" in unknown.output
    assert to_json([])["cost_usd"] == 0


# ---- draftgen run --------------------------------------------------------------------------------


def _tool_rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "tools": [WEATHER_TOOL],
             "messages": [{"role": "user", "content": f"What is the weather in town {i}?"}]}
            for i in range(n)]


def _plain_rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]}
            for i in range(n)]


def _probe_requests(server: TestServer) -> int:
    return int(server.stats["per_prompt"].get(PLAIN_QUESTION, 0))


def _run(cfg: Path, *args: str) -> Any:
    return CliRunner().invoke(app, ["run", str(cfg), "--no-live", *args])


def _run_json(tmp_path: Path) -> dict[str, Any]:
    return orjson.loads((tmp_path / "run" / "run.json").read_bytes())


def test_a_backend_unsafe_for_tools_serves_the_prompts_without(tmp_path: Path,
                                                              qwen3_dir: Path) -> None:
    """The probe finds `notools` unsafe for prompts with tools only: it serves the dataset's
    prompts without tools, `good` those with tools."""
    data = write_jsonl(tmp_path / "tools.jsonl", _tool_rows(6) + _plain_rows(6))
    with TestServer(**SHORT) as good, TestServer(**SHORT, tools_supported=False) as notools:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("good", "sglang", good.url, priority=1),
            fast_backend("notools", "openai", notools.url, logprobs=False, priority=0),
        ], datasets=[{"name": "d", "path": str(data)}])
        result = _run(cfg)
        sent_to_notools = sum(notools.stats["per_prompt"].values())
    assert result.exit_code == 0, result.output
    assert "backend notools serves only prompts without tools" in result.output
    assert "datasets needing tools: d" in result.output
    records = read_records(tmp_path / "run", "d")
    assert len(records) == 12
    by_backend = {r["id"].split("/", 1)[1]: r["backend"] for r in records}
    assert {i for i, b in by_backend.items() if b == "good"} >= {f"t{i}" for i in range(6)}
    assert {i for i, b in by_backend.items() if b == "notools"} <= {f"p{i}" for i in range(6)}
    assert sent_to_notools > PROBE_REQUESTS  # the probe's requests, then plain prompts
    probe = _run_json(tmp_path)["probe"]
    assert probe["last_gate"]["dropped"] == {}
    assert probe["last_gate"]["unfit"] == {"notools": ["tools"]}
    assert probe["backends"]["notools"]["verdict"] == "unsafe"


def test_run_keeps_a_tools_only_unsafe_backend_without_tool_prompts(
    tmp_path: Path, qwen3_dir: Path
) -> None:
    data = write_jsonl(tmp_path / "plain.jsonl", _plain_rows(8))
    with TestServer(**SHORT, tools_supported=False) as notools:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("notools", "openai", notools.url, logprobs=False)],
            datasets=[{"name": "d", "path": str(data)}])
        result = _run(cfg)
    assert result.exit_code == 0, result.output
    assert len(read_records(tmp_path / "run", "d")) == 8


def test_run_refuses_when_no_backend_is_safe_and_no_probe_skips(tmp_path: Path,
                                                                qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "plain.jsonl", _plain_rows(5))
    with TestServer(**SHORT, reasoning_field="none") as hidden:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("hidden", "openai", hidden.url, logprobs=False)],
            datasets=[{"name": "d", "path": str(data)}])
        refused = _run(cfg)
        sent_after_refusal = sum(hidden.stats["per_prompt"].values())
        records_after_refusal = read_records(tmp_path / "run", "d")
        skipped = _run(cfg, "--no-probe")
        probes_after_skip = _probe_requests(hidden)
    assert refused.exit_code == 1
    assert "no backend safe for this run, so nothing was sent" in refused.output
    assert "reasoning did not arrive" in refused.output
    assert sent_after_refusal == PROBE_REQUESTS  # the probe's requests only
    assert records_after_refusal == []
    assert _run_json(tmp_path)["sessions"][0]["outcome"] == "failed"
    assert skipped.exit_code == 0, skipped.output
    assert probes_after_skip == 1  # --no-probe sent no probe request
    records = read_records(tmp_path / "run", "d")
    assert len(records) == 5 and {r["token_check"] for r in records} == {"length_mismatch"}


def test_resume_reuses_the_stored_probe_unless_asked(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "plain.jsonl", _plain_rows(4))
    with TestServer(**SHORT) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("b", "openai", server.url)],
            datasets=[{"name": "d", "path": str(data)}])
        probed = CliRunner().invoke(app, ["probe", str(cfg)])  # stored for the run
        runs = [_run(cfg), _run(cfg), _run(cfg, "--probe")]
        probes = _probe_requests(server)
    assert probed.exit_code == 0, probed.output
    assert [r.exit_code for r in runs] == [0, 0, 0], runs[0].output
    assert probes == 2  # `draftgen probe`, then `run --probe`; the plain runs reused it
    assert "stored result" in runs[0].output
    assert _run_json(tmp_path)["probe"]["last_gate"]["reused"] == []
    assert len(read_records(tmp_path / "run", "d")) == 4


def test_a_conflicting_probe_option_is_refused(tmp_path: Path) -> None:
    result = _run(tmp_path / "whatever.yaml", "--probe", "--no-probe")
    assert result.exit_code == 2 and "contradict" in result.output


def test_runner_api_does_not_probe_unless_asked(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "plain.jsonl", _plain_rows(3))
    with TestServer(**SHORT) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("b", "sglang", server.url)], datasets=[{"name": "d", "path": str(data)}])
        assert run_config(cfg).status == "completed"
        assert _probe_requests(server) == 0
    assert "probe" not in _run_json(tmp_path)


def test_shards_of_a_run_probe_once(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "plain.jsonl", _plain_rows(8))
    with TestServer(**SHORT) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("b", "openai", server.url)],
            datasets=[{"name": "d", "path": str(data)}])
        runs = [_run(cfg, "--shard", f"{i}/2") for i in range(2)]
        probes = _probe_requests(server)
    assert [r.exit_code for r in runs] == [0, 0], runs[0].output
    assert probes == 1  # shard 0 probed; shard 1 reused its result
    assert "stored result" in runs[1].output
    second = orjson.loads((tmp_path / "run" / "shards" / "1-of-2" / "run.json").read_bytes())
    assert second["probe"]["backends"]["b"]["verdict"] == "exact"
    assert second["probe"]["last_gate"]["reused"] == ["b"]
    answered = [r["id"] for i in range(2)
                for r in read_records(tmp_path / "run" / "shards" / f"{i}-of-2", "d")]
    assert sorted(answered) == sorted(f"d/p{i}" for i in range(8))
