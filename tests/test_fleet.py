"""A fleet of engines behind one router: `fleet:` backends (backends/router.py) end to end.

A real `sglang-router` process on loopback in front of test servers in their own processes
(SGLang's `/generate` with `output_ids`), and, where the engine is built, two llama-servers
(chat endpoint with logprobs: the router has no route for llama-server's `/completion`).
Each test server counts the `/generate` calls it answered (`GET /stats`): the split of the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from draftgen.assets import smollm2_gguf
from draftgen.backends import router as router_module
from draftgen.backends.base import error_from_http
from draftgen.backends.managed_llamacpp import ManagedLlamaServer, free_port, tail
from draftgen.backends.router import healthy_workers, server_root
from draftgen.config.backends import FleetConfig, parse_backend
from draftgen.run import Outcome
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import (
    fast_backend,
    read_records,
    run_config,
    wait_for_lines,
    write_config,
    write_jsonl,
)
from tests.engine import require_engine
from tests.reliability.helpers import ServerProcess, start_run

DATASET = "d"
ROUTER_START_S = 30.0


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Explain topic {i}."}]}
            for i in range(n)]


def _config(tmp: Path, qwen3_dir: Path, url: str, n: int, **backend: Any) -> Path:
    data = write_jsonl(tmp / "data.jsonl", _rows(n))
    return write_config(tmp, qwen3_dir, backends=[fast_backend("fleet", "sglang", url, **backend)],
                        datasets=[{"name": DATASET, "path": str(data)}])


def _assert_each_answered_once_exactly(run_dir: Path, n: int) -> list[dict[str, Any]]:
    records = read_records(run_dir, DATASET)
    ids = Counter(r["id"] for r in records)
    assert len(ids) == n and set(ids.values()) == {1}, ids.most_common(3)
    for r in records:
        assert (r["token_source"], r["token_check"]) == ("native", "exact"), r["id"]
    return records


def _generate_calls(worker: ServerProcess) -> int:
    return int(worker.stats()["requests"].get("generate", 0))


# ---- the router process -----------------------------------------------------------------------


@dataclass
class Router:
    url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def log_text(self) -> str:
        """The router's log without its terminal colours."""
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text(errors="replace"))


@contextlib.contextmanager
def sglang_router(tmp: Path, workers: list[str], policy: str, *extra: str) -> Iterator[Router]:
    """`python -m sglang_router.launch_router` on free loopback ports (its Prometheus exporter
    too: it panics when the default port 29000 is taken), killed on exit whatever happened."""
    port = free_port()
    log = tmp / f"router-{port}.log"
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
           "--port", str(port), "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(free_port()), "--policy", policy,
           "--worker-startup-check-interval", "1", "--worker-urls", *workers, *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    router = Router(f"http://127.0.0.1:{port}", log, proc)
    try:
        _wait_router_listening(router)
        yield router
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _wait_router_listening(router: Router) -> None:
    deadline = time.monotonic() + ROUTER_START_S
    while time.monotonic() < deadline:
        if router.proc.poll() is not None:
            pytest.fail(f"sglang-router exited with {router.proc.returncode}:\n"
                        f"{tail(router.log)}", pytrace=False)
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(router.url + "/health", timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.1)
    pytest.fail(f"sglang-router not listening after {ROUTER_START_S:g}s:\n{tail(router.log)}",
                pytrace=False)


@contextlib.contextmanager
def workers(n: int, *args: str, ports: list[int] | None = None) -> Iterator[list[ServerProcess]]:
    """`n` test servers, each in its own process (so that one can be killed)."""
    ports = ports or [0] * n
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(ServerProcess("--port", str(p), *args)) for p in ports]


# ---- config and small units -----------------------------------------------------------------


def test_fleet_config_refuses_contradictions() -> None:
    base = {"name": "f", "type": "sglang", "url": "http://127.0.0.1:1"}
    with pytest.raises(ValueError, match=r"concurrency or fleet\.slots_per_worker"):
        parse_backend({**base, "concurrency": 8,
                                      "fleet": {"slots_per_worker": 4}})
    with pytest.raises(ValueError, match="not both"):
        FleetConfig(workers=2, wait_for_workers=2)
    with pytest.raises(ValueError, match="fleet: needs url"):
        parse_backend({"name": "f", "type": "llamacpp", "model": "x.gguf",
                                      "fleet": {}})
    ok = parse_backend({**base, "fleet": {"slots_per_worker": 4}})
    assert ok.fleet is not None and ok.fleet.wait_for_workers is None


def test_worker_listing_and_root() -> None:
    listing = {"workers": [{"url": "a", "is_healthy": True}, {"url": "b", "is_healthy": False},
                           {"url": "c", "is_healthy": True}], "total": 3}
    assert healthy_workers(listing) == 2
    with pytest.raises(ValueError):
        healthy_workers({"router_manager": True})
    assert server_root("http://h:1/v1/") == server_root("http://h:1") == "http://h:1"


@pytest.mark.parametrize(("status", "code"), [(500, "call_upstream_request_error"),
                                               (503, "no_available_workers")])
def test_router_errors_are_retryable(status: int, code: str) -> None:
    """The bodies sglang-router sends when a worker died mid-request / none is available."""
    body = orjson.dumps({"error": {"type": "x", "code": code, "message": "m"}})
    error = error_from_http(status, body, {})
    assert error.retryable and not error.permanent_for_backend and error.status == status


def test_endpoint_without_worker_list_is_a_clear_error(tmp_path: Path, qwen3_dir: Path) -> None:
    """`fleet` without `workers` on a server that is no router: fail at start, naming why."""
    with TestServer() as server:
        cfg = _config(tmp_path, qwen3_dir, server.url, 2, fleet={"wait_for_workers": 1})
        outcome = run_config(cfg)
        generated = server.stats["requests"].get("generate", 0)
    assert outcome.status == "failed"
    assert outcome.message.startswith(f"backend 'fleet': GET {server.url}/workers: HTTP 404: "
                                      "not a router that lists its workers")
    assert "give fleet.workers" in outcome.message and generated == 0


def test_data_parallel_endpoint_sized_from_workers(tmp_path: Path, qwen3_dir: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """`fleet.workers` (vLLM data parallel lists no workers): wait for /health only, and
    concurrency = workers × slots_per_worker, which the engine sees as its peak in flight."""
    caplog.set_level(logging.INFO, "draftgen")
    with TestServer(latency_s=0.2) as server:
        cfg = _config(tmp_path, qwen3_dir, server.url, 24,
                      fleet={"workers": 2, "slots_per_worker": 3})
        outcome = run_config(cfg)
        peak = server.stats["max_in_flight"]
    assert outcome.status == "completed", outcome.message
    assert peak == 6
    assert "2 workers ready; concurrency 2 workers × 3 slots = 6" in caplog.text
    _assert_each_answered_once_exactly(tmp_path / "run", 24)


# ---- behind a real sglang-router --------------------------------------------------------------


POLICY_BATCH = 64


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["round_robin", "power_of_two", "cache_aware"])
def test_policy_split_of_a_concurrent_batch(tmp_path: Path, qwen3_dir: Path,
                                            policy: str) -> None:
    """64 requests in flight at once through the router to 2 workers: every answer exact, and
    the split per policy (the figures the README quotes). cache_aware sends a batch whose
    prompts share their template's prefix to one worker."""
    with workers(2, "--latency", "0.5") as fleet, \
            sglang_router(tmp_path, [w.url for w in fleet], policy) as router:
        cfg = _config(tmp_path, qwen3_dir, router.url, POLICY_BATCH,
                      fleet={"wait_for_workers": 2, "slots_per_worker": POLICY_BATCH // 2})
        outcome = run_config(cfg)
        calls = sorted((_generate_calls(w) for w in fleet), reverse=True)
        peaks = [w.stats()["max_in_flight"] for w in fleet]
    assert outcome.status == "completed", outcome.message
    _assert_each_answered_once_exactly(tmp_path / "run", POLICY_BATCH)
    print(f"\n{policy}: {POLICY_BATCH} concurrent requests → workers {calls}, "
          f"peak in flight {peaks}")
    assert sum(calls) == POLICY_BATCH
    if policy == "round_robin":
        assert calls == [POLICY_BATCH // 2] * 2
    elif policy == "power_of_two":
        assert calls[1] >= POLICY_BATCH // 4
    else:
        assert calls[0] >= POLICY_BATCH * 7 // 8  # pinned: why batches use round_robin


@pytest.mark.slow
@pytest.mark.parametrize("router_retries", [False, True], ids=["draftgen-retries",
                                                               "router-retries"])
def test_worker_killed_mid_run_loses_and_duplicates_nothing(
        tmp_path: Path, qwen3_dir: Path, router_retries: bool) -> None:
    """SIGKILL one of two workers with requests in flight: the router answers those 500
    `call_upstream_request_error` (retryable for draftgen), or, with its own retries on,
    re-sends them to the live worker. Either way every prompt is answered exactly once."""
    n = 60
    extra = () if router_retries else ("--disable-retries",)
    with workers(2, "--latency", "0.2") as fleet, \
            sglang_router(tmp_path, [w.url for w in fleet], "round_robin", *extra) as router:
        cfg = _config(tmp_path, qwen3_dir, router.url, n, max_retries=30,
                      fleet={"wait_for_workers": 2, "slots_per_worker": 4})
        run = start_run(cfg, "--no-probe")
        try:
            wait_for_lines(tmp_path / "run" / DATASET / "responses.jsonl", 12)
            victim = fleet[1]
            assert victim.proc is not None
            victim.proc.kill()
            victim.proc.wait()
            out, _ = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
        survivor_calls = _generate_calls(fleet[0])
    assert run.returncode == 0, out.decode()[-3000:]
    records = _assert_each_answered_once_exactly(tmp_path / "run", n)
    assert survivor_calls > n // 2  # the dead worker's share went to the live one
    retried = sum(r["retries"] for r in records)
    if not router_retries:  # draftgen saw the router's 500s and retried them
        assert retried > 0 and "status_code=500" in router.log_text()


@pytest.mark.slow
def test_dispatch_waits_for_workers_that_start_after_the_router(
        tmp_path: Path, qwen3_dir: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The router is up, its workers are not: nothing is sent until both are healthy (no
    request meets the router's 503 `no_available_workers`), progress is logged meanwhile."""
    monkeypatch.setattr(router_module, "PROGRESS_EVERY_S", 0.5)
    caplog.set_level(logging.INFO, "draftgen")
    n = 16
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with sglang_router(tmp_path, urls, "round_robin") as router:
        cfg = _config(tmp_path, qwen3_dir, router.url, n,
                      fleet={"wait_for_workers": 2, "slots_per_worker": 2, "wait_timeout_s": 60})
        result: list[Outcome] = []
        run = threading.Thread(target=lambda: result.append(run_config(cfg)))
        run.start()
        time.sleep(2.0)
        assert run.is_alive() and not read_records(tmp_path / "run", DATASET)
        with workers(2, ports=ports) as fleet:
            run.join(timeout=90)
            calls = [_generate_calls(w) for w in fleet]
    assert not run.is_alive() and result and result[0].status == "completed", result
    records = _assert_each_answered_once_exactly(tmp_path / "run", n)
    assert all(r["retries"] == 0 for r in records)
    assert sum(calls) == n and min(calls) > 0
    assert f"backend fleet: waiting for {router.url}: 0 of 2 workers healthy" in caplog.text
    assert "backend fleet: 2 workers ready; concurrency 2 workers × 2 slots = 4" in caplog.text


@pytest.mark.slow
def test_wait_for_workers_times_out_with_a_clear_error(tmp_path: Path, qwen3_dir: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with sglang_router(tmp_path, [dead], "round_robin") as router:
        cfg = _config(tmp_path, qwen3_dir, router.url, 2,
                      fleet={"wait_for_workers": 1, "wait_timeout_s": 1.5})
        started = time.monotonic()
        outcome = run_config(cfg)
        waited = time.monotonic() - started
    assert outcome.status == "failed"
    assert outcome.message == (f"backend 'fleet': {router.url} not ready after "
                               "fleet.wait_timeout_s 1.5s (0 of 1 workers healthy)")
    assert 1.5 <= waited < 15
    assert not read_records(tmp_path / "run", DATASET)


# ---- two llama-servers behind the router ------------------------------------------------------


ENGINE_PROMPTS = [
    "Say hello.", "What is the capital of France?", "What is 2 + 2?",
    "List three prime numbers.", "Name a color.", "Write a haiku about the sea.",
    "Translate 'thank you' into Spanish.", "What day comes after Monday?",
]


@pytest.mark.slow
def test_two_llama_servers_behind_the_router_chat_logprobs(tmp_path: Path) -> None:
    """The real engine: two llama-servers behind sglang-router, draftgen's llamacpp chat
    backend (logprobs: IDs and bytes per token) on the router: every answer exact, both
    servers used."""
    require_engine()

    async def serve_and_run() -> tuple[Outcome, list[int]]:
        servers = [ManagedLlamaServer(smollm2_gguf(), name=f"w{i}", parallel=1, max_tokens=32,
                                      prompt_tokens=512, log_path=tmp_path / f"w{i}.log",
                                      server_args=["--metrics"])
                   for i in range(2)]
        async with contextlib.AsyncExitStack() as stack:
            urls = [(await stack.enter_async_context(s)).url or "" for s in servers]
            with sglang_router(tmp_path, urls, "round_robin") as router:
                outcome = await asyncio.to_thread(run_config, _engine_config(tmp_path, router))
            return outcome, [_tokens_predicted(url) for url in urls]

    outcome, predicted = asyncio.run(serve_and_run())
    assert outcome.status == "completed", outcome.message
    records = read_records(tmp_path / "run", DATASET)
    assert len({r["id"] for r in records}) == len(records) == len(ENGINE_PROMPTS)
    for r in records:
        assert (r["token_source"], r["token_check"]) == ("native", "exact"), r["id"]
        assert "ids_from_logprobs" in r["flags"], r["flags"]
    # Both servers decoded, and together exactly the tokens stored: no answer twice.
    assert min(predicted) > 0, predicted
    assert sum(predicted) == sum(len(r["output_ids"]) for r in records), predicted


def _engine_config(tmp: Path, router: Router) -> Path:
    data = write_jsonl(tmp / "prompts.jsonl", (
        {"id": f"p{i}", "messages": [{"role": "user", "content": text}]}
        for i, text in enumerate(ENGINE_PROMPTS)))
    cfg = {
        "output_dir": str(tmp / "run"),
        "model": {"name": "smollm2-135m-instruct", "format": "smollm2",
                  "tokenizer": "builtin:smollm2"},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32, "seed": 42},
        "backends": [{"name": "fleet", "type": "llamacpp", "url": router.url,
                      "endpoint": "chat", "logprobs": True,
                      "fleet": {"wait_for_workers": 2, "slots_per_worker": 1}}],
        "datasets": [{"name": DATASET, "path": str(data)}],
    }
    path = tmp / "engine.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _tokens_predicted(url: str) -> int:
    """`llamacpp:tokens_predicted_total` from a llama-server started with `--metrics`."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total "):
            return int(float(line.split()[-1]))
    raise AssertionError(f"no tokens_predicted_total in {url}/metrics:\n{text[:2000]}")
