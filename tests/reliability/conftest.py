"""The reliability suite's counts: each test fills in one or more `Case`s (runs, lost,
duplicated, corrupt, crashed, what was observed). With DRAFTGEN_RELIABILITY_REPORT=PATH set,
the cases and each test's outcome are written to PATH as JSON at the end of the session;
`python tests/reliability/report.py PATH` renders docs/reliability.md from it."""

from __future__ import annotations

import os
import platform
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

REPORT_ENV = "DRAFTGEN_RELIABILITY_REPORT"
_TMP = re.compile(r"[^\s`'\"(]*/pytest-of-[^/\s]+/pytest-\d+/[^/\s`'\"]+")
"""pytest's temporary folders, shown as $TMP in the report."""


@dataclass
class Case:
    scenario: str
    case: str
    test: str = ""
    runs: int = 0
    lost: int = 0
    """Answers written before a kill/fault that are gone afterwards, prompts neither
    answered nor recorded as failed, or answers received and not kept (asked for again)."""
    duplicated: int = 0
    """Answers recorded twice for one prompt."""
    corrupt: int = 0
    """Lines in the run folder that do not parse (or torn lines left in the middle)."""
    crashed: int = 0
    """Unhandled exceptions, tracebacks, hangs, or exit codes nobody chose."""
    observed: list[str] = field(default_factory=list)
    outcome: str = "not run"
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def note(self, text: str) -> None:
        self.observed.append(text)


_CASES: list[Case] = []
_OUTCOMES: dict[str, tuple[str, str, float]] = {}
_STARTED = time.time()


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Iterator[Callable[[str, str], Case]]:
    """`case = reliability("1. Kill anywhere", "kill -9 under 1,000+ in flight")`."""
    made: list[Case] = []

    def make(scenario: str, case: str) -> Case:
        c = Case(scenario, case, test=request.node.nodeid)
        made.append(c)
        _CASES.append(c)
        return c

    yield make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    if "reliability" not in item.nodeid:
        return
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        reason = ""
        if rep.skipped and isinstance(rep.longrepr, tuple):
            reason = str(rep.longrepr[2]).removeprefix("Skipped: ")
        elif rep.failed:
            reason = str(getattr(rep, "longreprtext", ""))[-400:]
        _OUTCOMES[item.nodeid] = (rep.outcome, reason, round(rep.duration, 1))
    elif rep.when == "teardown" and rep.failed:
        _OUTCOMES[item.nodeid] = ("failed", "teardown failed", _OUTCOMES.get(
            item.nodeid, ("", "", 0.0))[2])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path or not _OUTCOMES:
        return
    cases = []
    with_cases = {c.test for c in _CASES}
    for c in _CASES:
        outcome, reason, duration = _OUTCOMES.get(c.test, ("not run", "", 0.0))
        c.outcome, c.duration_s = outcome, duration
        if reason and outcome != "passed":
            c.note(f"{outcome}: {reason}")
        c.observed = [_TMP.sub("$TMP", note) for note in c.observed]
        cases.append(asdict(c))
    for nodeid, (outcome, reason, duration) in _OUTCOMES.items():
        if nodeid not in with_cases and outcome != "passed":  # before it described itself
            cases.append(asdict(Case("(unlabelled)", nodeid.rsplit("::", 1)[-1], test=nodeid,
                                     outcome=outcome, duration_s=duration,
                                     observed=[reason] if reason else [])))
    report = {
        "generated_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "wall_s": round(time.time() - _STARTED, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "cases": cases,
    }
    Path(path).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
