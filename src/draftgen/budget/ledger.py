"""The reservation ledger: budgets that hold while thousands of requests are in flight.

Before a request is sent, its worst case is reserved: `max_tokens` output tokens against its
dataset's token budget, and (prompt tokens + `max_tokens`) priced by its backend against the
dollar budget. When the answer arrives, the reservation is replaced by the real usage. A
request is admitted only when its worst case fits in what is neither spent nor reserved, so:

- the token budget of a dataset is never exceeded (a request's `max_tokens` is cut to what is
  left of it);
- the dollar budget is never exceeded while backends bill no more than their reservations
  say. A backend's reservations use its price raised by what its answers have cost so far
  (`pricing.PriceWatch`), and until a backend that reports costs has answered once, its
  requests beyond the first are reserved at LEARNING_MARGIN times its price (`admit`'s
  `learning`): the server's bill passes the budget by at most what the requests in flight cost
  beyond their reservations when a backend's charges rise — see docs/budgets.md.

The spend rate (`usd_per_minute`) is a token bucket of dollars: capacity one minute's worth,
refilled continuously; a request takes its worst case from it and gets the difference back when
it settles. A request whose worst case alone exceeds the bucket is admitted when the bucket is
full (which then goes below zero: the average rate holds). A rate below one request's output
worst case is refused at start (`budget.spend_rate`).

In a sharded run each shard's ledger holds the shard's lease on the run's budgets instead of the
budgets themselves (`usd` and the token limits follow the lease; `budget.lease`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from draftgen.budget.pricing import LEARNING_MARGIN, PriceWatch


def learning_hold(worsts: list[float]) -> float:
    """What requests sent together to a backend whose charges are not known yet hold: the first
    its worst case, each other one LEARNING_MARGIN times its own, as `Ledger.admit` reserves
    them one by one (the probe sends its requests at once: `reserve` holds this sum)."""
    return worsts[0] + LEARNING_MARGIN * sum(worsts[1:]) if worsts else 0.0


@dataclass(slots=True, eq=False)
class Reservation:
    dataset: str
    tokens: int
    usd: float
    priced: bool
    backend: str = ""
    ratio: float = 1.0
    """The ratio of charge to price its worst case assumed (`reprice`)."""
    margin: float = 1.0
    """`usd` over the worst case: LEARNING_MARGIN while its backend had not answered."""

    @property
    def worst_usd(self) -> float:
        """What the request may cost at what its backend is known to charge: what a kill or
        an unreadable answer counts (`usd` may hold a margin above it)."""
        return self.usd / self.margin


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
    _in_flight: dict[str, set[Reservation]] = field(default_factory=dict)
    """Each backend's priced reservations in flight (`reprice`)."""

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

    def admit(self, dataset: str, max_tokens: int, prompt_tokens: int,
              price: PriceWatch | None, backend: str = "", learning: bool = False
              ) -> Admission:
        """Reserve a request's worst case, priced at what `backend` charges (`price`), or say
        why not. `learning`: the backend reports costs and none has arrived yet: with a dollar
        budget, its first request in flight is reserved at its price, each other one at
        LEARNING_MARGIN times it (they wait for the first answer where that does not fit)."""
        worst = price.worst(prompt_tokens, max_tokens) if price else 0.0
        margin = 1.0
        if worst > 0:
            if learning and self._in_flight.get(backend) and self.usd is not None:
                margin = LEARNING_MARGIN
                worst *= margin
            if self.usd is not None and self.spent_usd + self.reserved_usd + worst > self.usd:
                return Admission(exhausted=True, settling=self.priced_in_flight > 0,
                                 worst_usd=worst)
            wait = self._take_from_bucket(worst)
            if wait > 0:
                self.throttled = True
                return Admission(wait_s=wait)
        self.throttled = False
        reservation = Reservation(dataset, max_tokens, worst, price is not None, backend,
                                  price.ratio if price else 1.0, margin)
        budget = self.datasets[dataset]
        budget.reserved_tokens += max_tokens
        budget.in_flight += 1
        self.reserved_usd += worst
        self.priced_in_flight += worst > 0
        if worst > 0:
            self._in_flight.setdefault(backend, set()).add(reservation)
        return Admission(reservation=reservation, worst_usd=worst)

    @property
    def budgeted(self) -> bool:
        return self.usd is not None or bool(self.usd_per_minute)

    def reserve(self, usd: float) -> bool:
        """Hold `usd` outside any request (the probe's worst case), if the budget can: False,
        nothing held, when it cannot. `release` gives it back."""
        if self.usd is not None and self.committed_usd() + usd > self.usd:
            return False
        self.reserved_usd += usd
        return True

    def release(self, usd: float) -> None:
        self.reserved_usd = max(0.0, self.reserved_usd - usd)

    def reprice(self, backend: str, ratio: float) -> None:
        """The backend charges `ratio` times its price: the worst case of each of its requests
        in flight rises to it, and so does its reservation where its margin does not cover it,
        so nothing more is admitted on the old figure."""
        for r in self._in_flight.get(backend, ()):
            if r.ratio >= ratio:
                continue
            worst = r.worst_usd * ratio / r.ratio
            usd = max(r.usd, worst)
            self.reserved_usd += usd - r.usd
            r.usd, r.ratio, r.margin = usd, ratio, usd / worst

    def hold_unknown(self, backend: str) -> None:
        """What the backend charges is not known again (a report that was no cost): each of
        its requests in flight is held at LEARNING_MARGIN times its worst case, as before its
        first answer, so nothing more is admitted on the old figure."""
        for r in self._in_flight.get(backend, ()):
            if r.margin < LEARNING_MARGIN:
                usd = r.worst_usd * LEARNING_MARGIN
                self.reserved_usd += usd - r.usd
                r.usd, r.margin = usd, LEARNING_MARGIN

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
            self._in_flight.get(reservation.backend, set()).discard(reservation)
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
