"""Reading a run back, writing nothing: `Run.open(path)` finds the run's folders (a run folder,
or a root with shard folders `shards/I-of-N`, see `store.shards`), reads each one's run.json and
whether a live run holds its lock, and hands the readers (status, audit, export, report) what
the store keeps: the index columns, torn tails, the journal's tail, rescue files, quarantine
files, and the complete lines of a data file up to a snapshot size.

A reader takes each file's size once (its snapshot) and reads up to it, so that several passes
over a folder a live run is still appending to see the same lines.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from draftgen.errors import DraftgenError
from draftgen.store.fast_index import (
    IndexColumns,
    index_entries,
    load_index_columns,
    torn_tail_bytes,
)
from draftgen.store.index_entry import IndexEntry
from draftgen.store.journal import JournalTail, read_journal
from draftgen.store.layout import RunLayout
from draftgen.store.lock import lock_holder
from draftgen.store.nofollow import StoreError as StoreError  # what `RunFolder.rescued` raises
from draftgen.store.rescue import Rescued, count_rescued, read_rescued
from draftgen.store.runjson import RunInfo, RunJsonDamaged, Session, read_run_info
from draftgen.store.scan import spend_in
from draftgen.store.shards import RunPart, holds_run, is_sharded, run_parts


class RunOpenError(DraftgenError):
    """The folder cannot be read as a run (not a folder, a damaged or unreadable run.json)."""


class NotARun(RunOpenError):
    """A folder that holds no run: no run.json, no dataset files, no shard folders."""

    def __init__(self, root: Path) -> None:
        super().__init__(f"{root}: not a draftgen run folder (no run.json, no dataset folders "
                         "with responses.jsonl or failures.jsonl)")
        self.root = root


def file_size(path: Path) -> int:
    """The file's size now; 0 when it is missing."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@dataclass(frozen=True)
class Snapshot:
    """A data file and the size it had when the run was opened: read up to there."""

    path: Path
    size: int

    @property
    def folder(self) -> Path:
        """The run folder holding this dataset file."""
        return self.path.parent.parent


@dataclass
class LineScan:
    """What reading a JSONL file's lines found besides them."""

    torn_tail_bytes: int = 0
    """Bytes after the last newline (a torn last line), skipped."""
    bad_lines: list[int] = field(default_factory=list)
    """1-based numbers of complete lines that are not records (the caller notes them)."""


def complete_lines(snapshot: Snapshot, scan: LineScan, block: int = 1 << 20
                   ) -> Iterator[tuple[int, int, bytes]]:
    """The complete lines of a file up to its snapshot size with their 1-based numbers and
    the byte each starts at; the bytes after the last newline are counted in
    `scan.torn_tail_bytes`, never returned."""
    with open(snapshot.path, "rb") as f:
        remaining = snapshot.size
        pending = b""
        lineno = 0
        start = 0
        while remaining > 0:
            chunk = f.read(min(block, remaining))
            if not chunk:
                break  # the file shrank under us: read what there is
            remaining -= len(chunk)
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                lineno += 1
                yield lineno, start, line
                start += len(line) + 1
        scan.torn_tail_bytes = len(pending)


def count_lines(path: Path) -> int:
    """Newlines in the file; 0 when it is missing."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


@dataclass
class RunFolder:
    """One folder of a run, opened: its run.json and its lock's holder when it was opened."""

    part: RunPart
    info: RunInfo
    """Its run.json, decoded (an empty one where the folder has none)."""
    holder: dict[str, Any] | None
    """The live run holding the folder's lock (pid, host), or None."""

    @property
    def root(self) -> Path:
        return self.part.folder

    @cached_property
    def layout(self) -> RunLayout:
        return RunLayout(self.part.folder)

    @property
    def live(self) -> bool:
        return self.holder is not None

    @property
    def holds_run(self) -> bool:
        """A run.json or a dataset's files (a shard folder just created holds neither)."""
        return holds_run(self.root)

    @property
    def sessions(self) -> list[Session]:
        return self.info.sessions

    def dataset_names(self) -> list[str]:
        """Datasets present on disk (folders holding a responses or failures file)."""
        return self.layout.dataset_names()

    def responses(self, dataset: str) -> Snapshot:
        path = self.layout.responses(dataset)
        return Snapshot(path, file_size(path))

    def failures(self, dataset: str) -> Snapshot:
        path = self.layout.failures(dataset)
        return Snapshot(path, file_size(path))

    def index_columns(self, dataset: str, size: int | None = None) -> IndexColumns:
        """The dataset's index caught up with its responses file at `size` bytes."""
        return load_index_columns(self.layout, dataset, size)

    def index_entries(self, dataset: str, cols: IndexColumns) -> list[IndexEntry] | None:
        """The index entries behind `cols` (from `index_columns`), with what the binary rows
        leave out (a `turns: all` record's `conversation`, `turn`, `end_reason`); None when
        the JSON index does not match the rows (read the records instead)."""
        return index_entries(self.layout.index(dataset), cols)

    def torn_tail(self, snapshot: Snapshot) -> int:
        """Bytes after the last newline of the snapshot (a torn last line)."""
        return torn_tail_bytes(snapshot.path, snapshot.size)

    def journal_size(self) -> int:
        return file_size(self.layout.journal)

    def journal(self, size: int | None = None) -> JournalTail:
        """The requests open at the journal's end (up to `size` bytes)."""
        return read_journal(self.layout.journal, size)

    def rescued(self) -> Rescued:
        """The folder's rescue files, read (StoreError for one that cannot be)."""
        return read_rescued(self.layout)

    def rescued_count(self) -> int:
        return count_rescued(self.layout)

    def quarantined(self, dataset: str) -> tuple[int, float]:
        """Answers `audit --quarantine` moved out of the dataset, and what they cost."""
        path = self.layout.quarantine(dataset)
        return count_lines(path), spend_in(path)


@dataclass
class Run:
    """A run opened for reading: every folder of it, in `run_parts` order."""

    root: Path
    folders: list[RunFolder]

    @classmethod
    def open(cls, path: Path) -> Run:
        """RunOpenError for a path that is not a folder or holds no run, or a folder whose
        run.json cannot be read (naming the file and how to recover)."""
        root = Path(path)
        if not root.is_dir():
            raise RunOpenError(f"{root}: not a folder")
        parts = run_parts(root)
        if not is_sharded(parts) and not holds_run(root):
            raise NotARun(root)
        return cls(root, [RunFolder(p, _run_info(RunLayout(p.folder)),
                                    lock_holder(RunLayout(p.folder).lock)) for p in parts])

    @property
    def parts(self) -> list[RunPart]:
        return [f.part for f in self.folders]

    @property
    def sharded(self) -> bool:
        return is_sharded(self.parts)

    @property
    def live(self) -> bool:
        """A draftgen run held a folder's lock when the run was opened."""
        return any(f.live for f in self.folders)

    def holding(self) -> list[RunFolder]:
        """The folders that hold a run (in a sharded run, a shard folder just created holds
        nothing yet)."""
        return [f for f in self.folders if not self.sharded or f.holds_run]

    def live_folders(self) -> list[RunFolder]:
        return [f for f in self.folders if f.live]


def _run_info(layout: RunLayout) -> RunInfo:
    try:
        return read_run_info(layout.run_json)
    except RunJsonDamaged as e:
        raise RunOpenError(str(e)) from None
    except OSError as e:
        raise RunOpenError(f"{layout.run_json}: cannot read: {e}") from None
