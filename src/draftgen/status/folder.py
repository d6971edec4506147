"""The status of one run folder: its answers from the index, every file up to the size it had
when status started; then its failures, quarantine, journal tail and rescue files, once the
answers of every folder of the run are known."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftgen.formats.trajectory import trajectory_datasets
from draftgen.status.clock import Activity, RateClock
from draftgen.status.model import DatasetStatus, RunStatus, latest
from draftgen.status.notes import run_notes
from draftgen.status.sums import Columns, contains, read_answers, read_failures
from draftgen.status.trajectories import (
    count_in_flight,
    count_stopped_by_budget,
    index_turns,
    trajectory_status,
)
from draftgen.store.appender import StoreError
from draftgen.store.columns import id_hash
from draftgen.store.journal import JournalTail
from draftgen.store.reader import RunFolder, Snapshot
from draftgen.store.record import Record
from draftgen.store.rescue import Rescued
from draftgen.store.runinfo import session_probe_usd, session_unsettled_usd


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
    def run_json(self) -> dict[str, Any]:
        return self.folder.run_json


def _config_datasets(run_json: dict[str, Any]) -> list[str]:
    cfg = run_json.get("config")
    names = []
    if isinstance(cfg, dict):
        for ds in cfg.get("datasets") or []:
            if isinstance(ds, dict) and isinstance(ds.get("name"), str):
                names.append(ds["name"])
    return names


def _run_dataset_info(run_json: dict[str, Any], name: str) -> dict[str, Any]:
    """What the runner recorded for a dataset at its last session (`run.json` "datasets")."""
    info = (run_json.get("datasets") or {}).get(name) if isinstance(
        run_json.get("datasets"), dict) else None
    return info if isinstance(info, dict) else {}


def read_folder_answers(folder: RunFolder) -> FolderAnswers:
    names = list(dict.fromkeys([*_config_datasets(folder.run_json), *folder.dataset_names()]))
    f = FolderAnswers(folder,
                      sizes={name: _Sizes(folder.responses(name), folder.failures(name))
                             for name in names},
                      journal_size=folder.journal_size())
    trajectories = trajectory_datasets(folder.run_json.get("config"))
    for name in names:
        d = DatasetStatus(name)
        info = _run_dataset_info(folder.run_json, name)
        d.total = info.get("total") if isinstance(info.get("total"), int) else None
        d.skipped = (info.get("skipped_budget") if isinstance(info.get("skipped_budget"), int)
                     else None)
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
    cfg = f.run_json.get("config") if isinstance(f.run_json.get("config"), dict) else {}
    max_attempts = int(cfg.get("max_attempts") or 3)
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
    last_outcome = sessions[-1].get("outcome") if sessions else None
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
        started_at=f.run_json.get("created_at") or (sessions[0].get("started_at")
                                                    if sessions else total.first_t),
        last_activity=last_activity, now=now, sessions=len(sessions),
        last_outcome=last_outcome,
        datasets=f.datasets, total=total, journal=journal,
        unsettled_usd=sum(map(session_unsettled_usd, sessions)),
        probe_usd=sum(map(session_probe_usd, sessions)),
        changed_prompts=_changed_left(sessions[-1] if sessions else None),
        cost_reports_refused=sum(map(_reports_refused, sessions)),
        rescued=len(rescued), rescue_files=[str(p) for p in rescued.files],
        rescue_error=rescue_error,
    )
    status.notes = run_notes(status, journal)
    return status


def _changed_left(session: Any) -> int:
    """Changed prompts the session found and did not ask again."""
    if not isinstance(session, dict) or session.get("reasked_changed"):
        return 0
    changed = session.get("changed_prompts")
    return sum(n for n in changed.values() if isinstance(n, int)) if isinstance(
        changed, dict) else 0


def _reports_refused(session: Any) -> int:
    summary = session.get("summary") if isinstance(session, dict) else None
    n = summary.get("cost_reports_refused") if isinstance(summary, dict) else None
    return n if isinstance(n, int) else 0


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
