"""`draftgen status RUN_DIR`: how far a run got and what it cost, on a live, stopped or killed
run, without writing anything in the run folder and without waiting for the writer.

Everything comes from files the runner keeps small: each dataset's index (its binary copy,
caught up with the data in memory, see `store.fast_index`), failures.jsonl, the tail of the
request journal, run.json and the lock. The data files are only read past the index's end.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from draftgen.errors import DraftgenError
from draftgen.scale.shards import RunPart, ShardSpec, is_sharded, run_parts
from draftgen.store.appender import StoreError
from draftgen.store.columns import id_hash, str_code, union_of_sorted
from draftgen.store.fast_index import IndexColumns, load_index_columns, torn_tail_bytes
from draftgen.store.journal import JournalTail, as_usd, read_journal
from draftgen.store.layout import RunLayout
from draftgen.store.lock import lock_holder
from draftgen.store.record import Record
from draftgen.store.rescue import Rescued, read_rescued
from draftgen.store.resume import spend_in
from draftgen.store.runinfo import RunJsonDamaged, read_run_json, session_unsettled_usd

WINDOW_S = 300.0
"""The span of the "last minutes" rates."""
FINISHED_CUT = "length"


class StatusError(DraftgenError):
    """The folder cannot be read as a run."""


# ---- numbers ---------------------------------------------------------------------------------


@dataclass
class Sums:
    done: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, other: Sums) -> None:
        self.done += other.done
        self.output_tokens += other.output_tokens
        self.reasoning_tokens += other.reasoning_tokens
        self.cost_usd += other.cost_usd

    def as_json(self) -> dict[str, Any]:
        return {"done": self.done, "output_tokens": self.output_tokens,
                "reasoning_tokens": self.reasoning_tokens, "cost_usd": round(self.cost_usd, 6)}


@dataclass
class Rates:
    seconds: float
    answers: int
    output_tokens: int
    cost_usd: float

    def as_json(self) -> dict[str, Any]:
        span = self.seconds
        return {
            "seconds": round(span, 1),
            "answers_per_s": round(self.answers / span, 3) if span > 0 else None,
            "tokens_per_s": round(self.output_tokens / span, 1) if span > 0 else None,
            "usd_per_min": round(self.cost_usd / span * 60, 6) if span > 0 else None,
        }


@dataclass
class DatasetStatus:
    name: str
    total: int | None = None
    skipped: int | None = None
    sums: Sums = field(default_factory=Sums)
    duplicates: int = 0
    failed_by_kind: Counter[str] = field(default_factory=Counter)
    failed_attempts: int = 0
    """Failure lines, answered or not."""
    out_of_attempts: int = 0
    in_flight: int = 0
    quarantined: int = 0
    cost_not_kept_usd: float = 0.0
    """Spent on no answer counted above: quarantined answers, billed failed requests."""
    truncated: int = 0
    not_exact: int = 0
    by_backend: dict[str, Sums] = field(default_factory=dict)
    by_provider: dict[str, Sums] = field(default_factory=dict)
    old_schema: int = 0
    """Answers whose index entry lacks created_at, backend or token_check."""
    torn_tail_bytes: dict[str, int] = field(default_factory=dict)
    bad_lines: int = 0
    first_t: float | None = None
    last_t: float | None = None
    recent: Rates | None = None
    overall: Rates | None = None

    @property
    def failed(self) -> int:
        return sum(self.failed_by_kind.values())

    @property
    def pending(self) -> int | None:
        if self.total is None:
            return None
        return max(0, self.total - self.sums.done - self.failed - (self.skipped or 0))

    def merge(self, other: DatasetStatus) -> None:
        for name in ("duplicates", "failed_attempts", "out_of_attempts", "in_flight",
                     "quarantined", "truncated", "not_exact", "old_schema", "bad_lines",
                     "cost_not_kept_usd"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.sums.add(other.sums)
        self.failed_by_kind.update(other.failed_by_kind)
        for mine, theirs in ((self.by_backend, other.by_backend),
                             (self.by_provider, other.by_provider)):
            for key, sums in theirs.items():
                mine.setdefault(key, Sums()).add(sums)
        for key, n in other.torn_tail_bytes.items():
            self.torn_tail_bytes[f"{other.name}/{key}"] = n
        self.first_t = _min(self.first_t, other.first_t)
        self.last_t = _max(self.last_t, other.last_t)

    def as_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "done": self.sums.done,
            "failed": self.failed,
            "skipped": self.skipped,
            "pending": self.pending,
            "in_flight": self.in_flight,
            "output_tokens": self.sums.output_tokens,
            "reasoning_tokens": self.sums.reasoning_tokens,
            "cost_usd": round(self.sums.cost_usd, 6),
            "by_backend": {k: _group_json(v) for k, v in sorted(self.by_backend.items())},
            "by_provider": {k: _group_json(v) for k, v in sorted(self.by_provider.items())},
            "failed_by_kind": dict(self.failed_by_kind.most_common()),
            "failed_attempts": self.failed_attempts,
            "out_of_attempts": self.out_of_attempts,
            "truncated": self.truncated,
            "not_exact": self.not_exact,
            "quarantined": self.quarantined,
            "cost_not_kept_usd": round(self.cost_not_kept_usd, 6),
            "duplicates": self.duplicates,
            "old_schema": self.old_schema,
            "bad_lines": self.bad_lines,
            "torn_tail_bytes": self.torn_tail_bytes,
            "first_answer_at": self.first_t,
            "last_answer_at": self.last_t,
            "rates": {"recent": self.recent.as_json() if self.recent else None,
                      "run": self.overall.as_json() if self.overall else None},
        }


def _group_json(s: Sums) -> dict[str, Any]:
    return {"done": s.done, "output_tokens": s.output_tokens, "cost_usd": round(s.cost_usd, 6)}


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class RunStatus:
    root: Path
    live: bool
    pid: int | None
    host: str | None
    started_at: float | None
    last_activity: float | None
    now: float
    sessions: int
    last_outcome: str | None
    datasets: dict[str, DatasetStatus]
    total: DatasetStatus
    journal: JournalTail
    notes: list[str] = field(default_factory=list)
    shards: list[ShardStatus] = field(default_factory=list)
    """A sharded run's folders, each by its own numbers (empty for a run without shards)."""
    unsettled_usd: float = 0.0
    """Earlier sessions' paid requests with no answer on disk (aborted, or in flight at a
    kill: their worst case; answers no disk would take: their bill), as run.json records
    them: counted as spent on resume."""
    rescued: int = 0
    """Answers a session could not write to the run folder, waiting in rescue files
    (store.rescue) for the next run to add them."""
    rescue_files: list[str] = field(default_factory=list)
    rescue_error: str | None = None
    """Why a rescue file could not be read (then none is counted)."""
    cost_reports_refused: int = 0
    """Answers and billed failures whose reported cost was not believed (counted at their
    price instead), as the sessions recorded them."""

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_dir": str(self.root),
            "live": self.live,
            "pid": self.pid,
            "host": self.host,
            "started_at": self.started_at,
            "last_activity": self.last_activity,
            "now": round(self.now, 3),
            "sessions": self.sessions,
            "last_outcome": self.last_outcome,
            "datasets": {name: d.as_json() for name, d in self.datasets.items()},
            "total": self.total.as_json(),
            "in_flight_ids": [r.id for r in self.journal.open][:100],
            "in_flight_worst_usd": round(self.journal.open_usd, 6),
            "unsettled_usd": round(self.unsettled_usd, 6),
            "cost_reports_refused": self.cost_reports_refused,
            "rescued": self.rescued,
            "rescue_files": self.rescue_files,
            "notes": self.notes,
        }
        if self.shards:
            data["shards"] = [s.as_json() for s in self.shards]
        return data


# ---- reading the run -------------------------------------------------------------------------


@dataclass
class _Sizes:
    """Each file's size when status started: everything is read up to there."""

    responses: int
    failures: int


def _snapshot(layout: RunLayout, name: str) -> _Sizes:
    def size(p: Path) -> int:
        try:
            return p.stat().st_size
        except FileNotFoundError:
            return 0

    return _Sizes(size(layout.responses(name)), size(layout.failures(name)))


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


Columns = dict[str, np.ndarray]
"""The index rows as one contiguous array per field (fast to mask and sum)."""
_FIELDS = ("idh", "t", "cost", "out", "reasoning", "backend", "provider", "quant", "finish",
           "check")


def _columns(rows: np.ndarray) -> Columns:
    return {name: np.ascontiguousarray(rows[name]) for name in _FIELDS}


def _sums(c: Columns, mask: np.ndarray | None = None) -> Sums:
    out, reasoning, cost = c["out"], c["reasoning"], c["cost"]
    if mask is not None:
        out, reasoning, cost = out[mask], reasoning[mask], cost[mask]
    return Sums(done=len(out), output_tokens=int(out.sum(dtype=np.int64)),
                reasoning_tokens=int(reasoning[reasoning > 0].sum(dtype=np.int64)),
                cost_usd=float(cost.sum()))


def distinct(col: np.ndarray) -> list[int]:
    """The distinct values of a column holding a few (one pass per value; no sort)."""
    values = []
    rest = col
    while len(rest):
        v = rest[0]
        values.append(int(v))
        rest = rest[rest != v]
    return values


def contains(sorted_unique: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Which `values` are in a sorted array (binary search; no re-sort of the big array)."""
    if not len(sorted_unique):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_unique, values), len(sorted_unique) - 1)
    return sorted_unique[at] == values


def _group(c: Columns, key: np.ndarray, label: Any) -> dict[str, Sums]:
    """Sums per distinct key (one pass per key to label the rows, then bincounts)."""
    keys = distinct(key)
    group = np.zeros(len(key), dtype=np.intp)
    for j, k in enumerate(keys[1:], 1):
        group[key == k] = j
    n = len(keys)
    done = np.bincount(group, minlength=n)
    out = np.bincount(group, weights=c["out"], minlength=n)
    reasoning = np.bincount(group, weights=np.maximum(c["reasoning"], 0), minlength=n)
    cost = np.bincount(group, weights=c["cost"], minlength=n)
    return {label(k): Sums(int(done[j]), int(out[j]), int(reasoning[j]), float(cost[j]))
            for j, k in enumerate(keys)}


def _provider_label(cols: IndexColumns) -> Any:
    def label(k: int) -> str:
        provider = cols.name(k >> 32) or "-"
        quant = cols.name(k & 0xFFFFFFFF)
        return f"{provider}/{quant}" if quant else provider
    return label


def _answers(d: DatasetStatus, cols: IndexColumns) -> tuple[np.ndarray, Columns]:
    """Fill the answer counts from the index; returns the answers' ID hashes (sorted, unique)
    and their columns."""
    rows = cols.rows
    idh = np.sort(rows["idh"])
    if len(idh) and (idh[1:] == idh[:-1]).any():  # duplicate lines: count each ID once
        idh, first = np.unique(rows["idh"], return_index=True)
        d.duplicates = len(rows) - len(idh)
        rows = rows[np.sort(first)]
    c = _columns(rows)
    d.sums = _sums(c)
    d.truncated = int((c["finish"] == str_code(FINISHED_CUT)).sum())
    d.not_exact = int((c["check"] != str_code("exact")).sum())
    d.old_schema = int((np.isnan(c["t"]) | (c["backend"] == 0) | (c["check"] == 0)).sum())
    d.by_backend = _group(c, c["backend"], lambda k: cols.name(k) or "-")
    pq = (c["provider"].astype(np.uint64) << np.uint64(32)) | c["quant"].astype(np.uint64)
    d.by_provider = _group(c, pq, _provider_label(cols))
    d.bad_lines = cols.bad_lines
    t = c["t"][~np.isnan(c["t"])]
    if len(t):
        d.first_t, d.last_t = float(t.min()), float(t.max())
    return idh, c


def _failures(path: Path, size: int, done: np.ndarray, max_attempts: int, d: DatasetStatus
              ) -> dict[str, float]:
    """Failed prompts (by the kind of their last failure) that were never answered; returns
    each failed ID's last failure time."""
    times: dict[str, float] = {}
    if size == 0:
        return times
    with open(path, "rb") as f:
        raw = f.read(size)
    cut = len(raw) - (raw.rfind(b"\n") + 1)
    if cut:
        d.torn_tail_bytes["failures.jsonl"] = cut
    last: dict[str, str] = {}
    attempts: Counter[str] = Counter()
    for line in raw[: len(raw) - cut].splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            d.bad_lines += 1
            continue
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            d.bad_lines += 1
            continue
        attempts[row["id"]] += 1
        last[row["id"]] = str(row.get("kind") or "unknown")
        d.cost_not_kept_usd += as_usd(row.get("cost_usd"))
        if isinstance(row.get("created_at"), int | float):
            times[row["id"]] = float(row["created_at"])
    d.failed_attempts = sum(attempts.values())
    ids = list(last)
    answered = contains(done, np.fromiter((id_hash(i) for i in ids), dtype=np.uint64,
                                          count=len(ids)))
    for rid, was_answered in zip(ids, answered.tolist(), strict=True):
        if not was_answered:
            d.failed_by_kind[last[rid]] += 1
            d.out_of_attempts += attempts[rid] >= max_attempts
    return times


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def _rates(c: Columns, start: float, stop: float) -> Rates:
    s = _sums(c, (c["t"] >= start) & (c["t"] <= stop))
    return Rates(seconds=max(0.0, stop - start), answers=s.done,
                 output_tokens=s.output_tokens, cost_usd=s.cost_usd)


def _sessions(run_json: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in run_json.get("sessions") or [] if isinstance(s, dict)]


def _session_spans(sessions: list[dict[str, Any]], live: bool, now: float,
                   last_activity: float | None) -> list[tuple[float, float]] | None:
    """When each session ran (a killed session ends at the last activity before the next one
    started); None when a session has no start time."""
    spans = []
    for i, s in enumerate(sessions):
        start = s.get("started_at")
        if not isinstance(start, int | float):
            return None
        nxt = sessions[i + 1].get("started_at") if i + 1 < len(sessions) else None
        stop = s.get("stopped_at")
        if not isinstance(stop, int | float):
            if live and nxt is None:
                stop = now
            else:
                stop = min(x for x in (nxt, last_activity, now) if isinstance(x, int | float))
        spans.append((float(start), float(stop)))
    return spans


def _covered_seconds(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one span (the sessions of shards overlap)."""
    total = 0.0
    reach = -math.inf
    for start, stop in sorted(spans):
        start = max(start, reach)
        if stop > start:
            total += stop - start
            reach = stop
    return total


@dataclass
class _Activity:
    """When one run folder was active, for the rates."""

    sessions: list[dict[str, Any]]
    live: bool
    first: float | None
    last: float | None

    @property
    def last_start(self) -> Any:
        return self.sessions[-1].get("started_at") if self.sessions else self.first


def _active_seconds(folders: list[_Activity], now: float) -> float | None:
    """Time the run spent running: the sessions of every folder, overlaps counted once."""
    timed = [f for f in folders if f.sessions]
    spans: list[tuple[float, float]] = []
    for f in timed:
        mine = _session_spans(f.sessions, f.live, now, f.last)
        if mine is None:
            return None
        spans.extend(mine)
    return _covered_seconds(spans) if timed else None


class _RateClock:
    """Where the windows of the rates lie: the last WINDOW_S seconds before now (live) or
    before the last activity (stopped), and the run's active time."""

    def __init__(self, folders: list[_Activity], now: float) -> None:
        last = max((f.last for f in folders if f.last is not None), default=None)
        self.end = now if any(f.live for f in folders) else (last or now)
        start = self.end - WINDOW_S
        starts = [float(f.last_start) for f in folders if isinstance(f.last_start, int | float)]
        if starts:
            start = max(start, min(starts))
        self.recent_start = start
        self.active_s = _active_seconds(folders, now)

    def fill(self, d: DatasetStatus, c: Columns) -> None:
        d.recent = _rates(c, self.recent_start, self.end)
        span = self.active_s
        if span is None and d.first_t is not None and d.last_t is not None:
            span = d.last_t - d.first_t
        if span is not None:
            d.overall = Rates(seconds=span, answers=d.sums.done,
                              output_tokens=d.sums.output_tokens, cost_usd=d.sums.cost_usd)

    def total(self, datasets: dict[str, DatasetStatus], cols: dict[str, Columns]
              ) -> DatasetStatus:
        """Each dataset's rates, and the run's total over them."""
        total = DatasetStatus("total")
        for name, d in datasets.items():
            self.fill(d, cols[name])
            total.merge(d)
        if all(d.total is not None for d in datasets.values()) and datasets:
            total.total = sum(d.total or 0 for d in datasets.values())
            total.skipped = sum(d.skipped or 0 for d in datasets.values())
        if cols:
            self.fill(total, _concat(cols.values()))
        return total


def _concat(cols: Iterable[Columns]) -> Columns:
    """The columns the rates need, of several sets of answers as one."""
    parts = list(cols)
    return {k: np.concatenate([c[k] for c in parts]) for k in ("t", "out", "reasoning", "cost")}


def open_layout(root: Path) -> tuple[RunLayout, dict[str, Any]]:
    """The run folder and its run.json; StatusError for a folder that is not a run."""
    if not root.is_dir():
        raise StatusError(f"{root}: not a folder")
    layout = RunLayout(root)
    if not layout.run_json.exists() and not layout.dataset_names():
        raise StatusError(f"{root}: not a draftgen run folder (no run.json, no dataset "
                          "folders with responses.jsonl or failures.jsonl)")
    try:
        run_json = read_run_json(layout.run_json)
    except RunJsonDamaged as e:
        raise StatusError(str(e)) from None
    except OSError as e:
        raise StatusError(f"{layout.run_json}: cannot read: {e}") from None
    return layout, run_json


@dataclass
class _Folder:
    """One run folder with its answers read from the index, every file up to the size it had
    when status started; failures and the journal are read by `_folder_status`, once the
    answers of every folder of the run are known."""

    root: Path
    layout: RunLayout
    run_json: dict[str, Any]
    holder: dict[str, Any] | None
    sizes: dict[str, _Sizes]
    journal_size: int
    datasets: dict[str, DatasetStatus] = field(default_factory=dict)
    cols: dict[str, Columns] = field(default_factory=dict)
    done_ids: dict[str, np.ndarray] = field(default_factory=dict)
    """Each dataset's answered ID hashes, sorted and unique."""


def _read_answers(root: Path, may_be_empty: bool = False) -> _Folder:
    """`may_be_empty`: a shard folder that holds nothing yet (a shard starting) is read as an
    empty run rather than refused."""
    if may_be_empty and not RunLayout(root).run_json.exists():
        layout, run_json = RunLayout(root), {}
    else:
        layout, run_json = open_layout(root)
    holder = lock_holder(layout.lock)
    names = list(dict.fromkeys([*_config_datasets(run_json), *layout.dataset_names()]))
    f = _Folder(root, layout, run_json, holder,
                sizes={name: _snapshot(layout, name) for name in names},
                journal_size=layout.journal.stat().st_size if layout.journal.exists() else 0)
    for name in names:
        d = DatasetStatus(name)
        info = _run_dataset_info(run_json, name)
        d.total = info.get("total") if isinstance(info.get("total"), int) else None
        d.skipped = (info.get("skipped_budget") if isinstance(info.get("skipped_budget"), int)
                     else None)
        cols = load_index_columns(layout, name, f.sizes[name].responses)
        torn = torn_tail_bytes(layout.responses(name), f.sizes[name].responses)
        if torn:
            d.torn_tail_bytes["responses.jsonl"] = torn
        f.done_ids[name], f.cols[name] = _answers(d, cols)
        f.datasets[name] = d
    return f


def _folder_status(f: _Folder, answered: dict[str, np.ndarray], now: float) -> RunStatus:
    """One folder's status. `answered`: each dataset's answered ID hashes in any folder of
    the run (sorted, unique): a failure or request in flight whose prompt was answered does
    not count."""
    cfg = f.run_json.get("config") if isinstance(f.run_json.get("config"), dict) else {}
    max_attempts = int(cfg.get("max_attempts") or 3)
    failed_at: dict[str, dict[str, float]] = {}
    last_activity: float | None = None
    for name, d in f.datasets.items():
        failed_at[name] = _failures(f.layout.failures(name), f.sizes[name].failures,
                                    answered[name], max_attempts, d)
        d.quarantined = _count_lines(f.layout.quarantine(name))
        d.cost_not_kept_usd += spend_in(f.layout.quarantine(name))
        last_failure = max(failed_at[name].values(), default=None)
        last_activity = _max(last_activity, _max(d.last_t, last_failure))
    journal = read_journal(f.layout.journal, f.journal_size)
    last_activity = _max(last_activity, journal.last_t)
    rescued, rescue_error = _read_rescued(f.layout)
    _in_flight(journal, f.datasets, answered, failed_at, rescued.records)
    first_activity = min((d.first_t for d in f.datasets.values() if d.first_t is not None),
                         default=None)
    sessions = _sessions(f.run_json)
    clock = _RateClock([_Activity(sessions, f.holder is not None, first_activity,
                                  last_activity)], now)
    total = clock.total(f.datasets, f.cols)
    status = RunStatus(
        root=f.root, live=f.holder is not None, pid=(f.holder or {}).get("pid"),
        host=(f.holder or {}).get("host"),
        started_at=f.run_json.get("created_at") or (sessions[0].get("started_at")
                                                    if sessions else total.first_t),
        last_activity=last_activity, now=now, sessions=len(sessions),
        last_outcome=sessions[-1].get("outcome") if sessions else None,
        datasets=f.datasets, total=total, journal=journal,
        unsettled_usd=sum(map(session_unsettled_usd, sessions)),
        cost_reports_refused=sum(map(_reports_refused, sessions)),
        rescued=len(rescued), rescue_files=[str(p) for p in rescued.files],
        rescue_error=rescue_error,
    )
    status.notes = _notes(status, journal)
    return status


def _read_rescued(layout: RunLayout) -> tuple[Rescued, str | None]:
    """The folder's rescue files, or none and why they could not be read."""
    try:
        return read_rescued(layout), None
    except StoreError as e:
        return Rescued(), str(e)


def collect_status(root: Path, now: float | None = None) -> RunStatus:
    """The status of a run folder; of a sharded run (`draftgen run --shard`), of every shard
    folder as one run, with each shard's own numbers in `shards`."""
    parts = run_parts(root)
    if is_sharded(parts):
        return _sharded_status(root, parts, now)
    folder = _read_answers(root)
    return _folder_status(folder, folder.done_ids, time.time() if now is None else now)


# ---- a sharded run ----------------------------------------------------------------------------


def _shard_state(st: RunStatus) -> str:
    if st.live:
        return "live"
    if not st.sessions:
        return "not started"
    return "stopped" if st.last_outcome else "killed"


@dataclass
class ShardStatus:
    """One folder of a sharded run, by its own numbers."""

    part: RunPart
    state: str
    """live, stopped, killed (its last session never ended) or not started."""
    status: RunStatus

    def as_json(self) -> dict[str, Any]:
        t = self.status.total
        return {"shard": self.part.label, "folder": str(self.part.folder), "state": self.state,
                "last_outcome": self.status.last_outcome, "pid": self.status.pid,
                "host": self.status.host, "done": t.sums.done, "failed": t.failed,
                "in_flight": t.in_flight, "output_tokens": t.sums.output_tokens,
                "cost_usd": round(t.sums.cost_usd, 6)}


def _answered_anywhere(folders: list[_Folder]) -> tuple[dict[str, np.ndarray], Counter[str]]:
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


def _run_totals(name: str, parts: list[RunPart], folders: list[_Folder]
                ) -> tuple[int | None, int | None]:
    """A dataset's prompts and budget-skipped prompts over the whole run. Each folder records
    its own share, so they come from a set of folders covering every shard of one count N
    (the root's own part is a set of one); the most recently started such set when a run was
    re-sharded."""
    sets: dict[int, dict[int, _Folder]] = {}
    for part, f in zip(parts, folders, strict=True):
        spec = part.shard or ShardSpec(0, 1)
        sets.setdefault(spec.count, {})[spec.index] = f
    best: tuple[float, int, int] | None = None
    for count, members in sets.items():
        mine = [m.datasets.get(name) for m in members.values()]
        if len(members) < count or any(d is None or d.total is None for d in mine):
            continue
        started = max(_started(m.run_json) for m in members.values())
        if best is None or started > best[0]:
            best = (started, sum(d.total or 0 for d in mine if d),
                    sum(d.skipped or 0 for d in mine if d))
    return (best[1], best[2]) if best else (None, None)


def _started(run_json: dict[str, Any]) -> float:
    starts = [s.get("started_at") for s in _sessions(run_json)]
    return max((float(s) for s in starts if isinstance(s, int | float)), default=0.0)


def _merged_dataset(name: str, root: Path, parts: list[RunPart], folders: list[_Folder],
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
    merged.sums.done -= repeats
    merged.duplicates += repeats
    return merged


def _sharded_status(root: Path, parts: list[RunPart], now: float | None) -> RunStatus:
    folders = [_read_answers(p.folder, may_be_empty=p.shard is not None) for p in parts]
    now = time.time() if now is None else now
    answered, repeats = _answered_anywhere(folders)
    statuses = [_folder_status(f, answered, now) for f in folders]
    names = list(dict.fromkeys(name for f in folders for name in f.datasets))
    datasets = {name: _merged_dataset(name, root, parts, folders, repeats[name])
                for name in names}
    clock = _RateClock([_Activity(_sessions(f.run_json), st.live, st.total.first_t,
                                  st.last_activity) for f, st in zip(folders, statuses,
                                                                    strict=True)], now)
    cols = {name: _concat(f.cols[name] for f in folders if name in f.cols) for name in names}
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
        rescued=sum(st.rescued for st in statuses),
        rescue_files=[p for st in statuses for p in st.rescue_files],
    )
    status.notes = _sharded_notes(status, repeats)
    return status


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


def _notes(st: RunStatus, journal: JournalTail) -> list[str]:
    return [*_totals_note(st), *_folder_notes(st, journal), *_stop_note(st),
            *_rescue_note(st), *_unsettled_note(st), *_spend_notes(st)]


def _totals_note(st: RunStatus) -> list[str]:
    unknown = [n for n, d in st.datasets.items() if d.total is None]
    if not unknown:
        return []
    missing = _missing_shards([shard.part for shard in st.shards])
    if missing:
        why = f"no folder yet for shard {', '.join(missing)}: not started"
    elif st.shards:
        why = "no set of shard folders covering every shard records them"
    else:
        why = "run.json has no \"datasets\" totals: written by draftgen run at each session start"
    return [f"prompt totals unknown for {', '.join(unknown)} ({why}); pending not shown"]


def _folder_notes(st: RunStatus, journal: JournalTail) -> list[str]:
    notes = []
    for name, d in st.datasets.items():
        for file, n in d.torn_tail_bytes.items():
            notes.append(f"{name}/{file}: torn last line ({n} bytes without a newline): "
                         "left out; the next draftgen run cuts it")
        if d.old_schema:
            notes.append(f"{name}: {d.old_schema:,} answers from an older record schema "
                         "(no created_at, backend or token_check): counted, left out of rates")
        if d.duplicates:
            notes.append(f"{name}: {d.duplicates:,} duplicate answer lines (counted once)")
        if d.bad_lines:
            notes.append(f"{name}: {d.bad_lines:,} lines that are not records")
    if journal.torn_tail_bytes:
        notes.append(f"journal.jsonl: torn last line ({journal.torn_tail_bytes} bytes)")
    if not journal.complete:
        notes.append("journal: fewer open requests found than its counts say (lines that are "
                     "not JSON?): in flight may be undercounted")
    return notes


def _stop_note(st: RunStatus) -> list[str]:
    if st.journal.open and not st.live:
        usd = st.journal.open_usd
        billed = (f" (at most ${usd:,.4f} at their worst case, counted as spent when the run "
                  "resumes)" if usd else "")
        return [f"{len(st.journal.open):,} requests were in flight at the stop: sent, never "
                f"answered, possibly billed{billed}; the next run sends them again"]
    return []


def _rescue_note(st: RunStatus) -> list[str]:
    if st.rescue_error:
        return [f"a rescue file cannot be read: {st.rescue_error}"]
    if not st.rescued:
        return []
    return [f"{st.rescued:,} answers a session could not write to the run folder are kept in "
            f"{', '.join(st.rescue_files)}: paid for, not in the counts above; the next run "
            "adds them"]


def _unsettled_note(st: RunStatus) -> list[str]:
    if not st.unsettled_usd:
        return []
    return [f"earlier sessions' paid requests with no answer on disk (aborted, in flight at a "
            f"kill, or answers no disk would take): at most ${st.unsettled_usd:,.4f}, not in "
            "the $ above; counted as spent against budget.usd"]


def _spend_notes(st: RunStatus) -> list[str]:
    notes = []
    if st.total.cost_not_kept_usd:
        notes.append(f"${st.total.cost_not_kept_usd:,.4f} spent on quarantined answers and "
                     "billed failed requests: not in the $ above; counted as spent against "
                     "budget.usd")
    if st.cost_reports_refused:
        notes.append(f"{st.cost_reports_refused:,} answers or billed failures reported a cost "
                     "that was not believed (0, negative, not a number, or far from the "
                     "price): counted at their price (cost_source priced_report_refused)")
    return notes


def _reports_refused(session: Any) -> int:
    summary = session.get("summary") if isinstance(session, dict) else None
    n = summary.get("cost_reports_refused") if isinstance(summary, dict) else None
    return n if isinstance(n, int) else 0


def _missing_shards(parts: list[RunPart]) -> list[str]:
    """The shards ("I/N") of each shard count N seen that have no folder."""
    present: dict[int, set[int]] = {}
    for part in parts:
        if part.shard is not None:
            present.setdefault(part.shard.count, set()).add(part.shard.index)
    return [f"{i}/{n}" for n, have in sorted(present.items()) for i in range(n) if i not in have]


def _sharded_notes(st: RunStatus, repeats: Counter[str]) -> list[str]:
    notes = _totals_note(st)
    for shard in st.shards:
        where = f"shard {shard.part.label} ({shard.part.folder})"
        own = shard.status
        notes.extend(f"{where}: {n}" for n in [*_folder_notes(own, own.journal),
                                               *_stop_note(own), *_rescue_note(own)])
    notes.extend(f"{name}: {n:,} prompts answered in two shard folders (a re-sharded run): "
                 "counted once; export keeps the first" for name, n in repeats.items() if n)
    return [*notes, *_unsettled_note(st), *_spend_notes(st)]


# ---- showing it -------------------------------------------------------------------------------


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    ago = now - t
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    return f"{stamp} ({_duration(ago)} ago)" if ago >= 0 else stamp


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _rate_text(r: Rates | None) -> str:
    if r is None or r.seconds <= 0:
        return "-"
    j = r.as_json()
    return (f"{j['answers_per_s']:.2f} answers/s · {j['tokens_per_s']:,.0f} tokens/s · "
            f"${j['usd_per_min']:.4f}/min over {_duration(r.seconds)}")


def summary_line(st: RunStatus) -> str:
    """The run in one line, for progress logs: answered of total, failed, in flight, spend,
    the recent rate."""
    t = st.total
    of = f"/{t.total:,}" if t.total is not None else ""
    return (f"{t.sums.done:,}{of} answered · {t.failed:,} failed · {t.in_flight:,} in flight · "
            f"{t.sums.output_tokens:,} tokens · ${t.sums.cost_usd:.4f} · "
            f"{_rate_text(t.recent)}")


def render_status(st: RunStatus, console: Any) -> None:
    from rich.table import Table

    if st.shards:
        live_n = sum(s.state == "live" for s in st.shards)
        live = (f"[bold green]{live_n} of {len(st.shards)} shard folders live[/]" if live_n
                else f"not running ({len(st.shards)} shard folders)")
    else:
        live = (f"[bold green]live[/] (pid {st.pid} on {st.host})" if st.live
                else f"not running (last session: {st.last_outcome or 'killed or crashed'})")
    console.print(f"[bold]{st.root}[/] · {live} · {st.sessions} session(s)")
    console.print(f"started {_when(st.started_at, st.now)} · last activity "
                  f"{_when(st.last_activity, st.now)}", highlight=False)
    table = Table(header_style="bold")
    cols = ("dataset", "total", "done", "failed", "skipped", "pending", "in flight",
            "out tokens", "reasoning", "$", "truncated", "not exact")
    for col in cols:
        table.add_column(col, justify="left" if col == "dataset" else "right")
    for d in [*st.datasets.values(), st.total]:
        style = "bold" if d is st.total else None
        table.add_row(d.name, _n(d.total), _n(d.sums.done), _n(d.failed), _n(d.skipped),
                      _n(d.pending), _n(d.in_flight), _n(d.sums.output_tokens),
                      _n(d.sums.reasoning_tokens), f"{d.sums.cost_usd:.4f}", _n(d.truncated),
                      _n(d.not_exact), style=style)
    console.print(table)
    for title, groups in (("by backend", st.total.by_backend),
                          ("by provider/quantization", st.total.by_provider)):
        if len(groups) > 1 or title == "by backend":
            console.print(_group_table(title, groups))
    if st.total.failed_by_kind:
        kinds = ", ".join(f"{k} {v:,}" for k, v in st.total.failed_by_kind.most_common())
        console.print(f"failed by kind: {kinds}", highlight=False)
    console.print(f"rates, last {_duration(WINDOW_S)}: {_rate_text(st.total.recent)}",
                  highlight=False)
    console.print(f"rates, whole run: {_rate_text(st.total.overall)}", highlight=False)
    if st.shards:
        console.print(_shards_table(st.shards))
    for note in st.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def _group_table(title: str, groups: dict[str, Sums]) -> Any:
    from rich.table import Table

    from draftgen.printable import for_console

    table = Table(title=title, title_justify="left", header_style="bold")
    for col in ("", "answers", "out tokens", "$"):
        table.add_column(col, justify="left" if not col else "right")
    for key, s in sorted(groups.items(), key=lambda kv: -kv[1].done):
        table.add_row(for_console(key), f"{s.done:,}", f"{s.output_tokens:,}",
                      f"{s.cost_usd:.4f}")
    return table


def _shards_table(shards: list[ShardStatus]) -> Any:
    from rich.table import Table

    table = Table(title="by shard", title_justify="left", header_style="bold")
    for col in ("shard", "state", "done", "failed", "in flight", "out tokens", "$", "folder"):
        table.add_column(col, justify="right" if col not in ("shard", "state", "folder")
                         else "left")
    for s in shards:
        t = s.status.total
        state = s.state
        if s.state == "live":
            state = f"live (pid {s.status.pid} on {s.status.host})"
        elif s.state == "stopped":
            state = f"stopped ({s.status.last_outcome})"
        table.add_row(s.part.label, state, _n(t.sums.done), _n(t.failed), _n(t.in_flight),
                      _n(t.sums.output_tokens), f"{t.sums.cost_usd:.4f}", s.part.place)
    return table


def print_status(st: RunStatus, as_json: bool) -> None:
    """The status on stdout: one JSON object, or tables (160 columns when not a terminal)."""
    if as_json:
        sys.stdout.write(orjson.dumps(st.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    from rich.console import Console

    render_status(st, Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160))


def main(argv: list[str] | None = None) -> int:
    """`python -m draftgen.status RUN_DIR [--json]`: `draftgen status` without loading the
    rest of the command-line tool (its imports take a second or more on a small machine)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m draftgen.status",
                                 description="How far a draftgen run got; reads only.")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    try:
        st = collect_status(args.run_dir)
    except StatusError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    print_status(st, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
