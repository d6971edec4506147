"""Small holes: a chat template that does not finish (3. Bad input), conversations a `turns:
all` run could not take or continue (3. Bad input), and two exports to one folder (6.
Concurrency safety). Each is met with one clear line, never a hang or a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.formats.base import FormatError
from draftgen.formats.chat_template import ChatTemplate, RenderLimits, TemplateDidNotFinish
from tests.e2e_helpers import mixed_rows, write_config, write_jsonl

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
