"""10. Stops stop: `draftgen stop`, `stop --now`, SIGTERM and Ctrl-C end a run within seconds
whatever it waits on — a spend-rate pause, the dollar budget waiting for requests in flight to
settle, a retry's back-off (a long Retry-After), a fleet whose router never comes up — with the
exit code of a stop and the run folder intact. A spend rate that can never admit one request is
refused before anything is sent, naming the figures."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.budget import SpendRateError
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, run_config, write_config
from tests.reliability.helpers import (
    check_folder,
    draftgen,
    no_probe,
    prompt_rows,
    start_run,
    wait_until,
    write_jsonl,
)

SCENARIO = "10. Stops stop"
PRICE = {"prompt": 1000.0, "completion": 1000.0}
"""USD per million tokens: $0.001 a token."""
MAX_TOKENS = 64
OUTPUT_WORST = MAX_TOKENS * PRICE["completion"] / 1e6
"""What one request's output alone may cost: $0.064."""
SHORT = {"reasoning_tokens": (5, 20), "content_tokens": (5, 20)}
STOP_WITHIN_S = 15.0
"""A stop ends the run within this long: about a second on an idle machine, with room for a
loaded one; each pause waited on is a minute or more (an hour, for ever)."""


@dataclass(frozen=True)
class Stop:
    name: str
    exit_code: int
    outcome: str
    send: Callable[[subprocess.Popen[bytes], Path], None]


def _stop_command(*flags: str) -> Callable[[subprocess.Popen[bytes], Path], None]:
    def send(proc: subprocess.Popen[bytes], run_dir: Path) -> None:
        asked = draftgen("stop", str(run_dir), *flags, timeout=60)
        assert asked.returncode == 0, asked.stderr

    return send


def _signal(sig: signal.Signals) -> Callable[[subprocess.Popen[bytes], Path], None]:
    return lambda proc, run_dir: proc.send_signal(sig)


STOPS = [
    Stop("draftgen stop", 0, "stopped", _stop_command()),
    Stop("draftgen stop --now", 130, "aborted", _stop_command("--now")),
    Stop("SIGTERM", 0, "stopped", _signal(signal.SIGTERM)),
    Stop("SIGINT", 0, "stopped", _signal(signal.SIGINT)),
]


# ---- the runs to stop: each set up to wait on one thing ------------------------------------


@dataclass
class Waiting:
    """A run's config, and how to tell that the run is waiting on what the case is about."""

    what: str
    config: Path
    waiting: Callable[[Path], bool]


def _config(tmp_path: Path, qwen3_dir: Path, backend: dict[str, Any], **top: Any) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(20))
    return write_config(tmp_path, qwen3_dir, backends=[backend],
                        datasets=[{"name": "d", "path": str(data)}],
                        sampling={"max_tokens": MAX_TOKENS}, **top)


def _paid(server: TestServer, concurrency: int) -> dict[str, Any]:
    return fast_backend("or", "openrouter", server.url + "/api/v1", concurrency=concurrency,
                        price=PRICE)


def _journal(run_dir: Path, event: str) -> int:
    path = run_dir / "journal.jsonl"
    if not path.exists():
        return 0
    return sum(orjson.loads(line).get("ev") == event for line in path.read_bytes().splitlines())


class _EmptyRouter(BaseHTTPRequestHandler):
    """A router with no worker: `GET /workers` lists none, for ever."""

    polls = 0

    def do_GET(self) -> None:
        type(self).polls += 1
        body = b'{"workers": [], "total": 0}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def rate_pause(tmp_path: Path, qwen3_dir: Path) -> Iterator[Waiting]:
    """One minute's rate pays for one request ($0.09 of ~$0.085): the second waits ~50 s."""
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    **SHORT) as server:
        cfg = _config(tmp_path, qwen3_dir, _paid(server, 2), budget={"usd_per_minute": 0.09})
        yield Waiting("a spend-rate pause (usd_per_minute $0.09, ~50 s to the next request)",
                      cfg, lambda run_dir: _journal(run_dir, "ok") >= 1)


@contextlib.contextmanager
def budget_settling(tmp_path: Path, qwen3_dir: Path) -> Iterator[Waiting]:
    """budget.usd holds two requests' worst case: the third waits for them to settle, on a
    server that takes 3 s an answer."""
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    latency_s=3.0, **SHORT) as server:
        cfg = _config(tmp_path, qwen3_dir, _paid(server, 4), budget={"usd": 0.2})
        yield Waiting("budget.usd settling (2 requests in flight on a 3 s server)", cfg,
                      lambda run_dir: _journal(run_dir, "sent") >= 2)


@contextlib.contextmanager
def retry_backoff(tmp_path: Path, qwen3_dir: Path) -> Iterator[Waiting]:
    """Every request is answered 429 with Retry-After 3600, which backoff_max_s allows."""
    with TestServer(fault_rates={"retry_after_hour": 1.0}, **SHORT) as server:
        backend = fast_backend("local", "openai", server.url, concurrency=2,
                               backoff_max_s=7200.0, max_retries=3)
        cfg = _config(tmp_path, qwen3_dir, backend)
        yield Waiting("a retry back-off (429, Retry-After 3600)", cfg,
                      lambda run_dir: server.stats.snapshot(bodies=False)["requests"] != {})


@contextlib.contextmanager
def fleet_wait(tmp_path: Path, qwen3_dir: Path) -> Iterator[Waiting]:
    """A fleet backend whose router never lists a worker: the run waits for one."""
    router = ThreadingHTTPServer(("127.0.0.1", 0), type("Router", (_EmptyRouter,), {}))
    thread = threading.Thread(target=router.serve_forever, daemon=True)
    thread.start()
    try:
        backend = fast_backend("fleet", "openai", f"http://127.0.0.1:{router.server_port}/v1",
                               fleet={"wait_for_workers": 1})
        cfg = _config(tmp_path, qwen3_dir, backend)
        yield Waiting("a fleet wait (the router never lists a worker)", cfg,
                      lambda run_dir: router.RequestHandlerClass.polls >= 2)
    finally:
        router.shutdown()
        router.server_close()


WAITS = {"rate_pause": rate_pause, "budget_settling": budget_settling,
         "retry_backoff": retry_backoff, "fleet_wait": fleet_wait}


def _last_session(run_dir: Path) -> dict[str, Any]:
    return orjson.loads((run_dir / "run.json").read_bytes())["sessions"][-1]


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS, ids=[s.name for s in STOPS])
@pytest.mark.parametrize("wait", list(WAITS))
def test_a_stop_ends_the_run_whatever_it_waits_on(tmp_path: Path, qwen3_dir: Path, reliability,
                                                 wait: str, stop: Stop) -> None:
    run_dir = tmp_path / "run"
    with WAITS[wait](tmp_path, qwen3_dir) as waiting:
        case = reliability(SCENARIO, f"`{stop.name}` during {waiting.what}: the run ends "
                           f"within {STOP_WITHIN_S:.0f}s, exit {stop.exit_code}, folder intact")
        proc = start_run(waiting.config, *no_probe())
        try:
            wait_until(lambda: waiting.waiting(run_dir) or proc.poll() is not None, 60,
                       "the run to start waiting")
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            time.sleep(1.0)  # well inside the wait
            stop.send(proc, run_dir)
            asked = time.monotonic()  # `draftgen stop` signals the run as it ends
            try:
                out = proc.communicate(timeout=STOP_WITHIN_S + 20)[0].decode()
            except subprocess.TimeoutExpired:
                out = ""
            took = time.monotonic() - asked
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    case.runs = 1
    folder = check_folder(run_dir)
    case.crashed += "Traceback" in out or proc.returncode != stop.exit_code
    case.corrupt += len(folder.corrupt)
    case.duplicated += folder.duplicated
    case.note(f"exit {proc.returncode} {took:.1f}s after the stop")
    assert took < STOP_WITHIN_S, f"still running {took:.0f}s after `{stop.name}`"
    assert proc.returncode == stop.exit_code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not folder.corrupt and not folder.duplicated
    assert not any(folder.failed.values()), folder.failed  # a stop fails no prompt
    assert _last_session(run_dir)["outcome"] == stop.outcome


@pytest.mark.parametrize("rate", [1e-9, 0.05], ids=["1e-9", "below_one_output"])
def test_a_rate_that_cannot_admit_one_request_is_refused_at_start(
        tmp_path: Path, qwen3_dir: Path, reliability, rate: float) -> None:
    case = reliability(SCENARIO, f"budget.usd_per_minute {rate:g} below one request's output "
                       f"worst case (${OUTPUT_WORST:g}): refused at start, naming both")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    **SHORT) as server:
        cfg = _config(tmp_path, qwen3_dir, _paid(server, 2), budget={"usd_per_minute": rate})
        with pytest.raises(SpendRateError) as refused:
            run_config(cfg)
        sent = server.stats.snapshot(bodies=False)["requests"]
    case.runs = 1
    message = str(refused.value)
    case.note(message)
    assert f"{rate:g}" in message and f"{OUTPUT_WORST:g}" in message and "'or'" in message
    assert "max_tokens 64" in message
    assert not any(k.endswith("completions") for k in sent), sent
