"""The resume scan (`scan_dataset`): what a dataset's folder already holds (completed IDs,
failed attempts), its torn last line cut (`cut_torn_tail`), and what the run's other folders hold.

The data files are the truth; no count of lines is trusted. Completed IDs come from the
compact index beside the data, which is caught up with the data before it is used. The done
IDs, output tokens and cost are read from the index's binary copy (`store.columns`; IDs as
64-bit `id_hash` values: a million in a few tens of ms) once what it and the JSON index lack
after a kill (a few records, a row) is appended and what they hold past the data is cut. Only
when the copy is missing or disagrees from its first row is the whole JSON index read and
repaired, which rebuilds the copy for the next time.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from draftgen.store.columns import id_hash, union_of_sorted
from draftgen.store.fast_index import catch_up_index, load_index_columns
from draftgen.store.index import read_index
from draftgen.store.journal import as_usd
from draftgen.store.layout import RunLayout
from draftgen.store.nofollow import open_file

log = logging.getLogger("draftgen.store")


class DoneIds:
    """A set of completed prompt IDs, held as their `columns.id_hash` values (sorted, unique):
    membership of a million IDs is one numpy search, with no Python string per ID. Two IDs
    with the same 64-bit hash would count as one (odds ~1e-8 at a million IDs)."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, hashes: np.ndarray | None = None) -> None:
        self.hashes = np.unique(np.asarray(hashes if hashes is not None else [],
                                           dtype=np.uint64))

    @classmethod
    def of(cls, ids: Iterable[str]) -> DoneIds:
        return cls(np.fromiter((id_hash(i) for i in ids), dtype=np.uint64))

    @classmethod
    def of_sorted(cls, hashes: np.ndarray) -> DoneIds:
        """From hashes already sorted and unique (not checked)."""
        done = cls()
        done.hashes = hashes
        return done

    def mask(self, hashes: np.ndarray) -> np.ndarray:
        """For each `id_hash` value, whether it is done."""
        return np.isin(hashes, self.hashes)

    def __or__(self, other: DoneIds) -> DoneIds:
        return DoneIds.of_sorted(union_of_sorted([self.hashes, other.hashes]))

    def __contains__(self, prompt_id: object) -> bool:
        return isinstance(prompt_id, str) and bool(self.mask(np.array([id_hash(prompt_id)],
                                                                      dtype=np.uint64))[0])

    def __len__(self) -> int:
        return len(self.hashes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (set, frozenset)):
            other = DoneIds.of(other)
        return isinstance(other, DoneIds) and np.array_equal(self.hashes, other.hashes)

    def __repr__(self) -> str:
        return f"DoneIds({len(self)} IDs)"


@dataclass
class TornTail:
    path: Path
    bytes_cut: int


@dataclass
class DatasetOnDisk:
    done: DoneIds = field(default_factory=DoneIds)
    duplicates: int = 0
    """Lines whose ID was already seen (should be 0; counted, never fatal)."""
    failed_attempts: Counter[str] = field(default_factory=Counter)
    failure_kinds: Counter[str] = field(default_factory=Counter)
    bad_lines: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    """Of the answers in responses.jsonl."""
    cost_not_kept: float = 0.0
    """Spent on no answer responses.jsonl holds: billed failed requests (failures.jsonl) and
    quarantined answers (quarantine.jsonl). Spend all the same."""
    from_columns: bool = False
    """The done IDs were read from the binary copy (not the JSON index)."""


def cut_torn_tail(path: Path, keep_in: Path, root: Path | None = None) -> TornTail | None:
    """If the file does not end with a newline, its last line was torn by a kill: move the
    partial bytes to `keep_in` and cut the file at the last complete line. Neither file, nor a
    folder below `root`, may be a link (`store.nofollow`)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    with open_file(path, "rb+", root=root) as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        keep = _last_newline_end(f, size)
        f.seek(keep)
        partial = f.read()
        with open_file(keep_in, "ab", root=root) as side:
            side.write(partial + b"\n")
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return TornTail(path=path, bytes_cut=size - keep)


def _last_newline_end(f, size: int, block: int = 1 << 16) -> int:
    pos = size
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        idx = chunk.rfind(b"\n")
        if idx >= 0:
            return start + idx + 1
        pos = start
    return 0


def completed(layout: RunLayout, dataset: str, into: DatasetOnDisk) -> None:
    """IDs, output tokens and cost of the records on disk, through the dataset's index
    (caught up with the data first): from the binary copy, with only what a kill left behind
    repaired (`catch_up_index`), else from the JSON index, repaired in full."""
    columns = catch_up_index(layout, dataset)
    if columns is None:
        _completed_from_json(layout, dataset, into)
        return
    into.bad_lines = columns.bad_lines
    into.from_columns = True
    ids = columns.rows["idh"]
    into.done.hashes, first = np.unique(ids, return_index=True)
    into.duplicates = len(ids) - len(first)
    first.sort()  # the first record of each ID, in file order, as the JSON path counts
    into.output_tokens = int(columns.rows["out"][first].sum())
    into.cost = float(columns.rows["cost"][first].sum())


def _completed_from_json(layout: RunLayout, dataset: str, into: DatasetOnDisk) -> None:
    entries, into.bad_lines = read_index(layout.index(dataset), layout.responses(dataset),
                                         repair=True)
    done: set[str] = set()
    for entry in entries:
        if entry.id in done:
            into.duplicates += 1
            continue
        done.add(entry.id)
        into.output_tokens += entry.out
        into.cost += entry.cost
    into.done = DoneIds.of(done)


@dataclass
class StoredElsewhere:
    """Another folder of the same run (another shard, the unsharded root), read once: per
    dataset on disk, its answered ID hashes, output tokens and cost."""

    folder: Path
    ids: dict[str, np.ndarray] = field(default_factory=dict)
    output_tokens: dict[str, int] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)


def read_elsewhere(folder: Path) -> StoredElsewhere:
    """What another run folder of the same run holds. Read-only: nothing there is repaired or
    locked, and a tail being written (or torn) right now is left out; a dataset that cannot be
    read counts as nothing (with a warning)."""
    layout = RunLayout(folder)
    stored = StoredElsewhere(Path(folder))
    for dataset in layout.dataset_names():
        try:
            rows = load_index_columns(layout, dataset).rows
        except (OSError, ValueError) as e:
            log.warning("%s: cannot read its answers of %s (%s); not counted", folder, dataset,
                        e)
            continue
        stored.ids[dataset] = rows["idh"]
        stored.output_tokens[dataset] = int(rows["out"].sum())
        stored.cost[dataset] = float(rows["cost"].sum()) + sum(
            spend_in(path) for path in (layout.failures(dataset), layout.quarantine(dataset)))
    return stored


def spend_in(path: Path) -> float:
    """The `cost_usd` of every line of a JSONL file (quarantined answers, billed failures);
    a line that does not parse (a torn tail being written) counts as nothing."""
    if not path.exists():
        return 0.0
    usd = 0.0
    with open(path, "rb") as f:
        for line in f:
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            usd += as_usd(row.get("cost_usd")) if isinstance(row, dict) else 0.0
    return usd


def done_elsewhere(stored: Iterable[StoredElsewhere], dataset: str) -> DoneIds:
    """The IDs of `dataset` answered in the run's other folders."""
    found = [s.ids[dataset] for s in stored if dataset in s.ids]
    return DoneIds(np.concatenate(found) if found else None)


def failed_attempts(path: Path, into: DatasetOnDisk) -> None:
    if not path.exists():
        return
    with open(path, "rb") as f:
        for line in f:
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                into.bad_lines += 1
                continue
            into.failed_attempts[row.get("id")] += 1
            into.failure_kinds[row.get("kind", "unknown")] += 1
            into.cost_not_kept += as_usd(row.get("cost_usd"))


def scan_dataset(layout: RunLayout, dataset: str) -> tuple[DatasetOnDisk, list[TornTail]]:
    """Make a dataset's files safe to append to, and read what they hold."""
    torn = [
        t for t in (
            cut_torn_tail(layout.responses(dataset), layout.torn(dataset), layout.root),
            cut_torn_tail(layout.failures(dataset), layout.torn(dataset), layout.root),
        ) if t
    ]
    for t in torn:
        log.warning("%s: cut a torn last line (%d bytes, kept in %s)", t.path, t.bytes_cut,
                    layout.torn(dataset).name)
    on_disk = DatasetOnDisk()
    completed(layout, dataset, on_disk)
    failed_attempts(layout.failures(dataset), on_disk)
    on_disk.cost_not_kept += spend_in(layout.quarantine(dataset))
    if on_disk.duplicates:
        log.warning("%s: %d duplicate answer lines", layout.responses(dataset), on_disk.duplicates)
    if on_disk.bad_lines:
        log.warning("%s: %d lines are not records", layout.dataset_dir(dataset), on_disk.bad_lines)
    return on_disk, torn
