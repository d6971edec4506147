"""`draftgen run`'s use of the probe: which backends may serve this run.

A backend is left out of the run when the probe found a problem of every prompt (length
mismatches, missing reasoning, a stop token inside answers, failed requests). One whose problems
concern only prompts with tools still serves the prompts without tools: the scheduler routes
each prompt by what it needs (`scheduler.needs_of`). When no backend is left, the run stops
before any request, with the reasons. Results are stored in run.json and reused on resume
while their key (model, tokenizer, backend settings, probe settings) is unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgen.backends import Backend
from draftgen.budget.probe_hold import ProbeHold
from draftgen.config import RunConfig
from draftgen.formats import Format
from draftgen.printable import printable
from draftgen.probe.core import ProbeOptions, probe_all, reusable_results
from draftgen.probe.model import BackendProbe, Problem
from draftgen.store.runjson_writer import read_probe, record_probe

log = logging.getLogger("draftgen.probe")


@dataclass
class Gate:
    results: list[BackendProbe]
    dropped: dict[str, str] = field(default_factory=dict)
    """Backend name -> why it does not serve this run."""
    refused: str | None = None
    """Set when no backend may serve: the run's failure message."""
    cost_usd: float = 0.0
    """Spent by this probe (reused results cost nothing)."""
    unfit: dict[str, frozenset[str]] = field(default_factory=dict)
    """Backend name -> what it must not be sent (prompts with tools), for the backends that
    serve the run's other prompts."""


def stored_results(*run_jsons: Path) -> dict[str, BackendProbe]:
    """The probe results stored in these run.json files, a later file's replacing an
    earlier's for the same backend. Whether a result is still valid is `core.reusable`'s
    call, by its key."""
    out: dict[str, BackendProbe] = {}
    for path in run_jsons:
        for name, data in read_probe(path).backends.items():
            result = BackendProbe.from_dict(data)
            if result is not None:
                out[name] = result
    return out


def _stored(own: dict[str, BackendProbe], shared_from: Sequence[Path]
            ) -> dict[str, BackendProbe]:
    """The results stored in the run's other folders, this folder's own replacing them."""
    return {**stored_results(*reversed(shared_from)), **own}


def backends_to_probe(fmt: Format, cfg: RunConfig, backends: Sequence[Backend],
                      opts: ProbeOptions, run_json: Path, shared_from: Sequence[Path] = ()
                      ) -> list[Backend]:
    """The backends `gate_backends` would send requests to: those without a stored result
    that still serves (the others' requests cost nothing and need no room in the budget)."""
    names = names_to_probe(fmt, cfg, [b.name for b in backends], opts, run_json, shared_from)
    return [b for b in backends if b.name in names]


def names_to_probe(fmt: Format, cfg: RunConfig, names: Sequence[str], opts: ProbeOptions,
                   run_json: Path, shared_from: Sequence[Path] = ()) -> list[str]:
    """`backends_to_probe` by the backends' names (the dry run has no backends started)."""
    reused = reusable_results(fmt, cfg, names, opts,
                              _stored(stored_results(run_json), shared_from))
    return [name for name in names if name not in reused]


def _why(problem: Problem, needs: Mapping[str, set[str]]) -> str:
    message = printable(problem.message)  # it may quote what the server said
    if problem.scope == "all":
        return message
    names = sorted(n for n, s in needs.items() if problem.scope in s)
    return f"{message} (datasets needing {problem.scope}: {', '.join(names)})"


def decide(results: list[BackendProbe], needs: Mapping[str, set[str]]
           ) -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    """The backends that may not serve this run, with the reasons; and those that serve only
    the prompts that do not need what they are unsafe for, with what that is."""
    wanted: set[str] = set().union(*needs.values()) if needs else set()
    dropped: dict[str, str] = {}
    unfit: dict[str, frozenset[str]] = {}
    for r in results:
        blocking = r.blocking(set())
        if blocking:
            dropped[r.backend] = "; ".join(_why(p, needs) for p in blocking)
            continue
        scopes = frozenset(p.scope for p in r.problems)
        if scopes & wanted:
            unfit[r.backend] = scopes
            log.warning("backend %s serves only prompts without %s: %s", r.backend,
                        "/".join(sorted(scopes)),
                        "; ".join(_why(p, needs) for p in r.blocking(wanted)))
        elif r.problems:
            log.info("backend %s is unsafe for prompts with tools only, and no dataset has "
                     "tools: it serves", r.backend)
    return dropped, unfit


def refusal(dropped: Mapping[str, str], results: list[BackendProbe]) -> str:
    lines = [f"  {name}: {why}" for name, why in dropped.items()]
    cached = any(r.cached for r in results)
    return ("the probe found no backend safe for this run, so nothing was sent:\n"
            + "\n".join(lines)
            + ("\n(probe results stored in run.json; --probe probes again)" if cached else "")
            + "\n`draftgen probe CONFIG` shows the details; `draftgen run --no-probe` skips it")


def _log(results: list[BackendProbe], dropped: Mapping[str, str], cost: float) -> None:
    for r in results:
        where = " (stored result)" if r.cached else f" · ${r.cost_usd:.4f}"
        log.info("probe: backend %s: %s%s", r.backend, r.verdict, where)
        for w in [] if r.cached else r.warnings:  # shown once, when probed
            log.info("probe: backend %s: %s", r.backend, printable(w))
    for name, why in dropped.items():
        log.warning("backend %s left out of this run by the probe: %s", name, why)
    if any(not r.cached for r in results):
        log.info("probe spend: $%.4f", cost)


def _gate_record(dropped: Mapping[str, str], refused: str | None, cost: float,
                 results: list[BackendProbe], unfit: Mapping[str, frozenset[str]]
                 ) -> dict[str, Any]:
    return {"at": round(time.time(), 3), "dropped": dict(dropped), "refused": refused,
            "unfit": {name: sorted(scopes) for name, scopes in unfit.items()},
            "cost_usd": round(cost, 8), "reused": [r.backend for r in results if r.cached],
            "verdicts": {r.backend: r.verdict for r in results}}


async def gate_backends(fmt: Format, cfg: RunConfig, needs: Mapping[str, set[str]],
                        backends: list[Backend], opts: ProbeOptions, run_json: Path,
                        shared_from: Sequence[Path] = (), hold: ProbeHold | None = None
                        ) -> Gate:
    """Probe the started `backends` for a run of `cfg` in `fmt` (or reuse results stored in
    `run_json`, else in the run.json files of `shared_from`, the run's other folders: shards
    probe once per run, not once per shard), record the results in run.json, and remove from
    `backends` (closing them) those that may not serve this run. `needs`: what each dataset's
    prompts need beyond plain answers (dataset name -> {"tools"} or nothing), which says whom
    a problem of prompts with tools concerns. `hold`: the run's budget, which the probe's
    requests are paid from."""
    own = stored_results(run_json)
    results = await probe_all(fmt, cfg, backends, opts, _stored(own, shared_from), hold)
    dropped, unfit = decide(results, needs)
    refused = refusal(dropped, results) if len(dropped) == len(backends) else None
    cost = sum(r.cost_usd for r in results if not r.cached)
    # A result taken from another folder is recorded in this one too, as its own record.
    record_probe(run_json, {r.backend: r.as_dict() for r in results
                            if not r.cached or r.backend not in own},
                 _gate_record(dropped, refused, cost, results, unfit))
    _log(results, dropped, cost)
    for b in backends:
        if b.name in dropped:
            await b.close()
    backends[:] = [b for b in backends if b.name not in dropped]
    return Gate(results, dropped, refused, cost, unfit=unfit)
