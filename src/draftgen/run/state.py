"""Where a run stands (`RunState`) and how it ended (`Outcome`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from draftgen.progress import RunCounters
from draftgen.stopping import StopSignal


class Phase(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"
    """No new request; those in flight are answered and written."""
    ABORTING = "aborting"
    """No new request; those in flight are cancelled (a second stop, or `--now`)."""


@dataclass
class RunState:
    """The run's phase, and what ends it other than a stop asked for: a failure (a write that
    failed, a full disk, a dataset that changed, no backend left), or budget.usd reached."""

    phase: Phase = Phase.RUNNING
    failure: str | None = None
    """The first reason the run failed: set, the outcome is "failed"."""
    budget_stop: str | None = None
    """Set when budget.usd stopped the paid backends: the prompts left are skipped."""
    stopping: StopSignal = field(default_factory=StopSignal)
    """Set as soon as the run stops sending (a stop, an abort, a failure): every wait of the
    dispatcher, the scheduler and the start-up races it (`draftgen.stopping`)."""

    @property
    def sending(self) -> bool:
        return self.phase is Phase.RUNNING

    @property
    def aborting(self) -> bool:
        return self.phase is Phase.ABORTING

    def stop(self) -> None:
        """Send nothing new; what is in flight is still answered."""
        if self.phase is Phase.RUNNING:
            self.phase = Phase.STOPPING
        self.stopping.set()

    def abort(self) -> None:
        """Send nothing new and drop what is in flight."""
        self.phase = Phase.ABORTING
        self.stopping.set()

    def fail(self, why: str, *, stop: bool = True) -> None:
        """The run fails with `why` (unless it failed already: the first cause is the one to
        show); with `stop`, nothing new is sent."""
        self.failure = self.failure or why
        if stop:
            self.stop()

    def outcome(self, prompts_left: bool) -> Outcome:
        if self.failure:
            return Outcome("failed", self.failure)
        if self.phase is Phase.ABORTING:
            return Outcome("aborted", "stopped at once; answers in flight were dropped")
        if self.phase is Phase.STOPPING:
            return Outcome("stopped", "stopped; answers in flight were saved")
        if self.budget_stop and prompts_left:
            return Outcome("budget", self.budget_stop)
        return Outcome("completed", "")


@dataclass
class Outcome:
    status: str
    """"completed", "budget" (stopped by budget.usd), "stopped", "aborted", or "failed"."""
    message: str = ""
    counters: RunCounters | None = None

    @property
    def exit_code(self) -> int:
        return {"completed": 0, "budget": 0, "stopped": 0, "aborted": 130}.get(self.status, 1)
