"""`draftgen run CONFIG --procs N`: one run as N shard processes on this machine.

One client process is bound by one core: its event loop and its worker threads share one
interpreter lock (about 1,400 answers/s with logprobs on the machine of
docs/benchmarks.md). `--procs N` runs shard I of N (`--shard I/N`, its own folder under
`shards/`) in N processes started here, so the client scales with the machine's cores:

- each backend's `concurrency` (or its fleet's `slots_per_worker`) is split between the
  processes, so the endpoints see the run's configured total in flight (at least 1 per
  process: more processes than `concurrency` raise the total to one per process);
- the budgets are shared through the file pool in `output_dir` (`budget.pool`), as for shards
  run by hand, and `budget.usd_per_minute` is split evenly;
- shard 0 starts first and the others once it has passed the probe gate, so a run is probed
  once, not once per process (the others reuse its stored result);
- the processes run in their own process group: a signal sent to this process (Ctrl-C, `kill`,
  `draftgen stop`'s SIGTERM or SIGUSR1) is passed on once to each, with the meaning it has for
  `draftgen run` (stop, then abort on a second; abort at once). If this process is killed
  (`kill -9`), the kernel kills them too (Linux): what they stored stays, as after any kill.

The reading commands (status, audit, export, report) read the shard folders as one run; running
the same command again resumes every shard, and a run started with another N (or without
`--procs`) answers only what no folder holds yet.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import orjson

from draftgen.budget import FilePool, PoolError, describe_pool
from draftgen.config import ConfigError, RunConfig, load_config
from draftgen.config.backends import BackendConfig
from draftgen.errors import DraftgenError
from draftgen.probe.options import ProbeOptions
from draftgen.scale.launch import (
    POLL_S,
    ShardResult,
    exit_code_of,
    print_ended,
    print_progress,
    print_table,
    run_shard,
    wait_for_probe,
)
from draftgen.store.shards import ShardSpec

PROGRESS_EVERY_S = 30.0
"""How often the launcher prints the whole run's progress while the processes run."""
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
_PR_SET_PDEATHSIG = 1


# ---- the launcher ------------------------------------------------------------------------------


def check_procs(cfg: RunConfig, procs: int) -> None:
    """What `--procs N` cannot do, as a config error before anything starts."""
    if procs < 1:
        raise ConfigError(f"--procs {procs}: the number of processes must be at least 1")
    for b in cfg.backends:
        b.api_key()  # an unset key: one error here, naming the variable, not N in the shards
    managed = [b.name for b in cfg.backends if b.starts_own_server]
    if managed and procs > 1:
        raise ConfigError(
            f"--procs {procs}: backend(s) {', '.join(managed)} start their own llama-server, "
            "and each process would start one; run them with one process, or start the server "
            "yourself and give its url")


def share_concurrency(cfg: RunConfig, shard: ShardSpec) -> RunConfig:
    """The config shard I of N runs: each backend's concurrency (or its fleet's slots per
    worker) split between the N processes, so that together they keep the configured total in
    flight (never less than 1 each)."""
    return cfg.model_copy(update={"backends": [_backend_share(b, shard) for b in cfg.backends]})


def _share(total: int, shard: ShardSpec) -> int:
    """Shard I's part of `total` split N ways: the first `total % N` shards take one more."""
    return max(1, total // shard.count + (shard.index < total % shard.count))


def _backend_share(b: BackendConfig, shard: ShardSpec) -> BackendConfig:
    if b.fleet is not None and b.fleet.slots_per_worker is not None:
        fleet = b.fleet.model_copy(update={
            "slots_per_worker": _share(b.fleet.slots_per_worker, shard)})
        return b.model_copy(update={"fleet": fleet})
    return b.model_copy(update={"concurrency": _share(b.concurrency, shard)})


@dataclass
class ShardProcess:
    spec: ShardSpec
    result_path: Path
    proc: subprocess.Popen[bytes] | None = None
    result: ShardResult | None = None

    def start(self, config: Path, probe: ProbeOptions | None, verbose: bool) -> None:
        cmd = [sys.executable, "-m", "draftgen.scale.local", str(config), str(self.spec),
               "--result", str(self.result_path), "--launcher", str(os.getpid())]
        if probe is None:
            cmd.append("--no-probe")
        else:
            cmd += ["--probe-max-tokens", str(probe.max_tokens)]
            if probe.force:
                cmd.append("--probe")
        if verbose:
            cmd.append("--verbose")
        # Own process group: a Ctrl-C at the terminal reaches the launcher only, which passes
        # it on once (a second copy from the terminal would turn the stop into an abort).
        self.proc = subprocess.Popen(cmd, process_group=0, preexec_fn=_die_with_parent)

    def ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def collect(self) -> ShardResult:
        """The shard's result as it wrote it, or what its exit status says."""
        assert self.proc is not None and self.proc.returncode is not None
        with contextlib.suppress(OSError, orjson.JSONDecodeError, TypeError):
            self.result = ShardResult.from_dict(orjson.loads(self.result_path.read_bytes()))
            return self.result
        code = self.proc.returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        self.result = ShardResult(str(self.spec), "failed", f"the process {how}",
                                  exit_code=code if code > 0 else 1)
        return self.result


def run_local(config_path: Path, *, procs: int, probe: ProbeOptions | None = None,
              verbose: bool = False, progress_every_s: float = PROGRESS_EVERY_S) -> int:
    """Run the config as `procs` shard processes on this machine (see the module doc); print
    each shard's end, the run's progress every `progress_every_s`, and a table at the end.
    The exit code is 0 when every shard ended as `draftgen run` exits 0, else that of the
    first shard that did not."""
    config_path = Path(config_path).resolve()
    cfg = load_config(config_path)  # a bad config fails here, not in N processes
    check_procs(cfg, procs)
    run_root = Path(cfg.output_dir)
    with tempfile.TemporaryDirectory(prefix="draftgen-procs-") as tmp:
        shards = [ShardProcess(ShardSpec(i, procs), Path(tmp) / f"{i}.json")
                  for i in range(procs)]
        with _forwarding_signals(shards) as signals:
            started = time.monotonic()
            first = shards[0]
            since = time.time()
            first.start(config_path, probe, verbose)
            if probe is not None:
                wait_for_probe(run_root, first.spec, since, first.ended)
                probe = dataclasses.replace(probe, force=False)  # shard 0 probed again
            if signals:  # stopped while shard 0 probed: the others never start
                shards = [first]
            for s in shards[1:]:
                s.start(config_path, probe, verbose)
            results = _watch(shards, run_root, started, progress_every_s)
    print_table(results, _pool_lines(run_root), cfg.output_dir)
    return exit_code_of(results)


def _pool_lines(run_root: Path) -> list[str]:
    """The shared budgets at the end (none without budgets), as `--ray` prints them."""
    try:
        return describe_pool(FilePool(run_root).read())
    except PoolError as e:
        return [str(e)]


def _watch(shards: list[ShardProcess], run_root: Path, started: float,
           progress_every_s: float) -> list[ShardResult]:
    last_progress = time.monotonic()
    waiting = list(shards)
    while waiting:
        time.sleep(POLL_S)
        for s in [s for s in waiting if s.ended()]:
            waiting.remove(s)
            print_ended(s.collect(), time.monotonic() - started)
        if waiting and time.monotonic() - last_progress >= progress_every_s:
            last_progress = time.monotonic()
            print_progress(run_root)
    return [s.result for s in shards if s.result is not None]


@contextlib.contextmanager
def _forwarding_signals(shards: list[ShardProcess]) -> Iterator[list[int]]:
    """Pass each signal this process gets on to every shard process running; yields the
    signals received so far."""
    received: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        for s in shards:
            if s.proc is not None and not s.ended():
                with contextlib.suppress(ProcessLookupError):
                    s.proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _die_with_parent() -> None:
    """In the child, before exec: the kernel kills it when the launcher dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# ---- one shard process -------------------------------------------------------------------------


def run_shard_process(config: Path, spec: ShardSpec, *, probe: ProbeOptions | None,
                      result_path: Path, verbose: bool, launcher: int) -> int:
    """One of the processes: shard `spec` of the run with its share of the concurrency; its
    result written to `result_path` for the launcher."""
    if os.getppid() != launcher:  # the launcher died before this process could watch it
        return 1
    try:
        result = run_shard(share_concurrency(load_config(config), spec), spec, probe,
                           verbose=verbose)
    except DraftgenError as e:
        result = ShardResult(str(spec), "failed", str(e))
        logging.getLogger("draftgen").error("%s", e)
    result_path.write_bytes(orjson.dumps(result.as_dict()))
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m draftgen.scale.local",
                                description="One shard process of `draftgen run --procs N`.")
    p.add_argument("config", type=Path)
    p.add_argument("shard", type=ShardSpec.parse)
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--no-probe", action="store_true")
    p.add_argument("--probe", action="store_true")
    p.add_argument("--probe-max-tokens", type=int)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--launcher", type=int, required=True, help="the launcher's pid")
    args = p.parse_args(argv)
    probe = None if args.no_probe else ProbeOptions(force=args.probe)
    if probe is not None and args.probe_max_tokens:
        probe = dataclasses.replace(probe, max_tokens=args.probe_max_tokens)
    return run_shard_process(args.config, args.shard, probe=probe, result_path=args.result,
                             verbose=args.verbose, launcher=args.launcher)


if __name__ == "__main__":
    sys.exit(main())
