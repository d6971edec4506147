"""Rows → prompts: schema, IDs, duplicates, bad rows counted in `LoadStats`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from draftgen.config import DatasetConfig
from draftgen.datasets.errors import BadRow, BadRowError, DatasetError
from draftgen.datasets.ids import IdAssigner, RowIdentity, row_identity
from draftgen.datasets.readers import Row, RowStream, open_rows
from draftgen.datasets.schema import PromptTurns, conversation_from_row, require_object
from draftgen.types import Prompt

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
        if self.limited:
            details.append("stopped at the limit")
        return f"{self.rows} rows → {self.prompts} prompts ({', '.join(details)})"


def rows_to_prompt(row: dict[str, Any], dataset: str, source: str) -> Prompt:
    """The prompt of one row, ID from the row alone (no duplicate/collision handling).
    Raises `BadRowError` saying what is wrong with the row."""
    prompt, _ = prompt_and_identity(row, dataset, source)
    return prompt


def iter_prompts(cfg: DatasetConfig, stats: LoadStats | None = None) -> Iterator[Prompt]:
    """The dataset's prompts, one at a time, at most `cfg.limit` of them.

    Raises `DatasetError` at once when the path is missing or of an unknown format, or the
    dataset asks for what the run does not do (`sampling_mix` without `turns: all`), and while
    iterating when the data cannot be read at all. `stats`, when given, is filled in as the
    iteration goes. For `turns: all`, each conversation's first turn (`first_turn_prompts`)."""
    if cfg.turns == "all":
        from draftgen.datasets.conversations import first_turn_prompts
        return first_turn_prompts(cfg, stats)
    turns = prompt_turns(cfg)
    rows = open_rows(cfg.path, cfg.split, cfg.subset)
    return _prompts_from_rows(
        rows, cfg.name, cfg.limit, stats if stats is not None else LoadStats(), turns
    )


def prompt_turns(cfg: DatasetConfig) -> PromptTurns:
    """The dataset's `turns` when the run answers them one prompt per row; `DatasetError`
    for a dataset whose rows are conversations (`turns: all`, read by
    `conversations.iter_conversations`), and for a `sampling_mix` on one-prompt rows (a mix is
    drawn per conversation)."""
    if cfg.turns == "all":
        raise DatasetError(f"dataset {cfg.name!r}: turns: all rows are read as conversations, "
                           "not one prompt per row")
    if cfg.sampling_mix is not None:
        raise DatasetError(f"dataset {cfg.name!r}: sampling_mix needs turns: all (a mix is "
                           "drawn per conversation); set the run's sampling instead")
    return cfg.turns


def load_prompts(cfg: DatasetConfig) -> tuple[list[Prompt], LoadStats]:
    """All of the dataset's prompts (up to `cfg.limit`) and what loading found."""
    stats = LoadStats()
    prompts = list(iter_prompts(cfg, stats))
    return prompts, stats


def _prompts_from_rows(
    rows: RowStream, dataset: str, limit: int | None, stats: LoadStats,
    turns: PromptTurns = "first",
) -> Iterator[Prompt]:
    for prompt, _ in admitted_rows(rows, dataset, limit, stats, turns):
        yield prompt


def admitted_rows(
    rows: RowStream, dataset: str, limit: int | None, stats: LoadStats,
    turns: PromptTurns = "first",
) -> Iterator[tuple[Prompt, Row]]:
    """Each kept prompt with the row it came from, at most `limit`; `stats` filled in."""
    def read(row: Any, source: str) -> tuple[Prompt, RowIdentity]:
        return prompt_and_identity(row, dataset, source, turns)

    return admitted(rows, dataset, limit, stats, read)


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


def prompt_and_identity(
    row: Any, dataset: str, source: str, turns: PromptTurns = "first"
) -> tuple[Prompt, RowIdentity]:
    """The row's prompt (ID from the row alone) and its identity; `BadRowError` when it has
    none."""
    row = require_object(row)
    conversation = conversation_from_row(row, turns)
    identity = row_identity(row, conversation.messages, conversation.tools)
    prompt = Prompt(
        id=f"{dataset}/{identity.row_id}",
        dataset=dataset,
        messages=conversation.messages,
        tools=conversation.tools,
        source=source,
    )
    return prompt, identity
