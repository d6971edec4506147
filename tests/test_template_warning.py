"""A paid run whose prompts differ from the model's own chat template says so where a user looks:
the run's opening lines (a warning, the run goes on: a format can differ on purpose),
run.json's session, `draftgen status` and the report, with the format that matches."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.report import write_report
from draftgen.status import collect_status
from draftgen.store.runjson import TemplateCheck
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, mixed_rows, run_config, write_config, write_jsonl

PRICE = (0.5, 2.5)
MATCHES = "format qwen3 renders them as the template does"


def paid_run(tmp_path: Path, qwen3_dir: Path, fmt: str) -> Path:
    """A paid run of 5 prompts with model.format `fmt` on the genuine Qwen3 folder."""
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(5))
    with TestServer(mode="openrouter", prices=PRICE, latency_s=0.01) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("or", "openrouter", server.url, logprobs=False)],
            datasets=[{"name": "d", "path": str(data)}], budget={"usd": 1.0},
            sampling={"max_tokens": 64})
        raw = yaml.safe_load(cfg.read_text())
        raw["model"]["format"] = fmt
        cfg.write_text(yaml.safe_dump(raw))
        outcome = run_config(cfg)
    assert outcome.status == "completed", outcome.message  # a warning, not a refusal
    return tmp_path / "run"


def test_a_run_with_another_format_than_the_template_warns_everywhere(
        tmp_path: Path, qwen3_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="draftgen"):
        run = paid_run(tmp_path, qwen3_dir, "qwen3-thinking")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "chat template differ" in r.getMessage()]
    assert len(warned) == 1
    assert "format 'qwen3-thinking' and the model's own chat template differ on 5 of 5" in (
        warned[0])
    assert MATCHES in warned[0]

    session = orjson.loads((run / "run.json").read_bytes())["sessions"][-1]
    assert session["template_check"] == {
        "format": "qwen3-thinking", "samples": 5, "differing": 5,
        "first": "sample: plain: first difference at token 15", "matches": ["qwen3"],
        "error": None}

    st = collect_status(run)
    assert [n for n in st.notes if n.startswith("prompts: ")] == [f"prompts: {warned[0]}"]
    assert st.as_json()["template_check"]["matches"] == ["qwen3"]
    shown = CliRunner().invoke(app, ["status", str(run)])
    assert MATCHES in " ".join(shown.output.split()), shown.output

    write_report(run, tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert 'id="template-check"' in page and MATCHES in page


def test_a_run_with_the_templates_format_says_nothing(
        tmp_path: Path, qwen3_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="draftgen"):
        run = paid_run(tmp_path, qwen3_dir, "qwen3")
    assert not any("chat template" in r.getMessage() for r in caplog.records)
    check = orjson.loads((run / "run.json").read_bytes())["sessions"][-1]["template_check"]
    assert check["differing"] == 0 and check["samples"] == 5
    assert not [n for n in collect_status(run).notes if n.startswith("prompts: ")]
    write_report(run, tmp_path / "report")
    assert 'id="template-check"' not in (tmp_path / "report" / "index.html").read_text()


def test_the_warning_names_every_matching_format_or_none() -> None:
    found = TemplateCheck(format="x", samples=5, differing=2, first="sample: tools: at 3",
                          matches=["a", "b"])
    assert "formats a, b render them as the template does" in str(found.warning)
    assert "render" not in str(TemplateCheck(format="x", samples=5, differing=1,
                                             first="f").warning)
    assert TemplateCheck(format="x", samples=5).warning is None
