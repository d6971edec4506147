"""Free space on the output disk: the run stops sending before the disk is full.

An answer that arrives after the disk filled up cannot be written, and it has been paid for.
So the runner sends no new request once the free space falls under `min_free_mb`, and the
answers already in flight are written into what is left (2,000 answers in flight take tens of
MB). The run then ends as after a write failure, and resumes once space is freed.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

CHECK_EVERY_S = 0.1
"""The disk is read at most this often: it is checked before every request."""


class SpaceGuard:
    """Says when the output disk holds less than `min_free_mb` free (0: never)."""

    def __init__(self, path: Path, min_free_mb: float, every_s: float = CHECK_EVERY_S) -> None:
        self.path = path
        self.min_free = int(min_free_mb * 2**20)
        self.every_s = every_s
        self._next_check = 0.0

    def shortage(self) -> str | None:
        """Why no new request may be sent, or None while there is room (or the last check is
        less than `every_s` old, or the free space cannot be read)."""
        if not self.min_free:
            return None
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.every_s
        try:
            free = shutil.disk_usage(self.path).free  # what an unprivileged writer may use
        except OSError:
            return None  # the writes themselves then say what is wrong with the disk
        if free >= self.min_free:
            return None
        return (f"{self.path}: output disk nearly full ({_mb(free)} MB free, min_free_mb is "
                f"{_mb(self.min_free)}): no new requests; free some space (or lower "
                f"min_free_mb) and run again to resume")


def _mb(n_bytes: int) -> str:
    """MB with the digits that tell 1.97 from 2 where it matters."""
    mb = n_bytes / 2**20
    return f"{mb:,.0f}" if mb >= 100 else f"{mb:.2f}".rstrip("0").rstrip(".")
