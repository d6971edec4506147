"""Live counters of a run, and their display: a rich live table on a terminal, plain periodic
log lines otherwise."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from draftgen.connections import ConnectionWatch
from draftgen.tally import Tally

log = logging.getLogger("draftgen")


@dataclass
class DatasetCounters(Tally):
    """A dataset's live counters: this session's answers, tokens and spend (the `Tally`), and
    what the session knows besides."""

    total: int = 0
    done_before: int = 0
    """Answers already on disk when this session started."""
    exhausted: int = 0
    """Prompts not retried: they failed `max_attempts` times in earlier sessions."""
    skipped: int = 0
    """Prompts not sent because the dataset's or the run's budget was reached."""
    failed: int = 0
    in_flight: int = 0
    output_tokens_before: int = 0
    cost_before: float = 0.0
    truncated: int = 0
    not_exact: int = 0
    failure_kinds: Counter[str] = field(default_factory=Counter)

    @property
    def done(self) -> int:
        """Answers this session (`Tally.answers`, by the name the run's counts use)."""
        return self.answers

    @done.setter
    def done(self, value: int) -> None:
        self.answers = value

    @property
    def pending(self) -> int:
        return (self.total - self.done_before - self.exhausted - self.skipped - self.done
                - self.failed)

    def add(self, other: Tally) -> None:
        super().add(other)
        if isinstance(other, DatasetCounters):
            for name in ("total", "done_before", "exhausted", "skipped", "failed", "in_flight",
                         "truncated", "not_exact", "output_tokens_before", "cost_before"):
                setattr(self, name, getattr(self, name) + getattr(other, name))
            self.failure_kinds.update(other.failure_kinds)


@dataclass
class RunCounters:
    datasets: dict[str, DatasetCounters] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    status: str = "running"
    throttled: bool = False
    loop_busy: float = 0.0
    """Share of the last minute or so that the event loop's thread spent on the CPU (set by
    `sample`, which runs on that thread): near 1, this process is what limits answers/s."""
    loop_busy_s: float = 0.0
    """Over how many seconds `loop_busy` was measured."""
    connections: ConnectionWatch = field(default_factory=ConnectionWatch)
    """The backends that cannot be reached now, and since when."""
    _window: deque[tuple[float, int, int, float, float]] = field(
        default_factory=lambda: deque(maxlen=120))

    def total(self) -> DatasetCounters:
        t = DatasetCounters()
        for d in self.datasets.values():
            t.add(d)
        return t

    def sample(self) -> tuple[float, float, float]:
        """Answers/s, output tokens/s and $/min over the last minute or so (and `loop_busy`)."""
        t = self.total()
        now, cpu = time.monotonic(), time.thread_time()
        self._window.append((now, t.done, t.output_tokens, t.cost, cpu))
        while len(self._window) > 2 and now - self._window[0][0] > 60:
            self._window.popleft()
        t0, done0, tok0, cost0, cpu0 = self._window[0]
        span = max(now - t0, 1e-9)
        if span >= 0.5:
            self.loop_busy, self.loop_busy_s = (cpu - cpu0) / span, span
        else:
            self.loop_busy, self.loop_busy_s = 0.0, 0.0
            span = max(now - self.started, 1e-9)
            done0, tok0, cost0 = 0, 0, 0.0
        answers_s = (t.done - done0) / span
        tokens_s = (t.output_tokens - tok0) / span
        return answers_s, tokens_s, (t.cost - cost0) / span * 60


def projected(counters: RunCounters) -> str:
    """The run's spend once every pending prompt is answered at this session's cost per answer
    so far, and the time left at the last minute's answers/s ("" before the first answer)."""
    t = counters.total()
    if not t.done:
        return ""
    answers_s = counters.sample()[0]
    final = t.cost_before + t.cost + t.pending * t.cost / t.done
    eta = f" · ETA {duration_text(t.pending / answers_s)}" if answers_s > 0 and t.pending else ""
    return f" · projected ${final:.4f}{eta}"


def duration_text(seconds: float) -> str:
    """"45s", "12min", "3.5h"."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}min"
    return f"{seconds / 3600:.1f}h"


def _throttled(counters: RunCounters) -> str:
    return " (throttled: spend rate)" if counters.throttled else ""


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def render_table(counters: RunCounters) -> Group:
    table = Table(expand=False, header_style="bold")
    for col in ("dataset", "done / total", "failed", "skipped", "pending", "in flight",
                "out tokens", "$"):
        table.add_column(col, justify="left" if col == "dataset" else "right")
    for name, d in counters.datasets.items():
        table.add_row(name, f"{_fmt_int(d.done_before + d.done)} / {_fmt_int(d.total)}",
                      _fmt_int(d.failed + d.exhausted), _fmt_int(d.skipped), _fmt_int(d.pending),
                      _fmt_int(d.in_flight), _fmt_int(d.output_tokens), f"{d.cost:.4f}")
    answers_s, tokens_s, usd_min = counters.sample()
    t = counters.total()
    footer = Text(
        f"{counters.status}{_throttled(counters)} · in flight {t.in_flight:,} · "
        f"{answers_s:.1f} answers/s · "
        f"{tokens_s:,.0f} tokens/s · ${t.cost:.4f} spent · ${usd_min:.4f}/min"
        f"{projected(counters)} · "
        f"{time.monotonic() - counters.started:.0f}s{_loop(counters, ' · ')}"
    )
    unreachable = counters.connections.summary()
    return Group(table, footer, Text(unreachable, style="bold red")) if unreachable \
        else Group(table, footer)


def _loop(counters: RunCounters, separator: str) -> str:
    return f"{separator}loop {counters.loop_busy:.0%} busy" if counters.loop_busy_s else ""


SATURATED = 0.9
"""`loop_busy` from which the run says that its own process limits answers/s..."""
SATURATED_FOR_S = 30.0
"""...when measured over at least this long."""


def saturation_hint(counters: RunCounters, cpus: int | None) -> str | None:
    """What to say when this process's event loop is what limits the run's answers/s (busy
    nearly all the time over the last half minute or more): one process uses one core for it,
    and `--procs` spreads the run over several. None while it is not."""
    if counters.loop_busy < SATURATED or counters.loop_busy_s < SATURATED_FOR_S:
        return None
    where = f" (this machine has {cpus} CPUs)" if cpus else ""
    return (f"draftgen's event loop was busy {counters.loop_busy:.0%} of the last "
            f"{counters.loop_busy_s:.0f} s: this process, not the endpoints, limits answers/s; "
            f"`draftgen run --procs N` spreads the run over N processes{where}")


def progress_line(counters: RunCounters) -> str:
    t = counters.total()
    answers_s, tokens_s, usd_min = counters.sample()
    return (
        f"{counters.status}{_throttled(counters)}: done {t.done_before + t.done:,}/{t.total:,} "
        f"(+{t.done:,} now) failed {t.failed:,} skipped {t.skipped:,} pending {t.pending:,} "
        f"in flight {t.in_flight:,} "
        f"| {answers_s:.1f} answers/s {tokens_s:,.0f} tokens/s | ${t.cost:.4f} ${usd_min:.4f}/min"
        f"{projected(counters)}{_loop(counters, ' | ')}{_unreachable(counters)}"
    )


def closing_line(status: str, t: DatasetCounters, where: str) -> str:
    """The run's last line: how it ended, answered of total, failed, skipped for a budget,
    pending, tokens and spend, and where the answers are."""
    skipped = f"{t.skipped:,} skipped for the budget, " if t.skipped else ""
    return (f"{status}: {t.done_before + t.done:,}/{t.total:,} answered "
            f"({t.done:,} this session), {t.failed:,} failed, {t.exhausted:,} out of attempts, "
            f"{skipped}{t.pending:,} pending, {t.output_tokens:,} output tokens, "
            f"${t.cost:.4f} {where}")


def _unreachable(counters: RunCounters) -> str:
    summary = counters.connections.summary()
    return f" | {summary}" if summary else ""


class ProgressDisplay:
    """Refreshes until cancelled. `live` forces the rich display on or off."""

    def __init__(self, counters: RunCounters, live: bool | None = None,
                 log_interval_s: float = 10.0) -> None:
        self.counters = counters
        self.live = sys.stdout.isatty() if live is None else live
        self.log_interval_s = log_interval_s
        self.console = Console()
        self._hinted = False

    async def run(self) -> None:
        if self.live:
            with Live(render_table(self.counters), console=self.console,
                      refresh_per_second=4, transient=False) as live:
                try:
                    while True:
                        await asyncio.sleep(0.5)
                        live.update(render_table(self.counters))
                        self._hint_once()
                finally:
                    live.update(render_table(self.counters))
        else:
            while True:
                await asyncio.sleep(self.log_interval_s)
                log.info(progress_line(self.counters))
                self._hint_once()

    def _hint_once(self) -> None:
        if not self._hinted and (hint := saturation_hint(self.counters, os.cpu_count())):
            self._hinted = True
            log.warning("%s", hint)
