"""Every command's `--help` reads at 80 and 120 columns: each option name whole, the
description column wide, options in their panels, examples at the end."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.presets import registry

GROUP = typer.main.get_command(app)
COMMANDS = sorted(GROUP.commands)  # type: ignore[attr-defined]
WIDTHS = (80, 120)
HELP_COLUMN_MAX = {80: 40, 120: 40}
"""Where each option's description starts at the latest: the names column never takes more."""
ROW = re.compile(r"^│ (-\S.*?)\s{2,}(\S.*?)\s*│$")


def _help(args: list[str], columns: int) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def _whole(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def _option_names(command: str) -> list[str]:
    params = GROUP.commands[command].params  # type: ignore[attr-defined]
    return [name for p in params for name in (*p.opts, *p.secondary_opts)
            if name.startswith("-")]


def test_the_commands_are_listed() -> None:
    assert {"run", "probe", "check-format", "stop", "export", "report", "status", "audit",
            "datasets"} <= set(COMMANDS)


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_name_is_whole(command: str, columns: int) -> None:
    text = _help([command], columns)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= columns
    cut = [name for name in _option_names(command) if not _whole(name, text)]
    assert not cut, f"{command} --help at {columns} columns cuts {cut}:\n{text}"


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("command", COMMANDS)
def test_descriptions_get_the_width(command: str, columns: int) -> None:
    starts = [m.start(2) for line in _help([command], columns).splitlines()
              if (m := ROW.match(line))]
    assert starts and max(starts) <= HELP_COLUMN_MAX[columns]


@pytest.mark.parametrize("command", COMMANDS)
def test_examples_come_last(command: str) -> None:
    text = _help([command], 80)
    examples = text.rindex("Examples:")
    assert "╰" not in text[examples:]  # no panel after them
    assert f"draftgen {command}" in text[examples:]


def test_export_options_are_grouped() -> None:
    text = _help(["export"], 80)
    panels = {m.group(1): m.start() for m in re.finditer(r"╭─ ([^─]+?) ─", text)}
    assert list(panels) == ["Arguments", "What to write", "How to mix and split",
                            "What to leave out", "Options"]

    def panel_of(option: str) -> str:
        at = text.index(option)
        return max((start, name) for name, start in panels.items() if start < at)[1]
    assert panel_of("--exclude-truncated") == panel_of("--max-len") == "What to leave out"
    assert panel_of("--val-fraction") == panel_of("--cap") == "How to mix and split"
    assert panel_of("--format") == panel_of("--overwrite") == "What to write"


@pytest.mark.parametrize("columns", WIDTHS)
def test_top_level_help_lists_every_command(columns: int) -> None:
    text = _help([], columns)
    assert all(_whole(command, text) for command in COMMANDS)
    assert max(len(line) for line in text.splitlines()) <= columns


@pytest.mark.parametrize("columns", WIDTHS)
def test_datasets_lists_every_preset_and_mix(columns: int) -> None:
    result = CliRunner().invoke(app, ["datasets"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= columns
    reg = registry()
    assert all(_whole(name, result.output) for name in [*reg.presets, *reg.mixes])
    if columns >= 120:
        assert all(p.hub in result.output for p in reg.presets.values())


def test_datasets_shows_one_preset_in_full() -> None:
    result = CliRunner().invoke(app, ["datasets", "hendrycks_math/geometry"],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "path: EleutherAI/hendrycks_math" in result.output
    assert "subset: geometry" in result.output and "prompt: '{problem}'" in result.output
    unknown = CliRunner().invoke(app, ["datasets", "nope"], env={"COLUMNS": "80"})
    assert unknown.exit_code == 2 and "unknown preset 'nope'" in unknown.output


def test_version_prints_the_packages_version() -> None:
    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    version = tomllib.loads(pyproject.read_text())["project"]["version"]
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"draftgen {version}\n"


@pytest.mark.parametrize("args", [[], ["status"], ["export"]])
def test_h_is_help(args: list[str]) -> None:
    short = CliRunner().invoke(app, [*args, "-h"], env={"COLUMNS": "80"})
    assert short.exit_code == 0, short.output
    assert short.output == _help(args, 80)
