"""The run folder: append-only answer files, the lock, run.json, and the resume scan."""

from draftgen.store.appender import JsonlAppender, StoreError
from draftgen.store.layout import RunLayout
from draftgen.store.lock import RunLock, RunLocked, lock_holder
from draftgen.store.resume import DatasetOnDisk, scan_dataset
from draftgen.store.store import Store

__all__ = [
    "DatasetOnDisk",
    "JsonlAppender",
    "RunLayout",
    "RunLock",
    "RunLocked",
    "Store",
    "StoreError",
    "lock_holder",
    "scan_dataset",
]
