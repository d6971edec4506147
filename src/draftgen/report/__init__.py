"""`draftgen report`: what a run did, as one self-contained HTML page plus PNGs.

`collect` streams the run folder into counters and bounded samples, `plots` draws the figures,
`page` renders the HTML. Nothing in the run folder is changed except the report folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftgen.errors import DraftgenError
from draftgen.export.source import SourceError, open_run
from draftgen.report.collect import RunStats, collect
from draftgen.store.layout import FAILURES, RESPONSES
from draftgen.store.shards import is_run_folder

__all__ = ["ReportError", "ReportResult", "RunStats", "collect", "default_out", "write_report"]


class ReportError(DraftgenError):
    pass


@dataclass
class ReportResult:
    index: Path
    pngs: list[Path]
    stats: RunStats


def default_out(run_dir: Path) -> Path:
    """RUN_DIR/report, unless a dataset of the run is called "report"."""
    out = run_dir / "report"
    if (out / "responses.jsonl").exists() or (out / "failures.jsonl").exists():
        out = run_dir / "_report"
    return out


def write_report(run_dir: Path, out: Path | None = None) -> ReportResult:
    from draftgen.report.page import render
    from draftgen.report.plots import PLOTS, png

    try:
        source = open_run(run_dir)
    except SourceError as e:
        raise ReportError(str(e)) from None
    if out is not None:
        _refuse_run_data(out)
    out = out or default_out(run_dir)
    if out.exists() and not out.is_dir():
        raise ReportError(f"{out}: not a folder; --out names the folder that gets index.html "
                          "and the PNGs")
    stats = collect(source)
    figures = {name: png(plot(stats)) for name, plot in PLOTS.items()}
    try:
        return _write(out, stats, figures, render(stats, figures))
    except OSError as e:
        raise ReportError(f"{e.filename or out}: cannot write the report: {e.strerror}; give "
                          "--out a folder you can write") from None


def _write(out: Path, stats: RunStats, figures: dict[str, bytes], page: str) -> ReportResult:
    out.mkdir(parents=True, exist_ok=True)
    pngs = []
    for name, data in figures.items():
        path = out / f"{name}.png"
        path.write_bytes(data)
        pngs.append(path)
    index = out / "index.html"
    tmp = index.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(index)
    return ReportResult(index, pngs, stats)


def _refuse_run_data(out: Path) -> None:
    """The report's files (index.html, PNGs) never go among a run's own files: not in a run
    folder, nor in one of its dataset folders."""
    if is_run_folder(out) or (out / RESPONSES).exists() or (out / FAILURES).exists():
        raise ReportError(f"--out {out}: holds a run's files; the report would be written "
                          "among them: choose another folder (by default RUN_DIR/report)")
