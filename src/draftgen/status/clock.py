"""Where the windows of the rates lie: the sessions' spans (a sharded run's overlap), the last
minutes before now or before the last activity."""

from __future__ import annotations

import math
from dataclasses import dataclass

from draftgen.status.model import WINDOW_S, DatasetStatus, Rates
from draftgen.status.sums import Columns, concat, rates
from draftgen.store.runjson import Session


def _session_spans(sessions: list[Session], live: bool, now: float,
                   last_activity: float | None) -> list[tuple[float, float]] | None:
    """When each session ran (a killed session ends at the last activity before the next one
    started); None when a session has no start time."""
    spans = []
    for i, s in enumerate(sessions):
        start = s.started_at
        if start is None:
            return None
        nxt = sessions[i + 1].started_at if i + 1 < len(sessions) else None
        stop = s.stopped_at
        if stop is None:
            if live and nxt is None:
                stop = now
            else:
                stop = min(x for x in (nxt, last_activity, now) if x is not None)
        spans.append((start, stop))
    return spans


def _covered_seconds(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one span (the sessions of shards overlap)."""
    total = 0.0
    reach = -math.inf
    for start, stop in sorted(spans):
        start = max(start, reach)
        if stop > start:
            total += stop - start
            reach = stop
    return total


@dataclass
class Activity:
    """When one run folder was active, for the rates."""

    sessions: list[Session]
    live: bool
    first: float | None
    last: float | None

    @property
    def last_start(self) -> float | None:
        return self.sessions[-1].started_at if self.sessions else self.first


def _active_seconds(folders: list[Activity], now: float) -> float | None:
    """Time the run spent running: the sessions of every folder, overlaps counted once."""
    timed = [f for f in folders if f.sessions]
    spans: list[tuple[float, float]] = []
    for f in timed:
        mine = _session_spans(f.sessions, f.live, now, f.last)
        if mine is None:
            return None
        spans.extend(mine)
    return _covered_seconds(spans) if timed else None


class RateClock:
    """Where the windows of the rates lie: the last WINDOW_S seconds before now (live) or
    before the last activity (stopped), and the run's active time."""

    def __init__(self, folders: list[Activity], now: float) -> None:
        last = max((f.last for f in folders if f.last is not None), default=None)
        self.end = now if any(f.live for f in folders) else (last or now)
        start = self.end - WINDOW_S
        starts = [float(f.last_start) for f in folders if isinstance(f.last_start, int | float)]
        if starts:
            start = max(start, min(starts))
        self.recent_start = start
        self.active_s = _active_seconds(folders, now)

    def fill(self, d: DatasetStatus, c: Columns) -> None:
        d.recent = rates(c, self.recent_start, self.end)
        span = self.active_s
        if span is None and d.first_t is not None and d.last_t is not None:
            span = d.last_t - d.first_t
        if span is not None:
            d.overall = Rates(seconds=span, answers=d.sums.answers,
                              output_tokens=d.sums.output_tokens, cost_usd=d.sums.cost)

    def total(self, datasets: dict[str, DatasetStatus], cols: dict[str, Columns]
              ) -> DatasetStatus:
        """Each dataset's rates, and the run's total over them."""
        total = DatasetStatus("total")
        for name, d in datasets.items():
            self.fill(d, cols[name])
            total.merge(d)
        if all(d.total is not None for d in datasets.values()) and datasets:
            total.total = sum(d.total or 0 for d in datasets.values())
            total.skipped = sum(d.skipped or 0 for d in datasets.values())
        if cols:
            self.fill(total, concat(cols.values()))
        return total
