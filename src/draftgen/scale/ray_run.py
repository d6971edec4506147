"""`draftgen run CONFIG --ray N`: the N shards of a run as Ray tasks sharing one budget.

Ray places the tasks (one CPU each), re-runs a shard whose worker died (`max_retries`; the
re-run resumes from the shard's folder, as `draftgen run CONFIG --shard I/N` run again would),
and brings the workers' log lines to the driver. Shard 0 starts first and the others once it has
passed the probe gate, reusing its result (one probe per run). The budget pool is an actor on
the driver's node that keeps the run folder's `budget_pool.json` (the file `--shard` runs
share), so only that node touches the file and runs by hand and on Ray see the same leases.

Every node must see the config, the datasets, the tokenizer and `output_dir` at the same paths
(a shared filesystem) and have draftgen installed. This is the only module that imports Ray; the
CLI imports it only for `--ray`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.exceptions import RayError, RayTaskError, TaskCancelledError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from draftgen.budget import BudgetPool, FilePool, PoolOp, PoolState, describe_pool
from draftgen.config import ConfigError, load_config
from draftgen.probe import ProbeOptions
from draftgen.scale.launch import (
    ShardResult,
    console,
    exit_code_of,
    print_ended,
    print_progress,
    print_table,
    wait_for_probe,
)
from draftgen.scale.launch import run_shard as launch_shard
from draftgen.store.shards import ShardSpec

T = TypeVar("T")

PROGRESS_EVERY_S = 60.0
"""How often the driver prints the whole run's progress while shards run."""
MAX_RETRIES = 3
"""Re-runs of a shard whose worker process or node died (not of a shard that failed)."""


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
    return launch_shard(load_config(Path(config_path)), ShardSpec(index, count), probe, pool)


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
        run_root = Path(cfg.output_dir)

        def start(i: int, probe: ProbeOptions | None) -> Any:
            return task.remote(str(config_path), i, shards, probe, pool, os.getcwd())

        since = time.time()
        first = start(0, probe)
        if probe is not None:  # the others reuse shard 0's probe: one probe per run
            wait_for_probe(run_root, ShardSpec(0, shards), since,
                           lambda: bool(ray.wait([first], timeout=0)[0]))
            probe = dataclasses.replace(probe, force=False)
        refs = {first: ShardSpec(0, shards)}
        refs |= {start(i, probe): ShardSpec(i, shards) for i in range(1, shards)}
        results = _gather(refs, run_root, PROGRESS_EVERY_S)
        lines = describe_pool(ray.get(pool.actor.apply.remote(PoolState.snapshot)))
    finally:
        if started_ray:
            ray.shutdown()
    print_table(results, lines, cfg.output_dir)
    return exit_code_of(results)


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
            print_progress(run_root)
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
        print_ended(result, time.monotonic() - started)
    return [done[str(spec)] for spec in refs.values()]


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
