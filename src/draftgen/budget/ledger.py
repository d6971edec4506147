"""The reservation ledger: budgets that hold while thousands of requests are in flight.

Before a request is sent, its worst case is reserved: `max_tokens` output tokens against its
dataset's token budget, and (prompt tokens + `max_tokens`) priced by its backend against the
dollar budget. When the answer arrives, the reservation is replaced by the real usage. A
request is admitted only when its worst case fits in what is neither spent nor reserved, so:

- the token budget of a dataset is never exceeded (a request's `max_tokens` is cut to what is
  left of it);
- the dollar budget is never exceeded while backends bill no more than their price says; when
  a backend bills more (a reported `usage.cost` above the priced worst case), the overshoot is
  at most the sum of those excesses over the requests in flight — see docs/budgets.md.

The spend rate (`usd_per_minute`) is a token bucket of dollars: capacity one minute's worth,
refilled continuously; a request takes its worst case from it and gets the difference back when
it settles. A request whose worst case alone exceeds the bucket is admitted when the bucket is
full (which then goes below zero: the average rate holds). A rate below one request's output
worst case is refused at start (`budget.spend_rate`).

In a sharded run each shard's ledger holds the shard's lease on the run's budgets instead of the
budgets themselves (`usd` and the token limits follow the lease; `budget.lease`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from draftgen.config import Price

REPORTED_COST_RATIO = 10.0
"""A reported cost is believed only within this factor of the priced cost, either way."""
PRICED, REPORTED, REPORT_REFUSED = "priced", "reported", "priced_report_refused"
"""Where an answer's `cost_usd` comes from (its record's `cost_source`)."""


def believable(usd: float, low: float, high: float) -> bool:
    """A finite number of dollars within [low, high] (NaN, inf and negatives never are)."""
    return math.isfinite(usd) and 0 <= low <= usd <= high


def answer_cost(reported: float | None, priced: float | None) -> tuple[float, str]:
    """What an answer (or a billed failure) counts for, and where that figure comes from: the
    endpoint's reported cost when it is believable against the priced one (within
    REPORTED_COST_RATIO either way; any finite cost >= 0 when no price is known), else the
    priced cost. OpenRouter reports 0 for bring-your-own-key requests, a server may report a
    negative, NaN or absurd cost: none of those is taken, and a negative one is no credit."""
    if reported is None:
        return priced or 0.0, PRICED
    low, high = (priced / REPORTED_COST_RATIO, priced * REPORTED_COST_RATIO
                 ) if priced is not None else (0.0, math.inf)
    if believable(reported, low, high):
        return reported, REPORTED
    return priced or 0.0, REPORT_REFUSED


@dataclass(slots=True)
class Reservation:
    dataset: str
    tokens: int
    usd: float
    priced: bool


@dataclass
class DatasetBudget:
    max_output_tokens: int | None
    spent_tokens: int = 0
    reserved_tokens: int = 0
    in_flight: int = 0

    def tokens_left(self) -> int | None:
        if self.max_output_tokens is None:
            return None
        return self.max_output_tokens - self.spent_tokens - self.reserved_tokens


@dataclass
class Admission:
    reservation: Reservation | None = None
    wait_s: float = 0.0
    """> 0: the spend rate is over its limit; try this backend again after that long."""
    exhausted: bool = False
    """The dollar budget cannot take this request now; `settling` says whether requests in
    flight may still free enough of it."""
    settling: bool = False
    worst_usd: float = 0.0
    """The priced worst case of the request (also when it was not admitted)."""


@dataclass
class Ledger:
    usd: float | None = None
    usd_per_minute: float | None = None
    datasets: dict[str, DatasetBudget] = field(default_factory=dict)
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    priced_in_flight: int = 0
    min_request_tokens: int = 64
    _bucket: float = 0.0
    _bucket_at: float = field(default_factory=time.monotonic)
    throttled: bool = False

    def __post_init__(self) -> None:
        self._bucket = self.usd_per_minute or 0.0

    # ---- tokens (per dataset) -----------------------------------------------------------

    def add_dataset(self, name: str, max_output_tokens: int | None, spent_tokens: int) -> None:
        self.datasets[name] = DatasetBudget(max_output_tokens, spent_tokens=spent_tokens)

    def max_tokens_for(self, dataset: str, max_tokens: int) -> int | None:
        """The `max_tokens` a new request of this dataset may have, or None when what is left
        of its token budget is below a useful answer (`min_request_tokens`)."""
        left = self.datasets[dataset].tokens_left()
        if left is None:
            return max_tokens
        allowed = min(max_tokens, left)
        return allowed if allowed >= min(max_tokens, self.min_request_tokens) else None

    def committed_tokens(self, dataset: str) -> int:
        """Output tokens of this dataset spent or reserved."""
        budget = self.datasets[dataset]
        return budget.spent_tokens + budget.reserved_tokens

    def set_token_limit(self, dataset: str, max_output_tokens: int) -> None:
        """A new token budget for the dataset (a shard's lease grew or shrank)."""
        self.datasets[dataset].max_output_tokens = max_output_tokens

    def token_budget_done(self, dataset: str) -> bool:
        """No request can be admitted for this dataset, now or later."""
        budget = self.datasets[dataset]
        return budget.in_flight == 0 and self.max_tokens_for(dataset, 1 << 30) is None

    # ---- dollars (per run) --------------------------------------------------------------

    def committed_usd(self) -> float:
        """Dollars spent or reserved."""
        return self.spent_usd + self.reserved_usd

    def admit(self, dataset: str, max_tokens: int, prompt_tokens: int, price: Price | None
              ) -> Admission:
        worst = price.cost(prompt_tokens, max_tokens) if price else 0.0
        if worst > 0:
            if self.usd is not None and self.spent_usd + self.reserved_usd + worst > self.usd:
                return Admission(exhausted=True, settling=self.priced_in_flight > 0,
                                 worst_usd=worst)
            wait = self._take_from_bucket(worst)
            if wait > 0:
                self.throttled = True
                return Admission(wait_s=wait)
        self.throttled = False
        reservation = Reservation(dataset, max_tokens, worst, price is not None)
        budget = self.datasets[dataset]
        budget.reserved_tokens += max_tokens
        budget.in_flight += 1
        self.reserved_usd += worst
        self.priced_in_flight += worst > 0
        return Admission(reservation=reservation, worst_usd=worst)

    def set_rate(self, usd_per_minute: float | None) -> None:
        """A new spend rate (a shard's part of the run's), starting with a full bucket."""
        self.usd_per_minute = usd_per_minute
        self._bucket = usd_per_minute or 0.0

    def _take_from_bucket(self, amount: float) -> float:
        if not self.usd_per_minute:
            return 0.0
        now = time.monotonic()
        capacity = self.usd_per_minute
        self._bucket = min(capacity, self._bucket + (now - self._bucket_at) * capacity / 60)
        self._bucket_at = now
        need = min(amount, capacity)
        if self._bucket >= need:
            self._bucket -= amount  # may go below zero for one oversized request
            return 0.0
        return (need - self._bucket) * 60 / capacity

    def settle(self, reservation: Reservation, output_tokens: int, cost: float) -> None:
        """Replace the reservation by what the request really used (also for failures that
        were billed: pass their usage; for unbilled failures pass zeros)."""
        budget = self.datasets[reservation.dataset]
        budget.reserved_tokens -= reservation.tokens
        budget.spent_tokens += output_tokens
        budget.in_flight -= 1
        if reservation.usd > 0:
            self.priced_in_flight -= 1
        # Sums of floats drift: with nothing in flight, nothing is reserved.
        self.reserved_usd = max(0.0, self.reserved_usd - reservation.usd
                                ) if self.priced_in_flight else 0.0
        self.spent_usd += cost
        if self.usd_per_minute:
            self._bucket = min(self.usd_per_minute, self._bucket + reservation.usd - cost)

    def charge(self, cost: float) -> bool:
        """Spend of a request in flight other than its answer (a failed attempt that was
        billed), counted at once. True while the budget still holds the request's reservation,
        that is, while another attempt may be sent."""
        self.spent_usd += cost
        if self.usd_per_minute:
            self._bucket -= cost
        return self.usd is None or self.spent_usd + self.reserved_usd <= self.usd

    def correct(self, counted: float, billed: float) -> None:
        """Spend counted at a worst case whose bill became known later."""
        self.spent_usd += billed - counted

    def add_spent(self, cost: float) -> None:
        """Spend that was never reserved (earlier sessions)."""
        self.spent_usd += cost
