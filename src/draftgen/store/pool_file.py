"""The file of a sharded run's budget pool, `<output_dir>/budget_pool.json`: its bytes read and
atomically rewritten under an fcntl lock on `budget_pool.lock`. What the bytes mean is the
budget's (`draftgen.budget.pool.FilePool`); only the store writes in the run folder."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from draftgen.store.atomic import replace_file
from draftgen.store.nofollow import StoreError, make_folders, open_fd

POOL_FILE = "budget_pool.json"
POOL_LOCK = "budget_pool.lock"


class PoolError(StoreError):
    """The budget pool is unreadable or was asked something it cannot answer."""


class PoolFile:
    def __init__(self, run_root: Path) -> None:
        self.path = Path(run_root) / POOL_FILE
        self.lock_path = Path(run_root) / POOL_LOCK

    def read(self) -> bytes | None:
        """The pool's bytes; None when there is no pool yet."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise PoolError(f"{self.path}: cannot read the budget pool: {e.strerror}") from None

    def write(self, data: bytes) -> None:
        try:
            replace_file(self.path, data, durable=True)
        except OSError as e:
            raise PoolError(f"{self.path}: cannot write the budget pool: {e.strerror}") from None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Held by one process at a time (shards on one machine, or on a shared filesystem
        whose locks work)."""
        try:
            make_folders(self.lock_path.parent)
            fd = open_fd(self.lock_path, os.O_RDWR | os.O_CREAT)
        except OSError as e:
            raise PoolError(f"{self.lock_path}: cannot open: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock
