"""What a run will do before it sends anything: the tokenizer, the model format and each dataset's
prompts (`prepare`), and the prompts rendered as the format lays them out within the model's
context length (`render_within`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftgen.config import RunConfig
from draftgen.datasets import LoadStats, PromptTable, load_prompt_table
from draftgen.datasets.conversations import ConversationPlan
from draftgen.datasets.table import load_conversation_table
from draftgen.formats import Format, FormatError, get_format
from draftgen.store import RunLayout
from draftgen.store.shards import ShardSpec, shard_mask
from draftgen.tokenize import Tokenizer, load_tokenizer, self_check
from draftgen.types import Prompt

if TYPE_CHECKING:
    from draftgen.run.trajectories import Conversation

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


def render_each(fmt: Format, prompts: list[Prompt]) -> list[list[int] | FormatError]:
    """Prompt IDs for a batch; a prompt the format refuses gets its FormatError instead."""
    try:
        return list(fmt.render_prompts(prompts))
    except FormatError:
        pass
    out: list[list[int] | FormatError] = []
    for prompt in prompts:
        try:
            out.append(fmt.render_prompt(prompt.messages, prompt.tools))
        except FormatError as e:
            out.append(FormatError(f"{prompt.source or prompt.id}: {e}"))
    return out


class PromptTooLong(FormatError):
    """A prompt that leaves no room for an answer within `model.context_length`."""


def render_within(fmt: Format, prompts: list[Prompt], context_length: int | None
                  ) -> list[list[int] | FormatError]:
    """`render_each`; with a context length, a prompt that leaves no room for one answer token
    gets a `PromptTooLong` instead. A prompt whose text alone is certainly too long (a token
    covers at most the tokenizer's longest token's bytes) is refused without tokenizing it:
    tokenizing 100 MB of text would take minutes."""
    if context_length is None:
        return render_each(fmt, prompts)
    out: list[list[int] | FormatError] = [FormatError("not rendered")] * len(prompts)
    todo: list[int] = []
    longest = 0
    for i, prompt in enumerate(prompts):
        chars = sum(len(m["content"]) for m in prompt.messages
                    if isinstance(m.get("content"), str))
        if chars > context_length:
            longest = longest or max(map(len, fmt.tokenizer.bytes_to_id()), default=1)
            if chars > 2 * longest * context_length:  # 2: room for any normalizer
                out[i] = PromptTooLong(
                    f"{prompt.source or prompt.id}: prompt of {chars:,} characters is longer "
                    f"than model.context_length ({context_length:,} tokens); not sent")
                continue
        todo.append(i)
    rendered = render_each(fmt, [prompts[i] for i in todo])
    for i, ids in zip(todo, rendered, strict=True):
        if not isinstance(ids, FormatError) and len(ids) + 1 > context_length:
            ids = PromptTooLong(
                f"{prompts[i].source or prompts[i].id}: prompt of {len(ids):,} tokens leaves "
                f"no room for an answer in model.context_length ({context_length:,}); not sent")
        out[i] = ids
    return out


@dataclass(slots=True)
class Pending:
    """A prompt queued to be sent."""

    dataset: str
    row: int
    """The prompt's row in its dataset's `PromptTable`."""
    prompt: Prompt | None = None
    """Read from the table just before the prompt is rendered."""
    input_ids: list[int] | None = None
    conversation: Conversation | None = None
    """`turns: all`: the conversation whose next turn this is (`prompt` is that turn's)."""
