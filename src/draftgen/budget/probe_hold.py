"""What the probe's requests hold of the dollar budget and what they count for: the rule
`Ledger.admit` applies to a run's requests, for the probe's few requests per backend.

A backend whose charges are not known yet (it reports costs and has not answered) is probed in
two steps: its first request alone, held at its worst case at the price and sent with no more
than the run's `max_tokens`, as the run's first request is; the others once that answer told
what the provider bills, held at that. So no request is held at LEARNING_MARGIN times its
price only because it was sent beside the first, and a small budget still pays for a probe.
Each step's `max_tokens` is cut to what the budget leaves (never below PROBE_MIN_TOKENS); a
step that cannot fit even then is not sent, and says what budget it would need.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from draftgen.budget.ledger import Ledger, learning_hold
from draftgen.budget.pricing import PriceWatch, counted_cost

PROBE_MIN_TOKENS = 64
"""The fewest tokens a probe request is sent with to fit the budget: fewer could not show a
reasoning block, a tool call and the end of an answer."""


@dataclass(frozen=True)
class ProbeCharge:
    """What one probe answer (or failed request) says about its bill."""

    reported_usd: float | None
    priced_usd: float | None
    billed_tokens: int


@dataclass
class _Step:
    worsts: list[float]
    """Each request's worst case at what its backend was known to charge when it was sent."""
    most: list[float]
    """Each request's most plausible bill (`PriceWatch.most_plausible`)."""
    usd: float
    """What the step holds of the budget."""


@dataclass
class ProbeHold:
    """The probe's reservations and spend against `ledger`, backend by backend (`prices`: each
    backend's price watch, None for one without a price; `reports_cost`: whether its endpoint
    reports what it charged)."""

    ledger: Ledger
    prices: Mapping[str, PriceWatch | None]
    reports_cost: Mapping[str, bool]
    run_max_tokens: int | None = None
    """The run's `max_tokens`: a request held at its price alone (its backend's charges not
    known yet) is sent with no more, so that what a provider billing more than it lists can
    pass the budget by is bounded by one of the run's own requests, probe or not."""
    held_usd: float = 0.0
    """The most held at once (run.json's `probe_reserved_usd`)."""
    unguarded_usd: float = 0.0
    """The part of it held at the price alone for backends whose charges were unknown (each
    one's first request): a provider charging f times its price passes the hold by at most
    (f - 1) times this."""
    spent_usd: float = 0.0
    """What the probe's answers count for, by the run's rule (`counted_cost`)."""
    _out: dict[str, _Step] = field(default_factory=dict)
    _holding: float = 0.0

    def _learning(self, backend: str, watch: PriceWatch) -> bool:
        return self.ledger.usd is not None and watch.charges_unknown(
            self.reports_cost.get(backend, False))

    def _step(self, backend: str, watch: PriceWatch, prompt_tokens: Sequence[int],
              max_tokens: int) -> _Step:
        worsts = [watch.worst(p, max_tokens) for p in prompt_tokens]
        most = [watch.most_plausible(p, max_tokens) for p in prompt_tokens]
        usd = learning_hold(worsts) if self._learning(backend, watch) else sum(worsts)
        return _Step(worsts, most, usd)

    def _needs(self, backend: str, watch: PriceWatch, now: Sequence[int], later: Sequence[int],
               max_tokens: int) -> float:
        """What sending `now` holds, plus what `later` may cost at what is known: the room
        the whole probe of the backend needs with `max_tokens`."""
        return (self._step(backend, watch, now, max_tokens).usd
                + sum(watch.worst(p, max_tokens) for p in later))

    def _room(self) -> float:
        usd = self.ledger.usd
        return math.inf if usd is None else usd - self.ledger.committed_usd()

    def fitting_max_tokens(self, backend: str, now: Sequence[int], later: Sequence[int],
                           max_tokens: int) -> int | None:
        """The largest `max_tokens` (at most `max_tokens`, at least PROBE_MIN_TOKENS or
        `max_tokens` if smaller) with which `now` and then `later` fit what is left of the
        budget; None when none does."""
        watch = self.prices.get(backend)
        if watch is None:
            return max_tokens
        room = self._room()
        low = min(max_tokens, PROBE_MIN_TOKENS)
        if self._needs(backend, watch, now, later, low) > room:
            return None
        high = max_tokens
        while low < high:  # what a request may cost grows with its max_tokens
            mid = (low + high + 1) // 2
            if self._needs(backend, watch, now, later, mid) <= room:
                low = mid
            else:
                high = mid - 1
        return low

    def _cap(self, backend: str, watch: PriceWatch, max_tokens: int) -> int:
        """The `max_tokens` a step may have: no more than the run's while it is held at the
        price alone (`run_max_tokens`)."""
        if self._learning(backend, watch) and self.run_max_tokens is not None:
            return min(max_tokens, self.run_max_tokens)
        return max_tokens

    def _short_of(self, what: str, needs: float) -> str:
        """`what` needs `needs` of the budget and less is left: the `budget.usd` to raise it
        to."""
        left = self._room()
        return (f"{what} may cost ${needs:.6f} (requests of at most {PROBE_MIN_TOKENS} tokens) "
                f"and ${max(0.0, left):.6f} of budget.usd is left: raise budget.usd to at "
                f"least ${(self.ledger.usd or 0.0) + needs - left:.6f}, or run with --no-probe")

    def refusal(self, requests: Mapping[str, Sequence[int]], max_tokens: int) -> str | None:
        """Why the budget cannot pay a probe of these backends (name -> its requests' prompt
        tokens) even at its least (each one's first request, then the others, at
        PROBE_MIN_TOKENS), and what to raise it to; None when it can."""
        needs = 0.0
        paid = [b for b, prompts in requests.items() if prompts and self.pays(b)]
        for backend in paid:
            watch = self.prices[backend]
            assert watch is not None
            prompts = requests[backend]
            least = min(self._cap(backend, watch, max_tokens), PROBE_MIN_TOKENS)
            needs += self._needs(backend, watch, prompts[:1], prompts[1:], least)
        if needs <= self._room():
            return None
        return "nothing was sent: " + self._short_of(f"the probe of {', '.join(paid)}", needs)

    def pays(self, backend: str) -> bool:
        """The backend's probe requests are paid from a dollar budget."""
        return self.ledger.usd is not None and self.prices.get(backend) is not None

    def in_steps(self, backend: str) -> bool:
        """The backend's first request goes alone: what it charges is not known yet."""
        watch = self.prices.get(backend)
        return watch is not None and self._learning(backend, watch)

    def hold(self, backend: str, prompt_tokens: Sequence[int], later: Sequence[int],
             max_tokens: int) -> int | str:
        """Reserve the worst case of sending these requests now (with room left for `later`,
        the backend's requests still to come), with the `max_tokens` returned; or say why
        they cannot be sent and what `budget.usd` they need."""
        assert backend not in self._out, "one step at a time per backend"
        watch = self.prices.get(backend)
        if watch is None:
            return max_tokens
        max_tokens = self._cap(backend, watch, max_tokens)
        fitting = self.fitting_max_tokens(backend, prompt_tokens, later, max_tokens)
        if fitting is None:
            needs = self._needs(backend, watch, prompt_tokens, later,
                                min(max_tokens, PROBE_MIN_TOKENS))
            return "not sent: " + self._short_of(
                f"at what {backend} charges, the probe's requests", needs)
        step = self._step(backend, watch, prompt_tokens, fitting)
        reserved = self.ledger.reserve(step.usd)
        assert reserved, "fitting_max_tokens checked the room"
        if self._learning(backend, watch) and step.worsts:
            self.unguarded_usd += step.worsts[0]
        self._out[backend] = step
        self._holding += step.usd
        self.held_usd = max(self.held_usd, self._holding)
        return fitting

    def settle(self, backend: str, charges: Sequence[ProbeCharge]) -> None:
        """The backend's step answered: its hold replaced by what its answers count for, and
        what they were billed beside their price taught to its price watch."""
        step = self._out.pop(backend, None)
        if step is None:
            return
        watch = self.prices.get(backend)
        spent = 0.0
        for worst, most, c in zip(step.worsts, step.most, charges, strict=True):
            spent += counted_cost(c.reported_usd, c.priced_usd, worst, most)[0]
            if watch is not None:
                watch.observe(c.reported_usd, c.priced_usd, c.billed_tokens, most)
        self._release(step, spent)

    def abandon(self) -> None:
        """Stopped while requests were out: each counts its worst case (it may have been
        billed), as a request in flight at a kill does."""
        for backend in list(self._out):
            step = self._out.pop(backend)
            self._release(step, sum(step.worsts))

    def _release(self, step: _Step, spent: float) -> None:
        self.ledger.release(step.usd)
        self._holding -= step.usd
        self.ledger.add_spent(spent)
        self.spent_usd += spent
