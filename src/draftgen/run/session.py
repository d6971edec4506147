"""`draftgen run`: datasets → scheduler → backends → format → store, crash-safe and resumable.

Every answer is appended to its dataset's responses.jsonl as soon as it arrives; re-running
on the same folder skips completed IDs, retries failed ones (up to `max_attempts`), and cuts a
torn last line left by a kill. Every request is journaled when sent and when it ends, so the
requests in flight at any stop are known.

`Runner` is one session of a run: the run's lock, start-up (settings check, resume scan,
backends, prices, probe), the dispatcher (`run.dispatch`), signals and stops, and what the
session leaves in run.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec

from draftgen.backends import Backend, BackendNotReady, make_backend
from draftgen.backends.base import share_answer_bytes
from draftgen.backends.managed_llamacpp import ManagedServerError, ManagedServers
from draftgen.backends.reach import all_reachable
from draftgen.budget import (
    BudgetPool,
    PriceWatch,
    ProbeHold,
    budget_for,
    refuse_impossible_rate,
    refuse_unaffordable_answer,
    too_small,
)
from draftgen.config import ConfigError
from draftgen.config.backends import Price
from draftgen.formats.check import template_check
from draftgen.perf import tuned_gc
from draftgen.probe import Gate, ProbeOptions, backends_to_probe, gate_backends
from draftgen.probe.exchange import probe_requests
from draftgen.progress import ProgressDisplay, RunCounters
from draftgen.run.dispatch import Dispatcher
from draftgen.run.free_space import SpaceGuard
from draftgen.run.pending import Pending, turns_queued
from draftgen.run.plan import Plan
from draftgen.run.request import Requests
from draftgen.run.resume import (
    KilledSession,
    ResumeScan,
    ask_bills,
    killed_session,
    settings_changes,
)
from draftgen.run.state import Outcome, RunState
from draftgen.scheduler import BackendSlots, NoBackendLeft
from draftgen.stopping import Stopped
from draftgen.store import RunLock, Store, StoreError
from draftgen.store.rescue import write_rescue
from draftgen.store.runjson_writer import (
    end_session,
    record_datasets,
    record_session,
    recover_run_json,
    start_session,
)
from draftgen.store.scan import StoredElsewhere
from draftgen.store.shards import claim_run_folder

log = logging.getLogger("draftgen")


class Runner:
    def __init__(self, plan: Plan, *, live_display: bool | None = None,
                 probe: ProbeOptions | None = None, pool: BudgetPool | None = None,
                 accept_changed_settings: bool = False, reask_changed: bool = False) -> None:
        self.plan = plan
        self.accept_changed_settings = accept_changed_settings
        """Resume even where the settings that define the data changed (`settings_changes`)."""
        self.reask_changed = reask_changed
        """Ask again answered prompts whose row changed under the same ID (`run.changed`)."""
        self.probe = probe
        """Probe the backends before the first request (`draftgen run` does; off by default)."""
        self.cfg = plan.cfg
        self.root = plan.run_dir
        self.store = Store(self.root, self.cfg.fsync_interval_s)
        self.counters = RunCounters()
        self.live_display = live_display
        self.state = RunState()
        self.queues: dict[str, deque[Pending]] = {}
        self.budget = budget_for(self.cfg, plan.shard, pool)
        """The ledger, and for a shard its lease on the run's shared budget (`pool`, by
        default the run folder's file pool)."""
        self.ledger = self.budget.ledger
        self.elsewhere: list[StoredElsewhere] = []
        """What the run's other folders (other shards, the unsharded root) hold, read once by
        the resume scan."""
        self.prices: dict[str, PriceWatch | None] = {}
        self.probe_usd = 0.0
        """What this session's probe requests count for (also in run.json's session)."""
        self.session = 0
        self._rescue_file: Path | None = None
        self._killed: KilledSession | None = None
        """The last session, when it was killed (`resume.killed_session`)."""
        self._bills: dict[str, float] = {}
        """What the endpoint billed for the killed session's requests, by generation ID."""
        self._unfit: dict[str, frozenset[str]] = {}
        """Backend name -> the prompts it must not be sent (the probe's `Gate.unfit`)."""
        self.requests = Requests(plan, self.store, self.ledger, self.state, self.counters,
                                 self.prices, requeue=self._requeue)
        self.dispatcher = Dispatcher(plan, self.queues, self.budget, self.requests, self.state,
                                     self.counters, SpaceGuard(self.root, self.cfg.min_free_mb))

    def _requeue(self, item: Pending) -> None:
        self.queues[item.dataset].appendleft(item)

    # ---- set-up ------------------------------------------------------------------------

    def _resume(self) -> None:
        """Queue every prompt not yet answered (`resume.ResumeScan`)."""
        scan = ResumeScan(self.plan, self.store, self.budget, self.counters, self.session,
                          reask_changed=self.reask_changed)
        self.elsewhere = scan.run(self.queues, self._killed, self._bills)

    async def _resolve_prices(self, backends: list[Backend]) -> None:
        """Each backend's price: configured, else listed by the endpoint, else 0 for a
        backend that does not bill. With a dollar budget, a paid backend of unknown price,
        or of a price no paid API charges (0, or a per-token figure given per million), is
        an error before anything is sent."""
        budgeted = self.ledger.budgeted
        for b in backends:
            price = b.cfg.price or await b.listed_price()
            if price is None and not b.cfg.is_paid:
                price = Price(prompt=0, completion=0)
            if budgeted:
                _check_paid_price(b, price)
            self.prices[b.name] = PriceWatch(price) if price is not None else None

    async def _probe_gate(self, backends: list[Backend]) -> bool:
        """With `probe` set: probe the started backends (or reuse run.json's results) and
        remove from `backends` those unsafe for this run's datasets (draftgen.probe.gate).
        False, with the run failed and nothing sent, when none is left, or when the budget
        cannot pay even the smallest probe (the figure to raise it to is named). The probe's
        requests are paid from the run's budget by `budget.ProbeHold`'s rule (stored results
        that still serve need no room), and what they cost is counted and kept in run.json."""
        if self.probe is None:
            return True
        plan = self.plan
        elsewhere = [s.folder / "run.json" for s in self.elsewhere]
        probed = backends_to_probe(plan.fmt, plan.cfg, backends, self.probe,
                                   self.store.layout.run_json, elsewhere)
        hold = ProbeHold(self.ledger, self.prices,
                         {b.name: b.capabilities.reports_cost for b in backends},
                         run_max_tokens=self.cfg.sampling.max_tokens)
        lengths = [len(r.input_ids) for r in probe_requests(plan.fmt)[0]]
        unaffordable = hold.refusal({b.name: lengths for b in probed}, self.probe.max_tokens)
        if unaffordable:
            self.state.fail(unaffordable, stop=False)
            return False
        try:
            gate = await gate_backends(plan.fmt, plan.cfg, plan.dataset_needs(), backends,
                                       self.probe, self.store.layout.run_json, elsewhere, hold)
        except BaseException:  # stopped while probing: what was sent may have been billed
            hold.abandon()
            self._record_probe_spend(hold)
            raise
        self._record_probe_spend(hold)
        self._learn_from_stored(gate)
        self._unfit = gate.unfit
        if gate.refused:
            self.state.fail(gate.refused, stop=False)
        return gate.refused is None

    def _learn_from_stored(self, gate: Gate) -> None:
        """Stored probe answers tell what their backends charge beside their price, as the
        answers probed now did (`ProbeHold.settle`)."""
        for result in gate.results:
            watch = self.prices.get(result.backend)
            if result.cached and watch is not None:
                for a in result.answers:
                    watch.observe(a.reported_usd, a.priced_usd, a.billed_tokens)

    def _record_probe_spend(self, hold: ProbeHold) -> None:
        """What the probe's requests count for, kept in run.json at once (the next session
        counts it, even after a kill)."""
        self.probe_usd += hold.spent_usd
        if hold.spent_usd:
            record_session(self.store.layout.run_json, self.session,
                           probe_usd=round(self.probe_usd, 8),
                           probe_reserved_usd=round(hold.held_usd, 8),
                           probe_unguarded_usd=round(hold.unguarded_usd, 8))

    # ---- the run -----------------------------------------------------------------------

    async def execute(self) -> Outcome:
        lock = RunLock(self.store.layout.lock)
        claim_run_folder(Path(self.cfg.output_dir), self.plan.shard, lock)
        if lock.took_over_stale:
            log.warning("%s: previous run did not exit cleanly; resuming", self.root)
        outcome = Outcome("failed", "interrupted")
        started = False
        try:
            self.store.refuse_links(d.name for d in self.cfg.datasets)
            recover_run_json(self.store.layout.run_json)
            tokenizer = {"path": str(self.plan.tokenizer.path),
                         "sha256": self.plan.tokenizer.sha256}
            changes = settings_changes(self.cfg, self.root, tokenizer,
                                       accept=self.accept_changed_settings)
            self.session = self.requests.session = start_session(
                self.store.layout.run_json, self.cfg.redacted(), tokenizer, changes)
            started = True
            self._check_template()
            try:
                self._killed = killed_session(self.store, self.session)
                if self._killed is not None:
                    self._bills = await ask_bills(self.cfg, self._killed[1])
                self._resume()
            except OSError as e:  # the resume scan repairs files: a read-only or full disk
                raise StoreError(f"{self.root}: cannot prepare the run folder: {e}") from None
            await self.budget.start(self.elsewhere)
            record_datasets(self.store.layout.run_json, self._dataset_totals())
            with tuned_gc():
                outcome = await self._run_backends()
        finally:
            if self.requests.parked:
                outcome.message = "; ".join(filter(None, [outcome.message,
                                                          self._write_parked()]))
            try:
                await self.budget.end()
                self.store.close()
                if started:
                    record_datasets(self.store.layout.run_json, self._dataset_totals())
                    end_session(self.store.layout.run_json, self.session, outcome.status,
                                self._summary())
            except StoreError as e:  # the run's own error (full disk...) is the one to show
                log.error("%s; run.json not updated for this session", e)
                if outcome.status != "failed":
                    outcome = Outcome("failed", str(e))
            finally:
                lock.release()
        outcome.counters = self.counters
        return outcome

    def _check_template(self) -> None:
        """The format's prompts against the model's own chat template, among the run's
        opening lines when they differ (a warning: a format can differ on purpose), and kept
        with the session, where `draftgen status` and the report read it."""
        found = template_check(self.plan.fmt)
        if found is None:
            return
        if found.warning:
            log.warning("%s", found.warning)
        record_session(self.store.layout.run_json, self.session,
                       template_check=msgspec.to_builtins(found))

    async def _run_backends(self) -> Outcome:
        try:
            async with ManagedServers(self.cfg.backends, run_dir=self.root,
                                      max_tokens=self.cfg.sampling.max_tokens) as configs:
                backends = [make_backend(b, self.cfg.model, self.cfg.sampling) for b in configs]
                share_answer_bytes(backends)
                for backend in backends:
                    backend.use_vocabulary(self.plan.tokenizer)
                await self._run_with(backends)
        except (ManagedServerError, BackendNotReady) as e:
            self.state.fail(str(e), stop=False)
        return self._outcome()

    async def _run_with(self, backends: list[Backend]) -> None:
        tasks: list[asyncio.Task[None]] = []
        self._install_signal_handlers()
        try:
            if self.dispatcher.out_of_space() or not await self._start_up(backends):
                return
            # The fast encoder, started by `prepare`, is built while the prompts are read, the
            # run folder is scanned and the backends start; the first request waits for it.
            await asyncio.to_thread(self.plan.tokenizer.warm_up)
            display = ProgressDisplay(self.counters, live=self.live_display)
            tasks = [asyncio.create_task(display.run()),
                     asyncio.create_task(self._stop_when_unreachable())]
            try:
                await self._dispatch(BackendSlots(backends, self._unfit, self.state.stopping))
            except NoBackendLeft as e:
                if self.state.budget_stop:
                    log.warning("%s", self.state.budget_stop)
                else:
                    self.state.fail(str(e), stop=False)
        finally:
            self._remove_signal_handlers()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for b in backends:
                await b.close()

    async def _stop_when_unreachable(self) -> None:
        """Stop the run (failed, nothing new sent) once every attempt of it has failed for
        want of a connection for `unreachable_stop_s`, with each backend's URL and last error:
        the prompts that reached no server stay pending for the next run."""
        limit = self.cfg.unreachable_stop_s
        watch = self.counters.connections
        while watch.down_for() < limit:
            await asyncio.sleep(min(1.0, max(limit - watch.down_for(), 0.05)))
        line = (f"no backend reachable for {watch.down_for():.0f}s (unreachable_stop_s "
                f"{limit:g}): {watch.summary()}; stopped, the prompts not answered stay "
                "pending for the next run")
        log.error("%s", line)
        self.state.fail(line)

    async def _dispatch(self, slots: BackendSlots) -> None:
        await self.dispatcher.run(slots)

    async def _start_up(self, backends: list[Backend]) -> bool:
        """Start the backends (a fleet may be waited for), price them, probe them. A stop asked
        meanwhile cancels all this and the run ends having sent nothing (False), as does a
        probe that leaves no backend."""
        try:
            return (await self.state.stopping.race(self._start_backends(backends))
                    and self.state.sending)
        except Stopped:
            return False

    async def _start_backends(self, backends: list[Backend]) -> bool:
        """Start the backends; with prompts to send, a server that cannot be reached is
        BackendUnreachable, before its price or the probe is asked (one line, naming each and
        why)."""
        for b in backends:
            await b.start()
        if self._may_send():
            await all_reachable(b.check_reachable() for b in backends)
        await self._resolve_prices(backends)
        refuse_impossible_rate(self.cfg, self.prices, self.ledger.usd_per_minute)
        refuse_unaffordable_answer(self.cfg, self.prices, self.ledger.min_request_tokens)
        return await self._probe_gate(backends)

    def _may_send(self) -> bool:
        """A prompt is queued in a dataset whose token budget may still admit it (a session
        with none sends nothing, and needs no server)."""
        return any(queue and not self.ledger.token_budget_done(name)
                   for name, queue in self.queues.items())

    def _outcome(self) -> Outcome:
        outcome = self.state.outcome(prompts_left=any(self.queues.values()))
        if outcome.status == "budget":
            for name, queue in self.queues.items():
                self.counters.datasets[name].skipped += turns_queued(queue)
                queue.clear()
        self.counters.status = outcome.status
        return outcome

    # ---- stopping ------------------------------------------------------------------------

    def request_stop(self, now: bool = False) -> None:
        """A stop (SIGINT, SIGTERM, `draftgen stop`): no new request, and every wait under way
        ends (`RunState.stopping`); `now`, or a second stop, also drops those in flight."""
        if now or not self.state.sending:
            self.state.abort()
            self.counters.status = "aborting"
            self.dispatcher.cancel_all()
            return
        self.state.stop()
        self.counters.status = "stopping (waiting for requests in flight; Ctrl-C again aborts)"
        log.warning("stop requested: no new requests; waiting for %d in flight",
                    len(self.dispatcher.tasks))

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self.request_stop)
            loop.add_signal_handler(signal.SIGTERM, self.request_stop)
            loop.add_signal_handler(signal.SIGUSR1, lambda: self.request_stop(now=True))

    def _remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)

    # ---- what the session leaves ---------------------------------------------------------

    def _dataset_totals(self) -> dict[str, dict[str, Any]]:
        out = {}
        for ds in self.plan.datasets:
            c = self.counters.datasets.get(ds.name)
            out[ds.name] = {
                "total": len(ds.prompts), "rows": ds.load.rows, "bad_rows": ds.load.bad_rows,
                "duplicates": ds.load.duplicates,
                "skipped_budget": c.skipped if c else 0,
                "out_of_attempts": c.exhausted if c else 0,
            }
        return out

    def _write_parked(self) -> str:
        """Write the answers the run folder would not take to a rescue file; what became of
        them, for the run's closing message."""
        parked = self.requests.parked
        name = f"session-{self.session}-{time.strftime('%Y%m%dT%H%M%S')}"
        path, errors = write_rescue(self.store.layout, parked, name)
        for error in errors:
            log.warning("rescue file not written in %s", error)
        if path is None:  # paid for and on no disk: later sessions must still count them
            self.requests.unsettled_usd += sum(r.cost_usd for r in parked)
            return (f"{len(parked)} answers in flight could not be written anywhere "
                    "and are lost (their cost counts as spent in later sessions too)")
        self._rescue_file = path
        return (f"{len(parked)} answers in flight kept in {path}; the next run of this "
                "config adds them")

    def _summary(self) -> dict[str, Any]:
        t = self.counters.total()
        requests = self.requests
        return {"done_now": t.done, "failed_now": t.failed, "done_total": t.done_before + t.done,
                "skipped_budget": t.skipped, "total": t.total,
                "output_tokens_now": t.output_tokens, "cost_usd_now": round(t.cost, 6),
                "cost_usd_total": round(t.cost + t.cost_before, 6),
                "unsettled_usd": round(requests.unsettled_usd, 6),
                **({"cost_reports_refused": requests.refused_reports}
                   if requests.refused_reports else {}),
                **({"cost_reports_implausible": requests.implausible_reports}
                   if requests.implausible_reports else {}),
                **({"rescued": len(requests.parked), "rescue_file": str(self._rescue_file)}
                   if requests.parked else {})}


def _check_paid_price(backend: Backend, price: Price | None) -> None:
    """A dollar budget needs a paid backend's true price: none known, or one too small to be
    a paid API's, would let it spend without counting."""
    where = "configured" if backend.cfg.price else "listed by the endpoint"
    if price is None:
        raise ConfigError(
            f"backend {backend.name!r}: no price known for a paid backend, so budget.usd "
            "cannot be enforced; set backends[].price: {prompt: ..., completion: ...} "
            "(USD per million tokens)")
    if backend.cfg.is_paid and too_small(price):
        raise ConfigError(
            f"backend {backend.name!r}: price {{prompt: {price.prompt:g}, completion: "
            f"{price.completion:g}}} USD per million tokens ({where}) is below what any paid "
            "API charges, so the dollar budget would not count its bill; give its real price "
            "(backends[].price, per million tokens), or `paid: false` if it is free")
