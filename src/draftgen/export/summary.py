"""What an export wrote and what it left out, for people."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from draftgen.export.pipeline import DUPLICATE, ExportSummary

REASONS: dict[str, str] = {
    "truncated": "cut off by max_tokens (finish_reason length; --keep-truncated keeps them)",
    "token_check:length_mismatch": "rebuilt IDs disagree with the engine's token count",
    "token_check:unverifiable": "rebuilt IDs the engine gave no token count to check against",
    "token_check:length_ok": "rebuilt IDs (length checked) while --min-check exact",
    "check:stop_token_missing": "finished answer not ending with the stop token",
    "check:stop_token_on_cut_off_answer": "cut-off answer ending with the stop token",
    "check:stop_token_inside_answer": "stop token before the end of the answer",
    "check:special_token_in_reasoning": "special-token text inside the reasoning",
    "check:special_token_in_content": "special-token text inside the content",
    "over_max_len": "longer than --max-len (--overlong drop)",
    "prompt_fills_max_len": "prompt alone fills --max-len (--overlong truncate)",
    "weight": "left out by a --weight below 1 (seeded)",
    "cap": "left out by --cap (seeded)",
    "broken_row": "cannot become a sound row (--skip-broken)",
    DUPLICATE: "prompt answered in two folders of a re-sharded run: the first folder's answer "
               "is kept",
}


def print_summary(summary: ExportSummary, console: Console) -> None:
    console.print(_written_table(summary))
    reasons: Counter[str] = Counter()
    for t in summary.tallies.values():
        reasons.update(t.excluded)
    if reasons:
        console.print(_excluded_table(summary, reasons))
        for reason in reasons:
            console.print(f"  {reason}: {REASONS.get(reason, reason)}", highlight=False,
                          markup=False, soft_wrap=True)
    for name, t in summary.tallies.items():
        if t.torn_tail_bytes:
            _line(console, f"{name}: skipped a torn last line ({t.torn_tail_bytes} bytes)")
        if t.bad_lines:
            _line(console, f"{name}: skipped {t.bad_lines:,} lines that are not JSON records")
    for note in summary.notes:
        _line(console, f"note: {note}")
    counts = ", ".join(f"{summary.written(s):,} {s}" for s in summary.options.splits)
    console.print(f"wrote {counts} rows in {summary.seconds:.1f}s:", highlight=False,
                  soft_wrap=True)
    for path in summary.files:
        _line(console, str(path))


def _line(console: Console, text: str) -> None:
    console.print(f"  {text}", highlight=False, markup=False, soft_wrap=True)


def _written_table(summary: ExportSummary) -> Table:
    splits = summary.options.splits
    table = Table(title=f"export {summary.options.format.value} → {summary.out}",
                  header_style="bold")
    for col in ("dataset", "answers", *splits, "upsampled", "cut to max-len", "excluded"):
        table.add_column(col, justify="left" if col == "dataset" else "right")
    for name, t in summary.tallies.items():
        table.add_row(name, f"{t.records:,}", *(f"{t.written[s]:,}" for s in splits),
                      f"{t.extra_copies:,}", f"{t.truncated_to_max_len:,}",
                      f"{sum(t.excluded.values()):,}")
    return table


def _excluded_table(summary: ExportSummary, reasons: Counter[str]) -> Table:
    table = Table(title="excluded answers, by reason", header_style="bold")
    table.add_column("reason")
    for name in summary.tallies:
        table.add_column(name, justify="right")
    table.add_column("total", justify="right")
    for reason, total in reasons.most_common():
        table.add_row(reason, *(f"{t.excluded[reason]:,}" for t in summary.tallies.values()),
                      f"{total:,}")
    return table
