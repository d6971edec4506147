"""What `draftgen status` tells about a run: the numbers of each dataset, of the run, and of
each folder of a sharded run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from draftgen.errors import DraftgenError
from draftgen.status.conversation_counts import TrajectoryStatus
from draftgen.store.journal import JournalTail
from draftgen.store.runjson import TemplateCheck
from draftgen.store.shards import RunPart
from draftgen.tally import Tally

WINDOW_S = 300.0
"""The span of the "last minutes" rates."""
FINISHED_CUT = "length"


class StatusError(DraftgenError):
    """The folder cannot be read as a run."""


@dataclass
class Rates:
    seconds: float
    answers: int
    output_tokens: int
    cost_usd: float

    def as_json(self) -> dict[str, Any]:
        span = self.seconds
        return {
            "seconds": round(span, 1),
            "answers_per_s": round(self.answers / span, 3) if span > 0 else None,
            "tokens_per_s": round(self.output_tokens / span, 1) if span > 0 else None,
            "usd_per_min": round(self.cost_usd / span * 60, 6) if span > 0 else None,
        }


@dataclass
class DatasetStatus:
    name: str
    total: int | None = None
    skipped: int | None = None
    sums: Tally = field(default_factory=Tally)
    duplicates: int = 0
    failed_by_kind: Counter[str] = field(default_factory=Counter)
    failed_attempts: int = 0
    """Failure lines, answered or not."""
    out_of_attempts: int = 0
    in_flight: int = 0
    quarantined: int = 0
    cost_not_kept_usd: float = 0.0
    """Spent on no answer counted above: quarantined answers, billed failed requests."""
    truncated: int = 0
    not_exact: int = 0
    by_backend: dict[str, Tally] = field(default_factory=dict)
    by_provider: dict[str, Tally] = field(default_factory=dict)
    old_schema: int = 0
    """Answers whose index entry lacks created_at, backend or token_check."""
    torn_tail_bytes: dict[str, int] = field(default_factory=dict)
    bad_lines: int = 0
    first_t: float | None = None
    last_t: float | None = None
    recent: Rates | None = None
    overall: Rates | None = None
    trajectories: TrajectoryStatus | None = None
    """`turns: all` datasets: their conversations (`status.conversation_counts`)."""

    @property
    def failed(self) -> int:
        return sum(self.failed_by_kind.values())

    @property
    def pending(self) -> int | None:
        if self.total is None:
            return None
        return max(0, self.total - self.sums.answers - self.failed - (self.skipped or 0))

    def merge(self, other: DatasetStatus) -> None:
        for name in ("duplicates", "failed_attempts", "out_of_attempts", "in_flight",
                     "quarantined", "truncated", "not_exact", "old_schema", "bad_lines",
                     "cost_not_kept_usd"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.sums.add(other.sums)
        self.failed_by_kind.update(other.failed_by_kind)
        for mine, theirs in ((self.by_backend, other.by_backend),
                             (self.by_provider, other.by_provider)):
            for key, sums in theirs.items():
                mine.setdefault(key, Tally()).add(sums)
        for key, n in other.torn_tail_bytes.items():
            self.torn_tail_bytes[f"{other.name}/{key}"] = n
        self.first_t = earliest(self.first_t, other.first_t)
        self.last_t = latest(self.last_t, other.last_t)
        if other.trajectories is not None:
            if self.trajectories is None:
                self.trajectories = TrajectoryStatus(total=None)
            self.trajectories.merge(other.trajectories)

    def as_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "done": self.sums.answers,
            "failed": self.failed,
            "skipped": self.skipped,
            "pending": self.pending,
            "in_flight": self.in_flight,
            "output_tokens": self.sums.output_tokens,
            "reasoning_tokens": self.sums.reasoning_tokens,
            "cost_usd": round(self.sums.cost, 6),
            "by_backend": {k: _group_json(v) for k, v in sorted(self.by_backend.items())},
            "by_provider": {k: _group_json(v) for k, v in sorted(self.by_provider.items())},
            "failed_by_kind": dict(self.failed_by_kind.most_common()),
            "failed_attempts": self.failed_attempts,
            "out_of_attempts": self.out_of_attempts,
            "truncated": self.truncated,
            "not_exact": self.not_exact,
            "quarantined": self.quarantined,
            "cost_not_kept_usd": round(self.cost_not_kept_usd, 6),
            "duplicates": self.duplicates,
            "old_schema": self.old_schema,
            "bad_lines": self.bad_lines,
            "torn_tail_bytes": self.torn_tail_bytes,
            "first_answer_at": self.first_t,
            "last_answer_at": self.last_t,
            "rates": {"recent": self.recent.as_json() if self.recent else None,
                      "run": self.overall.as_json() if self.overall else None},
            **({"trajectories": self.trajectories.as_json()} if self.trajectories else {}),
        }


def _group_json(s: Tally) -> dict[str, Any]:
    return {"done": s.answers, "output_tokens": s.output_tokens, "cost_usd": round(s.cost, 6)}


def earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def latest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class RunStatus:
    root: Path
    live: bool
    pid: int | None
    host: str | None
    started_at: float | None
    last_activity: float | None
    now: float
    sessions: int
    last_outcome: str | None
    datasets: dict[str, DatasetStatus]
    total: DatasetStatus
    journal: JournalTail
    notes: list[str] = field(default_factory=list)
    shards: list[ShardStatus] = field(default_factory=list)
    """A sharded run's folders, each by its own numbers (empty for a run without shards)."""
    unsettled_usd: float = 0.0
    """Earlier sessions' paid requests with no answer on disk (aborted, or in flight at a
    kill: their worst case; answers no disk would take: their bill), as run.json records
    them: counted as spent on resume."""
    rescued: int = 0
    """Answers a session could not write to the run folder, waiting in rescue files
    (store.rescue) for the next run to add them."""
    rescue_files: list[str] = field(default_factory=list)
    rescue_error: str | None = None
    """Why a rescue file could not be read (then none is counted)."""
    cost_reports_refused: int = 0
    """Answers and billed failures whose reported cost was no cost (NaN, negative, not a
    number: counted at their worst case), as the sessions recorded them."""
    cost_reports_implausible: int = 0
    """Answers and billed failures whose reported cost no request could have (over
    `budget.IMPLAUSIBLE_RATIO` times its worst case: counted capped, the backend taken out)."""
    probe_usd: float = 0.0
    """What the sessions' probe requests and `draftgen probe` commands counted for against
    budget.usd."""
    changed_prompts: int = 0
    """Answered prompts whose dataset row changed under the same ID, as the last session
    found them (and left in place unless it re-asked them)."""
    template_check: TemplateCheck | None = None
    """The last session's format against the model's own chat template (None: not checked)."""
    budget_usd: float | None = None
    """budget.usd of the latest session's config (None: no dollar budget)."""

    @property
    def spent_usd(self) -> float:
        """What counts as spent against budget.usd, as a resumed run counts it: the answers,
        quarantined answers and billed failures, earlier sessions' unsettled bills, the
        probe."""
        return (self.total.sums.cost + self.total.cost_not_kept_usd + self.unsettled_usd
                + self.probe_usd)

    @property
    def budget_left_usd(self) -> float | None:
        """budget.usd less what is spent and what the requests in flight hold at their worst
        case (None: no dollar budget)."""
        if self.budget_usd is None:
            return None
        return max(0.0, self.budget_usd - self.spent_usd - self.journal.open_usd)

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_dir": str(self.root),
            "live": self.live,
            "pid": self.pid,
            "host": self.host,
            "started_at": self.started_at,
            "last_activity": self.last_activity,
            "now": round(self.now, 3),
            "sessions": self.sessions,
            "last_outcome": self.last_outcome,
            "datasets": {name: d.as_json() for name, d in self.datasets.items()},
            "total": self.total.as_json(),
            "in_flight_ids": [r.id for r in self.journal.open][:100],
            "in_flight_worst_usd": round(self.journal.open_usd, 6),
            "unsettled_usd": round(self.unsettled_usd, 6),
            "cost_reports_refused": self.cost_reports_refused,
            "cost_reports_implausible": self.cost_reports_implausible,
            "probe_usd": round(self.probe_usd, 8),
            "budget_usd": self.budget_usd,
            "spent_usd": round(self.spent_usd, 6),
            "budget_left_usd": (None if self.budget_left_usd is None
                                else round(self.budget_left_usd, 6)),
            "changed_prompts": self.changed_prompts,
            "template_check": (msgspec.to_builtins(self.template_check)
                               if self.template_check is not None else None),
            "rescued": self.rescued,
            "rescue_files": self.rescue_files,
            "notes": self.notes,
        }
        if self.shards:
            data["shards"] = [s.as_json() for s in self.shards]
        return data


@dataclass
class ShardStatus:
    """One folder of a sharded run, by its own numbers."""

    part: RunPart
    state: str
    """live, stopped, killed (its last session never ended) or not started."""
    status: RunStatus

    def as_json(self) -> dict[str, Any]:
        t = self.status.total
        return {"shard": self.part.label, "folder": str(self.part.folder), "state": self.state,
                "last_outcome": self.status.last_outcome, "pid": self.status.pid,
                "host": self.status.host, "done": t.sums.answers, "failed": t.failed,
                "in_flight": t.in_flight, "output_tokens": t.sums.output_tokens,
                "cost_usd": round(t.sums.cost, 6)}

