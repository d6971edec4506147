"""`draftgen run`: datasets → scheduler → backends → format → store, crash-safe and resumable.

Every answer is appended to its dataset's responses.jsonl as soon as it arrives; re-running
on the same folder skips completed IDs, retries failed ones (up to `max_attempts`), and cuts a
torn last line left by a kill. Every request is journaled when sent and when it ends, so the
requests in flight at any stop are known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftgen.audit.checks import routing_problems
from draftgen.backends import Backend, BackendNotReady, capabilities_of, make_backend
from draftgen.backends.base import ON_GENERATION_ID
from draftgen.backends.managed_llamacpp import ManagedServerError, ManagedServers
from draftgen.budget import (
    REPORT_REFUSED,
    REPORTED_COST_RATIO,
    Admission,
    Ledger,
    Reservation,
    answer_cost,
    believable,
)
from draftgen.config import ConfigError, Price, RunConfig
from draftgen.datasets import DatasetError, LoadStats, PromptTable, load_prompt_table
from draftgen.formats import Format, FormatError, get_format
from draftgen.perf import tuned_gc
from draftgen.probe import ProbeOptions, gate_backends
from draftgen.progress import DatasetCounters, ProgressDisplay, RunCounters
from draftgen.redact import redact
from draftgen.scale.leases import (
    POLL_S,
    USD,
    BudgetPool,
    ShardLease,
    run_totals,
    spend_of,
    tokens_key,
)
from draftgen.scale.shards import ShardSpec, claim_run_folder, run_folders, shard_mask
from draftgen.scheduler import (
    BackendSlots,
    NoBackendFits,
    NoBackendLeft,
    needs_of,
    send_with_retries,
)
from draftgen.store import RunLayout, RunLock, Store, StoreError, scan_dataset
from draftgen.store.journal import OpenRequest, read_journal
from draftgen.store.rescue import Rescued, read_rescued, write_rescue
from draftgen.store.resume import (
    DatasetOnDisk,
    DoneIds,
    StoredElsewhere,
    done_elsewhere,
    read_elsewhere,
)
from draftgen.store.runinfo import (
    changed_settings,
    data_settings,
    end_session,
    read_run_json,
    record_datasets,
    record_session,
    recover_run_json,
    session_settings,
    session_unsettled_usd,
    start_session,
)
from draftgen.store.space import SpaceGuard
from draftgen.tokenize import OffLoopBatcher, Tokenizer, load_tokenizer, self_check
from draftgen.types import BackendError, Prompt, RawAnswer, Rebuilt

log = logging.getLogger("draftgen")

RENDER_BATCH = 256
BUDGET_PAUSE = "budget.usd: waiting for requests in flight to settle"
SHARDS_PAUSE = "budget.usd: waiting for other shards to give budget back"
ASK_BILLS_S = 20.0
"""At most this long at start asking OpenRouter what a killed session's requests cost."""
ASK_BILLS_IN_FLIGHT = 32
ASK_BILL_S = 5.0
"""At most this long asking OpenRouter, as the request ends, what an answer it could not read
was billed (else it stays counted at its worst case)."""


@dataclass
class DatasetPlan:
    name: str
    prompts: PromptTable
    """This run's prompts of the dataset (a shard's share when sharded): IDs up front, each
    prompt read when it is about to be sent."""
    load: LoadStats
    """What reading the whole dataset found."""


@dataclass
class Plan:
    cfg: RunConfig
    tokenizer: Tokenizer
    fmt: Format
    run_dir: Path
    """The folder this run writes: `cfg.output_dir`, or the shard's folder inside it."""
    shard: ShardSpec | None = None
    datasets: list[DatasetPlan] = field(default_factory=list)

    def prompts_of(self, dataset: str) -> PromptTable:
        return next(ds.prompts for ds in self.datasets if ds.name == dataset)


def prepare(cfg: RunConfig, shard: ShardSpec | None = None) -> Plan:
    """Load the tokenizer, check it against the format, read every dataset (through the
    prompt cache in output_dir); with `shard`, keep only the shard's prompts. Sends nothing."""
    tokenizer = load_tokenizer(cfg.model.tokenizer)
    tokenizer.warm_up(wait=False)  # built while the run starts: `Runner._run_with` waits
    fmt = get_format(cfg.model.format, tokenizer, cfg.model.format_options)
    self_check(tokenizer, fmt.special_tokens())
    root = Path(cfg.output_dir)
    plan = Plan(cfg=cfg, tokenizer=tokenizer, fmt=fmt, shard=shard,
                run_dir=shard.folder(root) if shard else root)
    caches = RunLayout(root)  # one cache for all shards: it describes the whole dataset
    for ds in cfg.datasets:
        table, stats = load_prompt_table(ds, caches.prompt_cache(ds.name))
        if shard is not None:
            table = table.where(shard_mask(table.id_hashes, shard))
        plan.datasets.append(DatasetPlan(ds.name, table, stats))
    return plan


class SettingsChanged(ConfigError):
    """A resume whose model, format, tokenizer or sampling differ from the run's."""


@dataclass
class Outcome:
    status: str
    """"completed", "budget" (stopped by budget.usd), "stopped", "aborted", or "failed"."""
    message: str = ""
    counters: RunCounters | None = None

    @property
    def exit_code(self) -> int:
        return {"completed": 0, "budget": 0, "stopped": 0, "aborted": 130}.get(self.status, 1)


@dataclass(slots=True)
class BilledAttempts:
    """A request's failed attempts that the endpoint billed, each charged as it ended."""

    usd: float = 0.0
    unknown: list[tuple[str, float]] = field(default_factory=list)
    """Attempts whose answer could not be read, counted at their worst case, with their
    generation ID (OpenRouter) to ask for the real bill."""
    gen: str | None = None
    """The generation ID of the attempt under way, once its headers arrived."""


@dataclass(slots=True)
class Pending:
    dataset: str
    row: int
    """The prompt's row in its dataset's `PromptTable`."""
    prompt: Prompt | None = None
    """Read from the table just before the prompt is rendered."""
    input_ids: list[int] | None = None


class Runner:
    def __init__(self, plan: Plan, *, live_display: bool | None = None,
                 probe: ProbeOptions | None = None, pool: BudgetPool | None = None,
                 accept_changed_settings: bool = False) -> None:
        self.plan = plan
        self.accept_changed_settings = accept_changed_settings
        """Resume even where the settings that define the data changed (`_settings_changes`)."""
        self.probe = probe
        """Probe the backends before the first request (`draftgen run` does; off by default)."""
        self.cfg = plan.cfg
        self.root = plan.run_dir
        self.store = Store(self.root, self.cfg.fsync_interval_s)
        self._space = SpaceGuard(self.root, self.cfg.min_free_mb)
        self.counters = RunCounters()
        self.live_display = live_display
        self.queues: dict[str, deque[Pending]] = {}
        self.ledger = Ledger(usd=self.cfg.budget.usd, usd_per_minute=self.cfg.budget.usd_per_minute)
        self.lease = ShardLease.for_run(self.cfg, plan.shard, self.ledger, pool)
        """A shard's lease on the run's shared budget (`pool`, by default the run folder's
        file pool); None for unsharded runs."""
        self.elsewhere: list[StoredElsewhere] = []
        """What the run's other folders (other shards, the unsharded root) hold, read once by
        the resume scan."""
        self.prices: dict[str, Price | None] = {}
        self.session = 0
        self._next_dataset = 0
        self._stopping = False
        self._aborting = False
        self._starting: asyncio.Future[bool] | None = None
        self._fatal: str | None = None
        self._budget_stop: str | None = None
        self._unsettled_usd = 0.0
        """What this session's paid requests with no answer on disk may have cost: the worst
        case of those that ended with no known bill, the bill of answers no disk would take."""
        self._parked: list[dict[str, Any]] = []
        """Answers the run folder would not take (write failed): written to a rescue file
        when the session ends (store.rescue)."""
        self._rescue_file: Path | None = None
        self._killed: tuple[int, list[OpenRequest]] | None = None
        """The last session, when it was killed (`_killed_session`)."""
        self._bills: dict[str, float] = {}
        self._refused_reports = 0
        """Answers and billed failures whose reported cost was not believed (`answer_cost`)."""
        """What the endpoint billed for the killed session's requests, by generation ID."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._unfit: dict[str, frozenset[str]] = {}
        """Backend name -> the prompts it must not be sent (the probe's `Gate.unfit`)."""
        self._unserved: set[str] = set()
        """Why prompts were left unsent (`_leave_unsent`), each logged once."""
        self._rebuild = OffLoopBatcher(
            self._rebuild_batch, max_batch=128,
            in_thread=lambda: plan.tokenizer.batches_gain_from_a_thread)

    def _rebuild_batch(self, items: list[tuple[RawAnswer, Prompt]]) -> list[Rebuilt]:
        return self.plan.fmt.rebuild_batch([raw for raw, _ in items], [p for _, p in items])

    async def _rebuilt(self, raw: RawAnswer, prompt: Prompt) -> Rebuilt:
        """The answer's token IDs; an answer the model format cannot lay out is a bad answer
        (a failed request, billed), not a bug."""
        try:
            return await self._rebuild((raw, prompt))
        except FormatError as e:
            raise BackendError("bad_response", f"the answer does not fit model format "
                               f"{self.plan.fmt.name!r}: {e}", retryable=False,
                               usage=raw.usage) from None

    # ---- set-up ------------------------------------------------------------------------

    def _resume(self) -> None:
        """Queue every prompt not yet answered (here or in another folder of the same run),
        not out of attempts and within its budget."""
        limits = {d.name: d for d in self.cfg.datasets}
        self.elsewhere = elsewhere = [read_elsewhere(f) for f in self._other_run_folders()]
        done_here: dict[str, DoneIds] = {}
        rescued = read_rescued(self.store.layout)
        for ds in self.plan.datasets:
            ds.prompts.save_cache()
            _warn_bad_rows(ds)
            theirs = done_elsewhere(elsewhere, ds.name) if elsewhere else None
            on_disk = self._scan_with_rescued(ds.name, rescued.records.pop(ds.name, []), theirs)
            done_here[ds.name] = on_disk.done
            done = on_disk.done | theirs if theirs else on_disk.done
            counters = DatasetCounters(total=len(ds.prompts))
            counters.output_tokens_before = on_disk.output_tokens
            queue = self._queue_of(ds.prompts, done, on_disk, counters)
            self._cut_to_max_prompts(queue, ds.prompts, limits[ds.name].max_prompts, counters)
            self.queues[ds.name] = queue
            self.counters.datasets[ds.name] = counters
            self.ledger.add_dataset(ds.name, limits[ds.name].max_output_tokens,
                                    spent_tokens=on_disk.output_tokens)
            counters.cost_before = on_disk.cost + on_disk.cost_not_kept
            self.ledger.add_spent(counters.cost_before)
            if counters.done_before or counters.exhausted:
                log.info("%s: resuming: %d done, %d out of attempts, %d to go", ds.name,
                         counters.done_before, counters.exhausted, len(queue))
        if elsewhere and self.lease is None:
            self._count_spend_elsewhere(elsewhere)
        self.ledger.add_spent(self._unsettled_before(done_here))
        self._drop_rescue_files(rescued, {ds.name for ds in self.plan.datasets})

    def _scan_with_rescued(self, dataset: str, rescued: list[dict[str, Any]],
                           theirs: DoneIds | None) -> DatasetOnDisk:
        """The dataset's folder as the resume scan reads it, once the answers an earlier
        session could not write (store.rescue) are appended, less any the run already has
        here or in `theirs` (its other folders)."""
        on_disk, _ = scan_dataset(self.store.layout, dataset)
        if not rescued:
            return on_disk
        done = on_disk.done | theirs if theirs else on_disk.done
        new = list({r["id"]: r for r in rescued if r["id"] not in done}.values())
        if not new:
            return on_disk
        for record in new:
            self.store.append_record(dataset, record)
        self.store.sync()
        log.warning("%s: %d answers an earlier session could not write were added from its "
                    "rescue file", dataset, len(new))
        return scan_dataset(self.store.layout, dataset)[0]

    def _drop_rescue_files(self, rescued: Rescued, added: set[str]) -> None:
        """Delete each rescue file whose records are all in the run now; keep one that holds
        answers of a dataset this config does not have."""
        for path, datasets in rescued.datasets_of.items():
            if datasets <= added:
                path.unlink(missing_ok=True)
            else:
                log.warning("%s holds answers of datasets not in this config (%s): kept until "
                            "a run with them adds them", path, ", ".join(sorted(datasets - added)))

    def _killed_session(self) -> tuple[int, list[OpenRequest]] | None:
        """The last session, when it was killed and its unknown bills are not yet recorded in
        run.json: its index and the requests it left open (sent, never ended)."""
        sessions = read_run_json(self.store.layout.run_json).get("sessions") or []
        tail = read_journal(self.store.layout.journal)
        killed = tail.session
        if killed is not None and killed < min(self.session, len(sessions)) \
                and sessions[killed].get("outcome") is None \
                and "unsettled_usd" not in sessions[killed]:
            return killed, tail.open
        return None

    async def _ask_bills(self, left_open: list[OpenRequest]) -> dict[str, float]:
        """What the endpoints billed for a killed session's paid requests, by generation ID,
        where they were journaled with one and the backend can be asked (OpenRouter). Asked
        once, for at most ASK_BILLS_S; a bill not known by then stays at its worst case."""
        configs = {b.name: b for b in self.cfg.backends if capabilities_of(b).looks_up_bills}
        wanted = [r for r in left_open if r.gen and r.usd and r.backend in configs]
        if not wanted:
            return {}
        by_name = {name: make_backend(configs[name], self.cfg.model, self.cfg.sampling)
                   for name in {r.backend for r in wanted if r.backend}}
        backends = list(by_name.values())
        bills: dict[str, float] = {}
        limit = asyncio.Semaphore(ASK_BILLS_IN_FLIGHT)

        async def ask(req: OpenRequest) -> None:
            async with limit:
                assert req.gen is not None and req.backend is not None
                billed = await by_name[req.backend].billed_usd(req.gen)
            if billed is not None and believable(billed, 0.0, req.usd * REPORTED_COST_RATIO):
                bills[req.gen] = billed

        log.info("asking OpenRouter what the %d requests in flight at the last kill cost",
                 len(wanted))
        try:
            for backend in backends:
                await backend.start()
            asks = [asyncio.ensure_future(ask(r)) for r in wanted]
            _, late = await asyncio.wait(asks, timeout=ASK_BILLS_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        finally:
            for backend in backends:
                await backend.close()
        return bills

    def _unsettled_before(self, done: dict[str, DoneIds]) -> float:
        """What earlier sessions' paid requests may have been billed without an answer on disk
        (aborted, or in flight at a kill): counted as spent. A killed session's share is read
        from the journal (its requests sent and never ended, less those whose answer is on
        disk), each at its bill where the endpoint told it (`_ask_bills`), else at its worst
        case, and kept in run.json."""
        path = self.store.layout.run_json
        if self._killed is not None:
            killed, left_open = self._killed
            open_ = [r for r in left_open if r.id not in done.get(r.dataset or "", DoneIds())]
            known = [self._bills[r.gen] for r in open_ if r.gen in self._bills]
            usd = sum(self._bills.get(r.gen or "", r.usd) for r in open_)
            record_session(path, killed, unsettled_usd=round(usd, 6))
            if usd:
                log.warning("%d paid requests were in flight when session %d was killed: "
                            "%d billed $%.4f as the endpoint reports, the others possibly "
                            "billed, counted at their worst case; $%.4f in all counted against "
                            "budget.usd", sum(r.usd > 0 for r in open_), killed, len(known),
                            sum(known), usd)
        sessions = read_run_json(path).get("sessions") or []
        return sum(map(session_unsettled_usd, sessions[:self.session]))

    def _count_spend_elsewhere(self, elsewhere: list[StoredElsewhere]) -> None:
        """An unsharded run whose run folder also holds shard folders (a run sharded before):
        what they spent counts against the run's budgets, which are the whole run's. (Shards
        count each other's spend through their budget pool.)"""
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

    def _other_run_folders(self) -> list[Path]:
        """The run's other folders (the unsharded root, other shards), whose answers count."""
        own = self.root.resolve()
        return [f for f in run_folders(Path(self.cfg.output_dir)) if f.resolve() != own]

    def _queue_of(self, table: PromptTable, done: DoneIds, on_disk: DatasetOnDisk,
                  counters: DatasetCounters) -> deque[Pending]:
        """The table's prompts still to send, in order; done and exhausted ones counted."""
        is_done = done.mask(table.id_hashes)
        counters.done_before = int(is_done.sum())
        queue: deque[Pending] = deque()
        failed = on_disk.failed_attempts
        for row in np.flatnonzero(~is_done).tolist():
            if failed and failed[table.id_at(row)] >= self.cfg.max_attempts:
                counters.exhausted += 1
            else:
                queue.append(Pending(table.name, row))
        return queue

    def _cut_to_max_prompts(self, queue: deque[Pending], table: PromptTable,
                            room: int | None, counters: DatasetCounters) -> None:
        """Unsharded: at most `room` answers in all. Sharded: the shard sends only its
        prompts among the dataset's first `room` (so the shards together send those)."""
        if room is None:
            return
        if self.plan.shard is None:
            allowed = max(0, room - counters.done_before)
        else:
            allowed = sum(1 for item in queue if table.positions[item.row] < room)
        while len(queue) > allowed:
            queue.pop()
            counters.skipped += 1

    async def _resolve_prices(self, backends: list[Backend]) -> None:
        """Each backend's price: configured, else listed by the endpoint, else 0 for a
        backend that does not bill. A budget with a paid backend of unknown price is an
        error before anything is sent."""
        budgeted = self.cfg.budget.usd is not None or self.cfg.budget.usd_per_minute is not None
        for b in backends:
            price = b.cfg.price or await b.listed_price()
            if price is None and not b.cfg.is_paid:
                price = Price(prompt=0, completion=0)
            if price is None and budgeted:
                raise ConfigError(
                    f"backend {b.name!r}: no price known for a paid backend, so budget.usd "
                    "cannot be enforced; set backends[].price: {prompt: ..., completion: ...} "
                    "(USD per million tokens)"
                )
            self.prices[b.name] = price

    async def _probe_gate(self, backends: list[Backend]) -> bool:
        """With `probe` set: probe the started backends (or reuse run.json's results) and
        remove from `backends` those unsafe for this run's datasets (draftgen.probe.gate).
        False, with the run failed and nothing sent, when none is left."""
        if self.probe is None:
            return True
        gate = await gate_backends(self.plan, backends, self.probe, self.store.layout.run_json,
                                   [s.folder / "run.json" for s in self.elsewhere])
        self.ledger.add_spent(gate.cost_usd)
        self._unfit = gate.unfit
        if gate.refused:
            self._fatal = gate.refused
        return gate.refused is None

    # ---- the run -----------------------------------------------------------------------

    async def execute(self) -> Outcome:
        lock = RunLock(self.store.layout.lock)
        claim_run_folder(Path(self.cfg.output_dir), self.plan.shard, lock)
        if lock.took_over_stale:
            log.warning("%s: previous run did not exit cleanly; resuming", self.root)
        outcome = Outcome("failed", "interrupted")
        started = False
        try:
            recover_run_json(self.store.layout.run_json)
            tokenizer = {"path": str(self.plan.tokenizer.path),
                         "sha256": self.plan.tokenizer.sha256}
            self.session = start_session(self.store.layout.run_json, self.cfg.redacted(),
                                         tokenizer, self._settings_changes(tokenizer))
            started = True
            try:
                self._killed = self._killed_session()
                if self._killed is not None:
                    self._bills = await self._ask_bills(self._killed[1])
                self._resume()
            except OSError as e:  # the resume scan repairs files: a read-only or full disk
                raise StoreError(f"{self.root}: cannot prepare the run folder: {e}") from None
            if self.lease:
                await self.lease.adopt(self.elsewhere)
            record_datasets(self.store.layout.run_json, self._dataset_totals())
            with tuned_gc():
                outcome = await self._run_backends()
        finally:
            if self._parked:
                outcome.message = "; ".join(filter(None, [outcome.message,
                                                          self._write_parked()]))
            try:
                if self.lease:
                    await self.lease.release()
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

    def _settings_changes(self, tokenizer: dict[str, Any]) -> list[str]:
        """How the settings that define the data differ from the run's last session (from
        another folder of the run for a new shard's): refused unless accepted, since answers
        of both would be one run, audited and exported as one."""
        earlier = None
        for folder in (self.root, *self._other_run_folders()):
            earlier = session_settings(read_run_json(RunLayout(folder).run_json))
            if earlier is not None:
                break
        now = data_settings(self.cfg.redacted(), tokenizer)
        changes = changed_settings(earlier, now) if earlier is not None else []
        if changes and not self.accept_changed_settings:
            raise SettingsChanged(
                f"{self.root}: settings that define the data differ from the run's last "
                f"session: {'; '.join(changes)}. Restore them, or use another output_dir, or "
                f"pass --accept-changed-settings to go on (each answer records its session)")
        if changes:
            log.warning("%s: settings changed (accepted): %s", self.root, "; ".join(changes))
        return changes

    async def _run_backends(self) -> Outcome:
        try:
            async with ManagedServers(self.cfg.backends, run_dir=self.root,
                                      max_tokens=self.cfg.sampling.max_tokens) as configs:
                backends = [make_backend(b, self.cfg.model, self.cfg.sampling) for b in configs]
                for backend in backends:
                    backend.use_vocabulary(self.plan.tokenizer)
                await self._run_with(backends)
        except (ManagedServerError, BackendNotReady) as e:
            self._fatal = str(e)
        return self._outcome()

    async def _run_with(self, backends: list[Backend]) -> None:
        display_task: asyncio.Task[None] | None = None
        self._install_signal_handlers()
        try:
            if self._out_of_space() or not await self._start_up(backends):
                return
            # The fast encoder, started by `prepare`, is built while the prompts are read, the
            # run folder is scanned and the backends start; the first request waits for it.
            await asyncio.to_thread(self.plan.tokenizer.warm_up)
            display = ProgressDisplay(self.counters, live=self.live_display)
            display_task = asyncio.create_task(display.run())
            try:
                await self._dispatch(BackendSlots(backends, self._unfit))
            except NoBackendLeft as e:
                if self._budget_stop:
                    log.warning("%s", self._budget_stop)
                else:
                    self._fatal = str(e)
        finally:
            self._remove_signal_handlers()
            if display_task is not None:
                display_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await display_task
            for b in backends:
                await b.close()

    async def _start_up(self, backends: list[Backend]) -> bool:
        """Start the backends (a fleet may be waited for), price them, probe them. A stop asked
        meanwhile cancels all this and the run ends having sent nothing (False), as does a
        probe that leaves no backend."""
        self._starting = asyncio.ensure_future(self._start_backends(backends))
        try:
            return await self._starting and not self._stopping
        except asyncio.CancelledError:
            if not self._stopping:  # cancelled from outside, not by request_stop
                raise
            return False
        finally:
            self._starting = None

    async def _start_backends(self, backends: list[Backend]) -> bool:
        for b in backends:
            await b.start()
        await self._resolve_prices(backends)
        return await self._probe_gate(backends)

    def _outcome(self) -> Outcome:
        if self._fatal:
            status, message = "failed", self._fatal
        elif self._aborting:
            status, message = "aborted", "stopped at once; answers in flight were dropped"
        elif self._stopping:
            status, message = "stopped", "stopped; answers in flight were saved"
        elif self._budget_stop and any(self.queues.values()):
            status, message = "budget", self._budget_stop
            for name, queue in self.queues.items():
                self.counters.datasets[name].skipped += len(queue)
                queue.clear()
        else:
            status, message = "completed", ""
        self.counters.status = status
        return Outcome(status, message)

    # ---- dispatch ------------------------------------------------------------------------

    async def _dispatch(self, slots: BackendSlots) -> None:
        self._slots = slots
        while not self._stopping and not self._out_of_space():
            picked = await self._next_pending()
            if picked is None:
                if not self._tasks:
                    if not self._waiting_for_shards():
                        break
                    await asyncio.sleep(POLL_S)
                    continue
                await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
                continue
            item, max_tokens = picked
            dataset = item.dataset
            assert item.prompt is not None
            try:
                backend = await slots.acquire(needs_of(item.prompt))
            except NoBackendFits as e:
                self._leave_unsent(item, str(e))
                continue
            except NoBackendLeft:
                self.queues[dataset].appendleft(item)
                await self._drain()
                raise
            if self._stopping:
                slots.release(backend)
                self.queues[dataset].appendleft(item)
                break
            assert item.input_ids is not None
            admission = self.ledger.admit(dataset, max_tokens, len(item.input_ids),
                                          self.prices[backend.name])
            self.counters.throttled = self.ledger.throttled
            if admission.reservation is None:
                slots.release(backend)
                self.queues[dataset].appendleft(item)
                if admission.exhausted and self.lease and await self._more_from_pool(admission):
                    continue
                self._hold_back(slots, backend, admission.wait_s, admission.settling)
                continue
            self.counters.datasets[dataset].in_flight += 1
            task = asyncio.create_task(
                self._answer(item, backend, max_tokens, admission.reservation))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await self._drain()

    def _leave_unsent(self, item: Pending, why: str) -> None:
        """A prompt no backend left in the run may be sent: not sent, not failed (a later run
        with a fitting backend answers it); counted as skipped."""
        self.counters.datasets[item.dataset].skipped += 1
        if why not in self._unserved:
            self._unserved.add(why)
            log.warning("%s: such prompts are left unsent for a later run", why)

    def _out_of_space(self) -> bool:
        """The output disk is nearly full (`store.space`): stop sending, as after a write
        failure; what is in flight is still written."""
        shortage = self._space.shortage()
        if shortage is None:
            return False
        log.error("%s", shortage)
        self._fatal = self._fatal or shortage
        self._stopping = True
        return True

    async def _more_from_pool(self, admission: Admission) -> bool:
        """A shard short of dollars asks its pool for more. True to admit again: the lease
        grew, or requests settled while the pool answered (their unpause came too early)."""
        assert self.lease is not None
        in_flight = self.ledger.priced_in_flight
        granted = await self.lease.more_usd(admission.worst_usd, admission.settling)
        return granted or self.ledger.priced_in_flight < in_flight

    def _hold_back(self, slots: BackendSlots, backend: Backend, wait_s: float,
                   settling: bool) -> None:
        """A paid backend that the dollar budget cannot take now: wait for the spend rate,
        wait for requests in flight to settle, or leave the run when the budget is spent."""
        if wait_s > 0:
            slots.pause(backend, wait_s, "budget.usd_per_minute: spend rate reached")
        elif settling:
            slots.pause(backend, math.inf, BUDGET_PAUSE)
        elif self.lease and self.lease.others_busy(USD):
            slots.pause(backend, POLL_S, SHARDS_PAUSE)
        else:
            spent = self.ledger.spent_usd
            whose = "by this shard; the rest is the other shards'" if self.lease else "spent"
            self._budget_stop = (f"budget.usd reached: ${spent:.4f} of "
                                 f"${self.cfg.budget.usd:.4f} {whose}; paid backends stopped")
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
            max_tokens = await self._tokens_for(name)
            if max_tokens is None:
                if self.ledger.token_budget_done(name) and not self._shards_may_give(name):
                    self._close_for_budget(name)
                continue  # requests in flight may still leave room
            self._next_dataset = (self._next_dataset + offset + 1) % len(names)
            while queue and queue[0].input_ids is None:
                if not await self._render_ahead(queue):
                    return None
            if queue:  # empty when the format refused every prompt left
                return queue.popleft(), max_tokens
        return None

    async def _tokens_for(self, dataset: str) -> int | None:
        """`Ledger.max_tokens_for`; a shard first tops its token lease up when the lease would
        cut the request short."""
        full = self.cfg.sampling.max_tokens
        if self.lease and self.ledger.max_tokens_for(dataset, full) != full:
            await self.lease.more_tokens(dataset, full)
        return self.ledger.max_tokens_for(dataset, full)

    def _shards_may_give(self, dataset: str) -> bool:
        """Another shard may still give this dataset's token budget back."""
        return self.lease is not None and self.lease.others_busy(tokens_key(dataset))

    def _waiting_for_shards(self) -> bool:
        return any(queue and self._shards_may_give(name) for name, queue in self.queues.items())

    def _close_for_budget(self, dataset: str) -> None:
        queue = self.queues[dataset]
        counters = self.counters.datasets[dataset]
        counters.skipped += len(queue)
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
                rendered = self._render(prompts)
        except DatasetError as e:
            self._fatal = self._fatal or str(e)
            self._stopping = True
            return False
        for item, prompt, ids in zip(batch, prompts, rendered, strict=True):
            item.prompt = prompt
            if isinstance(ids, FormatError):
                queue.remove(item)
                kind = "prompt_too_long" if isinstance(ids, PromptTooLong) else "bad_prompt"
                self._write_failure(prompt, None, kind, str(ids), None,
                                    self.counters.datasets[item.dataset])
            else:
                item.input_ids = ids
        return True

    def _load_and_render(self, batch: Sequence[Pending]
                         ) -> tuple[list[Prompt], list[list[int] | FormatError]]:
        prompts = self._load(batch)
        return prompts, self._render(prompts)

    def _render(self, prompts: list[Prompt]) -> list[list[int] | FormatError]:
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

    async def _drain(self) -> None:
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    # ---- one request -----------------------------------------------------------------------

    async def _answer(self, item: Pending, backend: Backend, max_tokens: int,
                      reservation: Reservation) -> None:
        prompt, input_ids = item.prompt, item.input_ids or []
        assert prompt is not None, "a prompt is read before it is sent"
        counters = self.counters.datasets[prompt.dataset]
        started = time.monotonic()
        settled = False
        record: dict[str, Any] | None = None
        written = False
        cost = 0.0
        attempts = BilledAttempts()
        try:
            self._journal("sent", prompt, backend=backend.name, max_tokens=max_tokens,
                          **({"usd": round(reservation.usd, 9)} if reservation.usd else {}))
            if reservation.usd and backend.capabilities.looks_up_bills:  # this task's own context
                ON_GENERATION_ID.set(lambda generation: self._on_generation_id(
                    prompt, attempts, generation))
            raw, retries = await send_with_retries(
                backend, prompt, input_ids, max_tokens,
                on_error=lambda e: self._on_attempt_error(e, backend, reservation, attempts,
                                                          counters))
            await self._learn_bills(backend, attempts, counters)
            rebuilt = await self._rebuilt(raw, prompt)
            cost, source = self._cost(
                backend, raw.usage.cost, raw.usage.prompt_tokens or len(input_ids),
                raw.usage.completion_tokens or len(rebuilt.output_ids))
            record = make_record(prompt, input_ids, raw, rebuilt, backend, cost + attempts.usd,
                                 time.monotonic() - started, retries, cost_source=source,
                                 session=self.session)
            self.store.append_record(prompt.dataset, record)
            written = True
            self.ledger.settle(reservation, len(rebuilt.output_ids), cost)
            settled = True
            self._journal("ok", prompt)
            self._slots.note_result(backend, failed=False)
            self._count_answer(counters, raw, rebuilt, cost)
        except BackendError as e:
            await self._learn_bills(backend, attempts, counters)
            self.ledger.settle(reservation, 0, 0.0)  # its billed attempts are charged already
            settled = True
            self._on_failure(item, backend, e, counters, attempts.usd)
        except StoreError as e:
            if not self._fatal:  # once, not once per answer in flight
                log.error("%s; stopping dispatch, everything written so far is kept", e)
            self._fatal = self._fatal or str(e)
            self._stopping = True
            if record is not None and not written:  # paid for: kept for a rescue file
                self._parked.append(record)
                self.ledger.settle(reservation, len(record["output_ids"]), cost)
                settled = True
                counters.cost += cost
        except asyncio.CancelledError:
            self._journal_quietly("dropped", prompt, reason="aborted")
            raise
        except Exception as e:  # a bug must not take the other 1,999 requests down with it
            log.exception("%s: unexpected error", prompt.id)
            self._write_failure(prompt, backend, "internal_error", f"{type(e).__name__}: {e}",
                                None, counters)
        finally:
            if not settled:
                # Unknown outcome (aborted mid-stream, write failed): keep the worst case
                # counted as spent, never less.
                self.ledger.settle(reservation, reservation.tokens, reservation.usd)
                self._unsettled_usd += reservation.usd + attempts.usd
            counters.in_flight -= 1
            self._slots.release(backend)
            if reservation.usd:
                self._slots.unpause(BUDGET_PAUSE)

    def _cost(self, backend: Backend, reported: float | None, prompt_tokens: int,
              completion_tokens: int) -> tuple[float, str]:
        """The reported cost where the backend gives a believable one, else priced by the
        backend (`budget.answer_cost`); and where the figure comes from."""
        price = self.prices.get(backend.name)
        priced = price.cost(prompt_tokens, completion_tokens) if price else None
        cost, source = answer_cost(reported, priced)
        if source == REPORT_REFUSED:
            if not self._refused_reports:
                log.warning("%s reported usage.cost %r for an answer priced $%.6f: not "
                            "believed; counted at its price (cost_source %r; status counts "
                            "them)", backend.name, reported, cost, REPORT_REFUSED)
            self._refused_reports += 1
        return cost, source

    def _billed(self, backend: Backend, e: BackendError, worst_usd: float) -> float:
        """What a failed attempt may have cost: its usage where the error carries it; its worst
        case where the endpoint accepted it and its answer could not be read."""
        if e.usage is not None:
            return self._cost(backend, e.usage.cost, e.usage.prompt_tokens or 0,
                              e.usage.completion_tokens or 0)[0]
        return worst_usd if e.billed_unknown else 0.0

    def _on_generation_id(self, prompt: Prompt, attempts: BilledAttempts, gen: str) -> None:
        attempts.gen = gen
        self._journal_quietly("gen", prompt, gen=gen)

    def _on_attempt_error(self, e: BackendError, backend: Backend, reservation: Reservation,
                          attempts: BilledAttempts, counters: DatasetCounters) -> None:
        """Each failed attempt: the backend's health, and the attempt's bill charged at once.
        No retry once the budget cannot hold the request's reservation beside what it spent."""
        self._slots.note_result(backend, failed=e.retryable)
        billed = self._billed(backend, e, reservation.usd)
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

    async def _learn_bills(self, backend: Backend, attempts: BilledAttempts,
                           counters: DatasetCounters) -> None:
        """Attempts counted at their worst case (answers that could not be read): where the
        endpoint tells what it billed (OpenRouter's generation lookup, ASK_BILL_S at most),
        that believable bill replaces the worst case."""
        for gen, counted in attempts.unknown:
            try:
                billed = await asyncio.wait_for(backend.billed_usd(gen), ASK_BILL_S)
            except TimeoutError:
                billed = None
            if billed is None or not believable(billed, 0.0, counted * REPORTED_COST_RATIO):
                continue
            self.ledger.correct(counted, billed)
            attempts.usd += billed - counted
            counters.cost += billed - counted
        attempts.unknown.clear()

    def _count_answer(self, counters: DatasetCounters, raw: RawAnswer, rebuilt: Rebuilt,
                      cost: float) -> None:
        counters.done += 1
        counters.output_tokens += len(rebuilt.output_ids)
        counters.reasoning_tokens += raw.usage.reasoning_tokens or 0
        counters.cost += cost
        counters.truncated += raw.finish_reason == "length"
        counters.not_exact += rebuilt.token_check != "exact"

    def _on_failure(self, item: Pending, backend: Backend, e: BackendError,
                    counters: DatasetCounters, billed_usd: float = 0.0) -> None:
        assert item.prompt is not None
        if e.permanent_for_backend:
            # Not the prompt's fault: give it to another backend.
            self._slots.disable(backend, str(e))
            self.queues[item.dataset].appendleft(item)
            self._journal_quietly("dropped", item.prompt, reason=e.kind)
            return
        self._write_failure(item.prompt, backend, e.kind, e.message, e.status, counters,
                            billed_usd)

    def _write_failure(self, prompt: Prompt, backend: Backend | None, kind: str, message: str,
                       status: int | None, counters: DatasetCounters,
                       billed_usd: float = 0.0) -> None:
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
            self._fatal = str(err)
            self._stopping = True

    def _journal(self, event: str, prompt: Prompt, **extra: Any) -> None:
        self.store.journal({"ev": event, "id": prompt.id, "dataset": prompt.dataset,
                            "t": round(time.time(), 3), "session": self.session, **extra})

    def _journal_quietly(self, event: str, prompt: Prompt, **extra: Any) -> None:
        with contextlib.suppress(StoreError):
            self._journal(event, prompt, **extra)

    # ---- stopping ------------------------------------------------------------------------

    def request_stop(self, now: bool = False) -> None:
        if self._starting is not None:  # nothing of the run sent yet: stop starting
            self._starting.cancel()
        if now or self._stopping:
            self._aborting = True
            self._stopping = True
            self.counters.status = "aborting"
            for task in list(self._tasks):
                task.cancel()
            return
        self._stopping = True
        self.counters.status = "stopping (waiting for requests in flight; Ctrl-C again aborts)"
        log.warning("stop requested: no new requests; waiting for %d in flight",
                    len(self._tasks))

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
        name = f"session-{self.session}-{time.strftime('%Y%m%dT%H%M%S')}"
        path, errors = write_rescue(self.store.layout, self._parked, name)
        for error in errors:
            log.warning("rescue file not written in %s", error)
        if path is None:  # paid for and on no disk: later sessions must still count them
            self._unsettled_usd += sum(r["cost_usd"] for r in self._parked)
            return (f"{len(self._parked)} answers in flight could not be written anywhere "
                    "and are lost (their cost counts as spent in later sessions too)")
        self._rescue_file = path
        return (f"{len(self._parked)} answers in flight kept in {path}; the next run of this "
                "config adds them")

    def _summary(self) -> dict[str, Any]:
        t = self.counters.total()
        return {"done_now": t.done, "failed_now": t.failed, "done_total": t.done_before + t.done,
                "skipped_budget": t.skipped, "total": t.total,
                "output_tokens_now": t.output_tokens, "cost_usd_now": round(t.cost, 6),
                "cost_usd_total": round(t.cost + t.cost_before, 6),
                "unsettled_usd": round(self._unsettled_usd, 6),
                **({"cost_reports_refused": self._refused_reports}
                   if self._refused_reports else {}),
                **({"rescued": len(self._parked), "rescue_file": str(self._rescue_file)}
                   if self._parked else {})}


def _warn_bad_rows(ds: DatasetPlan, shown: int = 10) -> None:
    """Rows skipped while reading a dataset: the first `shown` named by file and line."""
    for bad in ds.load.examples[:shown]:
        log.warning("%s: bad row %s: %s (skipped)", ds.name, bad.source, bad.reason)
    if ds.load.bad_rows > shown:
        log.warning("%s: %d more bad rows skipped", ds.name, ds.load.bad_rows - shown)
    if not ds.prompts:
        log.warning("%s: no prompts to send (%s)", ds.name, ds.load.summary())


def render_each(fmt: Format, prompts: list[Prompt]) -> list[list[int] | FormatError]:
    """Prompt IDs for a batch; a prompt the format refuses gets its FormatError instead."""
    try:
        return list(fmt.render_prompts(prompts))
    except FormatError:
        pass
    out: list[list[int] | FormatError] = []
    for prompt in prompts:
        try:
            out.append(fmt.render_prompt(prompt.messages, prompt.tools))
        except FormatError as e:
            out.append(FormatError(f"{prompt.source or prompt.id}: {e}"))
    return out


class PromptTooLong(FormatError):
    """A prompt that leaves no room for an answer within `model.context_length`."""


def render_within(fmt: Format, prompts: list[Prompt], context_length: int | None
                  ) -> list[list[int] | FormatError]:
    """`render_each`; with a context length, a prompt that leaves no room for one answer token
    gets a `PromptTooLong` instead. A prompt whose text alone is certainly too long (a token
    covers at most the tokenizer's longest token's bytes) is refused without tokenizing it:
    tokenizing 100 MB of text would take minutes."""
    if context_length is None:
        return render_each(fmt, prompts)
    out: list[list[int] | FormatError] = [FormatError("not rendered")] * len(prompts)
    todo: list[int] = []
    longest = 0
    for i, prompt in enumerate(prompts):
        chars = sum(len(m["content"]) for m in prompt.messages
                    if isinstance(m.get("content"), str))
        if chars > context_length:
            longest = longest or max(map(len, fmt.tokenizer.bytes_to_id()), default=1)
            if chars > 2 * longest * context_length:  # 2: room for any normalizer
                out[i] = PromptTooLong(
                    f"{prompt.source or prompt.id}: prompt of {chars:,} characters is longer "
                    f"than model.context_length ({context_length:,} tokens); not sent")
                continue
        todo.append(i)
    rendered = render_each(fmt, [prompts[i] for i in todo])
    for i, ids in zip(todo, rendered, strict=True):
        if not isinstance(ids, FormatError) and len(ids) + 1 > context_length:
            ids = PromptTooLong(
                f"{prompts[i].source or prompts[i].id}: prompt of {len(ids):,} tokens leaves "
                f"no room for an answer in model.context_length ({context_length:,}); not sent")
        out[i] = ids
    return out


def make_record(prompt: Prompt, input_ids: list[int], raw: RawAnswer, rebuilt: Rebuilt,
                backend: Backend, cost: float, latency_s: float, retries: int, *,
                cost_source: str, session: int | None = None) -> dict[str, Any]:
    """One line of responses.jsonl ("id" first, for people reading the file). `cost`: the
    answer's and its billed failed attempts'."""
    flags = list(rebuilt.flags)
    if raw.prompt_ids is not None and raw.prompt_ids != input_ids:
        flags.append("prompt_ids_differ_from_engine")
        input_ids = raw.prompt_ids  # what the engine actually saw
    served_by = {"provider": raw.provider, "quantization": raw.quantization}
    routing = backend.cfg.provider_routing
    flags.extend(f"{p}_by_config" for p in routing_problems(served_by, routing))
    record: dict[str, Any] = {
        "id": prompt.id,
        "dataset": prompt.dataset,
        "messages": prompt.messages,
    }
    if prompt.tools:
        record["tools"] = prompt.tools
    record.update({
        "input_ids": input_ids,
        "output_ids": rebuilt.output_ids,
        "token_source": rebuilt.token_source,
        "token_check": rebuilt.token_check,
        "flags": flags,
        "reasoning": rebuilt.reasoning,
        "content": rebuilt.content,
        "tool_calls": rebuilt.tool_calls,
        "finish_reason": raw.finish_reason,
        "backend": backend.name,
        "provider": raw.provider,
        "quantization": raw.quantization,
        "model": raw.model,
        "usage": raw.usage.as_dict(),
        "cost_usd": round(cost, 8),
        "cost_source": cost_source,
        "request_id": raw.request_id,
        "latency_s": round(latency_s, 3),
        "retries": retries,
        "created_at": round(time.time(), 3),
    })
    if session is not None:
        record["session"] = session  # which of run.json's sessions (and settings) wrote it
    return record
