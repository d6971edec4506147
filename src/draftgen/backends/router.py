"""A backend in front of a fleet of engines: wait for the workers, size `concurrency` from them.

A backend with `fleet:` points its `url` at a router (SGLang's `sglang-router`) or at a
data-parallel endpoint (`vllm serve --data-parallel-size N`). At `start()`, before any request:

- router (no `fleet.workers`): poll `GET {root}/workers` until `fleet.wait_for_workers`
  (default 1) workers are healthy; the healthy count is the fleet's size.
- `fleet.workers: N` (an endpoint that lists no workers, vLLM data parallel): poll
  `GET {root}/health` until 200; the fleet's size is N.
- then, with `fleet.slots_per_worker: S`, the backend's concurrency is size × S (config
  validation refuses `concurrency` and `slots_per_worker` together); otherwise `concurrency`
  is kept.

Progress is logged every few seconds; past `fleet.wait_timeout_s` start raises BackendNotReady
naming the backend, the URL and what was last seen. `{root}` is `url` without a trailing
`/v1`, so an OpenAI-style base URL works too.

What sglang-router 0.3.2 does (observed on loopback; `python -m sglang_router.launch_router
--worker-urls URL... --policy round_robin --host H --port P --prometheus-port P2`):

- Router endpoints: `GET /health` is 200 as soon as the router listens, with or without
  workers; `GET /readiness` is 503 `{"status": "not ready", "reason": "insufficient healthy
  workers"}` until a worker is registered, then `{"status": "ready", "healthy_workers": n,
  "total_workers": n}`; `GET /workers` is `{"workers": [{"url", "is_healthy", "load", ...}],
  "total", "stats"}` and lists a worker only once registered (one that never came up is absent,
  not unhealthy). `GET /list_workers` is an empty body.
- On each worker it calls `GET /health`, probes for gRPC (an HTTP/2 preface), then
  `GET /server_info` and `GET /model_info` (a 404 there is tolerated). A worker down at start
  is retried every `--worker-startup-check-interval` seconds (default 30) for
  `--worker-startup-timeout-secs`; health checks run every `--health-check-interval-secs`
  (default 60), so a dead worker stays "healthy" in `/workers` for up to a minute.
- It proxies `/generate` and `/v1/chat/completions` (not llama-server's `/completion`: 404) as
  typed requests: bodies are re-serialized, `max_tokens` becomes `max_completion_tokens`, and
  fields it does not know are dropped (vLLM's `return_token_ids`, OpenRouter's `reasoning`,
  unknown `sampling_params` keys); answers come back unchanged (`output_ids`, logprobs with
  `id`/`bytes`).
- No worker: 503 `{"error": {"code": "no_available_workers"}}`. A worker that dies (requests
  in flight, or a refused connection): with the router's retries on (`--retry-max-retries`,
  default 5) the request is re-sent to another worker and draftgen sees nothing; with
  `--disable-retries` the router answers 500 `{"error": {"code":
  "call_upstream_request_error"}}`. Both statuses are retryable for draftgen. After 10 failures
  (`--cb-failure-threshold`) the worker's circuit opens and it gets no more requests.
- It binds a Prometheus exporter on `--prometheus-port` (default 29000, on 0.0.0.0) and
  panics at start when that port is taken.
- Policies: `cache_aware` (default) sends requests sharing a prefix to the same worker until
  its in-flight lead exceeds `--balance-abs-threshold` (64): a batch of same-template prompts
  lands on one worker (2 workers, 64 concurrent: 64 / 0); `round_robin` (32 / 32) and
  `power_of_two` (35 / 29) spread them. See tests/test_fleet.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from draftgen.config.backends import BackendConfig, FleetConfig
from draftgen.errors import DraftgenError
from draftgen.urls import join_url, without_path_suffix

log = logging.getLogger("draftgen")

POLL_INTERVAL_S = 0.5
PROGRESS_EVERY_S = 5.0
_PROBE_TIMEOUT_S = 5.0


class BackendNotReady(DraftgenError):
    """A backend's endpoint did not become ready at start (the message names it and its URL)."""

    exit_code = 1


@dataclass(frozen=True)
class FleetState:
    ready: bool
    workers: int
    """Healthy workers (a router), or the configured count (an endpoint with no list)."""
    seen: str
    """What the last poll saw, for progress lines and the timeout error."""


def server_root(url: str) -> str:
    """The server's root: an OpenAI base URL's trailing `/v1` removed (its query kept)."""
    return without_path_suffix(url, "/v1")


def healthy_workers(listing: Any) -> int:
    """Healthy workers in sglang-router's `GET /workers` answer."""
    workers = listing.get("workers") if isinstance(listing, Mapping) else None
    if not isinstance(workers, list):
        raise ValueError("no `workers` list")
    return sum(1 for w in workers if isinstance(w, Mapping) and w.get("is_healthy") is True)


async def wait_for_fleet(cfg: BackendConfig, fleet: FleetConfig,
                         headers: Mapping[str, str]) -> int:
    """Wait until the backend's fleet is ready; return the backend's concurrency."""
    assert cfg.url is not None  # config validation: a fleet needs a url
    root = server_root(cfg.url)
    timeout = aiohttp.ClientTimeout(total=min(_PROBE_TIMEOUT_S, cfg.connect_timeout_s))
    async with aiohttp.ClientSession(headers=dict(headers), timeout=timeout) as session:
        poll: Callable[[], Awaitable[FleetState]]
        if fleet.workers is not None:
            poll = functools.partial(_poll_health, cfg, session, root, fleet.workers)
        else:
            poll = functools.partial(_poll_router, cfg, session, root,
                                     fleet.wait_for_workers or 1)
        workers = await _poll_until_ready(cfg, fleet, poll)
    return fleet_concurrency(cfg, fleet, workers)


def fleet_concurrency(cfg: BackendConfig, fleet: FleetConfig, workers: int) -> int:
    if fleet.slots_per_worker is None:
        log.info("backend %s: %d workers ready; concurrency %d", cfg.name, workers,
                 cfg.concurrency)
        return cfg.concurrency
    concurrency = workers * fleet.slots_per_worker
    log.info("backend %s: %d workers ready; concurrency %d workers × %d slots = %d", cfg.name,
             workers, workers, fleet.slots_per_worker, concurrency)
    return concurrency


async def _poll_until_ready(cfg: BackendConfig, fleet: FleetConfig,
                            poll: Callable[[], Awaitable[FleetState]]) -> int:
    started = time.monotonic()
    next_progress = started + PROGRESS_EVERY_S
    while True:
        state = await poll()
        if state.ready:
            return state.workers
        now = time.monotonic()
        if now - started >= fleet.wait_timeout_s:
            raise BackendNotReady(
                f"backend {cfg.name!r}: {cfg.url} not ready after fleet.wait_timeout_s "
                f"{fleet.wait_timeout_s:g}s ({state.seen})")
        if now >= next_progress:
            log.info("backend %s: waiting for %s: %s (%.0fs of %gs)", cfg.name, cfg.url,
                     state.seen, now - started, fleet.wait_timeout_s)
            next_progress = now + PROGRESS_EVERY_S
        await asyncio.sleep(POLL_INTERVAL_S)


async def _poll_router(cfg: BackendConfig, session: aiohttp.ClientSession, root: str,
                       wanted: int) -> FleetState:
    url = join_url(root, "/workers")
    try:
        async with session.get(url) as resp:
            status, raw = resp.status, await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        return FleetState(False, 0, f"router not reachable ({type(e).__name__})")
    _refuse_client_error(cfg, url, status, hint=(
        "not a router that lists its workers (sglang-router); for an endpoint without a "
        "worker list (vLLM data parallel) give fleet.workers"))
    if status != 200:
        return FleetState(False, 0, f"GET /workers: HTTP {status}")
    try:
        healthy = healthy_workers(orjson.loads(raw))
    except ValueError:  # orjson.JSONDecodeError too
        raise BackendNotReady(f"backend {cfg.name!r}: GET {url}: not a worker list: "
                              f"{raw[:200].decode('utf-8', 'replace')!r}") from None
    return FleetState(healthy >= wanted, healthy, f"{healthy} of {wanted} workers healthy")


async def _poll_health(cfg: BackendConfig, session: aiohttp.ClientSession, root: str,
                       workers: int) -> FleetState:
    url = join_url(root, "/health")
    try:
        async with session.get(url) as resp:
            status = resp.status
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        return FleetState(False, workers, f"endpoint not reachable ({type(e).__name__})")
    _refuse_client_error(cfg, url, status, hint="the endpoint has no health check")
    return FleetState(status == 200, workers, f"GET /health: HTTP {status}")


def _refuse_client_error(cfg: BackendConfig, url: str, status: int, hint: str) -> None:
    """A 4xx will not go away by waiting (a wrong URL, a missing key): fail at once."""
    if not 400 <= status < 500:
        return
    why = hint if status == 404 else "check the url and api_key_env"
    raise BackendNotReady(f"backend {cfg.name!r}: GET {url}: HTTP {status}: {why}")
