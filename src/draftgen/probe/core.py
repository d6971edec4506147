"""Probing started backends: a few small requests each, all backends at once."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence

import orjson

from draftgen.backends import Backend
from draftgen.config import RunConfig
from draftgen.formats import Format
from draftgen.probe.analyze import analyze
from draftgen.probe.exchange import exchange, probe_requests
from draftgen.probe.model import BackendProbe
from draftgen.probe.options import ProbeOptions
from draftgen.probe.verdict import judge

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


async def probe_backend(fmt: Format, backend: Backend, key: str, max_tokens: int
                        ) -> BackendProbe:
    requests, notes = probe_requests(fmt)
    price = backend.cfg.price or await backend.listed_price()
    exchanges, quantizations = await asyncio.gather(
        asyncio.gather(*(exchange(backend, r, max_tokens) for r in requests)),
        backend.listed_quantizations(),
    )
    answers = [analyze(fmt, ex, price, quantizations) for ex in exchanges]
    verdict, problems, warnings = judge(
        fmt, answers, notes, prompt_as_ids=backend.capabilities.needs_prompt_ids)
    return BackendProbe(
        backend=backend.name, type=backend.cfg.type, key=key, verdict=verdict,
        problems=problems, warnings=warnings, answers=answers,
        cost_usd=round(sum(a.cost_usd for a in answers), 8), probed_at=round(time.time(), 3),
        price=price.model_dump() if price is not None else None,
    )


def reusable(stored: BackendProbe | None, key: str) -> bool:
    """A stored result for the same key, unless a request failed (maybe transiently)."""
    return (stored is not None and stored.key == key
            and not any(p.code == "request_failed" for p in stored.problems))


def reusable_results(fmt: Format, cfg: RunConfig, backends: Sequence[Backend],
                     opts: ProbeOptions, stored: Mapping[str, BackendProbe]
                     ) -> dict[str, BackendProbe]:
    """The backends' results in `stored` that still serve (their key matches; none with
    `opts.force`): what `probe_all` reuses instead of probing."""
    if opts.force:
        return {}
    return {b.name: old for b in backends
            if (old := stored.get(b.name)) is not None
            and reusable(old, backend_key(cfg, b.name, fmt.tokenizer.sha256))}


async def probe_all(fmt: Format, cfg: RunConfig, backends: Sequence[Backend],
                    opts: ProbeOptions,
                    stored: Mapping[str, BackendProbe] | None = None) -> list[BackendProbe]:
    """One result per backend, in order: reused from `stored` where its key still matches
    (unless `opts.force`), else probed now (all backends concurrently)."""
    reused = reusable_results(fmt, cfg, backends, opts, stored or {})

    async def one(b: Backend) -> BackendProbe:
        old = reused.get(b.name)
        if old is not None:
            old.cached = True
            return old
        log.info("probing backend %s (%s)", b.name, b.cfg.type)
        return await probe_backend(fmt, b, backend_key(cfg, b.name, fmt.tokenizer.sha256),
                                   opts.max_tokens)

    return list(await asyncio.gather(*(one(b) for b in backends)))
