"""`draftgen audit --quarantine`: move the answers that failed the audit out of each
`responses.jsonl` into `quarantine.jsonl` beside it, so that the next `draftgen run` (which
counts as done only what responses.jsonl holds) generates them again.

The audit decides which lines fail; the store moves them (`store.quarantine`, crash-safe: no
answer is lost whatever moment a kill lands at). Refused while a run is live on the folder; the
run's lock is held throughout. In a sharded run each folder's files are moved within that
folder, under that folder's lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from draftgen.audit.engine import problems_of
from draftgen.audit.report import AuditReport, DatasetAudit
from draftgen.store.quarantine import (
    MovedLine,
    QuarantineError,
    check_unchanged,
    locked,
    move_lines,
    refuse_live,
)

__all__ = ["QuarantineError", "QuarantineResult", "quarantine"]


@dataclass
class QuarantineResult:
    moved: dict[str, int] = field(default_factory=dict)
    """Lines moved out of each dataset's responses.jsonl."""
    already: dict[str, int] = field(default_factory=dict)
    """Of those, lines quarantine.jsonl already held (from an interrupted quarantine)."""


def quarantine(report: AuditReport) -> QuarantineResult:
    """Move the failing lines of every audited file (each in its own run folder); the result
    is keyed as `report.datasets` is."""
    failing = {key: d for key, d in report.datasets.items() if len(d.failing)}
    folders = list(dict.fromkeys(d.folder for d in failing.values()))
    refuse_live(folders, report.root)
    result = QuarantineResult()
    lines = {key: _failing_lines(d) for key, d in failing.items()}
    with locked(folders):
        for key, d in failing.items():
            check_unchanged(d.folder, d.name, d.snapshot_size, lines[key])
        for key, d in failing.items():
            result.moved[key], result.already[key] = move_lines(d.folder, d.name, lines[key])
    return result


def _failing_lines(d: DatasetAudit) -> list[MovedLine]:
    """The file's failing lines in file order, each with the checks it failed."""
    order = np.argsort(np.frombuffer(d.failing.starts, dtype=np.int64), kind="stable")
    return [MovedLine(d.failing.starts[i], d.failing.ends[i], problems_of(d.failing.masks[i]))
            for i in order.tolist()]
