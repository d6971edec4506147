"""A session's start on its run folder: the settings check, the resume scan (what is done here
or in the run's other folders, what is out of attempts, what is left to send), the answers an
earlier session could not write (rescue files), and what earlier sessions may have spent
without an answer on disk (a killed session's open requests, at their bills where known)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from draftgen.backends import capabilities_of, make_backend
from draftgen.budget import Budget, is_cost
from draftgen.config import ConfigError, RunConfig
from draftgen.datasets import PromptTable
from draftgen.progress import DatasetCounters, RunCounters
from draftgen.run.changed import changed_prompts, read_answered, reask
from draftgen.run.pending import Pending
from draftgen.run.plan import DatasetPlan, Plan, warn_bad_rows
from draftgen.run.turns import (
    Formats,
    is_done,
    start_conversation,
    turn_id,
    written_turns,
)
from draftgen.store import RunLayout, Store, scan_dataset
from draftgen.store.journal import OpenRequest, read_journal
from draftgen.store.record import Record
from draftgen.store.rescue import Rescued, read_rescued
from draftgen.store.runjson import changed_settings, read_run_info
from draftgen.store.runjson_writer import data_settings, record_session
from draftgen.store.scan import (
    DatasetOnDisk,
    DoneIds,
    StoredElsewhere,
    done_elsewhere,
    read_elsewhere,
)
from draftgen.store.shards import run_folders

log = logging.getLogger("draftgen")

ASK_BILLS_S = 20.0
"""At most this long at start asking OpenRouter what a killed session's requests cost."""
ASK_BILLS_IN_FLIGHT = 32

Queues = dict[str, deque[Pending]]


class SettingsChanged(ConfigError):
    """A resume whose model, format, tokenizer or sampling differ from the run's."""


def other_run_folders(cfg: RunConfig, own: Path) -> list[Path]:
    """The run's other folders (the unsharded root, other shards), whose answers count."""
    own = own.resolve()
    return [f for f in run_folders(Path(cfg.output_dir)) if f.resolve() != own]


def settings_changes(cfg: RunConfig, root: Path, tokenizer: dict[str, Any], *,
                     accept: bool) -> list[str]:
    """How the settings that define the data differ from the run's last session (from
    another folder of the run for a new shard's): refused unless accepted, since answers
    of both would be one run, audited and exported as one."""
    earlier = None
    for folder in (root, *other_run_folders(cfg, root)):
        earlier = read_run_info(RunLayout(folder).run_json).settings_of()
        if earlier is not None:
            break
    now = data_settings(cfg.redacted(), tokenizer)
    changes = changed_settings(earlier, now) if earlier is not None else []
    if changes and not accept:
        raise SettingsChanged(
            f"{root}: settings that define the data differ from the run's last "
            f"session: {'; '.join(changes)}. Restore them, or use another output_dir, or "
            f"pass --accept-changed-settings to go on (each answer records its session)")
    if changes:
        log.warning("%s: settings changed (accepted): %s", root, "; ".join(changes))
    return changes


KilledSession = tuple[int, list[OpenRequest]]
"""A killed session's index and the requests it left open (sent, never ended)."""


def killed_session(store: Store, session: int) -> KilledSession | None:
    """The last session before `session`, when it was killed and its unknown bills are not
    yet recorded in run.json."""
    sessions = read_run_info(store.layout.run_json).sessions
    tail = read_journal(store.layout.journal)
    killed = tail.session
    if killed is not None and killed < min(session, len(sessions)) \
            and sessions[killed].outcome is None \
            and sessions[killed].unsettled_usd is None:
        return killed, tail.open
    return None


async def ask_bills(cfg: RunConfig, left_open: list[OpenRequest]) -> dict[str, float]:
    """What the endpoints billed for a killed session's paid requests, by generation ID,
    where they were journaled with one and the backend can be asked (OpenRouter). Asked
    once, for at most ASK_BILLS_S; a bill not known by then stays at its worst case."""
    configs = {b.name: b for b in cfg.backends if capabilities_of(b).looks_up_bills}
    wanted = [r for r in left_open if r.gen and r.usd and r.backend in configs]
    if not wanted:
        return {}
    by_name = {name: make_backend(configs[name], cfg.model, cfg.sampling)
               for name in {r.backend for r in wanted if r.backend}}
    backends = list(by_name.values())
    bills: dict[str, float] = {}
    limit = asyncio.Semaphore(ASK_BILLS_IN_FLIGHT)

    async def ask(req: OpenRequest) -> None:
        async with limit:
            assert req.gen is not None and req.backend is not None
            billed = await by_name[req.backend].billed_usd(req.gen)
        if is_cost(billed):  # the provider's bill, whether above or below the worst case
            assert billed is not None
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


class ResumeScan:
    """Queue every prompt not yet answered (here or in another folder of the same run), not
    out of attempts and within its budget; count what is done and spent."""

    def __init__(self, plan: Plan, store: Store, budget: Budget, counters: RunCounters,
                 session: int, *, reask_changed: bool = False) -> None:
        self.plan = plan
        self.reask_changed = reask_changed
        """Ask again the answered prompts whose row changed under the same ID (`run.changed`)."""
        self.changed: dict[str, int] = {}
        """Per dataset, the answered prompts found changed (re-asked with `reask_changed`)."""
        self.cfg = plan.cfg
        self.store = store
        self.budget = budget
        self.ledger = budget.ledger
        self.counters = counters
        self.session = session
        self._formats: Formats | None = None

    def run(self, queues: Queues, killed: KilledSession | None = None,
            bills: dict[str, float] | None = None) -> list[StoredElsewhere]:
        """Fill `queues`; what the run's other folders hold (read once, here)."""
        limits = {d.name: d for d in self.cfg.datasets}
        elsewhere = [read_elsewhere(f) for f in other_run_folders(self.cfg, self.store.layout.root)]
        done_here: dict[str, DoneIds] = {}
        rescued = read_rescued(self.store.layout)
        for ds in self.plan.datasets:
            ds.prompts.save_cache()
            warn_bad_rows(ds)
            theirs = done_elsewhere(elsewhere, ds.name) if elsewhere else None
            if ds.conversations is None and (self.reask_changed or not ds.prompts.from_cache):
                self._changed_prompts(ds)  # a dataset read from its cache did not change
            on_disk = self._scan_with_rescued(ds.name, rescued.records.pop(ds.name, []), theirs)
            done_here[ds.name] = on_disk.done
            done = on_disk.done | theirs if theirs else on_disk.done
            counters = DatasetCounters(total=len(ds.prompts))
            counters.output_tokens_before = on_disk.output_tokens
            if ds.conversations is not None:
                queue = self._queue_conversations(ds, on_disk, counters,
                                                  limits[ds.name].max_prompts)
            else:
                queue = self._queue_of(ds.prompts, done, on_disk, counters)
                self._cut_to_max_prompts(queue, ds.prompts, limits[ds.name].max_prompts,
                                         counters)
            queues[ds.name] = queue
            self.counters.datasets[ds.name] = counters
            self.ledger.add_dataset(ds.name, limits[ds.name].max_output_tokens,
                                    spent_tokens=on_disk.output_tokens)
            counters.cost_before = on_disk.cost + on_disk.cost_not_kept
            self.ledger.add_spent(counters.cost_before)
            if counters.done_before or counters.exhausted:
                log.info("%s: resuming: %d done, %d out of attempts, %d to go", ds.name,
                         counters.done_before, counters.exhausted, len(queue))
        if self.changed:
            record_session(self.store.layout.run_json, self.session,
                           changed_prompts=dict(self.changed),
                           **({"reasked_changed": True} if self.reask_changed else {}))
        if elsewhere:
            self.budget.count_spend_elsewhere(elsewhere)
        self.ledger.add_spent(self._unsettled_before(done_here, killed, bills or {}))
        self._drop_rescue_files(rescued, {ds.name for ds in self.plan.datasets})
        return elsewhere

    def _changed_prompts(self, ds: DatasetPlan) -> None:
        """Count the answered prompts of the dataset whose row changed under the same ID; with
        `reask_changed`, move their answers to quarantine.jsonl so that the scan queues them."""
        layout = self.store.layout
        if self.reask_changed:
            scan_dataset(layout, ds.name)  # a kill's torn tail cut before lines are moved
        answered = read_answered(layout.responses(ds.name))
        changed = changed_prompts(ds.prompts, answered) if answered.digests else []
        if not changed:
            return
        self.changed[ds.name] = len(changed)
        shown = ", ".join(changed[:3]) + (", …" if len(changed) > 3 else "")
        if self.reask_changed:
            moved = reask(layout, ds.name, answered, changed)
            log.warning("%s: %d answered prompts changed in the dataset since they were answered "
                        "(same ID, other content: %s): their %d answers moved to "
                        "quarantine.jsonl, asked again now", ds.name, len(changed), shown, moved)
        else:
            log.warning("%s: %d answered prompts changed in the dataset since they were answered "
                        "(same ID, other content: %s): their answers are kept and count as done; "
                        "pass --reask-changed to ask them again (the old answers are moved to "
                        "quarantine.jsonl)", ds.name, len(changed), shown)

    def _scan_with_rescued(self, dataset: str, rescued: list[Record],
                           theirs: DoneIds | None) -> DatasetOnDisk:
        """The dataset's folder as the resume scan reads it, once the answers an earlier
        session could not write (store.rescue) are appended, less any the run already has
        here or in `theirs` (its other folders)."""
        on_disk, _ = scan_dataset(self.store.layout, dataset)
        if not rescued:
            return on_disk
        done = on_disk.done | theirs if theirs else on_disk.done
        new = list({r.id: r for r in rescued if r.id not in done}.values())
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

    def _unsettled_before(self, done: dict[str, DoneIds], killed: KilledSession | None,
                          bills: dict[str, float]) -> float:
        """What earlier sessions' paid requests may have been billed without an answer on disk
        (aborted, or in flight at a kill): counted as spent. A killed session's share is read
        from the journal (its requests sent and never ended, less those whose answer is on
        disk), each at its bill where the endpoint told it (`ask_bills`), else at its worst
        case, and kept in run.json. Earlier sessions' probe requests count too, and what
        `draftgen probe` commands spent."""
        path = self.store.layout.run_json
        if killed is not None:
            index, left_open = killed
            open_ = [r for r in left_open if r.id not in done.get(r.dataset or "", DoneIds())]
            known = [bills[r.gen] for r in open_ if r.gen in bills]
            usd = sum(bills.get(r.gen or "", r.usd) for r in open_)
            record_session(path, index, unsettled_usd=round(usd, 6))
            if usd:
                log.warning("%d paid requests were in flight when session %d was killed: "
                            "%d billed $%.4f as the endpoint reports, the others possibly "
                            "billed, counted at their worst case; $%.4f in all counted against "
                            "budget.usd", sum(r.usd > 0 for r in open_), index, len(known),
                            sum(known), usd)
        return read_run_info(path).spent_outside_answers(self.session)

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

    def _queue_conversations(self, ds: DatasetPlan, on_disk: DatasetOnDisk,
                             counters: DatasetCounters, room: int | None) -> deque[Pending]:
        """A `turns: all` dataset: each conversation not done continued from its last written
        turn (its next turn queued), in dataset order. Counted in turns: `total` holds the
        turns written and every turn left of the conversations not done. `room`
        (`max_prompts`) counts conversations: unsharded, at most that many started in all;
        sharded, the shard's among the dataset's first `room`."""
        assert ds.conversations is not None
        folders = [self.store.layout.root,
                   *other_run_folders(self.cfg, self.store.layout.root)]
        spans: dict[str, tuple[int, int]] = {}
        written = written_turns(folders, ds.name, spans)
        formats = self._formats = self._formats or Formats(self.cfg, self.plan.fmt)
        failed = on_disk.failed_attempts
        table = ds.prompts
        started = sum(1 for turns in written.values() if turns)
        counters.done_before = sum(map(len, written.values()))
        counters.total = counters.done_before
        queue: deque[Pending] = deque()
        for row, position in enumerate(table.positions.tolist()):
            plan = ds.conversations[position]
            turns = written.get(plan.id, [])
            if is_done(turns):
                continue
            conversation = start_conversation(plan, self.cfg, formats, turns)
            left = conversation.turns_left
            counters.total += left
            fresh = not turns
            if room is not None and (position >= room if self.plan.shard is not None
                                     else fresh and started >= room):
                counters.skipped += left
                continue
            if failed and failed[turn_id(plan.id, conversation.turn)] >= self.cfg.max_attempts:
                counters.exhausted += left
                continue
            started += fresh
            if turns and turns[-1].id in spans:
                self.store.continue_turn(ds.name, turns[-1], *spans[turns[-1].id])
            queue.append(Pending.next_turn(conversation, row))
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
