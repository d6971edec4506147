"""`draftgen status` at 80 and 120 columns, on a terminal and piped: by default a few lines
answering "how bad is it?" (done/total, failed, skipped and why, in flight, $ spent of
budget.usd and what is left) with no line over the width and no cell cut short; `--wide`
gives every table whole."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest
from rich.console import Console
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.status import collect_status, render_status
from draftgen.store import Store

ANSWERED, FAILED, SKIPPED, TOTAL = 184, 3, 116, 303
PRICE = 0.00027
"""Each answer's cost."""
BUDGET, PROBE = 0.05, 0.0003
WIDE_COLUMNS = ("dataset", "total", "done", "failed", "skipped", "pending", "in flight",
                "out tokens", "reasoning", "truncated", "not exact")


def _budget_stopped_run(root: Path) -> Path:
    """A paid run the budget stopped: ANSWERED answered, FAILED timed out, SKIPPED never
    sent, a probe paid from the budget."""
    store = Store(root)
    for i in range(ANSWERED):
        store.append_record("prompts", {
            "id": f"prompts/{i}", "dataset": "prompts", "output_ids": [1, 2, 3],
            "finish_reason": "stop", "token_source": "native", "token_check": "exact",
            "backend": "openrouter", "provider": "DeepInfra", "quantization": "fp8",
            "usage": {"reasoning_tokens": 0}, "cost_usd": PRICE, "latency_s": 1.0,
            "created_at": 1000.0 + i})
    for i in range(ANSWERED, ANSWERED + FAILED):
        store.append_failure("prompts", {"id": f"prompts/{i}", "kind": "timeout",
                                         "created_at": 1200.0})
    store.close()
    (root / "run.json").write_bytes(orjson.dumps({
        "created_at": 900.0,
        "config": {"datasets": [{"name": "prompts"}], "budget": {"usd": BUDGET},
                   "max_attempts": 3},
        "sessions": [{"started_at": 950.0, "stopped_at": 1300.0, "outcome": "budget",
                      "probe_usd": PROBE}],
        "datasets": {"prompts": {"total": TOTAL, "skipped_budget": SKIPPED}}}))
    return root


def _rendered(root: Path, width: int, terminal: bool, wide: bool = False) -> str:
    out = io.StringIO()
    console = Console(width=width, force_terminal=terminal, color_system=None, file=out)
    st = collect_status(root, now=1400.0)
    if wide:
        render_status(st, console, wide=True)
    else:
        render_status(st, console)
    return out.getvalue()


def _key_figures_in(text: str) -> None:
    spent = ANSWERED * PRICE + PROBE
    flat = " ".join(text.split())  # the figures, wherever a line wraps
    assert f"{ANSWERED}/{TOTAL} answered" in flat
    assert f"failed {FAILED} (timeout {FAILED})" in flat
    assert f"skipped {SKIPPED} not sent: the last session stopped at a budget" in flat
    assert "0 in flight" in flat and "0 pending" in flat
    assert f"${spent:.4f} of ${BUDGET:.4f}" in flat
    assert f"left ${BUDGET - spent:.4f}" in flat


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
@pytest.mark.parametrize("width", [80, 120])
def test_status_fits_the_width_with_the_key_figures(tmp_path: Path, width: int,
                                                    terminal: bool) -> None:
    text = _rendered(_budget_stopped_run(tmp_path), width, terminal)
    lines = text.splitlines()
    assert max(map(len, lines)) <= width, text
    assert "…" not in text, text
    assert len(lines) <= 12, text
    _key_figures_in(text)


@pytest.mark.parametrize("width", [80, 120])
def test_status_command_piped_fits_columns(tmp_path: Path, width: int) -> None:
    root = _budget_stopped_run(tmp_path)
    result = CliRunner().invoke(app, ["status", str(root)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= width, result.output
    assert "…" not in result.output
    _key_figures_in(result.output)


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
def test_wide_gives_every_table_whole(tmp_path: Path, terminal: bool) -> None:
    text = _rendered(_budget_stopped_run(tmp_path), 80, terminal, wide=True)
    assert "…" not in text, text
    header = next(line for line in text.splitlines() if "dataset" in line)
    assert [c.strip() for c in header.strip("┃").split("┃")] == [*WIDE_COLUMNS[:9], "$",
                                                                  *WIDE_COLUMNS[9:]]
    row = next(line for line in text.splitlines() if line.startswith("│ prompts"))
    assert f"{ANSWERED * PRICE:.4f}" in row
    assert "by backend" in text and "by provider/quantization" not in text  # one provider
    assert "openrouter" in text
    spent = ANSWERED * PRICE + PROBE
    assert f"spent: ${spent:.4f} of ${BUDGET:.4f}" in text


def test_status_json_has_the_budget(tmp_path: Path) -> None:
    root = _budget_stopped_run(tmp_path)
    data = orjson.loads(CliRunner().invoke(app, ["status", str(root), "--json"]).output)
    spent = ANSWERED * PRICE + PROBE
    assert data["budget_usd"] == BUDGET
    assert data["spent_usd"] == pytest.approx(spent)
    assert data["budget_left_usd"] == pytest.approx(BUDGET - spent)
