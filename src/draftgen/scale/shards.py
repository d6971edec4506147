"""Sharded runs, the write side: `draftgen run CONFIG --shard I/N` answers the prompts whose
stable ID hashes to shard I (`shard_mask`), in its own run folder under the run's `shards/`
folder, taken under a guard against a run of another layout (`claim_run_folder`).

The shard folders themselves (their names, reading a run's folders as one) are the store's:
`store.shards`; the names the write path uses are re-exported here.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import numpy as np

from draftgen.store.lock import RunLock, RunLocked, open_lock_file
from draftgen.store.shards import (
    RunPart,
    ShardError,
    ShardSpec,
    all_parts,
    live_parts,
    run_folders,
    shard_of,
    shard_of_folder,
)

__all__ = ["LAYOUT_GUARD", "LayoutConflict", "ShardError", "ShardSpec", "claim_run_folder",
           "run_folders", "shard_mask", "shard_of", "shard_of_folder"]

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
