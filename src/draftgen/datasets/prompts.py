"""Rows → prompts: schema, IDs, duplicates, bad rows counted in `LoadStats`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from draftgen.config import DatasetConfig
from draftgen.datasets.admission import LoadStats, admitted
from draftgen.datasets.conversations import first_turn_prompts
from draftgen.datasets.errors import DatasetError
from draftgen.datasets.ids import RowIdentity, row_identity
from draftgen.datasets.readers import Row, RowStream, open_rows
from draftgen.datasets.rowmap import mapped_stream
from draftgen.datasets.schema import PromptTurns, conversation_from_row, require_object
from draftgen.types import Prompt


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
        return first_turn_prompts(cfg, stats)
    turns = prompt_turns(cfg)
    rows = mapped_stream(open_rows(cfg.path, cfg.split, cfg.subset, cfg.hub_timeout_s), cfg, stats)
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
