"""One request, from the moment it is admitted to its record or failure on disk: sent with
retries, each billed attempt charged as it ends, the answer's token IDs rebuilt, its cost
(reported or priced), the record written, the reservation settled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from draftgen.backends import Backend
from draftgen.backends.base import (
    RequestContext,
    past_max_tokens,
    rebuilt_length_problem,
)
from draftgen.budget import (
    IMPLAUSIBLE_RATIO,
    LEARNING_MARGIN,
    REPORT_IMPLAUSIBLE,
    REPORT_REFUSED,
    Ledger,
    PriceWatch,
    Reservation,
    counted_cost,
    lookup_cost,
)
from draftgen.formats import FormatError
from draftgen.formats.trajectory import TurnAnswer
from draftgen.progress import DatasetCounters, RunCounters
from draftgen.redact import redact
from draftgen.run.answer_record import make_record
from draftgen.run.pending import Pending
from draftgen.run.plan import Plan
from draftgen.run.state import RunState
from draftgen.run.turns import Conversation
from draftgen.scheduler import BackendSlots, send_with_retries
from draftgen.stopping import Stopped
from draftgen.store import Store, StoreError
from draftgen.store.record import Record
from draftgen.tokenize import OffLoopBatcher
from draftgen.types import BackendError, Prompt, RawAnswer, Rebuilt

log = logging.getLogger("draftgen")

BUDGET_PAUSE = "budget.usd: waiting for requests in flight to settle"
ASK_BILL_S = 5.0
"""At most this long asking OpenRouter, as the request ends, what an answer it could not read
was billed (else it stays counted at its worst case)."""


@dataclass(slots=True)
class BilledAttempts:
    """A request's failed attempts that the endpoint billed, each charged as it ended."""

    usd: float = 0.0
    unknown: list[tuple[str, float]] = field(default_factory=list)
    """Attempts whose answer could not be read, counted at their worst case, with their
    generation ID (OpenRouter) to ask for the real bill."""
    gen: str | None = None
    """The generation ID of the attempt under way, once its headers arrived."""


class Requests:
    """The run's requests: each one's life (`answer`), and the spend of this session that no
    answer on disk accounts for."""

    def __init__(self, plan: Plan, store: Store, ledger: Ledger, state: RunState,
                 counters: RunCounters, prices: dict[str, PriceWatch | None],
                 requeue: Callable[[Pending], None]) -> None:
        self.plan = plan
        self.store = store
        self.ledger = ledger
        self.state = state
        self.counters = counters
        self.prices = prices
        """Each backend's price as it charges (None: unknown, unbudgeted), once the backends
        have started."""
        self.requeue = requeue
        """Puts a prompt back at the head of its queue (for another backend)."""
        self.session = 0
        self.slots: BackendSlots | None = None
        self.unsettled_usd = 0.0
        """What this session's paid requests with no answer on disk may have cost: the worst
        case of those that ended with no known bill, the bill of answers no disk would take."""
        self.parked: list[Record] = []
        """Answers the run folder would not take (write failed): written to a rescue file
        when the session ends (store.rescue)."""
        self.refused_reports = 0
        """Answers and billed failures whose reported cost was no cost (`counted_cost`)."""
        self.implausible_reports = 0
        """Answers and billed failures whose reported cost no request could have."""
        self._rebuild = OffLoopBatcher(
            self._rebuild_batch, max_batch=128,
            in_thread=lambda: plan.tokenizer.batches_gain_from_a_thread)

    def _rebuild_batch(self, items: list[tuple[RawAnswer, Prompt]]) -> list[Rebuilt]:
        return self.plan.fmt.rebuild_batch([raw for raw, _ in items], [p for _, p in items])

    async def _rebuilt(self, raw: RawAnswer, prompt: Prompt, max_tokens: int) -> Rebuilt:
        """The answer's token IDs; an answer the model format cannot lay out is a bad answer
        (a failed request, billed), not a bug, and so is one whose IDs rebuilt from its text
        are more than its `max_tokens` allow (`rebuilt_length_problem`)."""
        try:
            rebuilt = await self._rebuild((raw, prompt))
        except FormatError as e:
            raise BackendError("bad_response", f"the answer does not fit model format "
                               f"{self.plan.fmt.name!r}: {e}", retryable=False,
                               usage=raw.usage) from None
        problem = rebuilt_length_problem(len(rebuilt.output_ids), max_tokens)
        if problem is not None:
            counted = max(raw.usage.completion_tokens or 0, len(rebuilt.output_ids))
            raise past_max_tokens(f"the answer's text is {problem}",
                                  msgspec.structs.replace(raw.usage, completion_tokens=counted))
        return rebuilt

    async def answer(self, item: Pending, backend: Backend, max_tokens: int,
                     reservation: Reservation) -> None:
        prompt, input_ids = item.prompt, item.input_ids or []
        assert prompt is not None, "a prompt is read before it is sent"
        assert self.slots is not None, "requests are sent by the dispatcher"
        slots = self.slots
        counters = self.counters.datasets[prompt.dataset]
        started = time.monotonic()
        settled = False
        record: Record | None = None
        written = False
        cost = 0.0
        attempts = BilledAttempts()
        try:
            self._journal("sent", prompt, backend=backend.name, max_tokens=max_tokens,
                          **({"usd": round(reservation.worst_usd, 9)} if reservation.usd else {}))
            ctx = RequestContext()
            if reservation.usd and backend.capabilities.looks_up_bills:
                ctx.on_generation_id = lambda generation: self._on_generation_id(
                    prompt, attempts, generation)
            conversation = item.conversation
            if conversation is not None and conversation.sampling is not None:
                ctx.sampling = conversation.request_sampling(
                    backend.capabilities.needs_prompt_ids)
            raw, retries = await send_with_retries(
                backend, prompt, input_ids, max_tokens,
                on_error=lambda e: self._on_attempt_error(e, backend, reservation, attempts,
                                                          counters),
                stop=self.state.stopping, ctx=ctx)
            self._watch_connection(backend, None)
            await self._learn_bills(backend, attempts, reservation, len(input_ids), counters)
            rebuilt = await self._rebuilt(raw, prompt, max_tokens)
            cost, source = self._cost(
                backend, raw.usage.cost, raw.usage.prompt_tokens or len(input_ids),
                raw.usage.completion_tokens or len(rebuilt.output_ids), reservation)
            record = make_record(prompt, input_ids, raw, rebuilt, backend, cost + attempts.usd,
                                 time.monotonic() - started, retries, cost_source=source,
                                 session=self.session)
            answer = conversation.label(record, raw, rebuilt) if conversation else None
            self.store.append_record(prompt.dataset, record)
            written = True
            self.ledger.settle(reservation, len(rebuilt.output_ids), cost)
            settled = True
            self._journal("ok", prompt)
            slots.note_result(backend, failed=False)
            _count_answer(counters, raw, rebuilt, cost)
            if conversation is not None and answer is not None:
                self._next_turn(conversation, answer, record, counters)
        except BackendError as e:
            await self._learn_bills(backend, attempts, reservation, len(input_ids), counters)
            self.ledger.settle(reservation, 0, 0.0)  # its billed attempts are charged already
            settled = True
            self._on_failure(item, backend, e, counters, attempts.usd)
        except StoreError as e:
            if not self.state.failure:  # once, not once per answer in flight
                log.error("%s; stopping dispatch, everything written so far is kept", e)
            self.state.fail(str(e))
            if record is not None and not written:  # paid for: kept for a rescue file
                self.parked.append(record)
                self.ledger.settle(reservation, len(record.output_ids), cost)
                settled = True
                counters.cost += cost
        except Stopped:  # the run stopped during a back-off: not sent again, left pending
            self.ledger.settle(reservation, 0, 0.0)  # its billed attempts are charged already
            settled = True
            self.unsettled_usd += attempts.usd  # on no disk: later sessions count it from here
            self.requeue(item)
            self._journal_quietly("dropped", prompt, reason="stopped")
        except asyncio.CancelledError:
            self._journal_quietly("dropped", prompt, reason="aborted")
            raise
        except Exception as e:  # a bug must not take the other 1,999 requests down with it
            log.exception("%s: unexpected error", prompt.id)
            self.write_failure(prompt, backend, "internal_error", f"{type(e).__name__}: {e}",
                               None, counters)
        finally:
            if not settled:
                # Unknown outcome (aborted mid-stream, write failed): keep the worst case
                # counted as spent, never less.
                self.ledger.settle(reservation, reservation.tokens, reservation.worst_usd)
                self.unsettled_usd += reservation.worst_usd + attempts.usd
            counters.in_flight -= 1
            slots.release(backend)
            if reservation.usd:
                slots.unpause(BUDGET_PAUSE)

    def _next_turn(self, conversation: Conversation, answer: TurnAnswer, record: Record,
                   counters: DatasetCounters) -> None:
        """A conversation's turn is written: queue its next turn, or count the turns it
        will not have (it ended early)."""
        conversation.answered(answer)
        if isinstance(record.end, str):
            counters.total -= conversation.turns_left
        else:
            self.requeue(Pending.next_turn(conversation))

    def _cost(self, backend: Backend, reported: float | None, prompt_tokens: int,
              completion_tokens: int, reservation: Reservation) -> tuple[float, str]:
        """What the answer counts for, never less than the backend reported nor than its price
        (`budget.counted_cost`), and where the figure comes from; what it cost beside its
        price raises the price the backend's reservations use. A report that is no cost
        holds the backend's requests with the margin again; one no request could cost takes
        the backend out of the session."""
        watch = self.prices.get(backend.name)
        priced = watch.cost(prompt_tokens, completion_tokens) if watch else None
        most = self._most_plausible(watch, prompt_tokens, reservation)
        cost, source = counted_cost(reported, priced, reservation.worst_usd, most)
        if source == REPORT_REFUSED:
            if not self.refused_reports:
                log.warning("%s reported usage.cost %r, which is no cost: what it charges is "
                            "not known, its requests are held with the margin again and this "
                            "one is counted at $%.6f (cost_source %r; status counts them)",
                            backend.name, reported, cost, REPORT_REFUSED)
            self.refused_reports += 1
        elif source == REPORT_IMPLAUSIBLE:
            self.implausible_reports += 1
            if self.slots is not None:
                self.slots.disable(backend, f"it reported usage.cost {reported!r}, over "
                                   f"{IMPLAUSIBLE_RATIO:g}x what the request could cost "
                                   f"(${most:.6f}): counted at ${cost:.6f} (cost_source "
                                   f"{REPORT_IMPLAUSIBLE!r}); check the provider's bill")
        if watch is not None:
            self._watch_price(backend, watch, reported, priced, prompt_tokens + completion_tokens,
                              most)
        return cost, source

    @staticmethod
    def _most_plausible(watch: PriceWatch | None, prompt_tokens: int,
                        reservation: Reservation) -> float:
        if watch is None:
            return math.inf
        return watch.most_plausible(prompt_tokens, reservation.tokens)

    def _watch_price(self, backend: Backend, watch: PriceWatch, reported: float | None,
                     priced: float | None, tokens: int, most: float) -> None:
        free_before = watch.reported_over_free
        unreadable_before = watch.unreadable
        if watch.observe(reported, priced, tokens, most):
            self.ledger.reprice(backend.name, watch.ratio)
            log.warning("%s charges %.3gx its price: its requests are reserved at that from "
                        "now on", backend.name, watch.ratio)
        if watch.unreadable and not unreadable_before:
            self.ledger.hold_unknown(backend.name)
        if watch.reported_over_free and not free_before:
            log.warning("%s is priced 0 (paid: false) but its answers report a cost ($%.6f): "
                        "counted, and its requests reserved at it from now on",
                        backend.name, reported)

    def _billed(self, backend: Backend, e: BackendError, reservation: Reservation) -> float:
        """What a failed attempt may have cost: its usage where the error carries it; its worst
        case where the endpoint accepted it and its answer could not be read."""
        least = reservation.worst_usd * LEARNING_MARGIN if e.past_max_tokens else 0.0
        if e.usage is not None:
            return max(least, self._cost(backend, e.usage.cost, e.usage.prompt_tokens or 0,
                                         e.usage.completion_tokens or 0, reservation)[0])
        return max(least, reservation.worst_usd) if e.billed_unknown else 0.0

    def _on_generation_id(self, prompt: Prompt, attempts: BilledAttempts, gen: str) -> None:
        attempts.gen = gen
        self._journal_quietly("gen", prompt, gen=gen)

    def _on_attempt_error(self, e: BackendError, backend: Backend, reservation: Reservation,
                          attempts: BilledAttempts, counters: DatasetCounters) -> None:
        """Each failed attempt: the backend's health, and the attempt's bill charged at once.
        No retry once the budget cannot hold the request's reservation beside what it spent."""
        assert self.slots is not None
        self._watch_connection(backend, e)
        self.slots.note_result(backend, failed=e.retryable, cause=e.connection)
        billed = self._billed(backend, e, reservation)
        gen, attempts.gen = attempts.gen, None
        if not billed:
            return
        attempts.usd += billed
        counters.cost += billed
        if e.billed_unknown and gen:
            attempts.unknown.append((gen, billed))
        if not self.ledger.charge(billed) and e.retryable:
            e.retryable = False
            e.message += " (not retried: budget.usd cannot take another attempt)"

    def _watch_connection(self, backend: Backend, e: BackendError | None) -> None:
        """Whether the attempt reached the backend's server (`connections.ConnectionWatch`,
        which the progress line shows and `unreachable_stop_s` reads)."""
        watch = self.counters.connections
        if e is None or e.connection is None:
            if watch.reached(backend.name):
                log.info("backend %s: reached again", backend.name)
        elif watch.failed(backend.name, backend.base_url, e.connection,
                          e.message.removeprefix(f"{e.connection}: ")):
            log.info("backend %s: cannot reach %s: %s", backend.name, backend.base_url,
                     e.message)

    async def _learn_bills(self, backend: Backend, attempts: BilledAttempts,
                           reservation: Reservation, prompt_tokens: int,
                           counters: DatasetCounters) -> None:
        """Attempts counted at their worst case (answers that could not be read): where the
        endpoint tells what it billed (OpenRouter's generation lookup, ASK_BILL_S at most),
        that bill replaces the worst case (`budget.lookup_cost`)."""
        most = self._most_plausible(self.prices.get(backend.name), prompt_tokens, reservation)
        for gen, counted in attempts.unknown:
            try:
                billed = lookup_cost(await asyncio.wait_for(backend.billed_usd(gen), ASK_BILL_S),
                                     counted, most)
            except TimeoutError:
                continue
            self.ledger.correct(counted, billed)
            attempts.usd += billed - counted
            counters.cost += billed - counted
        attempts.unknown.clear()

    def _on_failure(self, item: Pending, backend: Backend, e: BackendError,
                    counters: DatasetCounters, billed_usd: float = 0.0) -> None:
        assert item.prompt is not None and self.slots is not None
        if e.permanent_for_backend:
            # Not the prompt's fault: give it to another backend.
            self.slots.disable(backend, str(e))
            self.requeue(item)
            self._journal_quietly("dropped", item.prompt, reason=e.kind)
            return
        if e.never_connected and not billed_usd:
            # The server saw nothing: no attempt of the prompt's, which waits for a backend
            # that answers (or the next run, once unreachable_stop_s stops this one). One
            # with a billed attempt is written as failed: failures.jsonl keeps that bill.
            cfg = backend.cfg
            self.slots.pause(backend, max(cfg.cooldown_s, cfg.backoff_base_s),
                             f"no connection ({e.connection})")
            self.requeue(item)
            self._journal_quietly("dropped", item.prompt, reason="unreachable")
            return
        self.write_failure(item.prompt, backend, e.kind, e.message, e.status, counters,
                           billed_usd)
        if item.conversation is not None:  # not continued in this session
            counters.total -= item.conversation.turns_left - 1

    def write_failure(self, prompt: Prompt, backend: Backend | None, kind: str, message: str,
                      status: int | None, counters: DatasetCounters,
                      billed_usd: float = 0.0) -> None:
        """The prompt's failed attempt, in its dataset's failures.jsonl and the journal."""
        counters.failed += 1
        counters.failure_kinds[kind] += 1
        try:
            self.store.append_failure(prompt.dataset, {
                "id": prompt.id, "dataset": prompt.dataset,
                "backend": backend.name if backend else None,
                "kind": kind, "status": status, "message": redact(message),
                "created_at": round(time.time(), 3),
                **({"cost_usd": round(billed_usd, 8)} if billed_usd else {}),
            })
            self._journal("failed", prompt, kind=kind)
        except StoreError as err:
            self.state.fail(str(err))

    def _journal(self, event: str, prompt: Prompt, **extra: Any) -> None:
        self.store.journal({"ev": event, "id": prompt.id, "dataset": prompt.dataset,
                            "t": round(time.time(), 3), "session": self.session, **extra})

    def _journal_quietly(self, event: str, prompt: Prompt, **extra: Any) -> None:
        with contextlib.suppress(StoreError):
            self._journal(event, prompt, **extra)


def _count_answer(counters: DatasetCounters, raw: RawAnswer, rebuilt: Rebuilt,
                  cost: float) -> None:
    counters.done += 1
    counters.output_tokens += len(rebuilt.output_ids)
    counters.reasoning_tokens += raw.usage.reasoning_tokens or 0
    counters.cost += cost
    counters.truncated += raw.finish_reason == "length"
    counters.not_exact += rebuilt.token_check != "exact"
