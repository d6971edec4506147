"""A run's stop as one thing that every wait of the run races (`StopSignal`).

A run waits on many things before it sends a request: a free backend slot (a spend-rate pause,
the dollar budget waiting for requests in flight to settle, a cool-down), a retry's back-off, a
fleet's workers, other shards' budget. Each of those waits races the run's `StopSignal`, which
is set once when the run stops sending (`draftgen stop`, `stop --now`, SIGTERM, Ctrl-C, a
failure): a stop ends every wait at once (`Stopped`), whatever it was waiting for and for how
long, instead of each wait learning of the stop in its own way (or, as a pause of hours did,
not at all)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from draftgen.errors import DraftgenError

T = TypeVar("T")


class Stopped(DraftgenError):
    """A wait cut short because the run stops sending (`StopSignal`)."""


class StopSignal:
    """Set once, when the run stops sending; `race` and `sleep` end with `Stopped` as soon as
    it is. Made outside an event loop; used inside one."""

    def __init__(self) -> None:
        self._set = False
        self._stopped: asyncio.Future[None] | None = None
        """Done once set; every wait under way watches it (one future, no task per wait)."""

    @property
    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    def _watch(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        if self._stopped is None or self._stopped.get_loop() is not loop:
            self._stopped = loop.create_future()
            if self._set:
                self._stopped.set_result(None)
        return self._stopped

    async def race(self, aw: Awaitable[T], timeout: float | None = None) -> T:
        """`aw`'s result; `Stopped`, with `aw` cancelled (and its clean-up awaited), as soon as
        the signal is set; TimeoutError, likewise, after `timeout` seconds. An `aw` that ends
        together with the stop keeps its result."""
        task = asyncio.ensure_future(aw)
        try:
            if not self._set:
                await asyncio.wait((task, self._watch()), timeout=timeout,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait((task,))
        if task.cancelled():
            if self._set:
                raise Stopped("the run is stopping")
            raise TimeoutError
        return task.result()

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds`; `Stopped` at once when the signal is (or gets) set."""
        if not self._set:
            await asyncio.wait((self._watch(),), timeout=seconds)
        if self._set:
            raise Stopped("the run is stopping")
