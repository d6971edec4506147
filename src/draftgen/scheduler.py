"""Concurrency, priority and retries. The scheduler never parses a body.

- `BackendSlots` hands out backends: each has its own concurrency cap; a backend of a higher
  `priority` number takes work only while every backend of a lower number is saturated (free
  local servers first, paid overflow second).
- `send_with_retries` retries one request with exponential back-off and jitter, honouring
  `Retry-After`. Only that request waits: one 429 never pauses the others.

Both wait against the run's `StopSignal`: a stop ends a wait for a slot (whatever pauses the
backends) and a back-off at once, with `Stopped`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from draftgen.backends import Backend
from draftgen.backends.base import RequestContext
from draftgen.errors import DraftgenError
from draftgen.stopping import StopSignal
from draftgen.types import BackendError, Prompt, RawAnswer

log = logging.getLogger("draftgen.scheduler")
PAUSE_LOG_INTERVAL_S = 60.0


class NoBackendLeft(DraftgenError):
    """Every backend was taken out of the run (bad key, out of credits, ...)."""


class NoBackendFits(DraftgenError):
    """No backend left in the run may be sent a prompt with these needs (the probe found
    every one that is left unsafe for prompts with tools)."""


TOOLS = frozenset({"tools"})
NO_NEEDS: frozenset[str] = frozenset()


def needs_of(prompt: Prompt) -> frozenset[str]:
    """What a prompt needs from a backend beyond plain answers (the probe's problem scopes)."""
    return TOOLS if prompt.tools else NO_NEEDS


@dataclass
class BackendState:
    backend: Backend
    in_flight: int = 0
    disabled_reason: str | None = None
    paused_until: float = 0.0
    pause_reason: str | None = None
    consecutive_failures: int = 0
    unfit: frozenset[str] = NO_NEEDS
    """Needs this backend must not be sent (`needs_of`)."""
    logged_pauses: dict[str, float] = field(default_factory=dict)
    """Each pause reason logged and when: a pause that comes and goes with every settled
    request (a budget that is nearly spent, a server that is down) is logged once a minute,
    not each time."""

    @property
    def capacity(self) -> int:
        return self.backend.concurrency

    def free(self, now: float) -> bool:
        return (self.disabled_reason is None and self.in_flight < self.capacity
                and now >= self.paused_until)


class BackendSlots:
    def __init__(self, backends: Sequence[Backend],
                 unfit: Mapping[str, frozenset[str]] | None = None,
                 stop: StopSignal | None = None) -> None:
        """`unfit`: backend name -> the needs it must not be sent (from the probe). `stop`: the
        run's, which ends a wait in `acquire`."""
        self.states = {b.name: BackendState(b, unfit=(unfit or {}).get(b.name, NO_NEEDS))
                       for b in backends}
        self._by_priority = sorted(self.states.values(), key=lambda s: s.backend.cfg.priority)
        self._changed = asyncio.Event()
        self._stop = stop or StopSignal()

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.states.values())

    def _pick(self, needs: frozenset[str]) -> BackendState | None:
        best: BackendState | None = None
        now = time.monotonic()
        for state in self._by_priority:
            if state.unfit & needs:
                continue
            if best is not None and state.backend.cfg.priority > best.backend.cfg.priority:
                break
            if state.free(now) and (best is None
                               or state.in_flight / state.capacity
                               < best.in_flight / best.capacity):
                best = state
        return best

    async def acquire(self, needs: frozenset[str] = NO_NEEDS) -> Backend:
        """A backend for a prompt with these `needs`, waiting for a free one; `Stopped` when
        the run stops meanwhile."""
        while True:
            state = self._pick(needs)
            if state is not None:
                state.in_flight += 1
                return state.backend
            if all(s.disabled_reason for s in self.states.values()):
                reasons = "; ".join(f"{n}: {s.disabled_reason}" for n, s in self.states.items())
                raise NoBackendLeft(f"no backend left to send to ({reasons})")
            if all(s.disabled_reason or s.unfit & needs for s in self.states.values()):
                unfit = ", ".join(sorted(n for n, s in self.states.items()
                                         if s.unfit & needs and not s.disabled_reason))
                raise NoBackendFits(f"no backend left for prompts with {'/'.join(sorted(needs))}"
                                    f" (the probe found {unfit} unsafe for them)")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await self._stop.race(self._changed.wait(), timeout=self._next_unpause())

    def _next_unpause(self) -> float | None:
        now = time.monotonic()
        waits = [s.paused_until - now for s in self.states.values()
                 if s.disabled_reason is None and s.paused_until > now
                 and s.paused_until != math.inf]
        return max(0.001, min(waits)) if waits else None

    def release(self, backend: Backend) -> None:
        self.states[backend.name].in_flight -= 1
        self._changed.set()

    def pause(self, backend: Backend, seconds: float, reason: str) -> None:
        """No new requests for this backend for `seconds` (math.inf: until `unpause`)."""
        state = self.states[backend.name]
        now = time.monotonic()
        state.paused_until = now + seconds
        if now - state.logged_pauses.get(reason, -math.inf) >= PAUSE_LOG_INTERVAL_S:
            log.info("backend %s paused: %s", backend.name, reason)
            state.logged_pauses[reason] = now
        state.pause_reason = reason
        self._changed.set()

    def unpause(self, reason: str) -> None:
        for state in self.states.values():
            if state.pause_reason == reason:
                state.paused_until = 0.0
                state.pause_reason = None
        self._changed.set()

    def note_result(self, backend: Backend, failed: bool, cause: str | None = None) -> None:
        """Consecutive failed requests take a backend out of rotation for its cool-down.
        `cause`: what the last failure was, where it says more than a count ("connection
        refused")."""
        state = self.states[backend.name]
        if not failed:
            state.consecutive_failures = 0
            return
        state.consecutive_failures += 1
        cfg = backend.cfg
        if state.consecutive_failures >= cfg.cooldown_after:
            state.consecutive_failures = 0
            why = f" (the last: {cause})" if cause else ""
            self.pause(backend, cfg.cooldown_s,
                       f"cool-down after {cfg.cooldown_after} failures in a row{why}")

    def paused_reasons(self) -> dict[str, str]:
        now = time.monotonic()
        return {n: s.pause_reason or "" for n, s in self.states.items()
                if s.disabled_reason is None and s.paused_until > now}

    def disable(self, backend: Backend, reason: str) -> None:
        state = self.states[backend.name]
        if state.disabled_reason is None:
            state.disabled_reason = reason
            log.error("backend %s taken out of the run: %s", backend.name, reason)
        self._changed.set()


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None) -> float:
    """Exponential back-off with jitter; a server's Retry-After is a floor."""
    delay = min(cap, base * (2**attempt)) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


async def send_with_retries(
    backend: Backend, prompt: Prompt, input_ids: list[int], max_tokens: int,
    on_error: Callable[[BackendError], None] | None = None, stop: StopSignal | None = None,
    ctx: RequestContext | None = None, max_retries: int | None = None,
) -> tuple[RawAnswer, int]:
    """Send one prompt (with `ctx`, its request's context: `Backend.send`), retrying
    retryable errors (the backend's `max_retries` times at most, and `max_retries` if
    given). Returns the answer and the retry count.

    A Retry-After longer than the backend's `backoff_max_s` is not waited out within this run:
    the request fails with its kind and is retried by a later run. A `stop` set before a retry
    is sent ends the back-off with `Stopped` (the request is neither answered nor failed).
    """
    stop = stop or StopSignal()
    cfg = backend.cfg
    retries = cfg.max_retries if max_retries is None else min(max_retries, cfg.max_retries)
    attempt = 0
    while True:
        try:
            return await backend.send(prompt, input_ids, max_tokens, ctx), attempt
        except BackendError as e:
            if on_error is not None:
                on_error(e)
            if not e.retryable or e.permanent_for_backend or attempt >= retries:
                raise
            if e.retry_after is not None and e.retry_after > cfg.backoff_max_s:
                e.message += f" (Retry-After {e.retry_after:.0f}s exceeds backoff_max_s)"
                raise
            delay = backoff_delay(attempt, cfg.backoff_base_s, cfg.backoff_max_s, e.retry_after)
            log.debug("%s: %s on %s, retry %d in %.1fs", prompt.id, e.kind, backend.name,
                      attempt + 1, delay)
            attempt += 1
            await stop.sleep(delay)
