"""Rows admitted as a dataset's items (prompts, conversations): bad rows and duplicates counted
in `LoadStats`, colliding IDs suffixed, at most the dataset's limit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from draftgen.datasets.errors import BadRow, BadRowError
from draftgen.datasets.ids import IdAssigner, RowIdentity
from draftgen.datasets.readers import Row, RowStream

MAX_BAD_ROW_EXAMPLES = 1000


@dataclass(slots=True)
class LoadStats:
    """What loading one dataset found. Filled in as the prompts are iterated."""

    rows: int = 0
    """Rows read, bad ones included (blank JSONL lines are not rows)."""
    prompts: int = 0
    """Prompts yielded."""
    bad_rows: int = 0
    duplicates: int = 0
    """Rows dropped because an earlier row had the same messages and tools."""
    id_collisions: int = 0
    """Rows whose own ID was already used by a row with other content (kept, ID suffixed)."""
    limited: bool = False
    """The limit stopped loading while rows were left."""
    dropped: int = 0
    """Rows left out by the dataset's `rows.drop` rules (not counted in `rows`)."""
    examples: list[BadRow] = field(default_factory=list)
    """The first `MAX_BAD_ROW_EXAMPLES` bad rows."""

    def add_bad_row(self, bad_row: BadRow) -> None:
        self.bad_rows += 1
        if len(self.examples) < MAX_BAD_ROW_EXAMPLES:
            self.examples.append(bad_row)

    def summary(self) -> str:
        """One line for logs, e.g. "1000 rows → 990 prompts (8 bad, 2 duplicates)"."""
        details = [f"{self.bad_rows} bad", f"{self.duplicates} duplicates"]
        if self.id_collisions:
            details.append(f"{self.id_collisions} id collisions")
        if self.dropped:
            details.append(f"{self.dropped} dropped by rows.drop")
        if self.limited:
            details.append("stopped at the limit")
        return f"{self.rows} rows → {self.prompts} prompts ({', '.join(details)})"



class Identified(Protocol):
    id: str


ItemT = TypeVar("ItemT", bound=Identified)


def admitted(
    rows: RowStream, dataset: str, limit: int | None, stats: LoadStats,
    read: Callable[[Any, str], tuple[ItemT, RowIdentity]],
) -> Iterator[tuple[ItemT, Row]]:
    """Each kept item (a prompt, a conversation) that `read` makes of a row, with the row it
    came from, at most `limit`; bad rows and duplicates counted in `stats`."""
    ids = IdAssigner()
    try:
        for item in rows:
            if limit is not None and stats.prompts >= limit:
                stats.limited = True
                return
            stats.rows += 1
            kept = _admit(item, dataset, ids, stats, read)
            if kept is not None:
                stats.prompts += 1
                assert isinstance(item, Row)
                yield kept, item
    finally:
        rows.close()


def _admit(
    item: Row | BadRow, dataset: str, ids: IdAssigner, stats: LoadStats,
    read: Callable[[Any, str], tuple[ItemT, RowIdentity]],
) -> ItemT | None:
    """The row's item with its final ID, or None (after counting why) when it has none."""
    if isinstance(item, BadRow):
        stats.add_bad_row(item)
        return None
    try:
        kept, identity = read(item.data, item.source)
    except BadRowError as e:
        stats.add_bad_row(BadRow(item.source, e.reason))
        return None
    assigned = ids.assign(identity)
    if assigned is None:
        stats.duplicates += 1
        return None
    if assigned.collided:
        stats.id_collisions += 1
        kept.id = f"{dataset}/{assigned.row_id}"
    return kept
