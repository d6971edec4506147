"""The probe's results for people (a rich table, then the reasons) and for programs (JSON)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from draftgen.printable import for_console, widen_to_fit
from draftgen.probe.model import AnswerReport, BackendProbe

_VERDICT_STYLE = {"exact": "bold green", "reconstructable": "bold yellow", "unsafe": "bold red"}
COLUMNS = ("backend", "verdict", "IDs", "reasoning", "whitespace", "tool calls", "length",
           "logprobs", "provider", "cost")


def _joined(values: Iterable[str | None], empty: str = "-") -> str:
    seen: list[str] = []
    for v in values:
        if v and v not in seen:
            seen.append(v)
    return "/".join(seen) or empty


def _length(answers: Sequence[AnswerReport]) -> str:
    counted = [a for a in answers if a.completion_tokens is not None]
    if not counted:
        return "unknown"
    same = sum(a.output_tokens == a.completion_tokens for a in counted)
    return f"{same}/{len(counted)} match"


def _provider(a: AnswerReport) -> str | None:
    if not a.provider:
        return None
    return f"{a.provider} ({a.quantization})" if a.quantization else a.provider


def row(r: BackendProbe) -> list[str]:
    """The table row of one backend (plain strings)."""
    ok = [a for a in r.answers if a.ok]
    tool = next((a for a in ok if a.kind == "tool"), None)
    cost = "stored" if r.cached else f"${r.cost_usd:.4f}"
    return [
        r.backend,
        r.verdict,
        _joined(a.ids for a in ok),
        _joined(a.reasoning for a in ok if a.reasoning != "n/a") if ok else "-",
        _joined(a.whitespace for a in ok if a.whitespace != "n/a"),
        _joined(a.tool_calls for a in ok if a.kind == "tool") if tool is not None else "-",
        _length(ok),
        _joined(a.logprobs for a in ok),
        _joined(_provider(a) for a in ok),
        cost,
    ]


def _wide_table(results: Sequence[BackendProbe]) -> Table:
    """One column per check (about 120 columns wide)."""
    table = Table(title="probe", header_style="bold")
    for col in COLUMNS:
        table.add_column(col, justify="right" if col == "cost" else "left")
    for r in results:
        cells = [for_console(cell) for cell in row(r)]
        cells[1] = f"[{_VERDICT_STYLE[r.verdict]}]{r.verdict}[/]"
        table.add_row(*cells)
    return table


def findings(r: BackendProbe) -> str:
    """The checks of one backend as one text, `name: value` joined by " · ", to wrap in a
    narrow column."""
    cells = row(r)
    return " · ".join(f"{name}: {value}" for name, value in zip(COLUMNS[2:-1], cells[2:-1],
                                                                strict=True))


def _narrow_table(results: Sequence[BackendProbe]) -> Table:
    """backend, verdict, the checks wrapped in one column, cost: fits 80 columns."""
    table = Table(title="probe", header_style="bold")
    table.add_column("backend", overflow="fold")
    table.add_column("verdict", no_wrap=True)
    table.add_column("checks")
    table.add_column("cost", justify="right", no_wrap=True)
    for r in results:
        cells = row(r)
        table.add_row(for_console(r.backend), f"[{_VERDICT_STYLE[r.verdict]}]{r.verdict}[/]",
                      for_console(findings(r)), for_console(cells[-1]))
    return table


def print_results(results: Sequence[BackendProbe], console: Console,
                  wide: bool = False) -> None:
    """The results table, the problems and warnings, the spend. The table puts each check in
    its own column with `wide` (printed at the width it needs), else the checks of a backend
    wrapped in one column, to fit the console."""
    table = _wide_table(results) if wide else _narrow_table(results)
    if wide:
        widen_to_fit(console, [table])
    console.print(table)
    for r in results:
        for p in r.problems:
            scope = " [dim](prompts with tools)[/]" if p.scope == "tools" else ""
            console.print(f"[red]✗[/] {r.backend}: {for_console(p.message)}{scope}",
                          highlight=False)
        for w in r.warnings:
            console.print(f"[yellow]![/] {r.backend}: {for_console(w)}", highlight=False)
    fresh = [r for r in results if not r.cached]
    spent = sum(r.cost_usd for r in fresh)
    requests = sum(len(r.answers) for r in fresh)
    console.print(f"probe spend: ${spent:.4f} ({requests} requests)", highlight=False)
    if any(r.verdict == "reconstructable" for r in results):
        console.print("reconstructable: IDs rebuilt from text pass the length checks; that is "
                      "not proof of exactness (a same-length non-canonical split goes unseen)",
                      highlight=False)


def to_json(results: Sequence[BackendProbe]) -> dict[str, Any]:
    return {
        "backends": [{**r.as_dict(), "cached": r.cached} for r in results],
        "unsafe": [r.backend for r in results if r.verdict == "unsafe"],
        "cost_usd": round(sum(r.cost_usd for r in results if not r.cached), 8),
    }
