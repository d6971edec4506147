"""Probing started backends: a few small requests each, all backends at once."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence

import orjson

from draftgen.backends import Backend
from draftgen.backends.reach import BackendUnreachable, unreachable_text
from draftgen.budget.probe_hold import ProbeCharge, ProbeHold
from draftgen.config import RunConfig
from draftgen.formats import Format
from draftgen.probe.analyze import analyze
from draftgen.probe.exchange import Exchange, ProbeRequest, exchange, probe_requests
from draftgen.probe.model import AnswerReport, BackendProbe
from draftgen.probe.options import ProbeOptions
from draftgen.probe.verdict import judge
from draftgen.types import BackendError

log = logging.getLogger("draftgen.probe")

PROBE_VERSION = 2
"""Part of the cache key: a new probe logic re-probes."""

_KEY_EXCLUDE = {
    "concurrency", "priority", "price", "paid", "cooldown_after", "cooldown_s", "timeout_s",
    "connect_timeout_s", "max_retries", "backoff_base_s", "backoff_max_s", "headers", "fleet",
}
"""Backend settings that cannot change what the endpoint answers."""


def backend_key(cfg: RunConfig, backend: str, tokenizer_sha256: str) -> str:
    """What a probe result depends on: the model and its format, the tokenizer, the sampling,
    the backend's settings that reach the endpoint (its config as written, before a managed
    llama-server's URL is filled in), and the probe's version. Not the probe's max_tokens: a
    result of `draftgen probe --max-tokens N` serves the run that follows."""
    b = next(b for b in cfg.backends if b.name == backend)
    sampling = cfg.sampling.model_dump(mode="json", exclude={"max_tokens"})
    data = {
        "probe": PROBE_VERSION, "tokenizer": tokenizer_sha256,
        "model": cfg.model.model_dump(mode="json"), "sampling": sampling,
        "backend": {**b.model_dump(mode="json", exclude=_KEY_EXCLUDE),
                    "headers": sorted(b.headers)},
    }
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


async def probe_backend(fmt: Format, backend: Backend, key: str, max_tokens: int,
                        hold: ProbeHold | None = None) -> BackendProbe:
    """Probe one backend; with `hold`, its requests are paid from the run's budget (and a
    backend whose charges are not known yet gets its first request alone)."""
    requests, notes = probe_requests(fmt)
    price = backend.cfg.price or await backend.listed_price()
    quantizations = asyncio.ensure_future(backend.listed_quantizations())
    try:
        answers: list[AnswerReport] = []
        async for exchanges in _steps(backend, requests, max_tokens, hold):
            listed = await quantizations
            step = [analyze(fmt, ex, price, listed) for ex in exchanges]
            if hold is not None:
                hold.settle(backend.name, [ProbeCharge(a.reported_usd, a.priced_usd,
                                                       a.billed_tokens) for a in step])
            refuse_lost_connection(backend, exchanges)
            answers += step
    finally:
        quantizations.cancel()
    verdict, problems, warnings = judge(
        fmt, answers, notes, prompt_as_ids=backend.capabilities.needs_prompt_ids)
    return BackendProbe(
        backend=backend.name, type=backend.cfg.type, key=key, verdict=verdict,
        problems=problems, warnings=warnings, answers=answers,
        cost_usd=round(sum(a.cost_usd for a in answers), 8), probed_at=round(time.time(), 3),
        price=price.model_dump() if price is not None else None,
    )


async def _steps(backend: Backend, requests: list[ProbeRequest], max_tokens: int,
                 hold: ProbeHold | None) -> AsyncIterator[list[Exchange]]:
    """The probe's exchanges with the backend, a step at a time: all at once, or with `hold`
    (`ProbeHold.in_steps`) the first alone and the others after its answer, each step's
    `max_tokens` what the budget allows. A step that does not fit is not sent: its
    requests fail with the reason."""
    steps = [requests[:1], requests[1:]] if hold and hold.in_steps(backend.name) else [requests]
    for n, step in enumerate(steps):
        allowed: int | str = max_tokens
        if hold is not None:
            later = [len(r.input_ids) for s in steps[n + 1:] for r in s]
            allowed = hold.hold(backend.name, [len(r.input_ids) for r in step], later,
                                max_tokens)
        if isinstance(allowed, str):
            log.warning("probe: backend %s: %d requests %s", backend.name, len(step), allowed)
            error = BackendError("budget", allowed, retryable=False)
            yield [Exchange(r, error=error) for r in step]
            continue
        if allowed < max_tokens:
            log.info("probe: backend %s: max_tokens %d (of %d) to fit budget.usd",
                     backend.name, allowed, max_tokens)
        yield list(await asyncio.gather(*(exchange(backend, r, allowed) for r in step)))


def refuse_lost_connection(backend: Backend, exchanges: Sequence[Exchange]) -> None:
    """A probe request that failed for want of a connection says nothing of what the backend
    answers: BackendUnreachable, never a verdict."""
    for ex in exchanges:
        if ex.error is not None and ex.error.connection is not None:
            raise BackendUnreachable(unreachable_text(backend.name, backend.base_url,
                                                      ex.error.connection, ex.error.message))


def reusable(stored: BackendProbe | None, key: str) -> bool:
    """A stored result for the same key, unless a request failed (maybe transiently)."""
    return (stored is not None and stored.key == key
            and not any(p.code == "request_failed" for p in stored.problems))


def reusable_results(fmt: Format, cfg: RunConfig, names: Sequence[str],
                     opts: ProbeOptions, stored: Mapping[str, BackendProbe]
                     ) -> dict[str, BackendProbe]:
    """The results in `stored` of the backends `names` that still serve (their key matches;
    none with `opts.force`): what `probe_all` reuses instead of probing."""
    if opts.force:
        return {}
    return {name: old for name in names
            if (old := stored.get(name)) is not None
            and reusable(old, backend_key(cfg, name, fmt.tokenizer.sha256))}


async def probe_all(fmt: Format, cfg: RunConfig, backends: Sequence[Backend],
                    opts: ProbeOptions, stored: Mapping[str, BackendProbe] | None = None,
                    hold: ProbeHold | None = None) -> list[BackendProbe]:
    """One result per backend, in order: reused from `stored` where its key still matches
    (unless `opts.force`), else probed now, all backends concurrently but those paid from
    `hold`'s budget, one after another (what one backend's second step needs is not taken
    by another's first)."""
    reused = reusable_results(fmt, cfg, [b.name for b in backends], opts, stored or {})

    async def one(b: Backend) -> BackendProbe:
        old = reused.get(b.name)
        if old is not None:
            old.cached = True
            return old
        log.info("probing backend %s (%s)", b.name, b.cfg.type)
        return await probe_backend(fmt, b, backend_key(cfg, b.name, fmt.tokenizer.sha256),
                                   opts.max_tokens, hold)

    async def in_turn(paid: list[Backend]) -> list[BackendProbe]:
        return [await one(b) for b in paid]

    paid = [b for b in backends if hold is not None and hold.pays(b.name)]
    free = [b for b in backends if b not in paid]
    at_once, one_by_one = await asyncio.gather(asyncio.gather(*map(one, free)), in_turn(paid))
    by_name = {r.backend: r for r in [*at_once, *one_by_one]}
    return [by_name[b.name] for b in backends]
