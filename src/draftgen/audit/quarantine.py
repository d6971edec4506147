"""`draftgen audit --quarantine`: move the answers that failed the audit out of each
`responses.jsonl` into `quarantine.jsonl` beside it, so that the next `draftgen run` (which
counts as done only what responses.jsonl holds) generates them again.

The audit decides which lines fail; the store moves them (`store.quarantine_move`, crash-safe: no
answer is lost whatever moment a kill lands at). Refused while a run is live on the folder; the
run's lock is held throughout. In a sharded run each folder's files are moved within that
folder, under that folder's lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from draftgen.audit.engine import problems_of
from draftgen.audit.report import AuditReport, DatasetAudit
from draftgen.store.quarantine_move import (
    MovedLine,
    QuarantineError,
    QuarantineStopped,
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
    lines = {key: with_later_turns(d, _failing_lines(d)) for key, d in failing.items()}
    with locked(folders):
        for key, d in failing.items():
            check_unchanged(d.folder, d.name, d.snapshot_size, lines[key])
        for key, d in failing.items():
            try:
                result.moved[key], result.already[key] = move_lines(d.folder, d.name,
                                                                    lines[key])
            except QuarantineStopped as e:
                done = f" ({', '.join(result.moved)} moved)" if result.moved else ""
                raise QuarantineStopped(
                    f"{e}; quarantine not finished{done}: once the folder can be written (free "
                    f"some space), run `draftgen audit --quarantine {report.root}` again to "
                    "finish") from None
    return result


def _failing_lines(d: DatasetAudit) -> list[MovedLine]:
    """The file's failing lines in file order, each with the checks it failed."""
    order = np.argsort(np.frombuffer(d.failing.starts, dtype=np.int64), kind="stable")
    return [MovedLine(d.failing.starts[i], d.failing.ends[i], problems_of(d.failing.masks[i]))
            for i in order.tolist()]


AFTER_MOVED_TURN = "after_quarantined_turn"
"""Why a turn that passed goes too: an earlier turn of its conversation is moved."""


def with_later_turns(d: DatasetAudit, moved: list[MovedLine]) -> list[MovedLine]:
    """`moved`, plus every later turn of a `turns: all` conversation one of whose turns is
    moved: their prompts hold the moved answer as history, and the next run regenerates a
    conversation from its first missing turn on (it would write those turns again)."""
    starts = {m.start for m in moved}
    first: dict[str, int] = {}
    for t in d.turns:
        if t.start in starts:
            first[t.conversation] = min(t.turn, first.get(t.conversation, t.turn))
    later = [MovedLine(t.start, t.stop, [AFTER_MOVED_TURN]) for t in d.turns
             if t.start not in starts and t.turn > first.get(t.conversation, t.turn)]
    return sorted(moved + later, key=lambda m: m.start) if later else moved
