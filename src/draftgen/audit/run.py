"""`draftgen audit RUN_DIR`: every answer of a run checked against the run's model format.

The run's responses files are cut into byte ranges of a few hundred records (from the index, so
nothing is parsed twice) and the ranges are audited by a pool of worker processes, each holding
the run's tokenizer and format; results come back in file order. Memory stays flat: a range is
read, checked and dropped; only counts, example IDs and the failing lines' byte ranges are kept.
Nothing is written in the run folder (see `audit.quarantine` for moving failing answers out).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from draftgen.assets import resolve_builtin
from draftgen.audit.checks import Routing
from draftgen.audit.engine import Auditor, Chunk, ChunkResult, FormatSpec, audit_chunk, init_worker
from draftgen.audit.engine import run_chunk as _run_chunk
from draftgen.audit.report import AuditReport, DatasetAudit
from draftgen.formats import FormatError
from draftgen.status import StatusError, open_layout
from draftgen.store.fast_index import load_index_columns, torn_tail_bytes
from draftgen.store.layout import RunLayout
from draftgen.store.lock import lock_holder
from draftgen.tokenize import TokenizerError

CHUNK_RECORDS = 256
"""Records per byte range: one encode_batch call renders their prompts."""

Progress = Callable[[int, int], None]


class AuditError(Exception):
    """The run cannot be audited (not a run, no tokenizer, unknown format)."""


def format_spec(run_json: dict[str, Any], tokenizer: Path | None = None) -> FormatSpec:
    """The tokenizer, format and routing the run used, from run.json's stored config."""
    config = run_json.get("config") if isinstance(run_json.get("config"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    name = model.get("format")
    if not isinstance(name, str):
        raise AuditError("run.json names no model format (config.model.format): cannot audit")
    path = str(tokenizer) if tokenizer else None
    stored = run_json.get("tokenizer") if isinstance(run_json.get("tokenizer"), dict) else {}
    for candidate in (stored.get("path"), model.get("tokenizer")):
        if path is None and isinstance(candidate, str) and candidate:
            path = resolve_builtin(candidate)
    if path is None:
        raise AuditError("run.json names no tokenizer (config.model.tokenizer); pass "
                         "--tokenizer PATH")
    options = model.get("format_options") if isinstance(model.get("format_options"), dict) else {}
    return FormatSpec(path, name, dict(options), Routing.from_config(config).by_backend)


def _load(spec: FormatSpec) -> Auditor:
    try:
        return spec.load()
    except TokenizerError as e:
        raise AuditError(f"cannot load the run's tokenizer: {e} (pass --tokenizer PATH)") from None
    except FormatError as e:
        raise AuditError(f"cannot use the run's model format {spec.format!r}: {e}") from None


# ---- planning ---------------------------------------------------------------------------------


def _duplicate_ends(layout: RunLayout, names: list[str], sizes: dict[str, int]
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """Each dataset's record end offsets, and the end offsets of the records whose ID appeared
    earlier (in this file or an earlier dataset's), from the index; and lines not records."""
    ends: dict[str, np.ndarray] = {}
    hashes = []
    bad = 0
    for name in names:
        cols = load_index_columns(layout, name, sizes[name])
        ends[name] = cols.rows["end"].copy()
        hashes.append(cols.rows["idh"])
        bad += cols.bad_lines
    all_h = np.concatenate(hashes) if hashes else np.empty(0, dtype=np.uint64)
    first = np.zeros(len(all_h), dtype=bool)
    first[np.unique(all_h, return_index=True)[1]] = True
    dups: dict[str, np.ndarray] = {}
    pos = 0
    for name in names:
        n = len(ends[name])
        dups[name] = np.sort(ends[name][~first[pos:pos + n]])
        pos += n
    return ends, dups, bad


def _chunks(name: str, path: Path, ends: np.ndarray, dups: np.ndarray, stop: int,
            per_chunk: int) -> Iterator[Chunk]:
    """Byte ranges of about `per_chunk` records; the last one runs to the last newline."""
    start = 0
    for i in range(0, len(ends), per_chunk):
        last = i + per_chunk >= len(ends)
        end = stop if last else int(ends[min(i + per_chunk, len(ends)) - 1])
        lo, hi = np.searchsorted(dups, [start, end], side="right")
        yield Chunk(name, str(path), start, end, frozenset(dups[lo:hi].tolist()))
        start = end
    if not len(ends) and stop > 0:
        yield Chunk(name, str(path), 0, stop)


# ---- running ----------------------------------------------------------------------------------


def _in_process(auditor: Auditor, chunks: Iterator[Chunk]) -> Iterator[ChunkResult]:
    for chunk in chunks:
        yield audit_chunk(auditor, chunk)


def _in_pool(spec: FormatSpec, workers: int, chunks: Iterator[Chunk]) -> Iterator[ChunkResult]:
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


def audit_run(root: Path, *, workers: int | None = None, tokenizer: Path | None = None,
              per_chunk: int = CHUNK_RECORDS, progress: Progress | None = None) -> AuditReport:
    started = time.perf_counter()
    try:
        layout, run_json = open_layout(root)
    except StatusError as e:
        raise AuditError(str(e)) from None
    spec = format_spec(run_json, tokenizer)
    auditor = _load(spec)
    report = AuditReport(root=root, live=lock_holder(layout.lock) is not None,
                         tokenizer=str(auditor.tokenizer.path), format=spec.format)
    _tokenizer_note(report, run_json, auditor, tokenizer)
    names = [n for n in layout.dataset_names() if layout.responses(n).exists()]
    sizes = {n: layout.responses(n).stat().st_size for n in names}
    ends, dups, _ = _duplicate_ends(layout, names, sizes)
    total = sum(len(e) for e in ends.values())
    chunks: list[Chunk] = []
    for name in names:
        torn = torn_tail_bytes(layout.responses(name), sizes[name])
        report.datasets[name] = DatasetAudit(snapshot_size=sizes[name], torn_tail_bytes=torn)
        if torn:
            report.notes.append(f"{name}/responses.jsonl: torn last line ({torn} bytes without "
                                "a newline): not audited; the next draftgen run cuts it")
        chunks.extend(_chunks(name, layout.responses(name), ends[name], dups[name],
                              sizes[name] - torn, per_chunk))
    workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
    workers = min(workers, max(1, len(chunks)))
    report.workers = workers
    results = (_in_process(auditor, iter(chunks)) if workers == 1
               else _in_pool(spec, workers, iter(chunks)))
    for r in results:
        report.add(r)
        if progress is not None:
            progress(report.answers, total)
    if report.live:
        report.notes.append("a draftgen run is live on this folder: audited the answers present "
                            "when the audit started")
    if report.problems.get("missing_fields"):
        report.notes.append("some records are from an older schema (fields missing): the "
                            "checks needing those fields were skipped for them")
    report.seconds = time.perf_counter() - started
    return report


def _tokenizer_note(report: AuditReport, run_json: dict[str, Any], auditor: Auditor,
                    override: Path | None) -> None:
    expected = (run_json.get("tokenizer") or {}).get("sha256") if isinstance(
        run_json.get("tokenizer"), dict) else None
    if override is None and expected and expected != auditor.tokenizer.sha256:
        report.notes.append(f"{auditor.tokenizer.path}: sha256 differs from the one in run.json "
                            "(the tokenizer file changed since the run)")
