"""`Budget`: what a run's dispatcher asks of its budgets, the same way sharded or not.

An unsharded run's budgets are its `Ledger` alone; a shard's are its ledger and its lease on the
run's shared pool (`SharedBudget`), which tops the ledger's limits up from the pool and gives
back what the shard did not spend."""

from __future__ import annotations

import logging

from draftgen.budget.lease import ShardLease
from draftgen.budget.ledger import Admission, Ledger
from draftgen.budget.pool import USD, BudgetPool, run_totals, spend_of, tokens_key
from draftgen.config import RunConfig
from draftgen.store.scan import StoredElsewhere
from draftgen.store.shards import ShardSpec

log = logging.getLogger("draftgen")


class Budget:
    """An unsharded run's budgets: the ledger holds the whole run's."""

    def __init__(self, cfg: RunConfig, ledger: Ledger) -> None:
        self.cfg = cfg
        self.ledger = ledger

    def count_spend_elsewhere(self, elsewhere: list[StoredElsewhere]) -> None:
        """A run folder that also holds shard folders (a run sharded before): what they spent
        counts against the run's budgets, which are the whole run's."""
        totals = run_totals(self.cfg)
        if not totals:
            return
        for stored in elsewhere:
            spent = spend_of(stored, totals)
            self.ledger.add_spent(spent.get(USD, 0.0))
            for name, budget in self.ledger.datasets.items():
                budget.spent_tokens += int(spent.get(tokens_key(name), 0))
            if any(spent.values()):
                log.info("%s: its spend counts against this run's budgets (%s)", stored.folder,
                         ", ".join(f"{k} {v:,.4f}" if k == USD else f"{k} {v:,.0f}"
                                   for k, v in spent.items() if v))

    async def start(self, elsewhere: list[StoredElsewhere]) -> None:
        """Once the resume scan has counted what is spent, before the first request."""

    async def end(self) -> None:
        """When the session ends, whatever its outcome."""

    async def max_tokens_for(self, dataset: str, max_tokens: int) -> int | None:
        """`Ledger.max_tokens_for`."""
        return self.ledger.max_tokens_for(dataset, max_tokens)

    async def more_usd(self, admission: Admission) -> bool:
        """A request the dollar budget could not admit: True to admit it again at once."""
        return False

    def others_may_give(self, resource: str) -> bool:
        """Another part of the run may still give some of `resource` back: wait, not stop."""
        return False

    def whose_spend(self) -> str:
        """Whose spend reached budget.usd, for the stop message."""
        return "spent"


class SharedBudget(Budget):
    """A shard's budgets: its ledger holds its lease on the run's pool."""

    def __init__(self, cfg: RunConfig, ledger: Ledger, lease: ShardLease) -> None:
        super().__init__(cfg, ledger)
        self.lease = lease

    def count_spend_elsewhere(self, elsewhere: list[StoredElsewhere]) -> None:
        """The shards count each other's spend through their pool (`start`)."""

    async def start(self, elsewhere: list[StoredElsewhere]) -> None:
        await self.lease.adopt(elsewhere)

    async def end(self) -> None:
        await self.lease.release()

    async def max_tokens_for(self, dataset: str, max_tokens: int) -> int | None:
        """The lease is topped up first where it would cut the request short."""
        if self.ledger.max_tokens_for(dataset, max_tokens) != max_tokens:
            await self.lease.more_tokens(dataset, max_tokens)
        return self.ledger.max_tokens_for(dataset, max_tokens)

    async def more_usd(self, admission: Admission) -> bool:
        """A shard short of dollars asks its pool for more. True when the lease grew, or when
        requests settled while the pool answered (their unpause came too early)."""
        if not admission.exhausted:
            return False
        in_flight = self.ledger.priced_in_flight
        granted = await self.lease.more_usd(admission.worst_usd, admission.settling)
        return granted or self.ledger.priced_in_flight < in_flight

    def others_may_give(self, resource: str) -> bool:
        return self.lease.others_busy(resource)

    def whose_spend(self) -> str:
        return "by this shard; the rest is the other shards'"


def budget_for(cfg: RunConfig, shard: ShardSpec | None, pool: BudgetPool | None = None
               ) -> Budget:
    """The run's budgets: shared through `pool` (by default the run folder's file pool) for a
    shard of a run with budgets, the ledger alone otherwise."""
    ledger = Ledger(usd=cfg.budget.usd, usd_per_minute=cfg.budget.usd_per_minute)
    lease = ShardLease.for_run(cfg, shard, ledger, pool)
    return Budget(cfg, ledger) if lease is None else SharedBudget(cfg, ledger, lease)
