"""`draftgen run CONFIG --ray N`: the N shards of a run as Ray tasks sharing one budget.

Ray places the tasks (one CPU each), re-runs a shard whose worker died (`max_retries`; the
re-run resumes from the shard's folder, as `draftgen run CONFIG --shard I/N` run again would),
and brings the workers' log lines to the driver. The budget pool is an actor on the driver's
node that keeps the run folder's `budget_pool.json` (the file `--shard` runs share), so only
that node touches the file and runs by hand and on Ray see the same leases.

Every node must see the config, the datasets, the tokenizer and `output_dir` at the same paths
(a shared filesystem) and have draftgen installed. This is the only module that imports Ray; the
CLI imports it only for `--ray`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.exceptions import RayError, RayTaskError, TaskCancelledError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rich.console import Console
from rich.table import Table

from draftgen import perf
from draftgen.config import ConfigError, load_config
from draftgen.probe import ProbeOptions
from draftgen.runner import Outcome, Runner, prepare
from draftgen.scale.leases import BudgetPool, FilePool, PoolOp, PoolState, describe_pool
from draftgen.scale.shards import ShardSpec
from draftgen.status import StatusError, collect_status, summary_line

T = TypeVar("T")

PROGRESS_EVERY_S = 60.0
"""How often the driver prints the whole run's progress while shards run."""
MAX_RETRIES = 3
"""Re-runs of a shard whose worker process or node died (not of a shard that failed)."""

console = Console(stderr=False, highlight=False)


@dataclass(frozen=True, slots=True)
class ShardResult:
    shard: str
    status: str
    message: str = ""
    answered: int = 0
    """Prompts of the shard answered, all sessions."""
    total: int = 0
    failed: int = 0
    cost_usd: float = 0.0
    """This session's spend."""
    exit_code: int = 1

    @classmethod
    def of(cls, spec: ShardSpec, outcome: Outcome) -> ShardResult:
        if outcome.counters is None:
            return cls(str(spec), outcome.status, outcome.message, exit_code=outcome.exit_code)
        t = outcome.counters.total()
        return cls(str(spec), outcome.status, outcome.message, t.done_before + t.done, t.total,
                   t.failed, t.cost, outcome.exit_code)


class PoolActor:
    """The run's budget pool, served by one process: `FilePool` steps applied in call order."""

    def __init__(self, run_root: str) -> None:
        self.pool = FilePool(Path(run_root))

    def apply(self, op: PoolOp[T]) -> T:
        return self.pool.apply_now(op)


class RayPool(BudgetPool):
    """The shards' side of `PoolActor` (picklable: it travels to each task)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def apply(self, op: PoolOp[T]) -> T:
        return await self.actor.apply.remote(op)


def run_shard(config_path: str, index: int, count: int, probe: ProbeOptions | None,
              pool: BudgetPool, cwd: str) -> ShardResult:
    """One shard, in a Ray worker: an ordinary sharded run with the actor as its pool, in the
    driver's directory (relative paths in the config are relative to it)."""
    os.chdir(cwd)
    spec = ShardSpec(index, count)
    logging.basicConfig(level=logging.INFO, force=True,
                        format=f"%(asctime)s shard {spec} %(levelname)s %(message)s")
    plan = prepare(load_config(Path(config_path)), shard=spec)
    outcome = perf.run(Runner(plan, live_display=False, probe=probe, pool=pool).execute())
    return ShardResult.of(spec, outcome)


def run_on_ray(config_path: Path, *, shards: int, address: str | None = None,
               live: bool | None = None, probe: ProbeOptions | None = None,
               max_retries: int = MAX_RETRIES) -> int:
    """Run the config's N shards as Ray tasks on the cluster at `address` (None: the one this
    process is connected to, else a new local one); print a table of the shards' outcomes.
    The exit code is 0 when every shard ended as `draftgen run` exits 0 (completed, stopped by
    the budget, stopped), else that of the first shard that did not. `live` is not used: Ray
    workers have no terminal, their plain log lines reach the driver."""
    if shards < 1:
        raise ConfigError(f"--ray {shards}: the number of shards must be at least 1")
    config_path = Path(config_path).resolve()
    cfg = load_config(config_path)  # a bad config fails here, not in N workers
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=address, logging_level=logging.WARNING)
    try:
        pool = RayPool(_pool_actor(Path(cfg.output_dir).resolve()))
        task = ray.remote(num_cpus=1)(run_shard).options(max_retries=max_retries,
                                                         retry_exceptions=False)
        refs = {task.remote(str(config_path), i, shards, probe, pool, os.getcwd()):
                ShardSpec(i, shards) for i in range(shards)}
        results = _gather(refs, Path(cfg.output_dir), PROGRESS_EVERY_S)
        lines = describe_pool(ray.get(pool.actor.apply.remote(PoolState.snapshot)))
    finally:
        if started_ray:
            ray.shutdown()
    _print_table(results, lines, cfg.output_dir)
    return next((r.exit_code for r in results if r.exit_code != 0), 0)


def _pool_actor(run_root: Path) -> Any:
    """The pool actor, pinned to this (the driver's) node: the pool file is written from one
    machine only, so it needs no filesystem lock across machines."""
    here = ray.get_runtime_context().get_node_id()
    actor_class = ray.remote(num_cpus=0, max_restarts=3)(PoolActor)
    return actor_class.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(str(run_root))


def _gather(refs: dict[Any, ShardSpec], run_root: Path, progress_every_s: float
            ) -> list[ShardResult]:
    """Each shard's result as it ends (printed), and the whole run's progress every
    `progress_every_s`; on Ctrl-C the shards are asked to stop (as `draftgen stop` would:
    answers in flight are saved) and still gathered."""
    pending = list(refs)
    done: dict[str, ShardResult] = {}
    started = last_progress = time.monotonic()
    while pending:
        if time.monotonic() - last_progress >= progress_every_s:
            last_progress = time.monotonic()
            _print_progress(run_root)
        try:  # a timeout keeps the driver responsive to Ctrl-C
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        except KeyboardInterrupt:  # each shard gets a SIGINT: stop, then abort on a second
            console.print("stopping the shards (answers in flight are saved; Ctrl-C again "
                          "aborts them)")
            for ref in pending:
                ray.cancel(ref)
            continue
        if not ready:
            continue
        result = _result(ready[0], refs[ready[0]])
        done[result.shard] = result
        console.print(f"shard {result.shard}: {result.status} after "
                      f"{time.monotonic() - started:.0f}s "
                      f"({result.answered:,}/{result.total:,} answered)")
    return [done[str(spec)] for spec in refs.values()]


def _print_progress(run_root: Path) -> None:
    """The run's status in one line, read from the shard folders as `draftgen status` does."""
    try:
        line = summary_line(collect_status(run_root))
    except (OSError, StatusError) as e:  # a folder being created right now: next time
        line = f"(status not readable yet: {e})"
    console.print(f"{time.strftime('%H:%M:%S')} {line}")


def _result(ref: Any, spec: ShardSpec) -> ShardResult:
    try:
        return ray.get(ref)
    except TaskCancelledError:  # Ctrl-C before Ray started it
        return ShardResult(str(spec), "stopped", "stopped before it started", exit_code=0)
    except RayTaskError as e:  # the shard itself failed: a config or data error, a bug
        cause = e.cause if isinstance(e.cause, BaseException) else e
        return ShardResult(str(spec), "failed", f"{type(cause).__name__}: {cause}")
    except RayError as e:  # its worker or node died more often than max_retries
        return ShardResult(str(spec), "failed", f"{type(e).__name__}: {str(e).splitlines()[0]}")


def _print_table(results: list[ShardResult], pool_lines: list[str], output_dir: str) -> None:
    table = Table(title=f"{len(results)} shards → {output_dir}")
    for column in ("shard", "status", "answered", "failed", "cost now", "message"):
        table.add_column(column, justify="right" if column in ("answered", "failed",
                                                                "cost now") else "left")
    for r in results:
        table.add_row(r.shard, r.status, f"{r.answered:,}/{r.total:,}", f"{r.failed:,}",
                      f"${r.cost_usd:.4f}", r.message)
    console.print(table)
    for line in pool_lines:
        console.print(line)
