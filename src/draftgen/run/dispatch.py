"""The dispatcher: datasets taken in turn, their next prompts read and rendered ahead in
batches, each prompt admitted by the budgets and given a backend slot, one task per request.
Paid backends the dollar budget cannot take now are held back; the run stops sending when the
output disk is nearly full."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Sequence

from draftgen.backends import Backend
from draftgen.budget import POLL_S, USD, Admission, Budget, tokens_key
from draftgen.datasets import DatasetError
from draftgen.formats import FormatError
from draftgen.progress import RunCounters
from draftgen.run.free_space import SpaceGuard
from draftgen.run.pending import Pending, render_turns, turns_queued
from draftgen.run.plan import Plan
from draftgen.run.render import PromptTooLong, render_within
from draftgen.run.request import BUDGET_PAUSE, Requests
from draftgen.run.resume import Queues
from draftgen.run.state import RunState
from draftgen.scheduler import BackendSlots, NoBackendFits, NoBackendLeft, needs_of
from draftgen.stopping import Stopped
from draftgen.types import Prompt

log = logging.getLogger("draftgen")

RENDER_BATCH = 256
SHARDS_PAUSE = "budget.usd: waiting for other shards to give budget back"


class Dispatcher:
    def __init__(self, plan: Plan, queues: Queues, budget: Budget, requests: Requests,
                 state: RunState, counters: RunCounters, space: SpaceGuard) -> None:
        self.plan = plan
        self.cfg = plan.cfg
        self.queues = queues
        self.budget = budget
        self.ledger = budget.ledger
        self.requests = requests
        self.state = state
        self.counters = counters
        self.space = space
        self.tasks: set[asyncio.Task[None]] = set()
        self._next_dataset = 0
        self._unserved: set[str] = set()
        """Why prompts were left unsent (`_leave_unsent`), each logged once."""

    async def run(self, slots: BackendSlots) -> None:
        """Send every queued prompt the budgets allow, until done or stopped; then wait for
        the requests in flight. NoBackendLeft when no backend is left to send to. Every wait
        of the dispatcher races the run's stop (`RunState.stopping`): a stop ends it at once."""
        self.requests.slots = slots
        try:
            await self._send_all(slots)
        except Stopped:
            pass
        except NoBackendLeft:
            await self.drain()
            raise
        await self.drain()

    async def _send_all(self, slots: BackendSlots) -> None:
        stopping = self.state.stopping
        while self.state.sending and not self.out_of_space():
            picked = await self._next_pending()
            if picked is None:
                if not self.tasks:
                    if not self._waiting_for_shards():
                        break
                    await stopping.sleep(POLL_S)
                    continue
                # a copy: the set empties as tasks end, before the race starts the wait
                await stopping.race(asyncio.wait(set(self.tasks),
                                                 return_when=asyncio.FIRST_COMPLETED))
                continue
            item, max_tokens = picked
            dataset = item.dataset
            assert item.prompt is not None
            try:
                backend = await slots.acquire(needs_of(item.prompt))
            except NoBackendFits as e:
                self._leave_unsent(item, str(e))
                continue
            except (NoBackendLeft, Stopped):
                self.queues[dataset].appendleft(item)
                raise
            if not self.state.sending:
                slots.release(backend)
                self.queues[dataset].appendleft(item)
                break
            assert item.input_ids is not None
            admission = self._admit(dataset, max_tokens, len(item.input_ids), backend)
            self.counters.throttled = self.ledger.throttled
            if admission.reservation is None:
                slots.release(backend)
                self.queues[dataset].appendleft(item)
                if await self.budget.more_usd(admission):
                    continue
                self._hold_back(slots, backend, admission.wait_s, admission.settling)
                continue
            self.counters.datasets[dataset].in_flight += 1
            task = asyncio.create_task(
                self.requests.answer(item, backend, max_tokens, admission.reservation))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _admit(self, dataset: str, max_tokens: int, prompt_tokens: int, backend: Backend
               ) -> Admission:
        """The budgets' word on one request to `backend`, at what the backend charges; until a
        backend that reports costs has answered once, its requests beyond the first are
        reserved with a margin (`Ledger.admit`'s `learning`)."""
        price = self.requests.prices[backend.name]
        learning = price is not None and price.charges_unknown(backend.capabilities.reports_cost)
        return self.ledger.admit(dataset, max_tokens, prompt_tokens, price, backend.name,
                                 learning)

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.wait(set(self.tasks))

    def cancel_all(self) -> None:
        """Cancel every request in flight (their answers are dropped)."""
        for task in list(self.tasks):
            task.cancel()

    def out_of_space(self) -> bool:
        """The output disk is nearly full (`run.free_space`): stop sending, as after a write
        failure; what is in flight is still written."""
        shortage = self.space.shortage()
        if shortage is None:
            return False
        log.error("%s", shortage)
        self.state.fail(shortage)
        return True

    def _leave_unsent(self, item: Pending, why: str) -> None:
        """A prompt no backend left in the run may be sent: not sent, not failed (a later run
        with a fitting backend answers it); counted as skipped."""
        self.counters.datasets[item.dataset].skipped += turns_queued([item])
        if why not in self._unserved:
            self._unserved.add(why)
            log.warning("%s: such prompts are left unsent for a later run", why)

    def _hold_back(self, slots: BackendSlots, backend: Backend, wait_s: float,
                   settling: bool) -> None:
        """A paid backend that the dollar budget cannot take now: wait for the spend rate,
        wait for requests in flight to settle, or leave the run when the budget is spent."""
        if wait_s > 0:
            slots.pause(backend, wait_s, "budget.usd_per_minute: spend rate reached")
        elif settling:
            slots.pause(backend, math.inf, BUDGET_PAUSE)
        elif self.budget.others_may_give(USD):
            slots.pause(backend, POLL_S, SHARDS_PAUSE)
        else:
            self.state.budget_stop = (
                f"budget.usd reached: ${self.ledger.spent_usd:.4f} of "
                f"${self.cfg.budget.usd:.4f} {self.budget.whose_spend()}; paid backends stopped")
            slots.disable(backend, "budget.usd reached")

    async def _next_pending(self) -> tuple[Pending, int] | None:
        """The next prompt, taking datasets in turn, with the max_tokens its token budget
        allows. Datasets whose budget is spent are closed (the rest counted as skipped)."""
        names = list(self.queues)
        for offset in range(len(names)):
            name = names[(self._next_dataset + offset) % len(names)]
            queue = self.queues[name]
            if not queue:
                continue
            wanted = self._max_tokens_wanted(queue[0])
            max_tokens = await self._room_for(name, queue[0], wanted)
            if max_tokens is None:
                continue  # requests in flight may still leave room
            self._next_dataset = (self._next_dataset + offset + 1) % len(names)
            while queue and queue[0].input_ids is None:
                if not await self._render_ahead(queue):
                    return None
            if not queue:  # the format refused every prompt left
                continue
            item = queue.popleft()
            if self._max_tokens_wanted(item) != wanted:  # a conversation's drawn max_tokens
                max_tokens = await self._room_for(name, item, self._max_tokens_wanted(item))
                if max_tokens is None:
                    queue.appendleft(item)
                    continue
            return item, max_tokens
        return None

    async def _room_for(self, name: str, item: Pending, wanted: int) -> int | None:
        """The max_tokens the dataset's token budget allows the item now (None: none). A
        conversation's turn is not cut short by the budget (a truncated turn would end its
        trajectory): it waits for the whole `wanted`, and where no request in flight can
        give room back, the dataset is closed and the conversation stays pending. A dataset
        whose budget is spent is closed (the rest counted as skipped)."""
        max_tokens = await self.budget.max_tokens_for(name, wanted)
        if max_tokens is not None and (item.conversation is None or max_tokens >= wanted):
            return max_tokens
        done = (self.ledger.token_budget_done(name) if max_tokens is None
                else not self.counters.datasets[name].in_flight)
        if done and not self._shards_may_give(name):
            self._close_for_budget(name)
        return None

    def _max_tokens_wanted(self, item: Pending) -> int:
        """The run's `max_tokens`, or the one its conversation drew."""
        drawn = item.conversation.max_tokens if item.conversation is not None else None
        return drawn or self.cfg.sampling.max_tokens

    def _shards_may_give(self, dataset: str) -> bool:
        """Another shard may still give this dataset's token budget back."""
        return self.budget.others_may_give(tokens_key(dataset))

    def _waiting_for_shards(self) -> bool:
        return any(queue and self._shards_may_give(name) for name, queue in self.queues.items())

    def _close_for_budget(self, dataset: str) -> None:
        queue = self.queues[dataset]
        counters = self.counters.datasets[dataset]
        counters.skipped += turns_queued(queue)
        log.info("%s: max_output_tokens reached; %d prompts skipped", dataset, len(queue))
        queue.clear()

    async def _render_ahead(self, queue: deque[Pending]) -> bool:
        """Read and render the next prompts of a dataset in one batch, off the event loop. A
        prompt the format cannot render (tools for a model without tool support, an unknown
        role) is recorded as failed with its reason and left out. False, with the run
        stopping, when the dataset cannot be read any more (its file changed)."""
        batch = [p for _, p in zip(range(RENDER_BATCH), queue, strict=False)
                 if p.input_ids is None]
        loop = asyncio.get_running_loop()
        try:
            if self.plan.tokenizer.batches_gain_from_a_thread:
                prompts, rendered = await loop.run_in_executor(None, self._load_and_render, batch)
            else:  # read in a thread, rendered here (see `OffLoopBatcher`)
                prompts = await loop.run_in_executor(None, self._load, batch)
                rendered = self._render(batch, prompts)
        except DatasetError as e:
            self.state.fail(str(e))
            return False
        for item, prompt, ids in zip(batch, prompts, rendered, strict=True):
            item.prompt = prompt
            if isinstance(ids, FormatError):
                queue.remove(item)
                kind = "prompt_too_long" if isinstance(ids, PromptTooLong) else "bad_prompt"
                counters = self.counters.datasets[item.dataset]
                self.requests.write_failure(prompt, None, kind, str(ids), None, counters)
                if item.conversation is not None:  # not continued in this session
                    counters.total -= item.conversation.turns_left - 1
            else:
                item.input_ids = ids
        return True

    def _load_and_render(self, batch: Sequence[Pending]
                         ) -> tuple[list[Prompt], list[list[int] | FormatError]]:
        prompts = self._load(batch)
        return prompts, self._render(batch, prompts)

    def _render(self, batch: Sequence[Pending], prompts: list[Prompt]
                ) -> list[list[int] | FormatError]:
        if batch[0].conversation is not None:  # turns, each in its conversation's format
            return render_turns(batch, prompts, self.cfg.model.context_length)
        return render_within(self.plan.fmt, prompts, self.cfg.model.context_length)

    def _load(self, batch: Sequence[Pending]) -> list[Prompt]:
        """The batch's prompts, read from the table where not read yet."""
        unread = [i for i, item in enumerate(batch) if item.prompt is None]
        prompts = [item.prompt for item in batch]
        if unread:
            table = self.plan.prompts_of(batch[0].dataset)
            for i, prompt in zip(unread, table.load([batch[i].row for i in unread]),
                                 strict=True):
                prompts[i] = prompt
        loaded = [p for p in prompts if p is not None]
        assert len(loaded) == len(batch)
        return loaded
