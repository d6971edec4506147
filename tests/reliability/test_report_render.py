"""The markdown renderer of the suite's results (fast: no run)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.reliability.report import END, START, main, render

REPORT = {
    "generated_at": "2026-01-01 00:00:00 UTC", "wall_s": 12.0,
    "machine": {"cpus": 2, "python": "3.11"},
    "cases": [
        {"scenario": "1. Kill anywhere", "case": "kill | pipe", "runs": 30, "lost": 0,
         "duplicated": 0, "corrupt": 0, "crashed": 0, "observed": ["a", "b"],
         "outcome": "passed", "duration_s": 100.0},
        {"scenario": "2. Server faults", "case": "x", "runs": 1, "lost": 1, "duplicated": 0,
         "corrupt": 0, "crashed": 0, "observed": [], "outcome": "failed", "duration_s": 1.0},
    ],
}


def test_render_sums_per_scenario_and_flags_failures() -> None:
    text = render(REPORT)
    assert "| 1. Kill anywhere | 1 | 30 | 0 | 0 | 0 | 0 | passed |" in text
    assert "| 2. Server faults | 1 | 1 | 1 | 0 | 0 | 0 | **FAILED** |" in text
    assert "kill \\| pipe" in text and "| a; b |" in text


def test_update_replaces_only_between_the_markers(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    report.write_text(json.dumps(REPORT))
    doc = tmp_path / "doc.md"
    doc.write_text(f"# title\n\nprose\n\n{START}\nold\n{END}\n\nmore prose\n")
    assert main([str(report), "--update", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# title\n\nprose\n\n") and text.endswith(f"{END}\n\nmore prose\n")
    assert "old" not in text and "| 1. Kill anywhere |" in text
