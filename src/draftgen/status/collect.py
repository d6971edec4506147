"""The status of a run: of its one folder, or of every folder of a sharded run
(`draftgen run --shard`) as one run, with each shard's own numbers in `shards`."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np

from draftgen.status.clock import Activity, RateClock
from draftgen.status.folder import FolderAnswers, folder_status, read_folder_answers
from draftgen.status.model import DatasetStatus, RunStatus, ShardStatus, StatusError
from draftgen.status.notes import sharded_notes
from draftgen.status.sums import concat
from draftgen.store.columns import union_of_sorted
from draftgen.store.journal import JournalTail
from draftgen.store.reader import Run, RunOpenError
from draftgen.store.shards import RunPart, ShardSpec


def collect_status(root: Path, now: float | None = None) -> RunStatus:
    """The status of a run folder; of a sharded run (`draftgen run --shard`), of every shard
    folder as one run, with each shard's own numbers in `shards`."""
    try:
        run = Run.open(root)
    except RunOpenError as e:
        raise StatusError(str(e)) from None
    now = time.time() if now is None else now
    if run.sharded:
        return _sharded_status(run, now)
    folder = read_folder_answers(run.folders[0])
    return folder_status(folder, folder.done_ids, now)


def _shard_state(st: RunStatus) -> str:
    if st.live:
        return "live"
    if not st.sessions:
        return "not started"
    return "stopped" if st.last_outcome else "killed"




def _answered_anywhere(folders: list[FolderAnswers]) -> tuple[dict[str, np.ndarray], Counter[str]]:
    """Each dataset's answered ID hashes over every folder, and how many answers repeat one
    of another folder (a re-sharded run)."""
    names = dict.fromkeys(name for f in folders for name in f.done_ids)
    answered: dict[str, np.ndarray] = {}
    repeats: Counter[str] = Counter()
    for name in names:
        hashes = [f.done_ids[name] for f in folders if name in f.done_ids]
        answered[name] = union_of_sorted(hashes)
        repeats[name] = sum(map(len, hashes)) - len(answered[name])
    return answered, repeats


def _relative(part: RunPart, root: Path) -> str:
    return "" if part.shard is None else f"{part.folder.relative_to(root)}/"


def _run_totals(name: str, parts: list[RunPart], folders: list[FolderAnswers]
                ) -> tuple[int | None, int | None]:
    """A dataset's prompts and budget-skipped prompts over the whole run. Each folder records
    its own share, so they come from a set of folders covering every shard of one count N
    (the root's own part is a set of one); the most recently started such set when a run was
    re-sharded."""
    sets: dict[int, dict[int, FolderAnswers]] = {}
    for part, f in zip(parts, folders, strict=True):
        spec = part.shard or ShardSpec(0, 1)
        sets.setdefault(spec.count, {})[spec.index] = f
    best: tuple[float, int, int] | None = None
    for count, members in sets.items():
        mine = [m.datasets.get(name) for m in members.values()]
        if len(members) < count or any(d is None or d.total is None for d in mine):
            continue
        started = max(_started(m) for m in members.values())
        if best is None or started > best[0]:
            best = (started, sum(d.total or 0 for d in mine if d),
                    sum(d.skipped or 0 for d in mine if d))
    return (best[1], best[2]) if best else (None, None)


def _started(f: FolderAnswers) -> float:
    return max((s.started_at for s in f.folder.sessions if s.started_at is not None),
               default=0.0)


def _merged_dataset(name: str, root: Path, parts: list[RunPart], folders: list[FolderAnswers],
                    repeats: int) -> DatasetStatus:
    merged = DatasetStatus(name)
    torn: dict[str, int] = {}
    for part, f in zip(parts, folders, strict=True):
        d = f.datasets.get(name)
        if d is None:
            continue
        merged.merge(d)
        torn.update({f"{_relative(part, root)}{name}/{file}": n
                     for file, n in d.torn_tail_bytes.items()})
    merged.torn_tail_bytes = torn  # paths from the run folder, not merge's dataset/file
    merged.total, merged.skipped = _run_totals(name, parts, folders)
    merged.sums.answers -= repeats
    merged.duplicates += repeats
    return merged


def _sharded_status(run: Run, now: float) -> RunStatus:
    root, parts = run.root, run.parts
    folders = [read_folder_answers(f) for f in run.folders]
    answered, repeats = _answered_anywhere(folders)
    statuses = [folder_status(f, answered, now) for f in folders]
    names = list(dict.fromkeys(name for f in folders for name in f.datasets))
    datasets = {name: _merged_dataset(name, root, parts, folders, repeats[name])
                for name in names}
    clock = RateClock([Activity(f.folder.sessions, st.live, st.total.first_t,
                                st.last_activity) for f, st in zip(folders, statuses,
                                                                  strict=True)], now)
    cols = {name: concat(f.cols[name] for f in folders if name in f.cols) for name in names}
    total = clock.total(datasets, cols)
    total.torn_tail_bytes = {k: n for d in datasets.values() for k, n in d.torn_tail_bytes.items()}
    journal = JournalTail(open=[r for st in statuses for r in st.journal.open],
                          last_t=max((st.journal.last_t for st in statuses
                                      if st.journal.last_t is not None), default=None),
                          complete=all(st.journal.complete for st in statuses))
    starts = [st.started_at for st in statuses if isinstance(st.started_at, int | float)]
    status = RunStatus(
        root=root, live=any(st.live for st in statuses), pid=None, host=None,
        started_at=min(starts, default=None),
        last_activity=max((st.last_activity for st in statuses
                           if st.last_activity is not None), default=None),
        now=now, sessions=sum(st.sessions for st in statuses), last_outcome=None,
        datasets=datasets, total=total, journal=journal,
        shards=[ShardStatus(p, _shard_state(st), st) for p, st in zip(parts, statuses,
                                                                        strict=True)],
        unsettled_usd=sum(st.unsettled_usd for st in statuses),
        cost_reports_refused=sum(st.cost_reports_refused for st in statuses),
        cost_reports_implausible=sum(st.cost_reports_implausible for st in statuses),
        probe_usd=sum(st.probe_usd for st in statuses),
        changed_prompts=sum(st.changed_prompts for st in statuses),
        template_check=next((st.template_check for st in statuses
                             if st.template_check is not None), None),
        rescued=sum(st.rescued for st in statuses),
        rescue_files=[p for st in statuses for p in st.rescue_files],
        budget_usd=max(folders, key=_started).info.stored_config.budget.usd,
    )
    status.notes = sharded_notes(status, repeats)
    return status
