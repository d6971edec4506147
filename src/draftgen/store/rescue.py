"""Answers that could not be written to the run folder, kept so that what was paid for them is
not lost: a disk quota, a file made read-only, an I/O error or a full disk while requests were
in flight.

The runner keeps such answers in memory and, when the session ends, writes them as one rescue
file: in the run folder's `.rescue/` where that still works, else in a folder named after the
run folder under `$DRAFTGEN_RESCUE_DIR` (default: the system's temporary folder). The next
session adds them to the run before it works out what is left to send, skipping any already
there, and deletes the file. Each line is a record exactly as responses.jsonl holds it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.store.atomic import replace_file
from draftgen.store.layout import RunLayout
from draftgen.store.nofollow import StoreError, make_folders
from draftgen.store.record import Record, RecordError, decode_record, encode_record

RESCUE = ".rescue"
RESCUE_DIR_ENV = "DRAFTGEN_RESCUE_DIR"
SUFFIX = ".jsonl"


def outside_folder(root: Path) -> Path:
    """The rescue folder off the run's disk: one per run folder, named after its full path."""
    base = Path(os.environ.get(RESCUE_DIR_ENV) or tempfile.gettempdir()) / "draftgen-rescue"
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return base / f"{root.name}-{key}"


def rescue_folders(layout: RunLayout) -> list[Path]:
    """Where rescue files go, first choice first."""
    return [layout.root / RESCUE, outside_folder(layout.root)]


def write_rescue(layout: RunLayout, records: list[Record], name: str
                 ) -> tuple[Path | None, list[str]]:
    """Write the records to the first rescue folder that takes them, whole or not at all
    (written beside, synced, then renamed). Returns the file, or None, and why each folder
    tried before it failed."""
    data = b"".join(encode_record(r) + b"\n" for r in records)
    errors: list[str] = []
    for folder in rescue_folders(layout):
        path = folder / f"{name}{SUFFIX}"
        root = layout.root if folder.parent == layout.root else None
        try:
            make_folders(folder, root)
            replace_file(path, data, durable=True, root=root)
            return path, errors
        except OSError as e:
            errors.append(f"{folder}: {e.strerror or e}")
        except StoreError as e:  # a link: refused, the next folder tried
            errors.append(str(e))
    return None, errors


@dataclass(slots=True)
class Rescued:
    """Every rescue file of a run folder, read: records by dataset, and the files."""

    records: dict[str, list[Record]] = field(default_factory=dict)
    datasets_of: dict[Path, set[str]] = field(default_factory=dict)
    """Each file, and the datasets its records are of."""

    def __len__(self) -> int:
        return sum(len(r) for r in self.records.values())

    @property
    def files(self) -> list[Path]:
        return list(self.datasets_of)


def rescue_files(layout: RunLayout) -> list[Path]:
    return sorted(p for folder in rescue_folders(layout) if folder.is_dir()
                  for p in folder.glob(f"*{SUFFIX}"))


def read_rescued(layout: RunLayout) -> Rescued:
    """Read every rescue file of the run folder; a line that is not a record is a StoreError
    naming the file and line (the file is left as it is)."""
    rescued = Rescued()
    for path in rescue_files(layout):
        try:
            lines = path.read_bytes().splitlines()
        except OSError as e:
            raise StoreError(f"{path}: cannot read: {e.strerror}") from None
        datasets = rescued.datasets_of[path] = set()
        for number, line in enumerate(lines, 1):
            record = _record(path, number, line)
            rescued.records.setdefault(record.dataset, []).append(record)
            datasets.add(record.dataset)
    return rescued


def _record(path: Path, number: int, line: bytes) -> Record:
    try:
        return decode_record(line)
    except RecordError as e:
        raise StoreError(f"{path}:{number}: not an answer record ({e}); move the file away to "
                         "resume without it") from None


def count_rescued(layout: RunLayout) -> int:
    """Answers waiting in rescue files (lines), without parsing them."""
    total = 0
    for path in rescue_files(layout):
        with contextlib.suppress(OSError):
            total += path.read_bytes().count(b"\n")
    return total
