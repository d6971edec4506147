"""What the launchers of many shards (`--procs`, `--ray`) share: running one shard where they put
it, starting the others once shard 0 has passed the probe gate, and what they print (each
shard's outcome, the whole run's progress line, the final table)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from draftgen import perf
from draftgen.budget import BudgetPool
from draftgen.config import RunConfig
from draftgen.probe.options import ProbeOptions
from draftgen.redact import RedactingFilter
from draftgen.run import Outcome, Runner, prepare
from draftgen.status import StatusError, collect_status, summary_line
from draftgen.store.runjson_writer import read_probe
from draftgen.store.shards import ShardSpec

POLL_S = 0.2
"""How often a launcher looks at its shards."""

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardResult:
        return cls(**data)


def run_shard(cfg: RunConfig, spec: ShardSpec, probe: ProbeOptions | None,
              pool: BudgetPool | None = None, verbose: bool = False) -> ShardResult:
    """Shard `spec` of the run, in the process a launcher started for it (or a Ray worker):
    an ordinary sharded run, its log lines prefixed with the shard."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, force=True,
                        format=f"%(asctime)s shard {spec} %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    plan = prepare(cfg, shard=spec)
    outcome = perf.run(Runner(plan, live_display=False, probe=probe, pool=pool).execute())
    return ShardResult.of(spec, outcome)


def print_ended(result: ShardResult, elapsed_s: float) -> None:
    console.print(f"shard {result.shard}: {result.status} after {elapsed_s:.0f}s "
                  f"({result.answered:,}/{result.total:,} answered)")


def print_progress(run_root: Path) -> None:
    """The run's status in one line, read from the shard folders as `draftgen status` does."""
    try:
        line = summary_line(collect_status(run_root))
    except (OSError, StatusError) as e:  # a folder being created right now: next time
        line = f"(status not readable yet: {e})"
    console.print(f"{time.strftime('%H:%M:%S')} {line}")


def print_table(results: list[ShardResult], pool_lines: list[str], output_dir: str) -> None:
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


def exit_code_of(results: list[ShardResult]) -> int:
    """0 when every shard ended as `draftgen run` exits 0, else the first other exit code."""
    return next((r.exit_code for r in results if r.exit_code != 0), 0)


def wait_for_probe(run_root: Path, first: ShardSpec, since: float, ended: Callable[[], bool]
                   ) -> None:
    """Until shard `first` has recorded its probe gate after `since` (new results or reused
    ones), or `ended()`: the other shards then reuse its stored results (`probe.gate`), so the
    run is probed once, not once per shard."""
    run_json = first.folder(run_root) / "run.json"
    while not ended():
        updated = read_probe(run_json).updated_at
        if updated is not None and updated >= since:
            return
        time.sleep(POLL_S)
