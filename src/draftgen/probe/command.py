"""`draftgen probe CONFIG`: probe every backend of a config on its own (no dataset is read)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from pathlib import Path

from draftgen.backends import Backend, make_backend
from draftgen.backends.base import share_answer_bytes
from draftgen.backends.managed_llamacpp import ManagedServers
from draftgen.backends.reach import all_reachable
from draftgen.config import ConfigError, RunConfig
from draftgen.errors import DraftgenError
from draftgen.formats import Format, get_format
from draftgen.probe.core import ProbeOptions, probe_all
from draftgen.probe.model import BackendProbe
from draftgen.store import RunLayout, RunLock, RunLocked
from draftgen.store.runjson_writer import record_probe
from draftgen.tokenize import load_tokenizer, self_check

log = logging.getLogger("draftgen.probe")


def load_format(cfg: RunConfig) -> Format:
    """The run's tokenizer and model format, self-checked (as `runner.prepare` does)."""
    tokenizer = load_tokenizer(cfg.model.tokenizer)
    fmt = get_format(cfg.model.format, tokenizer, cfg.model.format_options)
    self_check(tokenizer, fmt.special_tokens())
    return fmt


def select_backends(cfg: RunConfig, only: Sequence[str] | None) -> RunConfig:
    """The config with only the named backends (all when `only` is empty)."""
    if not only:
        return cfg
    names = {b.name for b in cfg.backends}
    unknown = sorted(set(only) - names)
    if unknown:
        raise ConfigError(f"--backend: no backend named {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(names))})")
    return cfg.model_copy(update={"backends": [b for b in cfg.backends if b.name in only]})


async def probe_config(cfg: RunConfig, fmt: Format, opts: ProbeOptions) -> list[BackendProbe]:
    """Start the config's backends (and managed llama-servers), probe them all, stop them."""
    async with ManagedServers(cfg.backends, run_dir=cfg.output_dir,
                              max_tokens=opts.max_tokens) as configs:
        backends: list[Backend] = [make_backend(b, cfg.model, cfg.sampling) for b in configs]
        share_answer_bytes(backends)
        for backend in backends:
            backend.use_vocabulary(fmt.tokenizer)
        try:
            for b in backends:
                await b.start()
            await all_reachable(b.check_reachable() for b in backends)
            return await probe_all(fmt, cfg, backends, opts)
        finally:
            for b in backends:
                await b.close()


class ProbeStopped(DraftgenError):
    """SIGINT or SIGTERM arrived while probing: the probe was cancelled, nothing recorded."""

    exit_code = 130


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def probe_until_stopped(cfg: RunConfig, fmt: Format, opts: ProbeOptions
                              ) -> list[BackendProbe]:
    """`probe_config`, cancelled alike by SIGINT and SIGTERM (the backends and managed servers
    closed on the way out): ProbeStopped naming the signal."""
    task = asyncio.ensure_future(probe_config(cfg, fmt, opts))
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        received.append(sig)
        task.cancel()

    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop, sig)
    try:
        return await task
    except asyncio.CancelledError:
        if not received:
            raise
        raise ProbeStopped(f"probe stopped by {received[0].name}: nothing recorded in "
                           "run.json") from None
    finally:
        for sig in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def save_results(cfg: RunConfig, results: Sequence[BackendProbe], keep: bool = True
                 ) -> str | None:
    """Record the results in the run folder's run.json, for the run to reuse (`keep`), and
    what they cost, which every later session counts against budget.usd (also when the
    results are not kept, where the folder exists); a note when it could not (a run is live
    on the folder)."""
    layout = RunLayout(Path(cfg.output_dir))
    spent = sum(r.cost_usd for r in results if not r.cached)
    if not keep and not (spent and layout.run_json.exists()):
        return None
    lock = RunLock(layout.lock)
    try:
        lock.acquire()
    except RunLocked as e:
        return f"not recorded in run.json: {e}"
    try:
        record_probe(layout.run_json,
                     {r.backend: r.as_dict() for r in results} if keep else {},
                     command_usd=spent)
    finally:
        lock.release()
    return None
