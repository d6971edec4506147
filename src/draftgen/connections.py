"""Which backends a run cannot reach, since when, and why (`ConnectionWatch`): what the
progress line says while a server is down, and what stops a run whose backends have produced
only connection failures for `unreachable_stop_s`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from draftgen.redact import redact


@dataclass
class Down:
    """A backend whose requests have failed only for want of a connection since `since`."""

    url: str
    reason: str
    """The last failure in a few words ("connection refused")."""
    error: str
    """The last failure's error."""
    since: float
    attempts: int = 1


@dataclass
class ConnectionWatch:
    down: dict[str, Down] = field(default_factory=dict)
    """Backend name -> since when its attempts have all failed to connect."""
    since: float | None = None
    """Since when every attempt of the run, on any backend, failed to connect (None: one
    reached its server since the last such failure)."""

    def failed(self, backend: str, url: str, reason: str, error: str,
               now: float | None = None) -> bool:
        """One attempt that failed to connect; True when its backend was reachable until now."""
        now = time.monotonic() if now is None else now
        if self.since is None:
            self.since = now
        down = self.down.get(backend)
        if down is None:
            self.down[backend] = Down(url, reason, error, now)
            return True
        down.reason, down.error = reason, error
        down.attempts += 1
        return False

    def reached(self, backend: str) -> bool:
        """An attempt that reached its server (answered, or refused by the server itself);
        True when the backend was down until now."""
        self.since = None
        return self.down.pop(backend, None) is not None

    def down_for(self, now: float | None = None) -> float:
        """How long every attempt of the run has failed to connect (0: not so)."""
        if self.since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.since

    def summary(self, now: float | None = None) -> str:
        """Each backend down, with its URL, why, for how long and its last error ("": none)."""
        now = time.monotonic() if now is None else now
        return redact("; ".join(
            f"backend {name!r} unreachable for {now - d.since:.0f}s: {d.url}: {d.reason}, "
            f"{d.attempts:,} attempts (last error: {d.error})"
            for name, d in self.down.items()))
