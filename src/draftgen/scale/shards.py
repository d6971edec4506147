"""Sharded runs: `draftgen run CONFIG --shard I/N` answers the prompts whose stable ID hashes
to shard I, in its own run folder under the run's `shards/` folder.

A shard folder is an ordinary run folder (run.json, lock, journal, one folder per dataset),
so each shard resumes on its own; the reading commands (status, audit, export, report) take
the run folder and read every shard in it as one run (`run_folders`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

SHARDS_DIR = "shards"
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_FOLDER = re.compile(r"^(\d+)-of-(\d+)$")


class ShardError(ValueError):
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
    """The shard of a prompt: a hash of its stable ID, the same on every machine and Python
    (never the built-in `hash`, which is salted per process)."""
    if count == 1:
        return 0
    digest = hashlib.blake2b(prompt_id.encode(), digest_size=8, person=b"dg-shard").digest()
    return int.from_bytes(digest, "little") % count


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
    folders = [root] if (root / "run.json").exists() else []
    return folders + shard_folders(root)
