"""The commands that read or stop a run take its run.yaml where they take its folder: the
config's `output_dir` is read, and an invalid config is refused as `draftgen run` refuses it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.tokenize import Tokenizer
from tests.test_export import write_run


@pytest.fixture(scope="module")
def run_and_config(tmp_path_factory: pytest.TempPathFactory, qwen3_tok: Tokenizer
                   ) -> tuple[Path, Path]:
    root = write_run(tmp_path_factory.mktemp("run"), qwen3_tok, {"chat": 12})
    config = root.parent / "run.yaml"
    config.write_text(yaml.safe_dump({
        "output_dir": str(root),
        "model": {"name": "qwen/qwen3-8b", "format": "qwen3", "tokenizer": str(qwen3_tok.path)},
        "backends": [{"name": "b", "type": "vllm", "url": "http://127.0.0.1:1"}],
        "datasets": [{"name": "chat", "path": "chat.jsonl"}],
    }))
    return root, config


VOLATILE = re.compile(r'"(now|seconds|answers_per_s)": [0-9.]+|in [0-9.]+s:')
"""What changes from one call to the next: status's clock, audit's and export's timings."""


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, env={"COLUMNS": "120"})
    return result.exit_code, VOLATILE.sub("", result.output)


@pytest.mark.parametrize("command", [
    ["status", "--json"],
    ["audit", "--json", "-j", "1"],
    ["export", "-f", "parquet", "--overwrite", "-o", "{tmp}/out"],
    ["report", "-o", "{tmp}/report"],
])
def test_a_reader_given_the_config_reads_its_output_dir(
        run_and_config: tuple[Path, Path], tmp_path: Path, command: list[str]) -> None:
    root, config = run_and_config
    name, *options = [arg.format(tmp=tmp_path) for arg in command]
    by_folder = _invoke([name, str(root), *options])
    assert by_folder[0] in (0, 1), by_folder[1]  # audit finds the one bad answer: 1
    assert _invoke([name, str(config), *options]) == by_folder


def test_an_invalid_config_is_refused_as_run_refuses_it(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("output_dir: out\nmodel: {name: m, format: qwen3, tokenizer: t.json}\n"
                      "datasets: [{name: d, path: d.jsonl}]\nbackends: []\noutput_dri: x\n")
    said_by_run = _invoke(["run", str(config)])
    assert said_by_run[0] == 2 and "output_dri: unknown key" in said_by_run[1]
    for command in ("status", "audit", "export", "report", "stop"):
        extra = ["-f", "parquet", "-o", str(tmp_path / "out")] if command == "export" else []
        assert _invoke([command, str(config), *extra]) == said_by_run, command
