"""The run folder, the only code that writes in it: the writer (`writer.Store`), the lock,
run.json, the resume scan (`scan`), and reading a run back (`reader.Run`). docs/architecture.md
lists its modules by role: the record, writing, the index, recovery, reading, where."""

from typing import TYPE_CHECKING

from draftgen.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from draftgen.store.appender import JsonlAppender, StoreError
    from draftgen.store.layout import RunLayout
    from draftgen.store.lock import RunLock, RunLocked, lock_holder
    from draftgen.store.scan import DatasetOnDisk, scan_dataset
    from draftgen.store.writer import Store

# Imported on first use: the config imports `draftgen.store.layout` (light) for its folder
# names, which must not import numpy with the rest of the store.
__getattr__ = lazy_exports(__name__, {
    "draftgen.store.appender": ("JsonlAppender", "StoreError"),
    "draftgen.store.layout": ("RunLayout",),
    "draftgen.store.lock": ("RunLock", "RunLocked", "lock_holder"),
    "draftgen.store.scan": ("DatasetOnDisk", "scan_dataset"),
    "draftgen.store.writer": ("Store",),
})

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
