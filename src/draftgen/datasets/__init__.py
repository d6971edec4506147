"""Curated prompt datasets → `Prompt`s, streamed.

`iter_prompts(cfg)` reads the dataset at `cfg.path` (JSONL, JSON, Parquet, a `save_to_disk`
folder, a folder of data files, or a hub name), works out each row's schema, keeps the
conversation up to the first assistant turn, gives each prompt a stable ID and drops exact
duplicates. Bad rows never stop loading: they are counted in `LoadStats`, and the first
`MAX_BAD_ROW_EXAMPLES` are kept with where they are and what is wrong.

`load_prompt_table(cfg, cache_path)` gives the same prompts as a `PromptTable`: every prompt's
ID up front, a prompt itself read only when asked for. For plain JSONL it keeps, in
`cache_path`, where each kept row is, so that a second load (a resumed run) skips the parse.

Modules: `readers` (file formats → rows), `schema` (row → messages and tools), `ids` (IDs and
duplicates), `admission` (rows kept as items, `LoadStats`), `prompts` (rows → prompts),
`conversations` (rows → `turns: all` conversation plans), `sampling_mix` (a conversation's drawn
sampling), `table` (the prompt table), `cache` (its file), `errors`.
"""

from __future__ import annotations

from draftgen.datasets.admission import MAX_BAD_ROW_EXAMPLES, LoadStats
from draftgen.datasets.errors import BadRow, BadRowError, DatasetError
from draftgen.datasets.prompts import iter_prompts, load_prompts, rows_to_prompt
from draftgen.datasets.table import PromptTable, load_prompt_table

__all__ = [
    "MAX_BAD_ROW_EXAMPLES",
    "BadRow",
    "BadRowError",
    "DatasetError",
    "LoadStats",
    "PromptTable",
    "iter_prompts",
    "load_prompt_table",
    "load_prompts",
    "rows_to_prompt",
]
