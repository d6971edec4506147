"""Concurrency, priority and retries. The scheduler never parses a body.

- `BackendSlots` hands out backends: each has its own concurrency cap; a backend of a higher
  `priority` number takes work only while every backend of a lower number is saturated (free
  local servers first, paid overflow second).
- `send_with_retries` retries one request with exponential back-off and jitter, honouring
  `Retry-After`. Only that request waits: one 429 never pauses the others.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from draftgen.backends import Backend
from draftgen.types import BackendError, Prompt, RawAnswer

log = logging.getLogger("draftgen.scheduler")


class NoBackendLeft(Exception):
    """Every backend was taken out of the run (bad key, out of credits, ...)."""


@dataclass
class BackendState:
    backend: Backend
    in_flight: int = 0
    disabled_reason: str | None = None

    @property
    def capacity(self) -> int:
        return self.backend.cfg.concurrency

    @property
    def free(self) -> bool:
        return self.disabled_reason is None and self.in_flight < self.capacity


class BackendSlots:
    def __init__(self, backends: Sequence[Backend]) -> None:
        self.states = {b.name: BackendState(b) for b in backends}
        self._by_priority = sorted(self.states.values(), key=lambda s: s.backend.cfg.priority)
        self._changed = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.states.values())

    def _pick(self) -> BackendState | None:
        best: BackendState | None = None
        for state in self._by_priority:
            if best is not None and state.backend.cfg.priority > best.backend.cfg.priority:
                break
            if state.free and (best is None
                               or state.in_flight / state.capacity
                               < best.in_flight / best.capacity):
                best = state
        return best

    async def acquire(self) -> Backend:
        while True:
            state = self._pick()
            if state is not None:
                state.in_flight += 1
                return state.backend
            if all(s.disabled_reason for s in self.states.values()):
                reasons = "; ".join(f"{n}: {s.disabled_reason}" for n, s in self.states.items())
                raise NoBackendLeft(f"no backend left to send to ({reasons})")
            self._changed.clear()
            await self._changed.wait()

    def release(self, backend: Backend) -> None:
        self.states[backend.name].in_flight -= 1
        self._changed.set()

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
    backend: Backend, prompt: Prompt, input_ids: list[int], max_tokens: int
) -> tuple[RawAnswer, int]:
    """Send one prompt, retrying retryable errors. Returns the answer and the retry count.

    A Retry-After longer than the backend's `backoff_max_s` is not waited out within this run:
    the request fails with its kind and is retried by a later run.
    """
    cfg = backend.cfg
    attempt = 0
    while True:
        try:
            return await backend.send(prompt, input_ids, max_tokens), attempt
        except BackendError as e:
            if not e.retryable or e.permanent_for_backend or attempt >= cfg.max_retries:
                raise
            if e.retry_after is not None and e.retry_after > cfg.backoff_max_s:
                e.message += f" (Retry-After {e.retry_after:.0f}s exceeds backoff_max_s)"
                raise
            delay = backoff_delay(attempt, cfg.backoff_base_s, cfg.backoff_max_s, e.retry_after)
            log.debug("%s: %s on %s, retry %d in %.1fs", prompt.id, e.kind, backend.name,
                      attempt + 1, delay)
            attempt += 1
            await asyncio.sleep(delay)
