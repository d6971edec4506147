"""A server that cannot be reached is named as such: at start, one line with its URL and why
(connection refused), within seconds, never a missing price nor a probe's `unsafe`; mid-run,
the progress line names it, and a run whose backends have produced nothing but connection
failures for `unreachable_stop_s` stops, its unanswered prompts still pending, and the next
run answers them."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from draftgen.backends.base import transport_error
from draftgen.progress import DatasetCounters, RunCounters, progress_line
from tests.e2e_helpers import fast_backend, wait_for_lines, write_config
from tests.reliability.helpers import (
    ServerProcess,
    check_folder,
    draftgen,
    no_probe,
    prompt_rows,
    start_run,
    write_jsonl,
)

PRICE = {"prompt": 1.0, "completion": 2.0}
WITHIN_S = 45.0
"""A refusal at start comes this soon, interpreter start and tokenizer load included (a few
seconds on an idle machine); a backend retried for minutes would pass it."""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: Path, qwen3_dir: Path, backend: dict[str, Any], n: int = 5,
            **top: Any) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(n))
    return write_config(tmp_path, qwen3_dir, [backend], [{"name": "d", "path": str(data)}],
                        sampling={"max_tokens": 64}, **top)


@pytest.mark.parametrize("command,price", [("run", None), ("run", PRICE), ("probe", None)],
                         ids=["run-listed-price", "run-price-set", "probe"])
def test_a_closed_port_at_start(tmp_path: Path, qwen3_dir: Path, command: str,
                                price: dict[str, float] | None) -> None:
    port = _closed_port()
    url = f"http://127.0.0.1:{port}/api/v1?key=SECRET-IN-URL"
    backend = fast_backend("or", "openrouter", url, **({"price": price} if price else {}))
    cfg = _config(tmp_path, qwen3_dir, backend, budget={"usd": 1.0})
    t0 = time.monotonic()
    proc = draftgen(command, str(cfg), *(("--no-live",) if command == "run" else ()),
                    timeout=120)
    wall = time.monotonic() - t0
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said
    assert wall < WITHIN_S
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, said
    assert f"http://127.0.0.1:{port}/api/v1?key=***" in lines[0]
    assert "connection refused" in lines[0]
    assert "SECRET-IN-URL" not in said
    assert "price" not in said and "unsafe" not in said
    assert not (tmp_path / "run" / "d" / "failures.jsonl").exists()


def test_the_progress_line_names_a_refused_connection() -> None:
    """The error of a real refused connection, as the run's requests see it, in the line."""
    port = _closed_port()
    url = f"http://127.0.0.1:{port}/v1"

    async def refused() -> BaseException:
        async with aiohttp.ClientSession() as session:
            try:
                await session.get(url)
            except aiohttp.ClientError as e:
                return e
        raise AssertionError("a closed port answered")

    error = transport_error(asyncio.run(refused()))
    assert error.kind == "connection" and error.never_connected
    counters = RunCounters()
    counters.datasets["d"] = DatasetCounters(total=10)
    assert "unreachable" not in progress_line(counters)
    assert error.connection is not None
    counters.connections.failed("local", url, error.connection, error.message,
                                now=time.monotonic() - 42)
    line = progress_line(counters)
    assert f"backend 'local' unreachable for 42s: {url}: connection refused" in line
    assert f"127.0.0.1:{port}" in line.rsplit("last error:", 1)[1]
    counters.connections.reached("local")
    assert "unreachable" not in progress_line(counters)


def test_a_server_killed_mid_run(tmp_path: Path, qwen3_dir: Path) -> None:
    n, stop_s = 30, 2.0
    with ServerProcess("--latency", "0.3", "--reasoning-tokens", "3,8") as server:
        backend = fast_backend("local", "openai", server.url + "/v1", concurrency=2,
                               max_retries=2, backoff_max_s=0.1, cooldown_after=3,
                               cooldown_s=0.2)
        cfg = _config(tmp_path, qwen3_dir, backend, n=n, unreachable_stop_s=stop_s)
        run = start_run(cfg, *no_probe())
        responses = tmp_path / "run" / "d" / "responses.jsonl"
        wait_for_lines(responses, 4)
        assert server.proc is not None
        server.proc.kill()
        killed = time.monotonic()
        out, _ = run.communicate(timeout=120)
        stopped_after = time.monotonic() - killed
        said = out.decode()
    assert run.returncode == 1, said
    assert stop_s <= stopped_after < stop_s + 30, said
    stop_line = next(line for line in said.splitlines() if "unreachable_stop_s" in line)
    assert f"{server.url}/v1: connection refused" in stop_line
    folder = check_folder(tmp_path / "run")
    answered = folder.ids("d")
    assert 4 <= len(answered) < n
    assert not folder.corrupt and not folder.duplicated
    assert not folder.failed.get("d"), "a prompt that reached no server lost an attempt"

    with ServerProcess("--latency", "0.01", "--reasoning-tokens", "3,8") as again:
        _config(tmp_path, qwen3_dir, {**backend, "url": again.url + "/v1"}, n=n,
                unreachable_stop_s=stop_s)
        resumed = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    folder = check_folder(tmp_path / "run")
    assert len(folder.ids("d")) == n and not folder.duplicated
    assert answered <= folder.ids("d")
