"""The folders of a run: a run folder of its own, or a root whose `shards/I-of-N` folders each
hold one shard of a sharded run (`draftgen run --shard I/N`).

A shard folder is an ordinary run folder (run.json, lock, journal, one folder per dataset), so
each shard resumes on its own; the readers (status, audit, export, report) open the root with
`store.reader.Run`, which reads every folder of `run_parts` as one run. A shard takes the
prompts whose stable ID hashes to it (`shard_mask`) and claims its folder under a guard against
a run of another layout on the same output_dir (`claim_run_folder`).
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftgen.errors import DraftgenError
from draftgen.store.columns import id_hash
from draftgen.store.layout import SHARDS_DIR, RunLayout
from draftgen.store.lock import RunLock, RunLocked, lock_holder, open_lock_file
from draftgen.store.nofollow import refuse_linked_folders

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_FOLDER = re.compile(r"^(\d+)-of-(\d+)$")


class ShardError(DraftgenError, ValueError):
    """A malformed shard spec or an inconsistent set of shard folders."""


@dataclass(frozen=True, slots=True)
class ShardSpec:
    index: int
    """0-based: shard I of N takes the prompts with `shard_of(id, N) == I`."""
    count: int

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        """"I/N" with 0 <= I < N, as given to `--shard`."""
        m = _SPEC.match(text)
        if not m:
            raise ShardError(f"--shard {text!r}: expected I/N, e.g. 0/4 (shards are numbered "
                             "from 0)")
        index, count = int(m.group(1)), int(m.group(2))
        if count < 1 or not 0 <= index < count:
            raise ShardError(f"--shard {text!r}: I must be in 0..N-1 and N >= 1")
        return cls(index, count)

    @property
    def folder_name(self) -> str:
        return f"{self.index}-of-{self.count}"

    def folder(self, run_root: Path) -> Path:
        """This shard's own run folder inside the run's output_dir."""
        return Path(run_root) / SHARDS_DIR / self.folder_name

    def takes(self, prompt_id: str) -> bool:
        return shard_of(prompt_id, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def shard_of(prompt_id: str, count: int) -> int:
    """The shard of a prompt: the 64-bit hash of its stable ID (`store.columns.id_hash`, the
    same on every machine and Python, never the salted built-in `hash`) modulo the count. The
    prompt table caches that hash, so a dataset is split without hashing it
    (`shard_mask`)."""
    return 0 if count == 1 else id_hash(prompt_id) % count


def shard_folders(run_root: Path) -> list[Path]:
    """The shard folders of a run, in shard order (`shards/I-of-N`). Folders of different
    N (a run re-sharded) are all returned: each holds answers that count."""
    base = Path(run_root) / SHARDS_DIR
    if not base.is_dir():
        return []
    found = []
    for p in base.iterdir():
        m = _FOLDER.match(p.name)
        if p.is_dir() and m:
            found.append((int(m.group(2)), int(m.group(1)), p))
    return [p for _, _, p in sorted(found)]


def run_folders(run_root: Path) -> list[Path]:
    """Every run folder that holds part of this run: the root itself when it holds answers or
    a run.json of its own, then each shard folder. Readers treat them as one run."""
    root = Path(run_root)
    folders = [root] if holds_run(root) else []
    return folders + shard_folders(root)


def holds_run(folder: Path) -> bool:
    """Whether the folder holds a run of its own: its run.json or a dataset's files."""
    layout = RunLayout(folder)
    return layout.run_json.exists() or bool(layout.dataset_names())


def is_run_folder(folder: Path) -> bool:
    """Whether the folder holds a run: its own run.json or answers, or shard folders (False
    where it cannot be read: an ancestor such as /home may hold folders of other users)."""
    try:
        return holds_run(folder) or bool(shard_folders(folder))
    except OSError:
        return False


def run_folder_at_or_above(path: Path) -> Path | None:
    """The run folder that `path` is, or lies inside (nearest first); None when none."""
    here = Path(path).resolve()
    return next((p for p in (here, *here.parents) if p.is_dir() and is_run_folder(p)), None)


def run_folder_below(path: Path) -> Path | None:
    """A run folder somewhere inside `path` (not `path` itself), or None. Walks the whole
    tree: meant for folders about to be deleted, which are small (an export)."""
    for top, dirs, _ in os.walk(path):
        for name in dirs:
            if is_run_folder(Path(top) / name):
                return Path(top) / name
    return None


@dataclass(frozen=True, slots=True)
class RunPart:
    """One run folder of a run: the root's own (unsharded) part, or one shard's folder."""

    folder: Path
    shard: ShardSpec | None = None

    @property
    def label(self) -> str:
        """"0/4" for a shard, "root" for the run folder's own part."""
        return str(self.shard) if self.shard else "root"

    @property
    def place(self) -> str:
        """The folder from the run folder: "." or "shards/I-of-N"."""
        return f"{SHARDS_DIR}/{self.folder.name}" if self.shard else "."


def shard_of_folder(folder: Path) -> ShardSpec | None:
    """The shard whose folder this is (`shards/I-of-N`), or None."""
    m = _FOLDER.match(Path(folder).name)
    if not m or Path(folder).parent.name != SHARDS_DIR:
        return None
    return ShardSpec(int(m.group(1)), int(m.group(2)))


def run_parts(run_root: Path) -> list[RunPart]:
    """What the reading commands read, in order: `run_folders` labelled; a folder without
    shards is its own single part whatever it holds (the reader says what is wrong with it)."""
    root = Path(run_root)
    if not shard_folders(root):
        return [RunPart(root)]
    return [RunPart(f, shard_of_folder(f)) for f in run_folders(root)]


def all_parts(run_root: Path) -> list[RunPart]:
    """The root's own part, whatever it holds, then every shard folder's: where a run of any
    layout could be live."""
    root = Path(run_root)
    return [RunPart(root), *(RunPart(f, shard_of_folder(f)) for f in shard_folders(root))]


def is_sharded(parts: Sequence[RunPart]) -> bool:
    return any(p.shard is not None for p in parts)


def live_parts(parts: Sequence[RunPart]) -> list[tuple[RunPart, dict[str, Any]]]:
    """The parts a live draftgen run holds, with the holder's lock info (pid, host)."""
    held = ((p, lock_holder(RunLayout(p.folder).lock)) for p in parts)
    return [(p, holder) for p, holder in held if holder is not None]


def seen_earlier(hashes: Sequence[np.ndarray]) -> list[np.ndarray]:
    """For each folder's answered-ID hashes (in folder order), the sorted hashes that an
    earlier folder also answered: the answers a re-sharded run gave twice."""
    out = []
    earlier = np.empty(0, dtype=np.uint64)
    for h in hashes:
        mine = np.unique(h)
        out.append(mine[np.isin(mine, earlier, assume_unique=True)])
        earlier = np.union1d(earlier, mine)
    return out


LAYOUT_GUARD = "layout.lock"
"""In output_dir: held while a run checks the layouts live there and takes its folder's lock."""


def shard_mask(id_hashes: np.ndarray, shard: ShardSpec) -> np.ndarray:
    """For each prompt's `id_hash` (`PromptTable.id_hashes`), whether the shard takes it: the
    same answer as `shard.takes(id)`, for a million prompts in milliseconds."""
    hashes = np.asarray(id_hashes, dtype=np.uint64)
    return hashes % np.uint64(shard.count) == np.uint64(shard.index)


class LayoutConflict(RunLocked):
    """A run of another layout (unsharded, or another shard count) is live on the output_dir."""


def claim_run_folder(run_root: Path, shard: ShardSpec | None, lock: RunLock) -> None:
    """Take `lock` (the run folder's own), refused while a run of another layout is live on the
    same output_dir (an unsharded run beside shards, shards of another count): the two would
    answer the same prompts twice and each spend the budget as if alone. The check and the
    taking happen under an flock on output_dir/LAYOUT_GUARD, so that two runs starting at once
    cannot both pass it. Shards of one count run side by side, as they are meant to."""
    root = Path(run_root)
    refuse_linked_folders(lock.path.parent, root)  # a shard's folder: the run's own
    guard = root / LAYOUT_GUARD
    fd = open_lock_file(guard, "the layout lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        mine = shard.count if shard else None
        for part, holder in live_parts(all_parts(root)):
            if (part.shard.count if part.shard else None) != mine:
                raise LayoutConflict(_conflict_message(root, part, holder, shard))
        lock.acquire()
    finally:
        os.close(fd)  # drops the flock


def _conflict_message(root: Path, live: RunPart, holder: dict[str, Any],
                      shard: ShardSpec | None) -> str:
    theirs = f"shard {live.label}" if live.shard else "an unsharded run"
    mine = f"shard {shard}" if shard else "an unsharded run"
    return (f"{root}: {theirs} is running on this output_dir (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}); {mine} cannot run beside it (one output_dir has one "
            f"layout at a time: both would answer the same prompts and spend the budget). Let "
            f"it finish or stop it (draftgen stop {root}), then run again")
