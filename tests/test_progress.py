"""Run counters: rates over the last minute, and the event loop's load, said once when this
process is what limits answers/s."""

from __future__ import annotations

import asyncio
import logging

import pytest

from draftgen import progress
from draftgen.progress import (
    DatasetCounters,
    ProgressDisplay,
    RunCounters,
    progress_line,
    saturation_hint,
)


class Clock:
    """Wall and loop-thread CPU seconds as `draftgen.progress` reads them, moved by the test
    (asyncio's own clock is left alone)."""

    def __init__(self) -> None:
        self.wall = 1000.0
        self.cpu = 5.0

    def monotonic(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu

    def advance(self, wall_s: float, cpu_s: float) -> None:
        self.wall += wall_s
        self.cpu += cpu_s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(progress, "time", c)
    return c


def _counters(clock: Clock) -> RunCounters:
    counters = RunCounters(started=clock.wall)
    counters.datasets["d"] = DatasetCounters(total=10_000)
    return counters


def test_loop_load_over_the_window(clock: Clock) -> None:
    counters = _counters(clock)
    counters.sample()
    assert counters.loop_busy_s == 0 and "loop" not in progress_line(counters)
    for _ in range(4):
        clock.advance(10, 9.6)
        counters.datasets["d"].done += 1_000
        answers_s, _, _ = counters.sample()
    assert answers_s == pytest.approx(100)
    assert counters.loop_busy == pytest.approx(0.96) and counters.loop_busy_s == 40
    assert progress_line(counters).endswith("| loop 96% busy")
    hint = saturation_hint(counters, cpus=8)
    assert hint is not None and "96%" in hint and "--procs N" in hint and "8 CPUs" in hint


@pytest.mark.parametrize(("wall_s", "cpu_s"), [(40, 20), (20, 19.5)])
def test_no_hint_below_the_load_or_the_time(clock: Clock, wall_s: float, cpu_s: float) -> None:
    """Half busy: the endpoints are slower than the client. Busy for only 20 s: too soon."""
    counters = _counters(clock)
    counters.sample()
    clock.advance(wall_s, cpu_s)
    counters.sample()
    assert saturation_hint(counters, cpus=8) is None


def test_the_display_says_it_once(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    counters = _counters(clock)
    counters.sample()
    display = ProgressDisplay(counters, live=False, log_interval_s=0.005)

    async def three_lines() -> None:
        task = asyncio.create_task(display.run())
        for _ in range(3):
            clock.advance(15, 14.7)
            await asyncio.sleep(0.05)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="draftgen"):
        asyncio.run(three_lines())
    hints = [r for r in caplog.records if "event loop was busy" in r.getMessage()]
    assert len(hints) == 1 and hints[0].levelno == logging.WARNING
