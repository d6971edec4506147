"""One budget for all the shards of a run: each shard holds a lease on a shared pool.

The pool holds the run's totals (`budget.usd`; `max_output_tokens` of each dataset) and, per
shard, what the shard holds of each: its spend so far plus a slice it may still spend. A
shard's local `Ledger` enforces what it holds exactly as an unsharded run enforces the whole
budget (reserve the worst case, settle on arrival), so the shards together never commit more
than the run's totals: `Σ held ≤ total`, and each shard's `spent + reserved ≤ held`.

- **Taking more.** When an admission fails for want of lease, the shard asks the pool for a
  slice: at least what the request needs, as much as its backends' concurrency's worth of
  worst-case requests, never more than a fair share (what is left over the live shards) unless
  the need is bigger. A request that does not fit in what is left is denied; the shard then
  gives back the unspent part of its lease (it cannot use it) so that others can combine it.
- **Waiting rather than stopping.** A denied shard with nothing in flight is *waiting*. It
  stops for budget only when no other live shard may still give budget back (every other live
  lease is waiting, finished or dead); otherwise it asks again every `POLL_S`. So the run ends
  with less than one worst-case request of budget unspent (the last denial), however unevenly
  the shards finish: see docs/scaling.md for the bound.
- **Giving back.** A shard that finishes, stops or is stopped by the budget gives back what it
  did not spend.
- **Dead shards.** Each shard beats every `HEARTBEAT_S`; a lease not heard of for `STALE_S`
  counts as dead: nobody waits for it, and what it held beyond its stored spend (its last
  slice, and the worst case of the requests it had in flight) stays held until that shard runs
  again. A restarted shard re-adopts its lease (keyed by its folder name) and reconciles it
  with the spend it finds on disk, which gives the rest back. So a shard killed and never
  restarted strands at most one slice; running it again (even with nothing left to answer)
  reclaims it.

Two pools implement `BudgetPool`: `FilePool`, a JSON file in the run folder under an fcntl lock
(shards on one machine, or on a shared filesystem whose locks work), used by `--shard` runs;
and a Ray actor for `--ray` (draftgen.scale.ray_run). Both apply the same `PoolState` methods.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pydantic

from draftgen.config import RunConfig
from draftgen.store.pool_file import PoolError, PoolFile
from draftgen.store.scan import StoredElsewhere
from draftgen.store.shards import shard_of_folder

log = logging.getLogger("draftgen")

T = TypeVar("T")

USD = "usd"
HEARTBEAT_S = 5.0
STALE_S = 30.0
"""A lease not heard of for this long is dead: nobody waits for it to give budget back."""
POLL_S = 0.5
"""How often a waiting shard asks the pool again."""
NEED_MARGIN = 1e-9
"""Relative margin on what a request needs, so that float rounding between the pool's sums and
the ledger's cannot deny a request that the grant was meant to cover."""


TOKENS_PREFIX = "tokens:"


def tokens_key(dataset: str) -> str:
    """The pool's name for a dataset's output-token budget."""
    return f"{TOKENS_PREFIX}{dataset}"


def dataset_of(key: str) -> str:
    """The dataset of a `tokens_key`."""
    return key.removeprefix(TOKENS_PREFIX)


@dataclass(frozen=True, slots=True)
class Take:
    held: float
    """What the shard now holds of the resource (its spend included)."""
    granted: bool
    """The shard may commit `need` more."""
    others_busy: bool
    """Another live shard may still give some back: wait and ask again instead of stopping."""


class LeaseRecord(pydantic.BaseModel):
    held: dict[str, float] = {}
    waiting: set[str] = set()
    """Resources this shard was denied while it had nothing of them in flight."""
    seen_at: float = 0.0
    done: bool = False
    takes: int = 0
    """How often this shard asked for more (all sessions): a sign of slices too small."""

    def live(self, now: float) -> bool:
        return not self.done and now - self.seen_at <= STALE_S


class PoolState(pydantic.BaseModel):
    """The pool's whole state; every method is one atomic step (under the file lock, or in
    the actor)."""

    totals: dict[str, float] = {}
    leases: dict[str, LeaseRecord] = {}

    def adopt(self, shard: str, totals: dict[str, float], spent: dict[str, float],
              elsewhere: dict[str, dict[str, float]] | None = None, *, now: float
              ) -> dict[str, float]:
        """A shard starts (or restarts): it holds what it has spent; a slice left from an
        earlier, killed session goes back to the pool. The totals are the config's (a run
        restarted with a new budget takes it). `elsewhere`: what the run's other folders
        (other shards, the unsharded root) hold on disk, so that spend from before this pool
        existed, or that it never saw, counts too."""
        self.totals = dict(totals)
        for name, on_disk in (elsewhere or {}).items():
            known = self.leases.setdefault(name, LeaseRecord(done=True, seen_at=now))
            for r in totals:
                known.held[r] = max(known.held.get(r, 0.0), on_disk.get(r, 0.0))
        earlier = self.leases.get(shard)
        lease = LeaseRecord(held={r: spent.get(r, 0.0) for r in totals}, seen_at=now,
                            takes=earlier.takes if earlier else 0)
        self.leases[shard] = lease
        return dict(lease.held)

    def take(self, shard: str, resource: str, committed: float, need: float, want: float,
             settling: bool, *, now: float) -> Take:
        lease = self._lease(shard, resource)
        lease.seen_at, lease.done = now, False
        lease.takes += 1
        others = sum(other.held.get(resource, 0.0) for name, other in self.leases.items()
                     if name != shard)
        available = self.totals[resource] - others - committed
        if available < need:
            lease.held[resource] = committed  # the unspent part is of no use to this shard
            if settling:
                lease.waiting.discard(resource)
            else:
                lease.waiting.add(resource)
            return Take(committed, False, self._others_busy(shard, resource, now))
        live = sum(other.live(now) for other in self.leases.values())
        idle = max(0.0, lease.held.get(resource, 0.0) - committed)  # never taken away here
        grant = max(idle, min(available, max(need, min(want, available / max(1, live)))))
        if resource != USD:
            grant = math.floor(grant)  # whole tokens (`need` is whole: still >= need)
        lease.held[resource] = committed + grant
        lease.waiting.discard(resource)
        return Take(lease.held[resource], True, self._others_busy(shard, resource, now))

    def heartbeat(self, shard: str, *, now: float) -> None:
        if shard in self.leases:
            self.leases[shard].seen_at = now

    def release(self, shard: str, committed: dict[str, float], *, now: float) -> None:
        """The shard ends: it holds what it spent (or still counts as spent), no more."""
        lease = self.leases.get(shard)
        if lease is None:
            return
        lease.held.update({r: committed.get(r, 0.0) for r in self.totals})
        lease.waiting.clear()
        lease.done, lease.seen_at = True, now

    def free(self, resource: str) -> float:
        return self.totals[resource] - sum(x.held.get(resource, 0.0)
                                           for x in self.leases.values())

    def snapshot(self, *, now: float) -> PoolState:
        return self.model_copy(deep=True)

    def _lease(self, shard: str, resource: str) -> LeaseRecord:
        if resource not in self.totals:
            raise PoolError(f"budget pool: no shared budget {resource!r}")
        if shard not in self.leases:
            raise PoolError(f"budget pool: shard {shard} holds no lease (it never started)")
        return self.leases[shard]

    def _others_busy(self, shard: str, resource: str, now: float) -> bool:
        return any(lease.live(now) and resource not in lease.waiting
                   for name, lease in self.leases.items() if name != shard)


PoolOp = Callable[..., T]


class BudgetPool(ABC):
    """Where the shards of a run take and give back budget. Implementations only say how a
    `PoolState` method is applied atomically."""

    @abstractmethod
    async def apply(self, op: PoolOp[T]) -> T:
        """Run `op(state, now=...)` on the pool's state as one atomic step."""

    async def adopt(self, shard: str, totals: dict[str, float], spent: dict[str, float],
                    elsewhere: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
        return await self.apply(functools.partial(PoolState.adopt, shard=shard, totals=totals,
                                                  spent=spent, elsewhere=elsewhere))

    async def take(self, shard: str, resource: str, *, committed: float, need: float,
                   want: float, settling: bool) -> Take:
        return await self.apply(functools.partial(
            PoolState.take, shard=shard, resource=resource, committed=committed, need=need,
            want=want, settling=settling))

    async def heartbeat(self, shard: str) -> None:
        await self.apply(functools.partial(PoolState.heartbeat, shard=shard))

    async def release(self, shard: str, committed: dict[str, float]) -> None:
        await self.apply(functools.partial(PoolState.release, shard=shard,
                                           committed=committed))

    async def snapshot(self) -> PoolState:
        return await self.apply(PoolState.snapshot)


class FilePool(BudgetPool):
    """`<output_dir>/budget_pool.json` (`store.pool_file`), read and atomically rewritten under
    its fcntl lock: for shard processes on one machine, or on a shared filesystem whose locks
    work (NFSv4, Lustre with flock; not every FUSE filesystem)."""

    def __init__(self, run_root: Path) -> None:
        self.file = PoolFile(run_root)
        self.path = self.file.path

    async def apply(self, op: PoolOp[T]) -> T:
        return await asyncio.to_thread(self.apply_now, op)

    def apply_now(self, op: PoolOp[T]) -> T:
        with self.file.locked():
            state = self.read()
            result = op(state, now=time.time())
            self.file.write(state.model_dump_json(indent=1).encode())
        return result

    def read(self) -> PoolState:
        data = self.file.read()
        if data is None:
            return PoolState()
        try:
            return PoolState.model_validate_json(data)
        except pydantic.ValidationError as e:
            raise PoolError(f"{self.path}: not a budget pool ({e.error_count()} errors, first: "
                            f"{_first_error(e)}); remove it only when no shard is running"
                            ) from None


def _first_error(e: pydantic.ValidationError) -> str:
    first = e.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or "(top)"
    return f"{where}: {first['msg']}"


# ---- the run's totals and the spend of its folders -----------------------------------------


def run_totals(cfg: RunConfig) -> dict[str, float]:
    """The budgets a sharded run shares: dollars, and output tokens of each dataset that has
    a limit."""
    totals: dict[str, float] = {}
    if cfg.budget.usd is not None:
        totals[USD] = cfg.budget.usd
    for ds in cfg.datasets:
        if ds.max_output_tokens is not None:
            totals[tokens_key(ds.name)] = ds.max_output_tokens
    return totals




def spend_of(stored: StoredElsewhere, totals: dict[str, float]) -> dict[str, float]:
    """What another folder of the run spent, by its stored answers, of each shared budget."""
    spent = dict.fromkeys(totals, 0.0)
    if USD in spent:
        spent[USD] = sum(stored.cost.values())
    for dataset, tokens in stored.output_tokens.items():
        if tokens_key(dataset) in spent:
            spent[tokens_key(dataset)] = float(tokens)
    return spent


def pool_name(folder: Path) -> str:
    """A run folder's name in the pool: its shard folder name, or "root"."""
    return folder.name if shard_of_folder(folder) else "root"


def describe_pool(state: PoolState) -> list[str]:
    """One line per shared budget: held by the shards (spent, or granted and unspent) and
    free; for the end-of-run summary."""
    lines = []
    for resource, total in state.totals.items():
        free = state.free(resource)
        if resource == USD:
            lines.append(f"budget.usd: ${total - free:.4f} of ${total:.4f} held by shards, "
                         f"${free:.4f} free")
        else:
            lines.append(f"{resource}: {total - free:,.0f} of {total:,.0f} held by shards, "
                         f"{free:,.0f} free")
    return lines
