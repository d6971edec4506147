"""One shard's lease on the run's budget pool (`budget.pool`): the shard's `Ledger` limits kept
equal to what it holds in the pool, more taken when the ledger runs short, the unspent part given
back when the shard ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from draftgen.budget.ledger import Ledger
from draftgen.budget.pool import (
    HEARTBEAT_S,
    NEED_MARGIN,
    POLL_S,
    USD,
    BudgetPool,
    FilePool,
    Take,
    dataset_of,
    pool_name,
    run_totals,
    spend_of,
    tokens_key,
)
from draftgen.config import RunConfig
from draftgen.store.scan import StoredElsewhere
from draftgen.store.shards import ShardSpec

log = logging.getLogger("draftgen")


class ShardLease:
    """One shard's lease: keeps the shard's `Ledger` limits equal to what it holds in the
    pool, and takes more when the ledger runs short."""

    def __init__(self, pool: BudgetPool, shard: ShardSpec, ledger: Ledger,
                 totals: dict[str, float], concurrency: int) -> None:
        self.pool = pool
        self.shard = shard
        self.ledger = ledger
        self.totals = totals
        self.concurrency = concurrency
        self._others_busy: dict[str, bool] = {}
        self._ask_after: dict[str, float] = {}
        self._beat: asyncio.Task[None] | None = None
        self.adopted = False

    @classmethod
    def for_run(cls, cfg: RunConfig, shard: ShardSpec | None, ledger: Ledger,
                pool: BudgetPool | None = None) -> ShardLease | None:
        """The lease of a sharded run with a shared budget (the file pool in the run folder
        unless another is given); None for an unsharded run or one without budgets. A
        shard's spend rate is `budget.usd_per_minute / N`."""
        if shard is None:
            return None
        if ledger.usd_per_minute:
            ledger.set_rate(ledger.usd_per_minute / shard.count)
        totals = run_totals(cfg)
        if not totals:
            return None
        concurrency = sum(b.concurrency for b in cfg.backends)
        return cls(pool or FilePool(Path(cfg.output_dir)), shard, ledger, totals, concurrency)

    @property
    def name(self) -> str:
        return self.shard.folder_name

    # ---- start and end ------------------------------------------------------------------

    async def adopt(self, others: list[StoredElsewhere]) -> None:
        """Take (or re-take) this shard's lease, from the spend the ledger found on disk; the
        spend stored in the run's other folders is reported too."""
        elsewhere = {pool_name(s.folder): spend_of(s, self.totals) for s in others}
        held = await self.pool.adopt(self.name, self.totals, self._committed(), elsewhere)
        self._apply(held)
        self.adopted = True
        self._beat = asyncio.create_task(self._heartbeats())

    async def release(self) -> None:
        """Give back what was not spent. A failure is logged: the slice stays held until this
        shard runs again."""
        if not self.adopted:
            return
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        try:
            await self.pool.release(self.name, self._committed())
        except Exception as e:  # the pool gone or unwritable: the run's outcome still counts
            log.error("shard %s: could not give back its unspent budget (%s); it stays held "
                      "until this shard runs again", self.shard, e)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.pool.heartbeat(self.name)
            except Exception as e:
                log.warning("shard %s: budget pool heartbeat failed: %s", self.shard, e)

    # ---- taking more ---------------------------------------------------------------------

    async def more_usd(self, worst: float, settling: bool) -> bool:
        """Ask for enough to admit a request of this worst case; True when granted."""
        if USD not in self.totals:
            return False
        need = worst * (1 + NEED_MARGIN)
        take = await self._take(USD, self.ledger.committed_usd(), need,
                                self.concurrency * worst, settling)
        if take is not None:
            self.ledger.usd = take.held
        return take is not None and take.granted

    async def more_tokens(self, dataset: str, max_tokens: int) -> None:
        """Top the dataset's token lease up towards a full request and the concurrency's worth
        of them (a lease that cannot fit `max_tokens` would cut answers short). At most once
        per `POLL_S` while the pool cannot give a full request, except just before the
        dataset would be closed for budget: that decision is taken on the pool's latest word."""
        key = tokens_key(dataset)
        if key not in self.totals:
            return
        closing = self.ledger.token_budget_done(dataset) and not self.others_busy(key)
        if time.monotonic() < self._ask_after.get(key, 0.0) and not closing:
            return
        budget = self.ledger.datasets[dataset]
        useful = min(max_tokens, self.ledger.min_request_tokens)
        take = await self._take(key, self.ledger.committed_tokens(dataset), useful,
                                self.concurrency * max_tokens, budget.in_flight > 0)
        if take is not None:
            self.ledger.set_token_limit(dataset, int(take.held))
        if (budget.tokens_left() or 0) < max_tokens:
            self._ask_after[key] = time.monotonic() + POLL_S

    def others_busy(self, resource: str) -> bool:
        """At the pool's last answer, another live shard might still give budget back."""
        return self._others_busy.get(resource, False)

    async def _take(self, resource: str, committed: float, need: float, want: float,
                    settling: bool) -> Take | None:
        try:
            take = await self.pool.take(self.name, resource, committed=committed, need=need,
                                        want=max(need, want), settling=settling)
        except Exception as e:  # spend nothing beyond the lease without the pool's word
            log.error("shard %s: budget pool unavailable (%s): no more %s for this shard",
                      self.shard, e, resource)
            self._others_busy[resource] = False
            return None
        self._others_busy[resource] = take.others_busy
        return take

    # ---- the ledger ------------------------------------------------------------------------

    def _committed(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for resource in self.totals:
            if resource == USD:
                out[resource] = self.ledger.committed_usd()
            else:
                out[resource] = self.ledger.committed_tokens(dataset_of(resource))
        return out

    def _apply(self, held: dict[str, float]) -> None:
        for resource, amount in held.items():
            if resource == USD:
                self.ledger.usd = amount
            else:
                self.ledger.set_token_limit(dataset_of(resource), int(amount))
