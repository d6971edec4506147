"""What a run will do before it sends anything: the tokenizer, the model format and each dataset's
prompts (`prepare`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.config import RunConfig
from draftgen.datasets import LoadStats, PromptTable, load_prompt_table
from draftgen.datasets.conversations import ConversationPlan
from draftgen.datasets.table import load_conversation_table
from draftgen.formats import Format, get_format
from draftgen.store import RunLayout
from draftgen.store.shards import ShardSpec, shard_mask
from draftgen.tokenize import Tokenizer, load_tokenizer, self_check

log = logging.getLogger("draftgen")


@dataclass
class DatasetPlan:
    name: str
    prompts: PromptTable
    """This run's prompts of the dataset (a shard's share when sharded): IDs up front, each
    prompt read when it is about to be sent."""
    load: LoadStats
    """What reading the whole dataset found."""
    conversations: list[ConversationPlan] | None = None
    """`turns: all`: every conversation of the dataset, by its position in the dataset (the
    table's rows are their first turns)."""


@dataclass
class Plan:
    cfg: RunConfig
    tokenizer: Tokenizer
    fmt: Format
    run_dir: Path
    """The folder this run writes: `cfg.output_dir`, or the shard's folder inside it."""
    shard: ShardSpec | None = None
    datasets: list[DatasetPlan] = field(default_factory=list)

    def prompts_of(self, dataset: str) -> PromptTable:
        return next(ds.prompts for ds in self.datasets if ds.name == dataset)

    def dataset_needs(self) -> dict[str, set[str]]:
        """What each dataset's prompts need from a backend beyond plain answers."""
        return {ds.name: {"tools"} if ds.prompts.has_tools else set() for ds in self.datasets}


def prepare(cfg: RunConfig, shard: ShardSpec | None = None) -> Plan:
    """Load the tokenizer, check it against the format, read every dataset (through the
    prompt cache in output_dir); with `shard`, keep only the shard's prompts. Sends nothing."""
    tokenizer = load_tokenizer(cfg.model.tokenizer)
    tokenizer.warm_up(wait=False)  # built while the run starts: `Runner._run_with` waits
    fmt = get_format(cfg.model.format, tokenizer, cfg.model.format_options)
    self_check(tokenizer, fmt.special_tokens())
    root = Path(cfg.output_dir)
    plan = Plan(cfg=cfg, tokenizer=tokenizer, fmt=fmt, shard=shard,
                run_dir=shard.folder(root) if shard else root)
    caches = RunLayout(root)  # one cache for all shards: it describes the whole dataset
    for ds in cfg.datasets:
        conversations = None
        if ds.turns == "all":
            table, conversations, stats = load_conversation_table(ds)
        else:
            table, stats = load_prompt_table(ds, caches.prompt_cache(ds.name))
        if shard is not None:
            table = table.where(shard_mask(table.id_hashes, shard))
        plan.datasets.append(DatasetPlan(ds.name, table, stats, conversations))
    return plan


def warn_bad_rows(ds: DatasetPlan, shown: int = 10) -> None:
    """Rows skipped while reading a dataset: the first `shown` named by file and line."""
    for bad in ds.load.examples[:shown]:
        log.warning("%s: bad row %s: %s (skipped)", ds.name, bad.source, bad.reason)
    if ds.load.bad_rows > shown:
        log.warning("%s: %d more bad rows skipped", ds.name, ds.load.bad_rows - shown)
    if not ds.prompts:
        log.warning("%s: no prompts to send (%s)", ds.name, ds.load.summary())
