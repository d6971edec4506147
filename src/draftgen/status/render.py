"""Showing a run's status: a few lines that fit 80 columns (`brief`, the default), every table
(`--wide`), one JSON object, the one-line summary for progress logs; and
`python -m draftgen.status`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from draftgen.printable import for_console, widen_to_fit
from draftgen.status.brief import render_brief
from draftgen.status.collect import collect_status
from draftgen.status.conversation_counts import TrajectoryStatus
from draftgen.status.model import WINDOW_S, RunStatus, ShardStatus, StatusError
from draftgen.status.text import duration, headline, n, rate_text, spent_text, when
from draftgen.tally import Tally

WIDE_HELP = ("every table: each dataset's numbers, by backend, by provider, conversations, "
             "shards (as wide as they need)")


def summary_line(st: RunStatus) -> str:
    """The run in one line, for progress logs: answered of total, failed, in flight, spend,
    the recent rate."""
    t = st.total
    of = f"/{t.total:,}" if t.total is not None else ""
    return (f"{t.sums.answers:,}{of} answered · {t.failed:,} failed · {t.in_flight:,} in flight · "
            f"{t.sums.output_tokens:,} tokens · ${t.sums.cost:.4f} · "
            f"{rate_text(t.recent)}")


def render_status(st: RunStatus, console: Any, wide: bool = False) -> None:
    """The summary (`brief`), or with `wide` every table, at the width they need: a terminal
    narrower than the tables wraps their lines rather than rich cutting their cells."""
    if not wide:
        render_brief(st, console)
        return
    parts = wide_parts(st)
    widen_to_fit(console, [p for p in parts if not isinstance(p, str)])
    for part in parts:
        console.print(part, highlight=False)


def wide_parts(st: RunStatus) -> list[Any]:
    """What `--wide` prints: the headline, each dataset's numbers, the groups, the rates, the
    conversations, the shards and the notes (text lines as rich markup)."""
    t = st.total
    parts: list[Any] = [headline(st), f"started {when(st.started_at, st.now)} · last activity "
                        f"{when(st.last_activity, st.now)}", _datasets_table(st)]
    for title, groups in (("by backend", t.by_backend),
                          ("by provider/quantization", t.by_provider)):
        if len(groups) > 1 or title == "by backend":
            parts.append(_group_table(title, groups))
    if t.failed_by_kind:
        kinds = ", ".join(f"{k} {v:,}" for k, v in t.failed_by_kind.most_common())
        parts.append(f"failed by kind: {for_console(kinds)}")
    parts.append(f"spent: {spent_text(st)}")
    parts.append(f"rates, last {duration(WINDOW_S)}: {rate_text(t.recent)}")
    parts.append(f"rates, whole run: {rate_text(t.overall)}")
    trajectories = {name: d.trajectories for name, d in st.datasets.items() if d.trajectories}
    if trajectories:
        parts.append(_trajectories_table(trajectories))
    if st.shards:
        parts.append(_shards_table(st.shards))
    parts.extend(f"[yellow]note:[/] {for_console(note)}" for note in st.notes)
    return parts


def _datasets_table(st: RunStatus) -> Any:
    from rich.table import Table

    table = Table(header_style="bold")
    cols = ("dataset", "total", "done", "failed", "skipped", "pending", "in flight",
            "out tokens", "reasoning", "$", "truncated", "not exact")
    for col in cols:
        table.add_column(col, justify="left" if col == "dataset" else "right")
    kinds = {d.trajectories is not None for d in st.datasets.values()}
    for d in [*st.datasets.values(), st.total]:
        style = "bold" if d is st.total else None
        total, done, pending = n(d.total), n(d.sums.answers), n(d.pending)
        if d is st.total and len(kinds) > 1:  # a sum of conversations and prompts
            total = pending = "-"
        elif d.trajectories:  # total and pending count conversations, done counts turns
            total, done = f"{total} conv", f"{done} turns"
            pending = f"{n(d.trajectories.pending)} conv"
        table.add_row(for_console(d.name), total, done, n(d.failed), n(d.skipped),
                      pending, n(d.in_flight), n(d.sums.output_tokens),
                      n(d.sums.reasoning_tokens), f"{d.sums.cost:.4f}", n(d.truncated),
                      n(d.not_exact), style=style)
    return table


def _group_table(title: str, groups: dict[str, Tally]) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for col in ("", "answers", "out tokens", "$"):
        table.add_column(col, justify="left" if not col else "right")
    for key, s in sorted(groups.items(), key=lambda kv: -kv[1].answers):
        table.add_row(for_console(key), f"{s.answers:,}", f"{s.output_tokens:,}",
                      f"{s.cost:.4f}")
    return table


def _trajectories_table(trajectories: dict[str, TrajectoryStatus]) -> Any:
    from rich.table import Table

    t = Table(title="conversations (turns: all)", title_justify="left", header_style="bold")
    for col in ("dataset", "done", "pending", "in flight", "stopped by budget", "turns",
                "turns/conv", "max", "ended"):
        t.add_column(col, justify="left" if col in ("dataset", "ended") else "right")
    for name, tr in trajectories.items():
        mean = f"{tr.turns / tr.conversations:.2f}" if tr.conversations else "-"
        ends = ", ".join(f"{k} {n:,}" for k, n in tr.ends.most_common()) or "-"
        t.add_row(name, n(tr.done), n(tr.pending), n(tr.in_flight),
                  n(tr.stopped_by_budget), n(tr.turns), mean, n(tr.max_turns), ends)
    return t


def _shards_table(shards: list[ShardStatus]) -> Any:
    from rich.table import Table

    table = Table(title="by shard", title_justify="left", header_style="bold")
    for col in ("shard", "state", "done", "failed", "in flight", "out tokens", "$", "folder"):
        table.add_column(col, justify="right" if col not in ("shard", "state", "folder")
                         else "left")
    for s in shards:
        t = s.status.total
        state = s.state
        if s.state == "live":
            state = f"live (pid {s.status.pid} on {s.status.host})"
        elif s.state == "stopped":
            state = f"stopped ({s.status.last_outcome})"
        table.add_row(s.part.label, state, n(t.sums.answers), n(t.failed), n(t.in_flight),
                      n(t.sums.output_tokens), f"{t.sums.cost:.4f}", s.part.place)
    return table


def print_status(st: RunStatus, as_json: bool, wide: bool = False) -> None:
    """The status on stdout: one JSON object, the summary (at the terminal's width, or 80
    columns or $COLUMNS when not a terminal), or with `wide` every table."""
    if as_json:
        sys.stdout.write(orjson.dumps(st.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    from rich.console import Console

    render_status(st, Console(), wide=wide)


def main(argv: list[str] | None = None) -> int:
    """`python -m draftgen.status RUN_DIR [--wide] [--json]`: `draftgen status` without loading the
    rest of the command-line tool (its imports take a second or more on a small machine)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m draftgen.status",
                                 description="How far a draftgen run got; reads only.")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--wide", action="store_true", help=WIDE_HELP)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    try:
        st = collect_status(args.run_dir)
    except StatusError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    print_status(st, args.json, wide=args.wide)
    return 0
