"""The status of one run folder: its answers from the index, every file up to the size it had
when status started; then its failures, quarantine, journal tail and rescue files, once the
answers of every folder of the run are known."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from draftgen.status.clock import Activity, RateClock
from draftgen.status.conversation_counts import (
    count_in_flight,
    count_stopped_by_budget,
    index_turns,
    trajectory_status,
)
from draftgen.status.model import DatasetStatus, RunStatus, latest
from draftgen.status.notes import run_notes
from draftgen.status.sums import Columns, contains, read_answers, read_failures
from draftgen.store.columns import id_hash
from draftgen.store.journal import JournalTail
from draftgen.store.reader import RunFolder, Snapshot, StoreError
from draftgen.store.record import Record
from draftgen.store.rescue import Rescued
from draftgen.store.runjson import DatasetTotals, RunInfo


@dataclass
class _Sizes:
    """Each file's size when status started: everything is read up to there."""

    responses: Snapshot
    failures: Snapshot


@dataclass
class FolderAnswers:
    """One run folder with its answers read from the index; failures and the journal are read
    by `folder_status`, once the answers of every folder of the run are known."""

    folder: RunFolder
    sizes: dict[str, _Sizes]
    journal_size: int
    datasets: dict[str, DatasetStatus] = field(default_factory=dict)
    cols: dict[str, Columns] = field(default_factory=dict)
    done_ids: dict[str, np.ndarray] = field(default_factory=dict)
    """Each dataset's answered ID hashes, sorted and unique."""

    @property
    def info(self) -> RunInfo:
        return self.folder.info


def read_folder_answers(folder: RunFolder) -> FolderAnswers:
    config = folder.info.stored_config
    names = list(dict.fromkeys([*config.dataset_names, *folder.dataset_names()]))
    f = FolderAnswers(folder,
                      sizes={name: _Sizes(folder.responses(name), folder.failures(name))
                             for name in names},
                      journal_size=folder.journal_size())
    trajectories = config.trajectory_datasets
    for name in names:
        d = DatasetStatus(name)
        # what the runner recorded for the dataset at its last session
        totals = folder.info.datasets.get(name) or DatasetTotals()
        d.total, d.skipped = totals.total, totals.skipped_budget
        responses = f.sizes[name].responses
        cols = folder.index_columns(name, responses.size)
        torn = folder.torn_tail(responses)
        if torn:
            d.torn_tail_bytes["responses.jsonl"] = torn
        f.done_ids[name], f.cols[name] = read_answers(d, cols)
        if name in trajectories:
            turns = index_turns(folder.index_entries(name, cols), responses.path,
                                cols.rows["end"])
            d.trajectories = trajectory_status(turns, d.total)
        f.datasets[name] = d
    return f


def folder_status(f: FolderAnswers, answered: dict[str, np.ndarray], now: float) -> RunStatus:
    """One folder's status. `answered`: each dataset's answered ID hashes in any folder of
    the run (sorted, unique): a failure or request in flight whose prompt was answered does
    not count."""
    folder = f.folder
    max_attempts = f.info.stored_config.max_attempts or 3
    failed_at: dict[str, dict[str, float]] = {}
    last_activity: float | None = None
    for name, d in f.datasets.items():
        failures = f.sizes[name].failures
        failed_at[name] = read_failures(failures.path, failures.size, answered[name],
                                        max_attempts, d)
        d.quarantined, spent = folder.quarantined(name)
        d.cost_not_kept_usd += spent
        last_failure = max(failed_at[name].values(), default=None)
        last_activity = latest(last_activity, latest(d.last_t, last_failure))
    journal = folder.journal(f.journal_size)
    last_activity = latest(last_activity, journal.last_t)
    rescued, rescue_error = _read_rescued(folder)
    _in_flight(journal, f.datasets, answered, failed_at, rescued.records)
    sessions = folder.sessions
    last_outcome = sessions[-1].outcome if sessions else None
    for name, d in f.datasets.items():
        if d.trajectories is not None:
            count_in_flight(d.trajectories, [r.id for r in journal.open if r.dataset == name])
            # A budget skipped turns (`skipped`), and the session ended by it or completed
            # otherwise (not stopped by hand, not killed).
            if not folder.live and d.skipped and last_outcome in ("budget", "completed"):
                count_stopped_by_budget(d.trajectories, failed_at[name])
    first_activity = min((d.first_t for d in f.datasets.values() if d.first_t is not None),
                         default=None)
    clock = RateClock([Activity(sessions, folder.live, first_activity, last_activity)], now)
    total = clock.total(f.datasets, f.cols)
    holder = folder.holder or {}
    status = RunStatus(
        root=folder.root, live=folder.live, pid=holder.get("pid"), host=holder.get("host"),
        started_at=f.info.created_at or (sessions[0].started_at if sessions
                                         else total.first_t),
        last_activity=last_activity, now=now, sessions=len(sessions),
        last_outcome=last_outcome,
        datasets=f.datasets, total=total, journal=journal,
        unsettled_usd=sum(s.unknown_bills_usd for s in sessions),
        probe_usd=f.info.probe_commands_usd + sum(s.probe_spent_usd for s in sessions),
        changed_prompts=sessions[-1].changed_left if sessions else 0,
        template_check=sessions[-1].template_check if sessions else None,
        cost_reports_refused=sum(s.summary.cost_reports_refused for s in sessions if s.summary),
        cost_reports_implausible=sum(s.summary.cost_reports_implausible for s in sessions
                                     if s.summary),
        rescued=len(rescued), rescue_files=[str(p) for p in rescued.files],
        rescue_error=rescue_error,
        budget_usd=f.info.stored_config.budget.usd,
    )
    status.notes = run_notes(status, journal)
    return status


def _read_rescued(folder: RunFolder) -> tuple[Rescued, str | None]:
    """The folder's rescue files, or none and why they could not be read."""
    try:
        return folder.rescued(), None
    except StoreError as e:
        return Rescued(), str(e)


def _in_flight(journal: JournalTail, datasets: dict[str, DatasetStatus],
               done_ids: dict[str, np.ndarray], failed_at: dict[str, dict[str, float]],
               rescued: dict[str, list[Record]]) -> None:
    """Requests sent and never ended, less those whose answer or failure is on disk (a kill
    between writing it and journaling it) or in a rescue file."""
    rescued_ids = {(ds, r.id) for ds, records in rescued.items() for r in records}
    still_open = []
    for req in journal.open:
        ds = req.dataset or ""
        if (ds, req.id) in rescued_ids:
            continue
        done = done_ids.get(ds)
        if done is not None and contains(done, np.array([id_hash(req.id)], dtype=np.uint64))[0]:
            continue
        if failed_at.get(ds, {}).get(req.id, -1.0) >= (req.t or 0.0):
            continue
        still_open.append(req)
        if req.dataset in datasets:
            datasets[req.dataset].in_flight += 1
    journal.open = still_open
