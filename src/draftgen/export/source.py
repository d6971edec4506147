"""Reading a run folder without touching it: run.json, the tokenizer it names, and the records
of every `RUN/<dataset>/responses.jsonl`, streamed line by line. A sharded run (`draftgen run
--shard`) is read as one: every folder of `store.reader.Run`, in order; a prompt answered
in two folders (a run re-sharded) is read once, from the first.

Each file is read up to the size it had when the folder was opened (a snapshot), so several
passes over a folder that a live run is still appending to see the same lines. A last line
without its newline (torn by a kill, or still being written) is skipped and reported, never cut:
nothing here writes in the run folder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from draftgen.errors import DraftgenError
from draftgen.formats import Format, FormatError, get_format
from draftgen.store.columns import id_hash
from draftgen.store.prompt_refs import LineReader
from draftgen.store.reader import (
    LineScan,
    NotARun,
    Run,
    RunFolder,
    RunOpenError,
    Snapshot,
    complete_lines,
)
from draftgen.store.record import Damaged, Record
from draftgen.store.runjson import (
    RunInfo,
    Session,
    SessionModel,
    StoredConfig,
    kept_tokenizer,
    run_model,
    tokenizer_source,
)
from draftgen.store.shards import RunPart, seen_earlier
from draftgen.tokenize import Tokenizer, TokenizerError, load_tokenizer

log = logging.getLogger("draftgen.export")

Answer = Record | Damaged
"""A line of responses.jsonl: its record, or a damaged one (a JSON object that is not a
record), which the export reports as a broken row."""
Line = TypeVar("Line")


class SourceError(DraftgenError):
    """The run folder cannot be read as one."""


@dataclass
class ReadCounts:
    """What reading a dataset's files skipped, over every folder of the run."""

    torn_tail_bytes: int = 0
    bad_lines: int = 0
    duplicates: int = 0
    """Answers to a prompt answered in an earlier folder of the run (a re-sharded run)."""


@dataclass(frozen=True)
class SourceSession:
    """A session of one folder of the run."""

    session: Session
    shard: str | None = None
    """The folder's shard (e.g. "0/4") in a sharded run."""
    folder: Path = Path()
    index: int = 0
    """Its index in its folder's run.json: what the records it wrote name as their `session`."""
    live: bool = False
    """The folder's live run (the last session of a folder whose lock is held)."""

    @property
    def killed(self) -> bool:
        """It never closed (no outcome in run.json) and no run holds its folder: killed, or
        crashed past its handlers."""
        return self.session.outcome is None and not self.live


@dataclass
class RunSource:
    """A run folder opened for reading (every folder of a sharded run)."""

    root: Path
    info: RunInfo
    """The first folder's run.json that holds anything (the shards of a run share their
    config)."""
    responses: dict[str, list[Snapshot]]
    """Each dataset's responses files, in folder order."""
    failures: dict[str, list[Snapshot]]
    live: bool
    """A draftgen run held a folder's lock when it was opened."""
    folders: list[RunFolder] = field(default_factory=list)
    sessions: list[SourceSession] = field(default_factory=list)
    """Every folder's sessions in start order."""
    info_root: Path | None = None
    """The folder whose run.json `info` is."""
    _repeats: dict[str, list[set[int]]] = field(default_factory=dict)

    @property
    def parts(self) -> list[RunPart]:
        return [f.part for f in self.folders]

    @property
    def datasets(self) -> list[str]:
        return sorted(set(self.responses) | set(self.failures))

    @property
    def config(self) -> StoredConfig:
        return self.info.stored_config

    @property
    def sampling(self) -> dict[str, Any]:
        return self.config.sampling or {}

    def responses_bytes(self, datasets: list[str]) -> int:
        return sum(s.size for d in datasets for s in self.responses.get(d, []))

    def answers(self, dataset: str, counts: ReadCounts | None = None, report: bool = False
                ) -> Iterator[Answer]:
        """The dataset's answers, file after file; an answer to a prompt answered in an
        earlier folder is skipped and counted in `counts.duplicates`. `report`: log what was
        skipped (torn last lines, lines that are not JSON)."""
        for _, record in self.answers_by_folder(dataset, counts, report):
            yield record

    def answers_by_folder(self, dataset: str, counts: ReadCounts | None = None,
                          report: bool = False) -> Iterator[tuple[Path, Answer]]:
        """`answers`, each with the folder whose file holds it."""
        counts = counts if counts is not None else ReadCounts()
        for snapshot, repeated in zip(self.responses.get(dataset, []), self._repeated(dataset),
                                      strict=True):
            with LineReader(snapshot.path) as reader:
                for record in _read(snapshot, counts, report, reader.read):
                    if repeated and id_hash(str(record.id)) in repeated:
                        counts.duplicates += 1
                        continue
                    yield snapshot.folder, record

    def failure_lines_by_folder(self, dataset: str, report: bool = False
                                ) -> Iterator[tuple[Path, dict[str, Any]]]:
        """The dataset's failed attempts, file after file, each with the folder whose file
        holds it."""
        for snapshot in self.failures.get(dataset, []):
            for line in _read(snapshot, ReadCounts(), report, _parse_object):
                yield snapshot.folder, line

    def _repeated(self, dataset: str) -> list[set[int]]:
        """Per responses file, the ID hashes an earlier folder answered (from the indexes;
        empty sets and nothing read for a run in one folder)."""
        if dataset not in self._repeats:
            snapshots = self.responses.get(dataset, [])
            if len(snapshots) < 2:
                self._repeats[dataset] = [set() for _ in snapshots]
            else:
                folders = {f.root: f for f in self.folders}
                hashes = [folders[s.folder].index_columns(dataset, s.size).rows["idh"]
                          for s in snapshots]
                self._repeats[dataset] = [set(h.tolist()) for h in seen_earlier(hashes)]
        return self._repeats[dataset]


def _read(snapshot: Snapshot, counts: ReadCounts, report: bool,
          parse: Callable[[bytes, int], Line | None]) -> Iterator[Line]:
    scan = LineScan()
    yield from iter_jsonl(snapshot, scan, parse)
    counts.torn_tail_bytes += scan.torn_tail_bytes
    counts.bad_lines += len(scan.bad_lines)
    if report:
        report_scan(snapshot.path, scan)


def open_run(root: Path) -> RunSource:
    """Read run.json and take a snapshot of every dataset file's size, in every folder of the
    run (`store.reader.Run`)."""
    not_a_run = SourceError(f"{root}: not a draftgen run folder (no run.json, no dataset folders)")
    try:
        run = Run.open(root)
    except NotARun:
        raise not_a_run from None
    except RunOpenError as e:
        raise SourceError(str(e)) from None
    if not any(f.holds_run for f in run.folders):
        raise not_a_run
    responses: dict[str, list[Snapshot]] = {}
    failures: dict[str, list[Snapshot]] = {}
    for folder in run.folders:
        for name in folder.dataset_names():
            for snapshot, into in ((folder.responses(name), responses),
                                   (folder.failures(name), failures)):
                if snapshot.path.is_file():
                    into.setdefault(name, []).append(snapshot)
    _warn_rescued(run.folders)
    first = next((f for f in run.folders if f.info.recorded), None)
    return RunSource(root, first.info if first else RunInfo(), responses, failures,
                     live=run.live, folders=run.folders, sessions=_sessions(run),
                     info_root=first.root if first else None)


def _warn_rescued(folders: list[RunFolder]) -> None:
    """Answers waiting in rescue files are not exported until a run adds them."""
    for folder in folders:
        waiting = folder.rescued_count()
        if waiting:
            log.warning("%s: %d answers wait in rescue files (a write failed) and are not "
                        "exported; `draftgen run` with the run's config adds them",
                        folder.root, waiting)


def _sessions(run: Run) -> list[SourceSession]:
    sessions = [SourceSession(s, f.part.label if run.sharded else None, f.root, i,
                              live=f.holder is not None and i == len(f.sessions) - 1)
                for f in run.folders for i, s in enumerate(f.sessions)]
    if run.sharded:
        sessions.sort(key=lambda s: s.session.started_at or 0.0)
    return sessions


def iter_jsonl(snapshot: Snapshot, scan: LineScan,
               parse: Callable[[bytes, int], Line | None]) -> Iterator[Line]:
    """The JSON objects of a JSONL file up to its snapshot size, one at a time, as `parse`
    reads them (given each line and the byte it starts at)."""
    for lineno, start, line in complete_lines(snapshot, scan):
        record = parse(line, start)
        if record is None:
            if line.strip():
                scan.bad_lines.append(lineno)
            continue
        yield record


def _parse_object(line: bytes, _start: int) -> dict[str, Any] | None:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def report_scan(path: Path, scan: LineScan) -> None:
    if scan.torn_tail_bytes:
        log.warning("%s: skipped a torn last line (%d bytes without a newline)", path,
                    scan.torn_tail_bytes)
    if scan.bad_lines:
        shown = ", ".join(str(n) for n in scan.bad_lines[:5])
        log.warning("%s: skipped %d lines that are not JSON objects (lines %s%s)", path,
                    len(scan.bad_lines), shown, ", …" if len(scan.bad_lines) > 5 else "")


@dataclass
class RunTokenizer:
    """The run's tokenizer and format, when they can be loaded on this machine."""

    tokenizer: Tokenizer | None
    fmt: Format | None
    note: str
    """Why one is missing, or where it came from."""

    @property
    def stop_token_id(self) -> int | None:
        if self.fmt is None:
            return None
        try:
            return self.fmt.stop_token_id
        except FormatError:
            return None

    @property
    def end_think_id(self) -> int | None:
        if self.fmt is None or self.tokenizer is None or not self.fmt.end_think_token:
            return None
        return self.tokenizer.token_to_id(self.fmt.end_think_token)


_TOKENIZERS: dict[tuple[Path, int, int], Tokenizer] = {}


def _cached_tokenizer(path: str) -> Tokenizer:
    """Loading a large tokenizer.json takes a while; reuse it while the file is unchanged."""
    p = Path(path).expanduser()
    probe = p / "tokenizer.json" if (p / "tokenizer.json").is_file() else p
    try:
        stat = probe.stat()
    except OSError:
        return load_tokenizer(p)  # raises TokenizerError saying what is missing
    key = (probe.resolve(), stat.st_mtime_ns, stat.st_size)
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = load_tokenizer(p)
    return _TOKENIZERS[key]


def load_run_tokenizer(source: RunSource, override: Path | None = None, *,
                       decodes: bool = True) -> RunTokenizer:
    """The tokenizer the run's answers were made with (`override` instead, where given) and the
    run's format, best effort: each tokenizer hash the answering sessions recorded, loaded from
    the run folder's copy (`store.runjson_writer.keep_tokenizer`) or from where it was while its
    file there still has that hash. SourceError where sessions used different tokenizers and the
    export `decodes` IDs (text, SpecForge), or checks stop tokens that differ between them:
    one tokenizer for all would misread some answers."""
    if override is not None:
        return _run_tokenizer(source, str(override), None)
    used = _answering_tokenizers(source)
    if not used:
        model = run_model(source.info, source.info_root)
        return _run_tokenizer(source, model.tokenizer, model.sha256)
    loaded = {sha: _run_tokenizer(source, where, sha) for sha, where in used.items()}
    if len(loaded) == 1:
        return next(iter(loaded.values()))
    shas = ", ".join(f"{sha[:12]}…" for sha in loaded)
    mixed = (f"{source.root}: the run's sessions answered with {len(loaded)} different "
             f"tokenizers (sha256 {shas}; accepted with --accept-changed-settings)")
    if decodes:
        raise SourceError(f"{mixed}: decoding every answer's IDs with one of them would give "
                          "some rows the wrong text; export with --no-text (speculators), or "
                          "pass --tokenizer PATH to decode all with that one")
    tokens = {(t.stop_token_id, t.end_think_id) for t in loaded.values()}
    last = list(loaded.values())[-1]
    if len(tokens) > 1 and all(t.fmt is not None for t in loaded.values()):
        raise SourceError(f"{mixed} whose stop or end-of-reasoning tokens differ: the "
                          "stop-token checks cannot judge every answer with one; pass "
                          "--no-checks, or --tokenizer PATH to check all with that one")
    return last


def _answering_tokenizers(source: RunSource) -> dict[str, str | None]:
    """Each tokenizer hash a session that may have written answers recorded (one that wrote
    none by its summary is left out), with where to load it: the run folder's copy, else the
    path the session had it at."""
    used: dict[str, str | None] = {}
    for folder in source.folders:
        for i, session in enumerate(folder.sessions):
            if not session.may_have_answered:
                continue
            settings = SessionModel.of(folder.info.settings_of(i) or {})
            sha = settings.tokenizer_sha256
            if sha is None:
                continue
            where = tokenizer_source(folder.root, sha, settings.tokenizer_path)
            if used.get(sha) is None or kept_tokenizer(folder.root, sha) is not None:
                used[sha] = where
    return used


def _run_tokenizer(source: RunSource, path: str | None, sha256: str | None) -> RunTokenizer:
    """The tokenizer at `path` and the run's format; None where it cannot be loaded or its hash
    is not `sha256` (the file at that path changed since the run, and no copy was kept)."""
    if not path:
        return RunTokenizer(None, None, "run.json names no tokenizer")
    try:
        tok = _cached_tokenizer(path)
    except TokenizerError as e:
        return RunTokenizer(None, None, str(e))
    if sha256 is not None and sha256 != tok.sha256:
        log.warning("%s: sha256 differs from the one the run recorded (the file changed since "
                    "the run, and the run folder keeps no copy of the old one)", tok.path)
        return RunTokenizer(None, None, f"{tok.path} is no longer the tokenizer the run used "
                            f"(sha256 {sha256[:12]}…)")
    note = f"tokenizer {tok.path}"
    fmt = None
    model = run_model(source.info)
    if model.format:
        try:
            fmt = get_format(model.format, tok, model.options)
        except FormatError as e:
            note += f"; format unavailable: {e}"
    else:
        note += "; run.json names no model format"
    return RunTokenizer(tok, fmt, note)
