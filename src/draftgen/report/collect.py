"""One streaming pass over a run folder into counters and bounded samples.

Memory does not grow with the number of answers: counts are counters, distributions are
reservoir samples (at most `sample_cap` values each, 8 bytes a value), and the time series are
bins of one second, made twice as wide whenever there are more than `TIMELINE_CAP` of them.
"""

from __future__ import annotations

import math
import random
from array import array
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgen.export.source import ReadCounts, RunSource, SourceSession, load_run_tokenizer
from draftgen.status import collect_status
from draftgen.status.conversation_counts import TrajectoryStatus, Turn, trajectory_status
from draftgen.store.journal import as_usd
from draftgen.store.record import Damaged, Record
from draftgen.store.runjson import RunInfo
from draftgen.tally import Tally

SAMPLE_CAP = 200_000
TIMELINE_CAP = 8_192
"""The most bins a backend's timeline keeps (one second each, until a long run widens them)."""
TIMELINE_POINTS = 120
"""About how many points the report plots a run's timeline with, whatever its length."""


class Reservoir:
    """A uniform sample of at most `cap` values (Vitter's algorithm R), seeded."""

    def __init__(self, cap: int = SAMPLE_CAP, seed: int = 0) -> None:
        self.cap = cap
        self.seen = 0
        self.values = array("d")
        self._rng = random.Random(seed)

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.cap:
            self.values.append(value)
            return
        j = self._rng.randrange(self.seen)
        if j < self.cap:
            self.values[j] = value

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile of the sample (q in 0..100)."""
        if not self.values:
            return None
        ordered = sorted(self.values)
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        return ordered[rank - 1]


@dataclass
class DatasetStats(Tally, ReadCounts):
    """A dataset's answers (the `Tally`), what reading them skipped (`ReadCounts`), and their
    distributions."""

    failures: int = 0
    finish: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    failure_kinds: Counter[str] = field(default_factory=Counter)
    reasoning_len: Reservoir = field(default_factory=lambda: Reservoir(seed=1))
    content_len: Reservoir = field(default_factory=lambda: Reservoir(seed=2))
    latency: Reservoir = field(default_factory=lambda: Reservoir(seed=3))
    trajectories: TrajectoryStatus | None = None
    """`turns: all` datasets: turns per conversation and end reasons."""


class Timeline:
    """Answers and cost over time in bins of `bin_s` seconds: one second at first, doubled (the
    bins merged in pairs) whenever there are more than `cap`, so that a 37-second run keeps 37
    points and a week-long one a bounded number."""

    def __init__(self, cap: int = TIMELINE_CAP) -> None:
        self.cap = cap
        self.bin_s = 1
        self.bins: dict[int, list[float]] = {}
        """Bin index (time // bin_s) → [answers, cost] in that bin."""

    def __bool__(self) -> bool:
        return bool(self.bins)

    def add(self, t: float, cost: float) -> None:
        cell = self.bins.setdefault(int(t // self.bin_s), [0.0, 0.0])
        cell[0] += 1
        cell[1] += cost
        if len(self.bins) > self.cap:
            self._widen()

    def _widen(self) -> None:
        merged: dict[int, list[float]] = {}
        for index, (answers, cost) in self.bins.items():
            cell = merged.setdefault(index // 2, [0.0, 0.0])
            cell[0] += answers
            cell[1] += cost
        self.bins, self.bin_s = merged, self.bin_s * 2

    def series(self, bin_s: int) -> list[tuple[float, float, float]]:
        """(bin start in Unix seconds, answers, cost) per non-empty bin of `bin_s` seconds, in
        time order; `bin_s` is a multiple of this timeline's own (see `plot_bin_s`)."""
        if bin_s % self.bin_s:
            raise ValueError(f"bin_s {bin_s} is not a multiple of {self.bin_s}")
        factor = bin_s // self.bin_s
        merged: dict[int, list[float]] = {}
        for index, (answers, cost) in self.bins.items():
            cell = merged.setdefault(index // factor, [0.0, 0.0])
            cell[0] += answers
            cell[1] += cost
        return [(float(k * bin_s), a, c) for k, (a, c) in sorted(merged.items())]


def plot_bin_s(span_s: float, timelines: list[Timeline],
               points: int = TIMELINE_POINTS) -> int:
    """The bin width (seconds, a power of two) that shows a run of `span_s` seconds in about
    `points` points (at least one second, and no finer than any timeline's own bins)."""
    width = max([1, *(t.bin_s for t in timelines)])
    while span_s / width > points:
        width *= 2
    return width


@dataclass
class BackendStats(Tally):
    failures: int = 0
    timeline: Timeline = field(default_factory=Timeline)
    """Answers and cost over time."""
    latency: Reservoir = field(default_factory=lambda: Reservoir(seed=4))
    failure_kinds: Counter[str] = field(default_factory=Counter)


@dataclass
class SessionWork:
    """What a session's own lines in its folder's files show it did: the answers and failed
    attempts it wrote, what they cost, and when it wrote the last one (run.json has no
    summary of a session that was killed)."""

    answered: int = 0
    failed: int = 0
    cost: float = 0.0
    last_at: float | None = None

    def wrote(self, t: float | None, cost: float) -> None:
        self.cost += cost
        if t is not None:
            self.last_at = t if self.last_at is None else max(self.last_at, t)


class SessionOf:
    """Which session of its folder wrote a line: the one the line names (an answer's
    `session`), else the last one started before the line's time (failures, and answers
    written before records named their session)."""

    def __init__(self, sessions: list[SourceSession]) -> None:
        self._starts: dict[Path, list[float]] = {}
        for s in sorted(sessions, key=lambda s: s.index):
            self._starts.setdefault(s.folder, []).append(s.session.started_at or 0.0)

    def __call__(self, folder: Path, named: Any, t: Any) -> int | None:
        if isinstance(named, int) and not isinstance(named, bool):
            return named
        starts = self._starts.get(folder)
        if not starts or not isinstance(t, int | float):
            return None
        i = bisect_right(starts, t) - 1
        return i if i >= 0 else None


@dataclass
class BudgetGap:
    """What `budget.usd` counts as spent beyond the answers on disk, as `draftgen status`
    reads it and a resumed run counts it."""

    probe_usd: float = 0.0
    """The probe's requests (each session's, and `draftgen probe` commands')."""
    not_kept_usd: float = 0.0
    """Answers moved to quarantine.jsonl, and failed requests that were billed."""
    unsettled_usd: float = 0.0
    """Earlier sessions' paid requests with no answer on disk (aborted, or in flight at a
    kill), as run.json records them: their bill, else their worst case."""
    in_flight_usd: float = 0.0
    """Paid requests left open when the last session was killed, at their worst case: counted
    once the run resumes."""

    @property
    def usd(self) -> float:
        return self.probe_usd + self.not_kept_usd + self.unsettled_usd + self.in_flight_usd


def budget_gap(root: Path) -> BudgetGap:
    st = collect_status(root)
    return BudgetGap(probe_usd=st.probe_usd, not_kept_usd=st.total.cost_not_kept_usd,
                     unsettled_usd=st.unsettled_usd,
                     in_flight_usd=0.0 if st.live else st.journal.open_usd)


@dataclass
class RunStats:
    root: str
    info: RunInfo
    """The run's run.json (the first folder's, in a sharded run)."""
    sessions: list[SourceSession]
    """Every folder's sessions in start order."""
    datasets: dict[str, DatasetStats] = field(default_factory=dict)
    backends: dict[str, BackendStats] = field(default_factory=dict)
    providers: Counter[str] = field(default_factory=Counter)
    """"provider · quantization" → answers."""
    first_at: float | None = None
    last_at: float | None = None
    length_source: str = ""
    live: bool = False
    work: dict[tuple[Path, int], SessionWork] = field(default_factory=dict)
    """(folder, session index) → what the session's own lines show it did."""
    budget: BudgetGap = field(default_factory=BudgetGap)

    @property
    def answers(self) -> int:
        return sum(d.answers for d in self.datasets.values())

    @property
    def cost(self) -> float:
        return sum(d.cost for d in self.datasets.values())

    @property
    def span_s(self) -> float:
        if self.first_at is None or self.last_at is None:
            return 0.0
        return self.last_at - self.first_at

    def backend(self, name: str) -> BackendStats:
        return self.backends.setdefault(name, BackendStats())

    def work_of(self, folder: Path, index: int | None) -> SessionWork:
        """The session's work (a line of no known session: counted under index -1)."""
        return self.work.setdefault((folder, -1 if index is None else index), SessionWork())

    def seen_at(self, t: float) -> None:
        self.first_at = t if self.first_at is None else min(self.first_at, t)
        self.last_at = t if self.last_at is None else max(self.last_at, t)


class LengthSplitter:
    """Reasoning vs content tokens of an answer: split at the format's end-of-reasoning token
    when the run's tokenizer loads, else the engine's usage.reasoning_tokens."""

    def __init__(self, end_think_id: int | None) -> None:
        self.end_think_id = end_think_id

    def split(self, record: Record) -> tuple[int | None, int]:
        ids = record.output_ids
        total = len(ids)
        if self.end_think_id is not None:
            if self.end_think_id in ids:
                cut = ids.index(self.end_think_id) + 1
                return cut, total - cut
            if record.reasoning and not record.content:
                return total, 0  # cut off inside the reasoning
            return 0, total
        reasoning = record.usage.reasoning_tokens
        if reasoning is None:
            return None, total
        r = min(reasoning, total)
        return r, total - r


def answer_cost(record: Record) -> float:
    """What the answer cost: the runner's cost_usd (reported, or priced by the backend; 0.0
    in records written before it)."""
    return record.cost_usd


def collect(source: RunSource) -> RunStats:
    tok = load_run_tokenizer(source)
    splitter = LengthSplitter(tok.end_think_id)
    stats = RunStats(str(source.root), source.info, source.sessions, live=source.live,
                     budget=budget_gap(source.root))
    session_of = SessionOf(source.sessions)
    stats.length_source = (
        "split at the end-of-reasoning token of the run's format" if tok.end_think_id is not None
        else f"usage.reasoning_tokens as reported ({tok.note})"
    )
    trajectories = source.config.trajectory_datasets
    for name in source.datasets:
        ds = stats.datasets.setdefault(name, DatasetStats())
        _collect_answers(source, name, ds, stats, splitter, session_of, name in trajectories)
        _collect_failures(source, name, ds, stats, session_of)
    return stats


def _collect_answers(source: RunSource, name: str, ds: DatasetStats, stats: RunStats,
                     splitter: LengthSplitter, session_of: SessionOf,
                     trajectories: bool = False) -> None:
    """The dataset's answers, each counted to its session too; for a `turns: all` one, its
    turns per conversation and end reasons (one small tuple per turn held until the dataset
    is read)."""
    counts = ReadCounts()
    damaged = 0
    turns: list[Turn] = []
    for folder, record in source.answers_by_folder(name, counts, report=True):
        if isinstance(record, Damaged):
            damaged += 1
            continue
        add_answer(record, ds, stats, splitter)
        work = stats.work_of(folder, session_of(folder, record.session, record.created_at))
        work.answered += 1
        work.wrote(record.created_at, answer_cost(record))
        if trajectories and isinstance(record.conversation, str) and isinstance(record.turn,
                                                                                 int):
            end = record.end if isinstance(record.end, str) else None
            turns.append((record.conversation, record.turn, end))
    if trajectories:
        ds.trajectories = trajectory_status(turns)
    ds.torn_tail_bytes, ds.bad_lines = counts.torn_tail_bytes, counts.bad_lines + damaged
    ds.duplicates = counts.duplicates


def add_answer(record: Record, ds: DatasetStats, stats: RunStats,
               splitter: LengthSplitter) -> None:
    cost = answer_cost(record)
    ids = record.output_ids
    ds.answers += 1
    ds.output_tokens += len(ids)
    ds.cost += cost
    ds.finish[str(record.finish_reason)] += 1
    ds.checks[record.token_check] += 1
    ds.sources[record.token_source] += 1
    reasoning, content = splitter.split(record)
    if reasoning is not None:
        ds.reasoning_tokens += reasoning
        ds.reasoning_len.add(reasoning)
    ds.content_len.add(content)
    latency = record.latency_s
    backend = stats.backend(record.backend)
    backend.answers += 1
    backend.cost += cost
    backend.output_tokens += len(ids)
    if latency is not None:
        ds.latency.add(latency)
        backend.latency.add(latency)
    created = record.created_at
    if created is not None:
        stats.seen_at(created)
        backend.timeline.add(created, cost)
    provider = record.provider or "(not reported)"
    quant = record.quantization
    stats.providers[f"{provider} · {quant}" if quant else str(provider)] += 1


def _collect_failures(source: RunSource, name: str, ds: DatasetStats, stats: RunStats,
                      session_of: SessionOf) -> None:
    for folder, failure in source.failure_lines_by_folder(name, report=True):
        created = failure.get("created_at")
        work = stats.work_of(folder, session_of(folder, None, created))
        work.failed += 1
        work.wrote(created if isinstance(created, int | float) else None,
                   as_usd(failure.get("cost_usd")))
        kind = str(failure.get("kind") or "unknown")
        ds.failures += 1
        ds.failure_kinds[kind] += 1
        backend = stats.backend(str(failure.get("backend")))
        backend.failures += 1
        backend.failure_kinds[kind] += 1
