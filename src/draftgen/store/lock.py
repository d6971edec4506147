"""One run per folder. The lock is an flock on RUN/lock: the kernel drops it when the holder
dies, so a lock left by a kill -9 is recognised as stale and taken over."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Any

import orjson

from draftgen.errors import DraftgenError
from draftgen.store.nofollow import StoreError, make_folders, open_fd


class RunLocked(DraftgenError):
    """Another live draftgen process holds the run folder."""


def open_lock_file(path: Path, what: str) -> int:
    """Open (creating it and its folders) a lock file in a run folder (never through a link:
    `store.nofollow`). An output_dir that is a file, or lies under one, is named as such
    instead of as an OS error."""
    try:
        make_folders(path.parent)
        return open_fd(path, os.O_RDWR | os.O_CREAT)
    except (FileExistsError, NotADirectoryError):
        in_the_way = next((p for p in (path.parent, *path.parent.parents)
                           if p.exists() and not p.is_dir()), path.parent)
        raise StoreError(f"{in_the_way}: a file, not a folder; output_dir must name a "
                         "folder, or one draftgen can create") from None
    except OSError as e:
        raise StoreError(f"{path}: cannot open {what}: {e.strerror}") from None


class RunLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.took_over_stale = False

    def acquire(self) -> None:
        fd = open_lock_file(self.path, "the run's lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_lock_info(self.path)
            raise RunLocked(
                f"{self.path.parent} is in use by a running draftgen "
                f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}); "
                "stop it first (draftgen stop) or use another output_dir"
            ) from None
        self.took_over_stale = os.fstat(fd).st_size > 0
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, orjson.dumps(info), 0)
        except OSError as e:
            os.close(fd)
            raise StoreError(f"{self.path}: cannot write: {e.strerror}") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # a read-only or full disk: the flock is what counts
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def read_lock_info(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes() or b"{}")
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def lock_holder(path: Path) -> dict[str, Any] | None:
    """The live holder's info, or None when no process holds the lock. Never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):  # no run, or no folder at all
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_lock_info(path)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
