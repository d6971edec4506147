"""`draftgen audit RUN_DIR`: every answer of a run checked against the run's model format.

The run's responses files are cut into byte ranges of a few hundred records (from the index, so
nothing is parsed twice) and the ranges are audited by a pool of worker processes, each holding
the run's tokenizer and format; results come back in file order. Memory stays flat: a range is
read, checked and dropped; only counts, example IDs and the failing lines' byte ranges are kept.
Nothing is written in the run folder (see `audit.quarantine` for moving failing answers out).
A sharded run is audited as one: every folder of `store.reader.Run`, with one tokenizer
and format (the shards must share them), an ID answered in two folders failing `duplicate_id`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from draftgen.assets import resolve_builtin
from draftgen.audit.conversation_checks import TrajectoryFile, audit_trajectories
from draftgen.audit.engine import (
    UNJUDGED,
    Auditor,
    Chunk,
    ChunkResult,
    FormatSpec,
    Judges,
    SessionSpecs,
    audit_chunk,
    init_worker,
)
from draftgen.audit.engine import run_chunk as _run_chunk
from draftgen.audit.report import AuditReport, DatasetAudit
from draftgen.errors import DraftgenError
from draftgen.formats import FormatError
from draftgen.store.reader import Run, RunFolder, RunOpenError, Snapshot
from draftgen.store.runjson import RunInfo, SessionModel, run_model, tokenizer_source
from draftgen.tokenize import TokenizerError

CHUNK_RECORDS = 256
"""Records per byte range: one encode_batch call renders their prompts."""

Progress = Callable[[int, int], None]


class AuditError(DraftgenError):
    """The run cannot be audited (not a run, no tokenizer, unknown format)."""


def format_spec(info: RunInfo, tokenizer: Path | None = None,
                root: Path | None = None) -> FormatSpec:
    """The tokenizer, format and routing the run used, from run.json's stored config
    (`store.runjson.run_model`); the tokenizer is the run folder's copy of it (`root`) where
    one is kept."""
    model = run_model(info, root, tokenizer)
    if model.format is None:
        raise AuditError("run.json names no model format (config.model.format): cannot audit")
    if model.tokenizer is None:
        raise AuditError("run.json names no tokenizer (config.model.tokenizer); pass "
                         "--tokenizer PATH")
    return FormatSpec(model.tokenizer, model.format, model.options, info.stored_config.routing)


def _load(spec: SessionSpecs) -> Judges:
    try:
        return spec.load()
    except TokenizerError as e:
        raise AuditError(f"cannot load the run's tokenizer: {e} (pass --tokenizer PATH)") from None
    except FormatError as e:
        raise AuditError(f"cannot use the run's model format {spec.main.format!r}: {e}"
                         ) from None


# ---- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _File:
    """One dataset's responses file in one folder of the run."""

    key: str
    """How the report names it: the dataset, or its path in a shard folder (shards/0-of-4/d)."""
    folder: RunFolder
    name: str
    snapshot: Snapshot


def _duplicate_ends(files: list[_File]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each file's record end offsets, and the end offsets of the records whose ID appeared
    earlier (in this file, an earlier dataset's or an earlier folder's), from the index."""
    ends: list[np.ndarray] = []
    hashes = []
    for f in files:
        cols = f.folder.index_columns(f.name, f.snapshot.size)
        ends.append(cols.rows["end"].copy())
        hashes.append(cols.rows["idh"])
    all_h = np.concatenate(hashes) if hashes else np.empty(0, dtype=np.uint64)
    first = np.zeros(len(all_h), dtype=bool)
    first[np.unique(all_h, return_index=True)[1]] = True
    dups: dict[str, np.ndarray] = {}
    pos = 0
    for f, mine in zip(files, ends, strict=True):
        dups[f.key] = np.sort(mine[~first[pos:pos + len(mine)]])
        pos += len(mine)
    return {f.key: e for f, e in zip(files, ends, strict=True)}, dups


def _chunks(name: str, path: Path, ends: np.ndarray, dups: np.ndarray, stop: int,
            per_chunk: int, judges: tuple[str, ...] = ()) -> Iterator[Chunk]:
    """Byte ranges of about `per_chunk` records; the last one runs to the last newline."""
    start = 0
    for i in range(0, len(ends), per_chunk):
        last = i + per_chunk >= len(ends)
        end = stop if last else int(ends[min(i + per_chunk, len(ends)) - 1])
        lo, hi = np.searchsorted(dups, [start, end], side="right")
        yield Chunk(name, str(path), start, end, frozenset(dups[lo:hi].tolist()), judges)
        start = end
    if not len(ends) and stop > 0:
        yield Chunk(name, str(path), 0, stop, judges=judges)


# ---- running ----------------------------------------------------------------------------------


def _in_process(judges: Judges, chunks: Iterator[Chunk]) -> Iterator[ChunkResult]:
    for chunk in chunks:
        yield audit_chunk(judges, chunk)


def _in_pool(spec: SessionSpecs, workers: int, chunks: Iterator[Chunk]) -> Iterator[ChunkResult]:
    """Results in chunk order, at most 3 ranges per worker in flight."""
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                             initializer=init_worker, initargs=(spec,)) as pool:
        pending: list[Future[ChunkResult]] = []
        for chunk in chunks:
            pending.append(pool.submit(_run_chunk, chunk))
            if len(pending) >= workers * 3:
                yield pending.pop(0).result()
        for fut in pending:
            yield fut.result()


def _folders(root: Path) -> list[RunFolder]:
    """The run's folders that hold a run (a shard folder just created holds nothing yet)."""
    try:
        folders = Run.open(root).holding()
    except RunOpenError as e:
        raise AuditError(str(e)) from None
    if not folders:
        raise AuditError(f"{root}: no shard folder holds a run yet")
    return folders


def _run_spec(folders: list[RunFolder], tokenizer: Path | None) -> FormatSpec:
    """The tokenizer and format every folder used; their routing rules together."""
    specs = [format_spec(f.info, tokenizer, f.root) for f in folders]
    first = specs[0]
    sha = folders[0].info.tokenizer.sha256
    for f, spec in zip(folders[1:], specs[1:], strict=True):
        differs = (spec.format, spec.options) != (first.format, first.options) or (
            tokenizer is None and f.info.tokenizer.sha256 not in (None, sha))
        if differs:
            raise AuditError(f"{f.root}: run with another model format or tokenizer "
                             f"than {folders[0].root}; audit each folder on its own")
    routing: dict[str, dict[str, Any]] = {}
    for spec in reversed(specs):
        routing.update(spec.routing)
    return FormatSpec(first.tokenizer, first.format, first.options, routing)


def _session_judges(folders: list[RunFolder], judges: Judges, tokenizer: Path | None
                    ) -> tuple[dict[Path, tuple[str, ...]], list[str]]:
    """Per folder, the judge of each of its sessions (`Chunk.judges`): the run's own where a
    session's format, options and tokenizer hash are those of the run's tokenizer as loaded,
    else the session's own (its tokenizer from the run folder's copy, or where it was, if its
    hash is still the one recorded), added to `judges`; and notes on sessions whose settings
    cannot be had (their answers are counted as not checked)."""
    main = judges.specs.main
    out: dict[Path, tuple[str, ...]] = {}
    notes: list[str] = []
    for f in folders:
        sessions = f.info.sessions
        if all(s.settings is None for s in sessions):
            continue  # written before sessions recorded settings: all judged as the run's
        main_sha = None if tokenizer else judges.main.tokenizer.sha256
        keys = []
        for i in range(len(sessions)):
            session = SessionModel.of(f.info.settings_of(i) or {})
            spec = _settings_spec(session, main, tokenizer, f.root)
            sha = None if tokenizer else session.tokenizer_sha256
            if (spec.format, spec.options) == (main.format, main.options) and (
                    sha in (None, main_sha)):
                keys.append("")
                continue
            key = orjson.dumps([spec.tokenizer, sha, spec.format, spec.options],
                               option=orjson.OPT_SORT_KEYS).decode()
            if key not in judges.specs.others:
                problem = _add_judge(judges, key, spec, sha)
                if problem:
                    notes.append(f"{f.root}: answers of session {i} not audited: "
                                 f"{problem}")
                    key = UNJUDGED
            keys.append(key)
        out[f.root] = tuple(keys)
    return out, notes


def _settings_spec(session: SessionModel, main: FormatSpec, tokenizer: Path | None,
                   root: Path) -> FormatSpec:
    """A session's format, format options and tokenizer, from its recorded settings (the
    tokenizer: the copy the run folder `root` keeps of it, else where it was)."""
    path = str(tokenizer) if tokenizer else tokenizer_source(
        root, session.tokenizer_sha256, session.tokenizer_path) or main.tokenizer
    return FormatSpec(resolve_builtin(str(path)), session.format or main.format,
                      session.options, main.routing)


def _add_judge(judges: Judges, key: str, spec: FormatSpec, sha: str | None) -> str | None:
    """Load a session's spec into `judges`; what prevents it, if anything."""
    try:
        auditor = spec.load()
    except (TokenizerError, FormatError, OSError) as e:
        return f"its tokenizer or format cannot be loaded ({e}); pass --tokenizer PATH"
    if sha is not None and auditor.tokenizer.sha256 != sha:
        return (f"its tokenizer (sha256 {sha[:12]}…) is no longer at {spec.tokenizer}; pass "
                "--tokenizer PATH")
    judges.add(key, spec, auditor)
    return None


def _files(root: Path, folders: list[RunFolder]) -> list[_File]:
    files = []
    for f in folders:
        where = "" if f.part.shard is None else f"{f.root.relative_to(root)}/"
        for name in f.dataset_names():
            snapshot = f.responses(name)
            if snapshot.path.exists():
                files.append(_File(f"{where}{name}", f, name, snapshot))
    return files


def audit_run(root: Path, *, workers: int | None = None, tokenizer: Path | None = None,
              per_chunk: int = CHUNK_RECORDS, progress: Progress | None = None) -> AuditReport:
    started = time.perf_counter()
    folders = _folders(root)
    spec = SessionSpecs(_run_spec(folders, tokenizer))
    judges = _load(spec)
    auditor = judges.main
    judge_keys, session_notes = _session_judges(folders, judges, tokenizer)
    report = AuditReport(root=root, live=any(f.live for f in folders),
                         tokenizer=str(auditor.tokenizer.path), format=spec.main.format)
    _tokenizer_note(report, folders[0].info, auditor, tokenizer)
    files = _files(root, folders)
    ends, dups = _duplicate_ends(files)
    total = sum(len(e) for e in ends.values())
    chunks: list[Chunk] = []
    for f in files:
        torn = f.folder.torn_tail(f.snapshot)
        report.datasets[f.key] = DatasetAudit(snapshot_size=f.snapshot.size,
                                              torn_tail_bytes=torn, folder=f.folder.root,
                                              name=f.name)
        if torn:
            report.notes.append(f"{f.key}/responses.jsonl: torn last line ({torn} bytes "
                                "without a newline): not audited; the next draftgen run cuts it")
        chunks.extend(_chunks(f.key, f.snapshot.path, ends[f.key], dups[f.key],
                              f.snapshot.size - torn, per_chunk, judge_keys.get(f.folder.root, ())))
    workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
    workers = min(workers, max(1, len(chunks)))
    report.workers = workers
    results = (_in_process(judges, iter(chunks)) if workers == 1
               else _in_pool(spec, workers, iter(chunks)))
    unjudged = 0
    for r in results:
        report.add(r)
        unjudged += r.unjudged
        if progress is not None:
            progress(report.answers, total)
    _audit_trajectories(report, files)
    if report.live:
        report.notes.append("a draftgen run is live on this folder: audited the answers present "
                            "when the audit started")
    report.unchecked = unjudged
    if unjudged:
        report.notes.extend(session_notes)
        report.notes.append(f"{unjudged:,} answer(s) not checked: their session's tokenizer or "
                            "format cannot be had (see above)")
    if report.problems.get("missing_fields"):
        report.notes.append("some records are from an older schema (fields missing): the "
                            "checks needing those fields were skipped for them")
    report.seconds = time.perf_counter() - started
    return report


def _audit_trajectories(report: AuditReport, files: list[_File]) -> None:
    """The `turns: all` datasets' trajectories: summaries, and findings on their lines."""
    wanted = set().union(*(f.folder.info.stored_config.trajectory_datasets for f in files))
    chosen = [TrajectoryFile(f.key, f.name, str(f.snapshot.path),
                             report.datasets[f.key].snapshot_size
                             - report.datasets[f.key].torn_tail_bytes)
              for f in files if f.name in wanted]
    if not chosen:
        return
    report.trajectories, findings, lines = audit_trajectories(chosen)
    for finding in findings:
        report.add_finding(finding)
    for key, turns in lines.items():
        report.datasets[key].turns = turns


def _tokenizer_note(report: AuditReport, info: RunInfo, auditor: Auditor,
                    override: Path | None) -> None:
    expected = info.tokenizer.sha256
    if override is None and expected and expected != auditor.tokenizer.sha256:
        report.notes.append(f"{auditor.tokenizer.path}: sha256 differs from the one in run.json "
                            "(the tokenizer file changed since the run)")
