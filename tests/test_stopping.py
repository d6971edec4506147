"""The run's stop ends every wait at once (`draftgen.stopping.StopSignal`): a wait for a slot of
a backend paused for good, a back-off of an hour, any awaitable raced against it."""

from __future__ import annotations

import asyncio
import math

import pytest

from draftgen.run.state import RunState
from draftgen.scheduler import BackendSlots, send_with_retries
from draftgen.stopping import Stopped, StopSignal
from draftgen.types import BackendError
from tests.test_scheduler import PROMPT, _backend, _Flaky


def _stop_soon(signal: StopSignal) -> None:
    asyncio.get_running_loop().call_later(0.05, signal.set)


async def test_a_stop_ends_a_wait_for_a_backend_paused_for_good() -> None:
    stop = StopSignal()
    a = _backend("a", 1)
    slots = BackendSlots([a], stop=stop)
    slots.pause(a, math.inf, "budget.usd: waiting for requests in flight to settle")
    _stop_soon(stop)
    with pytest.raises(Stopped):
        await asyncio.wait_for(slots.acquire(), 2)


async def test_a_stop_ends_a_back_off_and_sends_nothing_more() -> None:
    stop = StopSignal()
    flaky = _Flaky([BackendError("rate_limited", "slow down", retryable=True, status=429,
                                 retry_after=3600)])
    flaky.cfg = flaky.cfg.model_copy(update={"backoff_max_s": 7200.0})  # an hour is waited
    _stop_soon(stop)
    with pytest.raises(Stopped):
        await asyncio.wait_for(send_with_retries(flaky, PROMPT, [1], 10, stop=stop), 2)
    assert flaky.calls == 1


@pytest.mark.parametrize("how", ["stop", "abort", "fail"])
async def test_every_way_a_run_stops_sending_sets_its_signal(how: str) -> None:
    state = RunState()
    waiting = asyncio.create_task(state.stopping.race(asyncio.sleep(3600)))
    await asyncio.sleep(0)
    {"stop": state.stop, "abort": state.abort, "fail": lambda: state.fail("disk full")}[how]()
    with pytest.raises(Stopped):
        await asyncio.wait_for(waiting, 2)


async def test_a_signal_set_before_the_wait_ends_it_and_a_result_ready_is_kept() -> None:
    stop = StopSignal()
    assert await stop.race(asyncio.sleep(0, "done")) == "done"
    stop.set()
    with pytest.raises(Stopped):
        await stop.sleep(3600)
    with pytest.raises(Stopped):
        await stop.race(asyncio.sleep(3600))


async def test_a_race_times_out_when_asked() -> None:
    with pytest.raises(TimeoutError):
        await StopSignal().race(asyncio.sleep(3600), timeout=0.01)
