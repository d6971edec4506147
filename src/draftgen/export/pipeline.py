"""`draftgen export`: run folder → filters → weights, caps → order, split → trainer files.

Memory stays flat in the number of answers:

* records are streamed from each responses.jsonl and rows written in batches;
* caps take a first pass that keeps at most N order keys (8 bytes each) per capped dataset;
* the shuffle is external: each kept row's record goes to one of K bucket files by the top
  bits of its order key (K ≈ input bytes / 64 MiB, at most 4096 and what the open-file limit
  allows), then the buckets are read back in key order, each sorted in memory. Peak memory is
  about one bucket (twice its size while it is split into lines), so it stays near 64 MiB of
  records up to 256 GB of input and grows slowly past that.

The export is written into a staging folder next to --out and moved into place when complete,
so a failed export leaves no partial output. The staging folder is made as any folder is (the
umask decides who may read it): an export holds what the run folder holds, which is made the
same way. For the whole export, a lock file next to --out (`.NAME.export-lock`, flocked) keeps
a second export to the same --out out: it fails at once, naming the first one's pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import resource
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from draftgen.errors import NO_ROOM, os_reason
from draftgen.export.branches import (
    AFTER_EXCLUDED,
    TURN_DROPOUT,
    Branch,
    branches,
    dropout_turns,
    group,
    kept_turns,
    order_problem,
)
from draftgen.export.checks import BrokenRow
from draftgen.export.options import ExportError, ExportFormat, ExportOptions
from draftgen.export.rows import TrainRow, build_row, sampling
from draftgen.export.select import CapFinder, DatasetTally, Pick, Selector
from draftgen.export.source import (
    Answer,
    ReadCounts,
    RunSource,
    RunTokenizer,
    SourceError,
    load_run_tokenizer,
    open_run,
)
from draftgen.export.writers import (
    ParquetSink,
    Sink,
    SpecForgeSink,
    SpeculatorsSink,
    TrajectorySink,
)
from draftgen.store.lock import read_lock_info
from draftgen.store.record import Record, decode_record, encode_record
from draftgen.store.runjson import changed_settings
from draftgen.store.shards import run_folder_at_or_above, run_folder_below

log = logging.getLogger("draftgen.export")

MANIFEST = "draftgen_export.json"
DUPLICATE = "duplicate_across_shards"
"""The exclusion reason of an answer whose prompt an earlier folder of the run answered."""


@dataclass
class ExportSummary:
    out: Path
    options: ExportOptions
    tallies: dict[str, DatasetTally] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def written(self, split: str | None = None) -> int:
        return sum(t.written[split] if split else sum(t.written.values())
                   for t in self.tallies.values())


def export_run(run_dir: Path, opts: ExportOptions) -> ExportSummary:
    """Export a run folder as `opts` says. Raises ExportError (nothing written to opts.out)."""
    started = time.monotonic()
    opts.validate()
    try:
        source = open_run(run_dir)
    except SourceError as e:
        raise ExportError(str(e)) from None
    datasets = _pick_datasets(source, opts)
    tok = _tokenizer(source, opts)
    summary = ExportSummary(out=opts.out, options=opts)
    summary.tallies = {d: DatasetTally() for d in datasets}
    summary.notes = _notes(source, opts, tok)
    selector = Selector(opts, tok.stop_token_id)
    _check_out(opts.out)
    try:
        with _export_lock(opts.out):
            staging = _staging_dir(opts)
            try:
                _export_into(staging, source, datasets, selector, tok, summary, run_dir)
            except BrokenRow as e:
                shutil.rmtree(staging, ignore_errors=True)
                raise ExportError(f"broken row, nothing written: {e}") from None
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    except OSError as e:  # a full disk, a quota, a read-only folder: one line, as a run says
        raise ExportError(_cannot_write(opts.out, e)) from None
    summary.seconds = time.monotonic() - started
    return summary


def _export_into(staging: Path, source: RunSource, datasets: list[str], selector: Selector,
                 tok: RunTokenizer, summary: ExportSummary, run_dir: Path) -> None:
    """Write the export in `staging`, then move it into place as --out."""
    opts = summary.options
    if opts.caps:
        selector.thresholds = _cap_thresholds(source, datasets, selector, opts.caps)
    sink = _make_sink(opts, staging, source, tok, run_dir)
    try:
        picks = _picks(source, datasets, selector, summary)
        rows = (_sorted_by_key(picks, source, datasets, opts, staging) if opts.shuffle
                else picks)
        _write_rows(rows, sink, opts, summary)
        summary.files = [opts.out / p.relative_to(staging) for p in sink.close()]
    except BaseException:
        sink.abort()
        raise
    summary.notes += sink.notes()
    _write_manifest(staging, run_dir, summary)
    _move_into_place(staging, opts)


def _cannot_write(out: Path, e: OSError) -> str:
    """The one line of an export stopped by an OSError (nothing was written to --out): the
    file named, unless it is one of the export's own temporary files (removed by now), whose
    folder is --out's."""
    own = str(out.parent / f".{out.name}.")
    where = e.filename if e.filename and not str(e.filename).startswith(own) else out.parent
    mend = ("free some space on that disk (or choose another --out)" if e.errno in NO_ROOM
            else "choose a --out you can write")
    return (f"{where}: {os_reason(e)}; export stopped, nothing written to --out {out}: "
            f"{mend}, then export again")


# ---- set-up ---------------------------------------------------------------------------------


def _pick_datasets(source: RunSource, opts: ExportOptions) -> list[str]:
    present = [d for d in source.datasets if d in source.responses]
    wanted = opts.datasets or present
    unknown = sorted(set(wanted) - set(present))
    if unknown:
        raise ExportError(f"no answers for dataset(s) {', '.join(unknown)} in {source.root} "
                          f"(datasets with answers: {', '.join(present) or 'none'})")
    for what, names in (("--cap", opts.caps), ("--weight", opts.weights)):
        stray = sorted(set(names) - set(wanted))
        if stray:
            raise ExportError(f"{what} names dataset(s) not exported: {', '.join(stray)}")
    return list(dict.fromkeys(wanted))


def _tokenizer(source: RunSource, opts: ExportOptions) -> RunTokenizer:
    needs_text = ((opts.format is ExportFormat.speculators and opts.text)
                  or opts.format is ExportFormat.specforge)
    if not (needs_text or opts.checks):
        return RunTokenizer(None, None, "not needed")
    return load_run_tokenizer(source, opts.tokenizer, decodes=needs_text)


def _notes(source: RunSource, opts: ExportOptions, tok: RunTokenizer) -> list[str]:
    notes = []
    if source.live:
        notes.append("a draftgen run is live on this folder: exported a snapshot of the answers "
                     "present when the export started")
    if opts.format is ExportFormat.speculators:
        if not opts.text:
            notes.append("text column left out (--no-text)")
        elif tok.tokenizer is None:
            notes.append(f"text column left out: the run's tokenizer is unavailable "
                         f"({tok.note}); pass --tokenizer PATH to decode it")
        else:
            notes.append("text decoded from input_ids with the run's tokenizer "
                         "(special tokens kept)")
    if opts.checks and tok.stop_token_id is None:
        notes.append(f"stop-token checks skipped: the run's format/tokenizer is unavailable "
                     f"({tok.note})")
    if _settings_differ(source):
        notes.append("the run's sessions differ in model, format, tokenizer or sampling "
                     "(accepted with --accept-changed-settings): the stop-token checks and the "
                     "speculators `sampling` metadata follow the last session's settings")
    if opts.max_len is not None:
        how = ("dropped" if opts.overlong.value == "drop"
               else "cut to max-len (prompt kept whole; answer tail lost)")
        notes.append(f"rows longer than {opts.max_len} tokens were {how}")
    order = f"shuffled (seed {opts.seed})" if opts.shuffle else "in run order"
    notes.append(f"rows {order}")
    return notes


def _settings_differ(source: RunSource) -> bool:
    recorded = [s.session.settings for s in source.sessions if s.session.settings is not None]
    return any(changed_settings(recorded[0], other) for other in recorded[1:])


def _check_out(out: Path) -> None:
    """--out names a folder outside any run folder (checked before its lock file is made)."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out}: exists and is not a folder")
    _refuse_run_folders(out)


@contextlib.contextmanager
def _export_lock(out: Path) -> Iterator[None]:
    """An exclusive flock on `.NAME.export-lock` next to --out while the export runs; a second
    export to the same --out fails at once. The file is removed on release; one removed (or
    replaced) between our open and our flock is opened again, so two exports never hold locks
    on two different files."""
    path = out.parent / f".{out.name}.export-lock"
    while True:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ExportError(f"--out {out}: cannot make its lock file {path}: "
                              f"{e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_lock_info(path)
            raise ExportError(
                f"--out {out}: another draftgen export is writing it (pid "
                f"{holder.get('pid', '?')} on {holder.get('host', '?')}); wait for it to "
                "finish or choose another --out") from None
        if _same_file(fd, path):
            break
        os.close(fd)
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
        with contextlib.suppress(OSError):  # the flock is what counts
            os.pwrite(fd, orjson.dumps(info), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)  # releases the flock


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _staging_dir(opts: ExportOptions) -> Path:
    """A new folder next to --out, made with the umask's mode (tempfile's are 0700). Checks
    --out's contents first: the caller holds the --out lock, so they cannot change."""
    out = opts.out
    if out.is_dir() and any(out.iterdir()):
        if not opts.overwrite:
            raise ExportError(f"--out {out}: folder is not empty (pass --overwrite to replace "
                              "it)")
        _refuse_replacing(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    while True:
        staging = out.parent / f".{out.name}.staging-{secrets.token_hex(4)}"
        with contextlib.suppress(FileExistsError):
            staging.mkdir()
            return staging


def _refuse_run_folders(out: Path) -> None:
    """An export never writes in a run folder (its staging folder goes next to --out)."""
    run = run_folder_at_or_above(out)
    if run is not None:
        where = "is" if run == out.resolve() else "is inside"
        raise ExportError(f"--out {out}: {where} the run folder {run}; export never writes in "
                          "a run folder: choose a folder outside it")


def _refuse_replacing(out: Path) -> None:
    """--overwrite replaces only an earlier export: a folder holding draftgen's manifest and no
    run folder."""
    if not (out / MANIFEST).is_file():
        raise ExportError(f"--out {out}: not a draftgen export (no {MANIFEST}); --overwrite "
                          "replaces only a folder draftgen exported: choose another --out")
    run = run_folder_below(out)
    if run is not None:
        raise ExportError(f"--out {out}: holds the run folder {run}; --overwrite would delete "
                          "it: choose another --out")


def _make_sink(opts: ExportOptions, staging: Path, source: RunSource, tok: RunTokenizer,
               run_dir: Path) -> Sink:
    if opts.format is ExportFormat.speculators:
        seed = f"{run_dir.resolve()}\x00{opts!r}"
        return SpeculatorsSink(staging, opts.splits, sampling(source.sampling),
                               tok.tokenizer if opts.text else None, opts.jsonl, seed)
    if opts.format is ExportFormat.specforge:
        return SpecForgeSink(staging, opts.splits, tok.tokenizer, tok.fmt)
    if opts.format is ExportFormat.trajectories:
        return TrajectorySink(staging, opts.splits, source.sampling)
    return ParquetSink(staging, opts.splits)


# ---- reading and choosing -------------------------------------------------------------------


def _records(source: RunSource, dataset: str, tally: DatasetTally | None = None
             ) -> Iterator[Answer]:
    """The dataset's answers; with `tally`, what was skipped is counted there and logged (an
    answer repeating one of an earlier shard folder counts as an excluded duplicate)."""
    counts = ReadCounts()
    yield from source.answers(dataset, counts, report=tally is not None)
    if tally is not None:
        tally.torn_tail_bytes = counts.torn_tail_bytes
        tally.bad_lines = counts.bad_lines
        if counts.duplicates:
            tally.records += counts.duplicates
            tally.excluded[DUPLICATE] += counts.duplicates


def _cap_thresholds(source: RunSource, datasets: list[str], selector: Selector,
                    caps: dict[str, int]) -> dict[str, int | None]:
    """First pass: per capped dataset, the largest order key among its N smallest."""
    out: dict[str, int | None] = {}
    trajectories = source.config.trajectory_datasets
    for d in datasets:
        if d not in caps:
            continue
        finder = CapFinder(caps[d])
        if d in trajectories:
            for record, _ in _trajectory_rows(source, d, selector):
                finder.add(selector.order_keys(d, record.id))
        else:
            for record in _records(source, d):
                if selector.exclusion(d, record) is None:
                    finder.add(selector.order_keys(d, record.id))
        out[d] = finder.threshold()
    return out


def _trajectory_rows(source: RunSource, dataset: str, selector: Selector,
                     tally: DatasetTally | None = None) -> Iterator[tuple[Record, Branch]]:
    """A `turns: all` dataset's rows: each conversation's turns up to the first excluded one,
    cut by --turn-dropout, one row per sequence of its layout (`export.branches`)."""
    opts = selector.opts
    counted = tally if tally is not None else DatasetTally()

    def read() -> Iterator[tuple[Record, str | None]]:
        for record in _records(source, dataset, tally):
            counted.records += 1
            reason = selector.exclusion(dataset, record)
            if reason:
                counted.excluded[reason] += 1
            if isinstance(record, Record):
                yield record, reason

    for conversation, conv in group(read()).items():
        problem = order_problem(conversation, conv.turns)
        if problem:
            if not opts.skip_broken:
                raise BrokenRow(f"dataset {dataset}: {problem}")
            counted.excluded["broken_row"] += len(conv.turns) - conv.excluded
            continue
        kept = kept_turns(conv)
        n = dropout_turns(conversation, len(kept), opts.turn_dropout, opts.seed)
        for reason, turns in ((AFTER_EXCLUDED, len(conv.turns) - conv.excluded - len(kept)),
                              (TURN_DROPOUT, len(kept) - n)):
            if turns:
                counted.excluded[reason] += turns
        if n:
            yield from branches(conversation, kept[:n], cut=n < len(kept))


Item = tuple[str, Record, Pick, Branch | None]


def _picks(source: RunSource, datasets: list[str], selector: Selector,
           summary: ExportSummary) -> Iterator[Item]:
    """Every row to write, in run order, with exclusions counted."""
    trajectories = source.config.trajectory_datasets
    for d in datasets:
        tally = summary.tallies[d]
        if d in trajectories:
            yield from _branch_picks(source, d, selector, tally)
            continue
        for record in _records(source, d, tally):
            tally.records += 1
            reason = selector.exclusion(d, record)
            if reason:
                tally.excluded[reason] += 1
                continue
            assert isinstance(record, Record)  # a damaged line always has a reason
            for pick in _row_picks(d, record.id, selector, tally):
                yield d, record, pick, None


def _branch_picks(source: RunSource, dataset: str, selector: Selector, tally: DatasetTally
                  ) -> Iterator[Item]:
    for record, branch in _trajectory_rows(source, dataset, selector, tally):
        reason = selector.length_exclusion(record)
        if reason:
            tally.excluded[reason] += 1
            continue
        for pick in _row_picks(dataset, record.id, selector, tally):
            yield dataset, record, pick, branch


def _row_picks(dataset: str, rid: str, selector: Selector, tally: DatasetTally) -> list[Pick]:
    """The copies of an eligible row after weights and caps (what leaves none, counted)."""
    if selector.copies(dataset, rid) == 0:
        tally.excluded["weight"] += 1
        return []
    picks = selector.picks(dataset, rid)
    if not picks:
        tally.excluded["cap"] += 1
    tally.extra_copies += max(0, len(picks) - 1)
    return picks


# ---- the external shuffle -------------------------------------------------------------------


def _bucket_count(source: RunSource, datasets: list[str], opts: ExportOptions) -> int:
    size = source.responses_bytes(datasets)
    wanted = max(1, min(opts.max_buckets, -(-size // opts.bucket_bytes)))
    return min(wanted, _open_file_budget(wanted))


def _open_file_budget(wanted: int, spare: int = 64) -> int:
    """How many bucket files may be open at once, raising the soft limit when allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted + spare:
        target = wanted + spare if hard == resource.RLIM_INFINITY else min(wanted + spare, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, soft - spare)


def _sorted_by_key(items: Iterator[Item], source: RunSource, datasets: list[str],
                   opts: ExportOptions, staging: Path) -> Iterator[Item]:
    """The items in order-key order, through K bucket files (range-partitioned by key)."""
    k = _bucket_count(source, datasets, opts)
    folder = Path(tempfile.mkdtemp(prefix=f".{opts.out.name}.shuffle-", dir=staging.parent))
    try:
        paths = [folder / f"{i:04d}.bin" for i in range(k)]
        with contextlib.ExitStack() as stack:
            files: list[IO[bytes]] = [stack.enter_context(open(p, "wb", buffering=1 << 16))
                                      for p in paths]
            for dataset, record, pick, branch in items:
                files[(pick.key * k) >> 64].write(_spill_line(dataset, record, pick, branch))
        for path in paths:
            yield from _read_bucket(path)
            path.unlink()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _spill_line(dataset: str, record: Record, pick: Pick, branch: Branch | None) -> bytes:
    head = f"{pick.key:016x}\t{pick.copy}\t{pick.split}\t{dataset}\t".encode()
    # A record's JSON holds no raw tab: the branch, if any, follows the record after one.
    tail = b"" if branch is None else b"\t" + branch.encode()
    return head + encode_record(record) + tail + b"\n"


def _read_bucket(path: Path) -> Iterator[Item]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    del data
    lines.pop()  # after the last newline
    lines.sort()  # the fixed-width hex key comes first
    for line in lines:
        key, copy, split, dataset, body = line.split(b"\t", 4)
        pick = Pick(int(key, 16), int(copy), split.decode())
        body, _, branch = body.partition(b"\t")
        yield (dataset.decode(), decode_record(body), pick,
               Branch.decode(branch) if branch else None)


# ---- writing --------------------------------------------------------------------------------


def _write_rows(items: Iterator[Item], sink: Sink, opts: ExportOptions,
                summary: ExportSummary) -> None:
    batches: dict[str, list[TrainRow]] = {s: [] for s in opts.splits}
    max_len = opts.max_len if opts.overlong.value == "truncate" else None
    for dataset, record, pick, branch in items:
        row = build_row(dataset, record, pick.split, max_len, branch)
        tally = summary.tallies[dataset]
        tally.written[pick.split] += 1
        tally.truncated_to_max_len += row.cut
        batch = batches[pick.split]
        batch.append(row)
        if len(batch) >= opts.batch_rows:
            sink.write(pick.split, batch)
            batches[pick.split] = []
    for split, batch in batches.items():
        if batch:
            sink.write(split, batch)


def _write_manifest(staging: Path, run_dir: Path, summary: ExportSummary) -> None:
    opts = summary.options
    data: dict[str, Any] = {
        "run_dir": str(run_dir.resolve()),
        "created_at": round(time.time(), 3),
        "options": {k: (v.value if hasattr(v, "value") else str(v) if isinstance(v, Path) else v)
                    for k, v in vars(opts).items()},
        "written": {s: summary.written(s) for s in opts.splits},
        "datasets": {d: {"records": t.records, "written": dict(t.written),
                         "excluded": dict(t.excluded), "extra_copies": t.extra_copies,
                         "truncated_to_max_len": t.truncated_to_max_len,
                         "torn_tail_bytes": t.torn_tail_bytes, "bad_lines": t.bad_lines}
                     for d, t in summary.tallies.items()},
        "files": [str(f.relative_to(opts.out)) for f in summary.files],
        "notes": summary.notes,
    }
    (staging / MANIFEST).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    summary.files.append(opts.out / MANIFEST)


def _move_into_place(staging: Path, opts: ExportOptions) -> None:
    out = opts.out
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out)
