"""What a request counts for in dollars, and the price its reservations use.

The bill is the truth: a request never counts for less than the provider reported it cost.

- A finite reported cost >= 0 above the priced cost (usage times the backend's price) is
  believed; one below it, or none, counts the price (a report of 0 is no discount: OpenRouter
  reports 0 for bring-your-own-key requests, which the key's owner pays elsewhere). A numeric
  string ("0.0031") is a number (`backends.base.wire_cost` reads it).
- A report that is no cost at all (NaN, infinite, negative, a word, a list) says that
  draftgen does not know what the backend charges: the request counts its worst case at the
  highest ratio yet seen times LEARNING_MARGIN, never the bare listing
  (`cost_source` `worst_case_report_refused`), and the backend's requests are held with the
  margin again until a readable cost arrives (`PriceWatch.charges_unknown`).
- A report no request could cost (over IMPLAUSIBLE_RATIO times its worst case at the listing,
  and at least that times $1 per million of its tokens) counts the same capped figure, is
  flagged (`cost_source` `worst_case_report_implausible`), and takes the backend out of the
  session: believed, one such figure would spend every later session's budget.
- A backend whose answers cost more than its price raises the price its reservations use
  (`PriceWatch`): the highest ratio of reported to priced cost seen, so the worst case of what
  is in flight is reserved at what the provider really charges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from draftgen.config.backends import Price

PRICED, REPORTED = "priced", "reported"
REPORT_REFUSED, REPORT_IMPLAUSIBLE = "worst_case_report_refused", "worst_case_report_implausible"
"""Where an answer's `cost_usd` comes from (its record's `cost_source`): its usage priced (no
cost reported, or one below the price), the reported cost (at or above the price), or the
request's worst case with the margin (the report was not a cost, or none a request could
have)."""
LEARNING_MARGIN = 20.0
"""Until a backend that reports costs has answered once (or after it reported no readable
cost), its requests in flight beyond the first are reserved at this many times its price, and
a report that is no cost counts this many times the request's worst case: a provider billing
up to this much more than it lists cannot pass the budget before a readable bill tells."""
IMPLAUSIBLE_RATIO = 1000.0
"""A reported cost above this many times the request's worst case at the listing (and above
this many times $1 per million of its prompt and `max_tokens` tokens) is none any request
could have: `usage.cost: 1e308`. It is counted at the margin's worst case instead."""
PLAUSIBLE_FLOOR_USD_PER_TOKEN = 1e-6
"""The per-token figure the plausibility bound never goes below ($1 per million tokens): a
backend listed at 0, or at a fraction of a cent, may still report real costs."""
MIN_PAID_USD_PER_M = 1e-3
"""A paid backend priced below this (USD per million tokens, prompt and completion alike) is
refused when a dollar budget is set, unless its config says `paid: false`: a price of 0 or a
per-token/per-million typo would turn the budget off."""


def is_cost(usd: float | None) -> bool:
    """A figure a provider may bill: finite and >= 0."""
    return usd is not None and math.isfinite(usd) and usd >= 0


def counted_cost(reported: float | None, priced: float | None, worst: float,
                 most: float = math.inf) -> tuple[float, str]:
    """What an answer (or a billed failure) counts for, and where the figure comes from:
    never less than the provider reported, never less than the price. `worst`: the request's
    worst case at what its backend is known to charge; `most`: the most a request could
    cost (`PriceWatch.most_plausible`). A report that is no cost, or above `most`, counts
    `worst` times LEARNING_MARGIN."""
    floor = priced or 0.0
    if reported is None:
        return floor, PRICED
    if not is_cost(reported):
        return max(worst * LEARNING_MARGIN, floor), REPORT_REFUSED
    if reported > most:
        return max(min(worst * LEARNING_MARGIN, most), floor), REPORT_IMPLAUSIBLE
    if reported >= floor:
        return reported, REPORTED
    return floor, PRICED


def lookup_cost(billed: float | None, counted: float, most: float = math.inf) -> float:
    """A bill looked up afterwards (OpenRouter's generation record) for an attempt counted at
    its worst case: the provider's figure where it is a cost a request could have, else the
    worst case stays."""
    return billed if billed is not None and is_cost(billed) and billed <= most else counted


@dataclass
class PriceWatch:
    """A backend's price as the provider charges it: the configured or listed price, raised by
    the highest ratio of a reported cost to its priced cost seen so far. A backend with no
    price (0: a free backend) that reports costs is priced by the highest cost per token seen."""

    listed: Price | None
    ratio: float = 1.0
    usd_per_token: float = 0.0
    answers: int = 0
    """Answers (or billed failures) seen, with or without a reported cost."""
    reported_over_free: int = 0
    """Reported costs > 0 from a backend whose price is 0."""
    unreadable: bool = False
    """Its last report was no cost (or none a request could have): what it charges is not
    known again."""

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """The listed price's cost of this usage (None: no price known)."""
        if self.listed is None:
            return None
        return self.listed.cost(prompt_tokens, completion_tokens)

    def worst(self, prompt_tokens: int, max_tokens: int) -> float:
        """What a request of `prompt_tokens` and `max_tokens` may cost, at what the provider
        has charged so far."""
        listed = (self.listed.cost(prompt_tokens, max_tokens) * self.ratio
                  if self.listed is not None else 0.0)
        return max(listed, (prompt_tokens + max_tokens) * self.usd_per_token)

    def most_plausible(self, prompt_tokens: int, max_tokens: int) -> float:
        """The most a request of `prompt_tokens` and `max_tokens` could be billed: a report
        above it is none (IMPLAUSIBLE_RATIO)."""
        listed = self.listed.cost(prompt_tokens, max_tokens) if self.listed is not None else 0.0
        floor = (prompt_tokens + max_tokens) * PLAUSIBLE_FLOOR_USD_PER_TOKEN
        return IMPLAUSIBLE_RATIO * max(listed, floor)

    def charged(self) -> Price | None:
        """The price as charged so far: the listed one times `ratio`, and never below the
        highest cost per token a backend priced at 0 reported (None: no price known)."""
        per_m = self.usd_per_token * 1e6
        if self.listed is None:
            return Price(prompt=per_m, completion=per_m) if per_m else None
        return Price(prompt=max(self.listed.prompt * self.ratio, per_m),
                     completion=max(self.listed.completion * self.ratio, per_m))

    def charges_unknown(self, reports_cost: bool) -> bool:
        """Its backend reports what it charges and nothing readable it charged has arrived
        (none yet, or the last report was no cost): its requests in flight are held with a
        margin (LEARNING_MARGIN)."""
        return (reports_cost and self.answers == 0) or self.unreadable

    def observe(self, reported: float | None, priced: float | None, tokens: int,
                most: float = math.inf) -> bool:
        """One answer's reported cost beside its priced cost (`most`: the most its request
        could cost: a report above it teaches nothing). True when it raised `ratio` (the
        requests in flight then need re-reserving: `Ledger.reprice`)."""
        self.answers += 1
        if reported is not None:
            self.unreadable = not (is_cost(reported) and reported <= most)
        if self.unreadable or not is_cost(reported) or not reported:
            return False
        assert reported is not None
        if priced:
            before, self.ratio = self.ratio, max(self.ratio, reported / priced)
            return self.ratio > before
        if tokens > 0:
            self.reported_over_free += 1
            self.usd_per_token = max(self.usd_per_token, reported / tokens)
        return False


def too_small(price: Price) -> bool:
    """A price no paid API charges: 0, or a per-token figure given as per-million."""
    return max(price.prompt, price.completion) < MIN_PAID_USD_PER_M
