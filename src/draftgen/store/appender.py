"""Append-only JSONL files: each record is one write() of a whole line, so a kill -9 leaves
every earlier line intact (at worst one torn last line, cut on resume).

With `fsync_interval_s` 0 every line is fsync'ed before `append` returns. Otherwise the periodic
fsync runs on a background thread, so that a slow disk never stalls the event loop; an fsync
that fails there raises its StoreError from the next append, sync or close."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from draftgen.store.nofollow import StoreError, make_folders, open_fd

__all__ = ["JsonlAppender", "StoreError"]

_syncer: ThreadPoolExecutor | None = None
_syncer_lock = threading.Lock()


def _background() -> ThreadPoolExecutor:
    global _syncer
    with _syncer_lock:
        if _syncer is None:
            _syncer = ThreadPoolExecutor(1, thread_name_prefix="draftgen-fsync")
        return _syncer


class JsonlAppender:
    def __init__(self, path: Path, fsync_interval_s: float = 1.0, *,
                 root: Path | None = None) -> None:
        """`root`: the run folder, whose folders down to the file may not be links (the file
        itself never may: `store.nofollow`)."""
        self.path = path
        try:
            make_folders(path.parent, root)
            self._fd = open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, root=root)
        except OSError as e:
            raise StoreError(f"{path}: cannot open for writing: {e.strerror}") from None
        self._size = os.fstat(self._fd).st_size
        self._fsync_interval = fsync_interval_s
        self._last_fsync = time.monotonic()
        self._dirty = self._size > 0  # what an earlier process wrote may not be on disk yet
        self._pending: Future[None] | None = None
        self._pending_size = 0
        self._durable = 0
        """Bytes known to be on disk: those an fsync that returned covered."""

    def append(self, obj: Any) -> None:
        """One JSON line of plain values (journal events, failures)."""
        self.append_bytes(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE))

    def append_bytes(self, line: bytes) -> None:
        before = self._size
        try:
            view = memoryview(line)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as e:
            self._undo_partial(before)
            raise StoreError(f"{self.path}: write failed: {e.strerror}") from None
        self._size = before + len(line)
        self._dirty = True
        if self._fsync_interval == 0:
            self.sync()
        elif time.monotonic() - self._last_fsync >= self._fsync_interval:
            self._sync_in_background()

    @property
    def size(self) -> int:
        """Bytes in the file, as this appender wrote them."""
        return self._size

    @property
    def durable_size(self) -> int:
        """Bytes of the file an fsync is known to have covered (a background one counts once
        it has returned)."""
        if self._pending is not None and self._pending.done():
            self._check_pending()
        return self._durable

    def sync_soon(self) -> None:
        """Start a background fsync of what is written now, unless one is running (the next
        append or `sync_soon` after it starts another)."""
        if self._dirty and (self._pending is None or self._pending.done()):
            self._sync_in_background()

    def _undo_partial(self, size: int) -> None:
        # A partial line followed by later appends would leave a corrupt line mid-file.
        with contextlib.suppress(OSError):  # resume detects and cuts a torn tail anyway
            os.ftruncate(self._fd, size)

    def _sync_in_background(self) -> None:
        if self._pending is not None:
            if not self._pending.done():
                return  # the previous one is still running: it is retried after it
            self._check_pending()
        self._dirty = False
        self._last_fsync = time.monotonic()
        self._pending_size = self._size
        self._pending = _background().submit(os.fsync, self._fd)

    def _check_pending(self) -> None:
        """Wait for the background fsync, if one runs; raise its failure."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except OSError as e:
            self._dirty = True
            raise StoreError(f"{self.path}: fsync failed: {e.strerror}") from None
        self._durable = max(self._durable, self._pending_size)

    def sync(self) -> None:
        self._check_pending()
        if self._dirty:
            try:
                os.fsync(self._fd)
            except OSError as e:
                raise StoreError(f"{self.path}: fsync failed: {e.strerror}") from None
            self._dirty = False
        self._durable = self._size
        self._last_fsync = time.monotonic()

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1
