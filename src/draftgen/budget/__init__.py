"""A run's budgets: what a request counts for (`pricing`), the reservation ledger (`ledger`),
the pool the shards of a run share (`pool`, its file in `store.pool_file`), a shard's lease on
it (`lease`), and `Budget`, what the dispatcher asks of them the same way sharded or not
(`run_budget`), and what the probe's requests hold of it (`probe_hold`)."""

from draftgen.budget.lease import ShardLease
from draftgen.budget.ledger import Admission, DatasetBudget, Ledger, Reservation, learning_hold
from draftgen.budget.pool import (
    POLL_S,
    STALE_S,
    USD,
    BudgetPool,
    FilePool,
    PoolError,
    PoolOp,
    PoolState,
    describe_pool,
    run_totals,
    spend_of,
    tokens_key,
)
from draftgen.budget.pricing import (
    IMPLAUSIBLE_RATIO,
    LEARNING_MARGIN,
    PRICED,
    REPORT_IMPLAUSIBLE,
    REPORT_REFUSED,
    REPORTED,
    PriceWatch,
    counted_cost,
    is_cost,
    lookup_cost,
    too_small,
)
from draftgen.budget.probe_hold import PROBE_MIN_TOKENS, ProbeCharge, ProbeHold
from draftgen.budget.run_budget import Budget, SharedBudget, budget_for
from draftgen.budget.spend_rate import (
    SpendRateError,
    least_output_tokens,
    refuse_impossible_rate,
    refuse_unaffordable_answer,
)

__all__ = [
    "IMPLAUSIBLE_RATIO",
    "LEARNING_MARGIN",
    "POLL_S",
    "PRICED",
    "PROBE_MIN_TOKENS",
    "REPORTED",
    "REPORT_IMPLAUSIBLE",
    "REPORT_REFUSED",
    "STALE_S",
    "USD",
    "Admission",
    "Budget",
    "BudgetPool",
    "DatasetBudget",
    "FilePool",
    "Ledger",
    "PoolError",
    "PoolOp",
    "PoolState",
    "PriceWatch",
    "ProbeCharge",
    "ProbeHold",
    "Reservation",
    "ShardLease",
    "SharedBudget",
    "SpendRateError",
    "budget_for",
    "counted_cost",
    "describe_pool",
    "is_cost",
    "learning_hold",
    "least_output_tokens",
    "lookup_cost",
    "refuse_impossible_rate",
    "refuse_unaffordable_answer",
    "run_totals",
    "spend_of",
    "tokens_key",
    "too_small",
]
