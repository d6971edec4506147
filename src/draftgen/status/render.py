"""Showing a run's status: tables on a terminal (rich), one JSON object, the one-line summary
for progress logs; and `python -m draftgen.status`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson

from draftgen.status.collect import collect_status
from draftgen.status.conversation_counts import TrajectoryStatus
from draftgen.status.model import WINDOW_S, Rates, RunStatus, ShardStatus, StatusError
from draftgen.tally import Tally


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    ago = now - t
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    return f"{stamp} ({_duration(ago)} ago)" if ago >= 0 else stamp


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _rate_text(r: Rates | None) -> str:
    if r is None or r.seconds <= 0:
        return "-"
    j = r.as_json()
    return (f"{j['answers_per_s']:.2f} answers/s · {j['tokens_per_s']:,.0f} tokens/s · "
            f"${j['usd_per_min']:.4f}/min over {_duration(r.seconds)}")


def summary_line(st: RunStatus) -> str:
    """The run in one line, for progress logs: answered of total, failed, in flight, spend,
    the recent rate."""
    t = st.total
    of = f"/{t.total:,}" if t.total is not None else ""
    return (f"{t.sums.answers:,}{of} answered · {t.failed:,} failed · {t.in_flight:,} in flight · "
            f"{t.sums.output_tokens:,} tokens · ${t.sums.cost:.4f} · "
            f"{_rate_text(t.recent)}")


def render_status(st: RunStatus, console: Any) -> None:
    from rich.table import Table

    if st.shards:
        live_n = sum(s.state == "live" for s in st.shards)
        live = (f"[bold green]{live_n} of {len(st.shards)} shard folders live[/]" if live_n
                else f"not running ({len(st.shards)} shard folders)")
    else:
        live = (f"[bold green]live[/] (pid {st.pid} on {st.host})" if st.live
                else f"not running (last session: {st.last_outcome or 'killed or crashed'})")
    console.print(f"[bold]{st.root}[/] · {live} · {st.sessions} session(s)")
    console.print(f"started {_when(st.started_at, st.now)} · last activity "
                  f"{_when(st.last_activity, st.now)}", highlight=False)
    table = Table(header_style="bold")
    cols = ("dataset", "total", "done", "failed", "skipped", "pending", "in flight",
            "out tokens", "reasoning", "$", "truncated", "not exact")
    for col in cols:
        table.add_column(col, justify="left" if col == "dataset" else "right")
    kinds = {d.trajectories is not None for d in st.datasets.values()}
    for d in [*st.datasets.values(), st.total]:
        style = "bold" if d is st.total else None
        total, done, pending = _n(d.total), _n(d.sums.answers), _n(d.pending)
        if d is st.total and len(kinds) > 1:  # a sum of conversations and prompts
            total = pending = "-"
        elif d.trajectories:  # total and pending count conversations, done counts turns
            total, done = f"{total} conv", f"{done} turns"
            pending = f"{_n(d.trajectories.pending)} conv"
        table.add_row(d.name, total, done, _n(d.failed), _n(d.skipped),
                      pending, _n(d.in_flight), _n(d.sums.output_tokens),
                      _n(d.sums.reasoning_tokens), f"{d.sums.cost:.4f}", _n(d.truncated),
                      _n(d.not_exact), style=style)
    console.print(table)
    for title, groups in (("by backend", st.total.by_backend),
                          ("by provider/quantization", st.total.by_provider)):
        if len(groups) > 1 or title == "by backend":
            console.print(_group_table(title, groups))
    if st.total.failed_by_kind:
        kinds = ", ".join(f"{k} {v:,}" for k, v in st.total.failed_by_kind.most_common())
        console.print(f"failed by kind: {kinds}", highlight=False)
    console.print(f"rates, last {_duration(WINDOW_S)}: {_rate_text(st.total.recent)}",
                  highlight=False)
    console.print(f"rates, whole run: {_rate_text(st.total.overall)}", highlight=False)
    trajectories = {n: d.trajectories for n, d in st.datasets.items() if d.trajectories}
    if trajectories:
        console.print(_trajectories_table(trajectories))
    if st.shards:
        console.print(_shards_table(st.shards))
    for note in st.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def _group_table(title: str, groups: dict[str, Tally]) -> Any:
    from rich.table import Table

    from draftgen.printable import for_console

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
        t.add_row(name, _n(tr.done), _n(tr.pending), _n(tr.in_flight),
                  _n(tr.stopped_by_budget), _n(tr.turns), mean, _n(tr.max_turns), ends)
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
        table.add_row(s.part.label, state, _n(t.sums.answers), _n(t.failed), _n(t.in_flight),
                      _n(t.sums.output_tokens), f"{t.sums.cost:.4f}", s.part.place)
    return table


def print_status(st: RunStatus, as_json: bool) -> None:
    """The status on stdout: one JSON object, or tables (160 columns when not a terminal)."""
    if as_json:
        sys.stdout.write(orjson.dumps(st.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    from rich.console import Console

    render_status(st, Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160))


def main(argv: list[str] | None = None) -> int:
    """`python -m draftgen.status RUN_DIR [--json]`: `draftgen status` without loading the
    rest of the command-line tool (its imports take a second or more on a small machine)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m draftgen.status",
                                 description="How far a draftgen run got; reads only.")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    try:
        st = collect_status(args.run_dir)
    except StatusError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    print_status(st, args.json)
    return 0
