"""`draftgen status RUN`'s default answer to "how bad is it?": a few labelled lines that fit
80 columns (rich wraps a longer one at its spaces): done of total and in flight, failed and
why, skipped and why, pending, the spend against budget.usd and what is left of it, the recent
rate, then the notes. `--wide` prints the tables of `render`."""

from __future__ import annotations

from typing import Any

from draftgen.printable import for_console
from draftgen.status.model import DatasetStatus, RunStatus
from draftgen.status.text import headline, rate_text, spent_text, when

LABEL = 9
"""The width of the labels ("done", "failed", ...) before their figures."""


def brief_lines(st: RunStatus) -> list[str]:
    """The summary, one string a line (rich markup; no line needs more than 80 columns but
    a note or a long path, which rich wraps)."""
    t = st.total
    lines = [headline(st), *_done(st)]
    lines.append(_line("failed", _failed(t)))
    if t.skipped:
        why = ("the last session stopped at a budget" if st.last_outcome == "budget"
               else "budget.usd or a dataset's token budget was reached")
        lines.append(_line("skipped", f"{t.skipped:,} not sent: {why}"))
    lines.append(_line("spent", spent_text(st)))
    lines.append(_line("rate", rate_text(t.recent)))
    lines.append(_line("last", f"activity {when(st.last_activity, st.now)}"))
    lines.extend(f"[yellow]note:[/] {for_console(note)}" for note in st.notes)
    lines.append("[dim]tables by dataset, backend, provider and shard: --wide; everything: "
                 "--json[/]")
    return lines


def render_brief(st: RunStatus, console: Any) -> None:
    for line in brief_lines(st):
        console.print(line, highlight=False)


def _line(label: str, text: str) -> str:
    return f"[bold]{label:<{LABEL}}[/]{text}"


def _done(st: RunStatus) -> list[str]:
    """Prompts answered of the total (of the prompt datasets), conversations done of the total
    (of the `turns: all` ones), each with its pending and in flight."""
    prompts = [d for d in st.datasets.values() if d.trajectories is None]
    lines = []
    if prompts or not st.datasets:
        lines.append(_line("done", _prompts_done(prompts)))
    conversations = [d for d in st.datasets.values() if d.trajectories is not None]
    if conversations:
        lines.append(_line("convs", _conversations_done(conversations)))
    return lines


def _prompts_done(datasets: list[DatasetStatus]) -> str:
    answered = sum(d.sums.answers for d in datasets)
    in_flight = sum(d.in_flight for d in datasets)
    totals = [d.total for d in datasets]
    if not datasets or None in totals:
        return f"{answered:,} answered (total unknown) · {in_flight:,} in flight"
    total = sum(x or 0 for x in totals)
    share = f" ({answered / total:.0%})" if total else ""
    pending = sum(d.pending or 0 for d in datasets)
    return (f"{answered:,}/{total:,} answered{share} · {pending:,} pending · "
            f"{in_flight:,} in flight")


def _conversations_done(datasets: list[DatasetStatus]) -> str:
    trajectories = [d.trajectories for d in datasets if d.trajectories is not None]
    done = sum(tr.done for tr in trajectories)
    totals = [tr.total for tr in trajectories]
    of = "" if None in totals else f"/{sum(x or 0 for x in totals):,}"
    stopped = sum(tr.stopped_by_budget for tr in trajectories)
    by_budget = f" · {stopped:,} stopped by budget" if stopped else ""
    return (f"{done:,}{of} done ({sum(tr.turns for tr in trajectories):,} turns)"
            f"{by_budget} · {sum(tr.pending for tr in trajectories):,} pending · "
            f"{sum(tr.in_flight for tr in trajectories):,} in flight")


def _failed(t: DatasetStatus) -> str:
    if not t.failed:
        return "0"
    kinds = for_console(", ".join(f"{k} {v:,}" for k, v in t.failed_by_kind.most_common(3)))
    more = ", ..." if len(t.failed_by_kind) > 3 else ""
    out = f" · {t.out_of_attempts:,} out of attempts" if t.out_of_attempts else ""
    return f"{t.failed:,} ({kinds}{more}){out}"
