"""Small holes: a chat template that does not finish (3. Bad input), conversations a `turns:
all` run could not take or continue (3. Bad input), and two exports to one folder (6.
Concurrency safety). Each is met with one clear line, never a hang or a traceback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.config import DatasetConfig, SamplingChoice, load_config
from draftgen.datasets.admission import LoadStats
from draftgen.datasets.conversations import RESULTS_UNASKED, iter_conversations
from draftgen.datasets.errors import DatasetError
from draftgen.datasets.sampling_mix import choose
from draftgen.export import pipeline
from draftgen.export.options import ExportError, ExportFormat, ExportOptions
from draftgen.formats import get_format
from draftgen.formats.base import FormatError
from draftgen.formats.chat_template import ChatTemplate, RenderLimits, TemplateDidNotFinish
from draftgen.run.turns import Formats, start_conversation
from draftgen.store.record import Record, read_record
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import Tokenizer
from tests.e2e_helpers import (
    WEATHER_TOOL,
    fast_backend,
    mixed_rows,
    read_records,
    run_config,
    write_config,
    write_jsonl,
)
from tests.test_export import write_run
from tests.test_run_trajectories import assistant, call, chat_rows, tool_result, tool_rows, user

BAD_INPUT = "3. Bad input"
CONCURRENCY = "6. Concurrency safety"

# ---- 12. chat templates that do not finish -------------------------------------------------

NESTED_LOOPS = ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}"
                "{% endfor %}{{ messages[0].content }}")
HUGE_RANGE = "{% for i in range(10**12) %}{{ i }}{% endfor %}"
TEMPLATES = {"nested range(99999) loops": NESTED_LOOPS, "range(10**12)": HUGE_RANGE}


@pytest.fixture
def quick_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 s render limit instead of 10 s, so that a looping template is stopped quickly."""
    monkeypatch.setattr(ChatTemplate, "limits", RenderLimits(seconds=2), raising=False)


def _model_with_template(root: Path, qwen3_dir: Path, template: str) -> Path:
    folder = root / "model"
    shutil.copytree(qwen3_dir, folder)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder


def _config(root: Path, model: Path, fmt: str) -> Path:
    data = write_jsonl(root / "data.jsonl", mixed_rows(4))
    path = write_config(root, model, [{"name": "local", "type": "openai",
                                       "url": "http://127.0.0.1:9/v1"}],
                        [{"name": "mix", "path": str(data)}])
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["format"] = fmt
    path.write_text(yaml.safe_dump(cfg))
    return path


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", list(TEMPLATES))
def test_a_template_that_does_not_finish_is_one_line(tmp_path: Path, qwen3_dir: Path,
                                                     reliability: Any, quick_limits: None,
                                                     kind: str) -> None:
    case = reliability(BAD_INPUT, f"a chat template with {kind}: check-format and run "
                       "--dry-run stop (or warn) with one line naming the template file")
    model = _model_with_template(tmp_path, qwen3_dir, TEMPLATES[kind])
    template_file = str(model / "chat_template.jinja")
    outcomes = {
        "check-format": _invoke("check-format", str(_config(tmp_path / "a", model, "qwen3"))),
        "run --dry-run (format chat-template)": _invoke(
            "run", "--dry-run", str(_config(tmp_path / "b", model, "chat-template"))),
        "run --dry-run (format qwen3)": _invoke(
            "run", "--dry-run", str(_config(tmp_path / "c", model, "qwen3"))),
    }
    for label, result in outcomes.items():
        case.runs += 1
        case.note(f"{label}: exit {result.exit_code}: {result.output.strip()[-300:]}")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            case.crashed += 1
        assert "Traceback" not in result.output, (label, result.output)
        lines = [line for line in result.output.splitlines() if "did not finish" in line]
        assert len(lines) == 1 and template_file in lines[0], (label, result.output)
    assert case.crashed == 0
    assert outcomes["check-format"].exit_code == 2
    assert outcomes["run --dry-run (format chat-template)"].exit_code == 2
    # the run renders with draftgen's own qwen3 format: the model's template only warns
    assert outcomes["run --dry-run (format qwen3)"].exit_code == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", [
    "{{ 10 ** 100000000 }}",
    "{{ 'x' * 10**10 }}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{% for i in range(99999) %}{{ range(99999)|sum }}{% endfor %}",
], ids=["power", "repeat", "recursion", "call-tree", "loop-of-sums"])
def test_a_runaway_template_is_stopped(quick_limits: None, source: str) -> None:
    template = ChatTemplate(source, {}, origin="model/chat_template.jinja")
    with pytest.raises(TemplateDidNotFinish, match=r"model/chat_template\.jinja did not finish"):
        template.render([{"role": "user", "content": "Hi"}], None, add_generation_prompt=True)


def test_a_template_raising_python_errors_is_a_format_error() -> None:
    with pytest.raises(FormatError, match="ZeroDivisionError"):
        ChatTemplate("{{ 1 / 0 }}", {}).render([], None, add_generation_prompt=True)


# ---- 13. turns: all conversations ------------------------------------------------------------


def test_a_tool_result_before_any_call_is_a_bad_row(tmp_path: Path, reliability: Any) -> None:
    case = reliability(BAD_INPUT, "turns: all: a tool result before any assistant tool call "
                       "is a bad row naming its line; one after a turn that called nothing "
                       "ends the conversation there")
    rows = [
        {"id": "orphan", "messages": [user("Weather?"), tool_result("sunny"), assistant("ok")]},
        {"id": "late", "messages": [user("A"), assistant("a"), user("B"), tool_result("sunny"),
                                    assistant("b")]},
        {"id": "good", "tools": [WEATHER_TOOL], "messages": [
            user("Weather?"), assistant("", [call("Paris")]), tool_result("sunny"),
            assistant("Sunny.")]},
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    stats = LoadStats()
    plans = {p.id.split("/")[-1]: p for p in iter_conversations(
        DatasetConfig(name="chat", path=str(data), turns="all"), stats)}
    case.runs = 1
    case.note(f"bad rows: {[(b.source, b.reason) for b in stats.examples]}; "
              f"plans: {sorted(plans)}")
    assert stats.bad_rows == 1, stats
    [bad] = stats.examples
    assert bad.source == f"{data}:1"
    assert "tool result" in bad.reason and "before any assistant turn called a tool" in \
        bad.reason
    assert sorted(plans) == ["good", "late"]
    assert len(plans["late"].turns) == 1 and plans["late"].ends_early == RESULTS_UNASKED
    assert len(plans["good"].turns) == 2 and plans["good"].ends_early is None


def test_tool_calls_returned_as_text_are_recognised(tmp_path: Path, qwen3_dir: Path,
                                                    qwen3_tok: Tokenizer,
                                                    reliability: Any) -> None:
    case = reliability(BAD_INPUT, "turns: all on a backend that returns tool calls as raw "
                       "<tool_call> text (no tool parser): the format reads the call, the "
                       "dataset's result is fed back, a resumed run reads it the same way")
    data = write_jsonl(tmp_path / "tools.jsonl", tool_rows()[:1])  # the call the dataset made
    with TestServer(tool_call_display="content", reasoning_tokens=(3, 8),
                    content_tokens=(3, 8)) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("engine", "vllm", server.url, concurrency=2)],
            datasets=[{"name": "tools", "path": str(data), "turns": "all"}])
        outcome = run_config(cfg)
    records = sorted(read_records(tmp_path / "run", "tools"), key=lambda r: r["turn"])
    case.runs = 1
    case.note(f"ends: {[r['end'] for r in records]}; turn 0 content: "
              f"{records[0]['content']!r}")
    assert outcome.status == "completed", outcome.message
    assert "<tool_call>" in records[0]["content"] and not records[0].get("tool_calls")
    assert [r["end"] for r in records] == [None, "last_turn"]
    fed = [m for m in records[1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in fed] == ["sunny"]
    # a resumed run rebuilds the conversation from turn 0's record and reads the call again
    run_cfg = load_config(cfg)
    written = [_record(tmp_path / "run" / "tools" / "responses.jsonl", turn=0)]
    [plan] = iter_conversations(run_cfg.datasets[0])
    fmt = get_format("qwen3", qwen3_tok)
    conversation = start_conversation(plan, run_cfg, Formats(run_cfg, fmt), written)
    assert conversation.next_prompt().messages == records[1]["messages"]


def _record(path: Path, turn: int) -> Record:
    for line in path.read_bytes().splitlines(keepends=True):
        record = read_record(line)
        if isinstance(record, Record) and record.turn == turn:
            return record
    raise AssertionError(f"no turn {turn} in {path}")


def test_weights_near_the_float_limit_still_mix(reliability: Any) -> None:
    case = reliability(BAD_INPUT, "sampling_mix weights of 1e308: both choices drawn, no "
                       "overflow to one choice for every conversation")
    mix = [SamplingChoice(weight=1e308, temperature=0.2),
           SamplingChoice(weight=1e308, temperature=0.9)]
    drawn = [choose(mix, 7, f"chat/c{i}").temperature for i in range(2000)]
    share = drawn.count(0.2) / len(drawn)
    case.runs = 1
    case.note(f"share of the first choice over 2,000 conversations: {share:.3f}")
    assert 0.45 < share < 0.55


def test_a_mix_max_tokens_over_the_datasets_budget_is_refused(tmp_path: Path,
                                                              reliability: Any) -> None:
    case = reliability(BAD_INPUT, "sampling_mix max_tokens: 100000000 over the dataset's "
                       "max_output_tokens: refused before anything is sent, naming the key")
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(2))
    dataset = DatasetConfig(name="chat", path=str(data), turns="all", max_output_tokens=100_000,
                            sampling_mix=[SamplingChoice(weight=1),
                                          SamplingChoice(weight=1, max_tokens=100_000_000)])
    case.runs = 1
    with pytest.raises(DatasetError) as refused:
        list(iter_conversations(dataset))
    case.note(str(refused.value))
    assert "datasets[chat].sampling_mix[1].max_tokens" in str(refused.value)
    assert "max_output_tokens (100,000)" in str(refused.value)


# ---- 14. exports to one --out -----------------------------------------------------------------


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory: pytest.TempPathFactory, qwen3_tok: Tokenizer) -> Path:
    return write_run(tmp_path_factory.mktemp("run"), qwen3_tok, {"chat": 30, "code": 20})


def _parquet_rows(out: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.read_metadata(out / "data.parquet").num_rows)


def test_a_second_export_to_the_same_out_fails_at_once(
        exported_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        reliability: Any) -> None:
    case = reliability(CONCURRENCY, "two `draftgen export`s to one --out at once: the second "
                       "fails at once naming the first; the folder holds what the first "
                       "reported")
    out = tmp_path / "export"
    write_rows = pipeline._write_rows
    second: list[Any] = []

    def write_then_export_again(*args: Any) -> None:
        write_rows(*args)
        if not second:  # while the first export is writing: the second, chat only
            second.append(None)
            second[0] = _invoke("export", str(exported_run), "--format", "parquet", "--out",
                                str(out), "--dataset", "chat")

    monkeypatch.setattr(pipeline, "_write_rows", write_then_export_again)
    first = pipeline.export_run(exported_run, ExportOptions(format=ExportFormat.parquet,
                                                            out=out))
    [other] = second
    case.runs = 2
    case.note(f"first wrote {first.written()} rows; second: exit {other.exit_code}: "
              f"{other.output.strip()}; the folder holds {_parquet_rows(out)} rows")
    if other.exit_code == 0:
        case.corrupt += 1  # a second success report the folder does not hold
    assert other.exit_code == ExportError.exit_code, other.output
    assert "another draftgen export is writing it" in other.output
    assert f"pid {os.getpid()}" in other.output
    assert _parquet_rows(out) == first.written() > 0
    manifest = json.loads((out / pipeline.MANIFEST).read_text())
    assert sum(manifest["written"].values()) == first.written()
    assert not list(tmp_path.glob(".export.*"))  # no lock file or staging folder left


def test_the_export_folder_follows_the_umask(exported_run: Path, tmp_path: Path,
                                             reliability: Any) -> None:
    case = reliability(CONCURRENCY, "the export folder is made with the umask's mode, not "
                       "0700")
    before = os.umask(0o022)
    try:
        pipeline.export_run(exported_run, ExportOptions(format=ExportFormat.parquet,
                                                        out=tmp_path / "export"))
    finally:
        os.umask(before)
    mode = (tmp_path / "export").stat().st_mode & 0o777
    case.runs = 1
    case.note(f"umask 022: folder mode {mode:o}")
    assert mode == 0o755
