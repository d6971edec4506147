"""`draftgen status RUN_DIR`: how far a run got and what it cost, on a live, stopped or killed
run, without writing anything in the run folder and without waiting for the writer.

Everything comes from files the runner keeps small, read through `store.reader.Run`: each
dataset's index (its binary copy, caught up with the data in memory, see `store.fast_index`),
failures.jsonl, the tail of the request journal, run.json and the lock. The data files are only
read past the index's end.

`model` holds what status tells, `sums` the sums over the index columns, `folder` one folder's
status, `collect` the run's (a sharded run's folders merged), `notes` the notes, `render` the
tables and `main`.
"""

from draftgen.status.collect import collect_status
from draftgen.status.model import (
    WINDOW_S,
    DatasetStatus,
    Rates,
    RunStatus,
    ShardStatus,
    StatusError,
)
from draftgen.status.render import main, print_status, render_status, summary_line

__all__ = [
    "WINDOW_S",
    "DatasetStatus",
    "Rates",
    "RunStatus",
    "ShardStatus",
    "StatusError",
    "collect_status",
    "main",
    "print_status",
    "render_status",
    "summary_line",
]
