"""A dataset's prompts as a table: every prompt's ID known up front, the prompts themselves
read only when asked for (`load`), so that a resumed run does not build the prompts it will not
send.

`load_prompt_table` reads plain JSONL sources through the prompt-row cache (`datasets.cache`):
the first load parses every row and writes the cache; a later load of the same files with the
same options reads the cache instead, and `load` re-reads only the rows asked for, by offset.
Other sources (JSON, Parquet, Arrow, gzipped JSONL, hub datasets) have no cheap way to read one
row: they are parsed in full each time and their prompts held in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from draftgen.config import DatasetConfig
from draftgen.datasets.cache import cache_key, discard_cache, read_cache, write_cache
from draftgen.datasets.conversations import (
    ConversationPlan,
    first_turn_prompt,
    iter_conversations,
)
from draftgen.datasets.errors import BadRow, BadRowError, DatasetError
from draftgen.datasets.prompts import (
    LoadStats,
    admitted_rows,
    iter_prompts,
    prompt_and_identity,
    prompt_turns,
)
from draftgen.datasets.readers import Row, located_jsonl_rows, plain_jsonl_files, rows_at
from draftgen.datasets.rowindex import PromptIndex, PromptIndexBuilder, index_of
from draftgen.datasets.rowmap import map_row, mapped_stream
from draftgen.types import Prompt

LOAD_BATCH = 512
"""Prompts read at a time when the table is iterated."""
SPOT_CHECKS = 64
"""Rows of a cached dataset re-read at load to check the cache still describes the file."""

log = logging.getLogger("draftgen.datasets")

Loader = Callable[[np.ndarray], list[Prompt]]
"""Dataset positions → their prompts, in that order."""


class PromptTable:
    """The prompts of one dataset (or of one shard of it), in dataset order."""

    def __init__(self, name: str, index: PromptIndex, loader: Loader,
                 positions: np.ndarray | None = None,
                 cache_writer: Callable[[], None] | None = None,
                 from_cache: bool = False) -> None:
        self.name = name
        self._index = index
        self._loader = loader
        self.from_cache = from_cache
        """Read through a prompt cache written by an earlier session for the same files and
        options: no row changed since (a changed file is read in full)."""
        self._cache_writer = cache_writer
        self.positions = (np.arange(len(index), dtype=np.int64) if positions is None
                          else positions)
        """Each row's position among all the dataset's prompts (ascending)."""

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def id_hashes(self) -> np.ndarray:
        """uint64 `store.columns.id_hash` of each prompt's ID."""
        return self._index.id_hashes[self.positions]

    def id_at(self, row: int) -> str:
        return self._index.id_at(int(self.positions[row]))

    @property
    def ids(self) -> list[str]:
        return [self._index.id_at(int(p)) for p in self.positions]

    @property
    def has_tools(self) -> bool:
        """Whether any prompt of the table has tools."""
        return bool(self._index.tools[self.positions].any())

    def load(self, rows: Sequence[int] | np.ndarray) -> list[Prompt]:
        """The prompts of these rows of the table, in the order given."""
        return self._loader(self.positions[np.asarray(rows, dtype=np.int64)])

    def __iter__(self) -> Iterator[Prompt]:
        for start in range(0, len(self), LOAD_BATCH):
            yield from self._loader(self.positions[start:start + LOAD_BATCH])

    def where(self, keep: np.ndarray) -> PromptTable:
        """The table of the rows where the bool array `keep` is true."""
        return PromptTable(self.name, self._index, self._loader, self.positions[keep],
                           self._cache_writer, self.from_cache)

    def save_cache(self) -> None:
        """Write the prompt cache that this full read of the dataset has built, if any. Left
        to the caller so that reading a dataset (`--dry-run`) writes nothing in the run
        folder; the run writes it once it holds the folder."""
        writer, self._cache_writer = self._cache_writer, None
        if writer is not None:
            writer()


def load_prompt_table(cfg: DatasetConfig, cache_path: Path | None = None
                      ) -> tuple[PromptTable, LoadStats]:
    """The dataset's prompts and what loading found: the same prompts, IDs and stats as
    `iter_prompts`. With `cache_path`, a plain JSONL source goes through the prompt cache
    there: read when it matches the files and options; else the dataset is read in full and
    the table's `save_cache()` writes the cache. A `turns: all` dataset's table holds each
    conversation's first turn (`load_conversation_table`). `DatasetError` when the dataset asks
    for what the run does not do (`prompts.prompt_turns`)."""
    if cfg.turns == "all":
        table, _, stats = load_conversation_table(cfg)
        return table, stats
    prompt_turns(cfg)
    files = plain_jsonl_files(cfg.path, cfg.split)
    if files is None or cache_path is None:
        return _read_in_memory(cfg)
    key = cache_key(cfg, files)
    cached = read_cache(cache_path, key)
    if cached is not None:
        index, stats = cached
        loader = JsonlRowLoader(cfg, index, cache_path)
        if _rows_still_match(loader, len(index)):
            return PromptTable(cfg.name, index, loader, from_cache=True), stats
    prompts, index, stats = _read_located(cfg, files)
    unchanged = cache_key(cfg, files) == key  # not written to while it was read
    writer = partial(write_cache, cache_path, key, index, stats) if unchanged else None
    return PromptTable(cfg.name, index, _from_memory(prompts), cache_writer=writer), stats


def load_conversation_table(cfg: DatasetConfig
                            ) -> tuple[PromptTable, list[ConversationPlan], LoadStats]:
    """A `turns: all` dataset: its conversation plans (read in full, held in memory) and the
    table of their first turns (`first_turn_prompt`), row i of the table being conversation
    i; what loading found."""
    stats = LoadStats()
    plans = list(iter_conversations(cfg, stats))
    prompts = [first_turn_prompt(plan) for plan in plans]
    return PromptTable(cfg.name, index_of(prompts), _from_memory(prompts)), plans, stats


def _rows_still_match(loader: JsonlRowLoader, count: int) -> bool:
    """Whether SPOT_CHECKS rows spread over the dataset (the first and last among them) still
    give their cached IDs: a file rewritten keeping its size and mtime (sorted, shuffled) is
    read in full now rather than failing when its rows are sent. A mismatch discards the
    cache."""
    sample = np.unique(np.linspace(0, count - 1, num=min(count, SPOT_CHECKS)).astype(np.int64))
    try:
        loader(sample)
    except DatasetChanged as e:
        log.warning("%s: the dataset file changed since its prompt cache was written (%s); "
                    "reading it in full", e.source, e.why)
        return False
    return True


def _read_in_memory(cfg: DatasetConfig) -> tuple[PromptTable, LoadStats]:
    stats = LoadStats()
    prompts = list(iter_prompts(cfg, stats))
    return PromptTable(cfg.name, index_of(prompts), _from_memory(prompts)), stats


def _read_located(cfg: DatasetConfig, files: list[Path]
                  ) -> tuple[list[Prompt], PromptIndex, LoadStats]:
    """A full read that also notes where each kept row is. The prompts are kept in memory:
    this run needs them all anyway."""
    stats = LoadStats()
    builder = PromptIndexBuilder(locate=True)
    prompts = []
    rows = mapped_stream(located_jsonl_rows(files), cfg, stats)
    for prompt, row in admitted_rows(rows, cfg.name, cfg.limit, stats, prompt_turns(cfg)):
        builder.add(prompt, row)
        prompts.append(prompt)
    return prompts, builder.build(), stats


def _from_memory(prompts: list[Prompt]) -> Loader:
    def load(positions: np.ndarray) -> list[Prompt]:
        return [prompts[i] for i in positions.tolist()]
    return load


class JsonlRowLoader:
    """Re-reads prompts from their JSONL rows by offset, checking that each row still gives
    the ID it had when the cache was written. A row that does not (the file changed without
    its size and mtime changing: the cache's key cannot tell) discards the cache, so that the
    next run reads the dataset in full and writes it again."""

    def __init__(self, cfg: DatasetConfig, index: PromptIndex, cache_path: Path) -> None:
        assert index.places is not None
        self._cfg = cfg
        self._cache_path = cache_path
        self._index = index
        self._places = index.places

    def __call__(self, positions: np.ndarray) -> list[Prompt]:
        places = [self._places.at(p) for p in positions.tolist()]
        return [self._prompt(int(p), row)
                for p, row in zip(positions, rows_at(places), strict=True)]

    def _prompt(self, position: int, row: Row | BadRow) -> Prompt:
        cached_id = self._index.id_at(position)
        if isinstance(row, Row) and self._cfg.rows is not None:
            row = map_row(row, self._cfg.rows) or BadRow(row.source, "dropped by rows.drop")
        if isinstance(row, BadRow):
            raise self._changed(row.source, row.reason)
        try:
            prompt, _ = prompt_and_identity(row.data, self._cfg.name, row.source,
                                            prompt_turns(self._cfg))
        except BadRowError as e:
            raise self._changed(row.source, e.reason) from None
        # The ID of a row whose own ID clashed carries a suffix (`ids.IdAssigner`).
        if prompt.id != cached_id and not cached_id.startswith(prompt.id + "-"):
            raise self._changed(prompt.source, f"gives ID {prompt.id!r}, expected {cached_id!r}")
        prompt.id = cached_id
        return prompt

    def _changed(self, source: str | None, why: str) -> DatasetChanged:
        discard_cache(self._cache_path)
        return DatasetChanged(source, why, self._cfg.name)


class DatasetChanged(DatasetError):
    """A row no longer gives the ID its prompt cache holds (the cache is discarded)."""

    def __init__(self, source: str | None, why: str, dataset: str) -> None:
        self.source, self.why = source, why
        super().__init__(f"{source}: the dataset file changed since its prompt cache was "
                         f"written ({why}); the cache is discarded: run again to read dataset "
                         f"{dataset!r} in full")
