"""`draftgen check-format`: draftgen's format against the model folder's own chat template, on
sample conversations and the first rows of the user's datasets; `run --dry-run` warns."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.formats import get_format
from draftgen.formats.check import disagreement_warning
from draftgen.testing.assets import (
    cached_tokenizer,
    deepseek_r1_tokenizer_dir,
    qwen3_tokenizer_dir,
)
from tests.e2e_helpers import mixed_rows, write_config, write_jsonl

BACKENDS = [{"name": "local", "type": "openai", "url": "http://127.0.0.1:9/v1"}]


def config(tmp_path: Path, tokenizer: Path, fmt: str = "qwen3", **options: Any) -> Path:
    data = write_jsonl(tmp_path / "data.jsonl", mixed_rows(10))
    path = write_config(tmp_path, tokenizer, BACKENDS, [{"name": "mix", "path": str(data)}])
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["format"] = fmt
    if options:
        cfg["model"]["format_options"] = options
    path.write_text(yaml.safe_dump(cfg))
    return path


def wrong_qwen3_folder(tmp_path: Path) -> Path:
    """The genuine Qwen3 folder with one sentence of the tool preamble changed."""
    folder = tmp_path / "model"
    shutil.copytree(qwen3_tokenizer_dir(), folder)
    config_file = folder / "tokenizer_config.json"
    data = json.loads(config_file.read_text(encoding="utf-8"))
    genuine = "You may call one or more functions to assist with the user query."
    assert genuine in data["chat_template"]
    data["chat_template"] = data["chat_template"].replace(genuine, "You may call functions.")
    config_file.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return folder


def check(path: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["check-format", str(path), *args])
    return result.exit_code, result.output


def test_the_genuine_template_agrees_on_samples_and_rows(tmp_path: Path) -> None:
    code, out = check(config(tmp_path, qwen3_tokenizer_dir()), "--rows", "5")
    assert code == 0, out
    assert "10 identical, 0 differing" in out
    # the fifth row carries a tool: the declaration is compared too
    assert "identical  mix " in out and "data.jsonl:5 (155 tokens)" in out


def test_a_wrong_template_shows_the_first_difference(tmp_path: Path) -> None:
    code, out = check(config(tmp_path, wrong_qwen3_folder(tmp_path)), "--rows", "5")
    assert code == 1, out
    # Conversations without tools agree; those with tools differ, shown at the first token.
    assert "identical  sample: plain" in out
    assert "DIFFERS    sample: tools: first difference at token" in out
    assert "DIFFERS    mix " in out and "7 identical, 3 differing" in out  # row 5 has a tool
    assert "draftgen:       " in out and "model template: " in out
    assert "You may call' then" in out
    assert "draftgen:       ' one or more functions to assist" in out
    assert "model template: ' functions.\\n\\nYou are provided" in out


def test_dry_run_warns_when_they_disagree(tmp_path: Path) -> None:
    good = CliRunner().invoke(app, ["run", "--dry-run", str(config(tmp_path / "a",
                                                                    qwen3_tokenizer_dir()))])
    assert good.exit_code == 0 and "warning" not in good.output
    bad = CliRunner().invoke(app, ["run", "--dry-run", str(config(
        tmp_path / "b", wrong_qwen3_folder(tmp_path / "b")))])
    assert bad.exit_code == 0
    assert "differ on 2 of 5 sample conversations" in bad.output
    assert "draftgen check-format" in bad.output


def test_deepseek_r1s_packaged_template_and_the_think_prefill(tmp_path: Path) -> None:
    """R1's packaged template does not open the think block; draftgen does unless told not to
    (docs/formats.md): the check says so, and `think_prefill: false` agrees."""
    code, out = check(config(tmp_path / "a", deepseek_r1_tokenizer_dir(), "deepseek-r1"))
    assert code == 1 and "'<think>\\n'" in out, out
    code, out = check(config(tmp_path / "b", deepseek_r1_tokenizer_dir(), "deepseek-r1",
                             think_prefill=False))
    assert code == 0, out


def test_no_warning_without_a_template(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    shutil.copy(qwen3_tokenizer_dir() / "tokenizer.json", folder / "tokenizer.json")
    fmt = get_format("qwen3", cached_tokenizer(str(folder / "tokenizer.json")))
    assert disagreement_warning(fmt) is None


def test_a_differing_format_names_the_registered_one_that_matches(tmp_path: Path) -> None:
    """qwen3-thinking opens the think block (`<think>\n`) where Qwen3's own template leaves
    it to the model: every conversation differs, and plain qwen3 matches them all."""
    code, out = check(config(tmp_path, qwen3_tokenizer_dir(), "qwen3-thinking"), "--rows", "5")
    assert code == 1, out
    assert "0 identical, 10 differing" in out
    assert ("format qwen3 renders every one as the model's template does: set model.format: "
            "qwen3 (instead of qwen3-thinking)") in out


def test_no_registered_format_matches_a_changed_template(tmp_path: Path) -> None:
    code, out = check(config(tmp_path, wrong_qwen3_folder(tmp_path)), "--rows", "5")
    assert code == 1, out
    assert "no other registered format renders them as the model's template does" in out
