"""Run counters: rates over the last minute, and the event loop's load, said once when this
process is what limits answers/s; the run's closing line, which names the prompts skipped for
the budget and wraps at spaces on a terminal."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest

from draftgen import progress
from draftgen.printable import message_console
from draftgen.progress import (
    DatasetCounters,
    ProgressDisplay,
    RunCounters,
    closing_line,
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


# ---- the run's closing line --------------------------------------------------------------------


def _budget_stopped() -> DatasetCounters:
    """184 of 303 answered (103 before this session), 3 failed, 116 skipped for the budget."""
    c = DatasetCounters(total=303, done_before=103, skipped=116, failed=3, cost=0.0221,
                        cost_before=0.0278)
    c.done, c.output_tokens = 81, 20_412
    return c


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
def test_the_closing_line_names_the_skipped_and_cuts_no_word(width: int, terminal: bool) -> None:
    line = closing_line("budget", _budget_stopped(),
                        "→ runs/a-rather-long-folder-name/for-a-paid-trial-run")
    assert "116 skipped for the budget, 0 pending" in line
    out = io.StringIO()
    console = message_console(file=out, width=width, force_terminal=terminal, color_system=None)
    console.print(line, highlight=False, markup=False)
    printed = out.getvalue().splitlines()
    if terminal:  # wrapped at its spaces: every word whole, no line past the width
        assert len(printed) > 1 and max(map(len, printed)) <= width
        assert [w for part in printed for w in part.split()] == line.split()
    else:  # a log keeps one line per message
        assert printed == [line]
