"""Render the reliability suite's results as markdown.

    DRAFTGEN_RELIABILITY_REPORT=/tmp/reliability.json python -m pytest tests/reliability
    python tests/reliability/report.py /tmp/reliability.json --update docs/reliability.md

With --update, the part of the file between the `<!-- results:start -->` and
`<!-- results:end -->` markers is replaced (the prose around it is kept); without, the tables
are printed on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

START = "<!-- results:start -->"
END = "<!-- results:end -->"
COUNTS = ("lost", "duplicated", "corrupt", "crashed")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _result(cases: list[dict[str, Any]]) -> str:
    outcomes = {c["outcome"] for c in cases}
    bad = sum(c[k] for c in cases for k in COUNTS)
    if "failed" in outcomes or bad:
        return "**FAILED**"
    if outcomes == {"skipped"}:
        return "skipped"
    if "skipped" in outcomes:
        return "passed (some cases skipped)"
    return "passed"


def _numbered(scenario: str) -> tuple[int, str]:
    """"10. Stops stop" after "9. ...": by the scenario's number, then its name."""
    number, _, _ = scenario.partition(".")
    return (int(number) if number.isdigit() else 1 << 30, scenario)


def render(report: dict[str, Any]) -> str:
    cases = [c for c in report["cases"] if c["scenario"] != "(unlabelled)"]
    cases += [c for c in report["cases"] if c["scenario"] == "(unlabelled)"]
    by_scenario: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in cases:
        by_scenario[c["scenario"]].append(c)
    m = report.get("machine", {})
    lines = [
        f"Generated from the suite's run of {report['generated_at']} "
        f"({m.get('cpus', '?')} CPUs, Python {m.get('python', '?')}; "
        f"{report.get('wall_s', 0):.0f} s for the tests that wrote this report).",
        "",
        "| scenario | cases | runs | lost | duplicated | corrupt | crashed | result |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for scenario in sorted(by_scenario, key=_numbered):
        group = by_scenario[scenario]
        sums = [sum(c[k] for c in group) for k in ("runs", *COUNTS)]
        lines.append(f"| {_cell(scenario)} | {len(group)} | "
                     + " | ".join(f"{n:,}" for n in sums) + f" | {_result(group)} |")
    lines += [
        "",
        "| scenario | case | runs | lost | dup. | corrupt | crashed | result | observed |",
        "|---|---|--:|--:|--:|--:|--:|---|---|",
    ]
    for scenario in sorted(by_scenario, key=_numbered):
        for c in by_scenario[scenario]:
            counts = " | ".join(f"{c[k]:,}" for k in ("runs", *COUNTS))
            seconds = f" ({c['duration_s']:.0f} s)" if c.get("duration_s") else ""
            lines.append(f"| {_cell(scenario)} | {_cell(c['case'])} | {counts} | "
                         f"{c['outcome']}{seconds} | {_cell('; '.join(c['observed']))} |")
    return "\n".join(lines) + "\n"


def update(path: Path, tables: str) -> None:
    text = path.read_text() if path.exists() else f"{START}\n{END}\n"
    if START not in text or END not in text:
        raise SystemExit(f"{path}: no {START} … {END} markers to replace")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{tables}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path, help="the JSON written by the suite")
    p.add_argument("--update", type=Path, metavar="MD",
                   help="replace the results between the markers in this file")
    args = p.parse_args(argv)
    tables = render(json.loads(args.report.read_text()))
    if args.update:
        update(args.update, tables)
    else:
        sys.stdout.write(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
