"""Rows → conversation plans, for `turns: all` (docs/trajectories.md).

A plan is what the run walks turn by turn: for each point where the model speaks, the
dataset's messages since it last spoke (`context`: the previous turn's tool results, then user
and system messages) and the dataset's own assistant message there (`expected`: its tool calls
are the ones the next context's tool results answer; None where the dataset's conversation
ends with a question or with tool results the target must answer). The target's answers
replace the expected messages as the run goes (`formats.trajectory`).

Rows are read as for prompts (every schema of `schema`, system field, tools, IDs, duplicates,
bad rows counted in `LoadStats`); a row without a user turn before its first assistant turn,
or with a tool result before any assistant turn called a tool, is a bad row naming its dataset.
A plan stops early, saying why in `ends_early`, at an assistant turn whose tool calls the
dataset does not answer, or at tool results no tool call asked for: no later turn could follow
it honestly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from draftgen.config import DatasetConfig
from draftgen.datasets.admission import LoadStats, admitted
from draftgen.datasets.errors import BadRowError, DatasetError
from draftgen.datasets.ids import RowIdentity, row_identity
from draftgen.datasets.readers import open_rows
from draftgen.datasets.rowmap import mapped_stream
from draftgen.datasets.sampling_mix import check_mix
from draftgen.datasets.schema import require_object, whole_conversation_from_row
from draftgen.types import Message, Prompt, Tool

CALLS_UNANSWERED = "tool_calls_without_results"
"""`ConversationPlan.ends_early`: the dataset's assistant turn calls tools and no tool result
follows it."""
RESULTS_UNASKED = "tool_results_without_calls"
"""`ConversationPlan.ends_early`: tool results follow an assistant turn that called no tool."""


@dataclass(frozen=True, slots=True)
class PlannedTurn:
    """One turn of the model in a dataset conversation (`formats.trajectory.PlannedTurn`)."""

    context: list[Message]
    """The dataset's messages since the model last spoke."""
    expected: Message | None
    """The dataset's assistant message for this turn; None when the dataset has none."""


@dataclass(slots=True)
class ConversationPlan:
    id: str
    dataset: str
    tools: list[Tool] | None
    turns: list[PlannedTurn]
    source: str = ""
    """Where it came from, for error messages: "path:line" or "path[row]"."""
    ends_early: str | None = None
    """Why the plan stops before the dataset's conversation does (`CALLS_UNANSWERED`,
    `RESULTS_UNASKED`)."""


def plan_turns(messages: list[Message]) -> tuple[list[PlannedTurn], str | None]:
    """The model's turns in `messages` (a whole conversation, its first message not an
    assistant one), and why they stop early, if they do. `BadRowError` for a tool result before
    the first assistant turn: there is no turn to keep."""
    turns: list[PlannedTurn] = []
    context: list[Message] = []
    after_calls = False  # the last message other than a tool result called tools
    for i, m in enumerate(messages):
        if m["role"] == "tool" and not after_calls:  # a result nobody asked for
            if not turns:
                call_id = m.get("tool_call_id")
                named = f" (tool_call_id {call_id!r})" if isinstance(call_id, str) else ""
                raise BadRowError(f"a tool result{named} comes before any assistant turn "
                                  "called a tool")
            return turns, RESULTS_UNASKED
        if m["role"] != "tool":
            after_calls = m["role"] == "assistant" and bool(m.get("tool_calls"))
        if m["role"] != "assistant":
            context.append(m)
            continue
        turns.append(PlannedTurn(context, m))
        context = []
        answered = i + 1 < len(messages) and messages[i + 1]["role"] == "tool"
        if m.get("tool_calls") and not answered:
            return turns, CALLS_UNANSWERED if i + 1 < len(messages) else None
        if answered and not m.get("tool_calls"):
            return turns, RESULTS_UNASKED
    if context:
        turns.append(PlannedTurn(context, None))
    return turns, None


def conversation_plan(row: Any, dataset: str, source: str
                      ) -> tuple[ConversationPlan, RowIdentity]:
    """The row's plan (ID from the row alone) and its identity; `BadRowError` when it has no
    turn to answer."""
    row = require_object(row)
    try:
        conversation = whole_conversation_from_row(row)
    except BadRowError as e:
        raise BadRowError(f"dataset {dataset!r}: {e.reason}") from None
    turns, ends_early = plan_turns(conversation.messages)
    identity = row_identity(row, conversation.messages, conversation.tools)
    plan = ConversationPlan(f"{dataset}/{identity.row_id}", dataset, conversation.tools, turns,
                            source, ends_early)
    return plan, identity


def iter_conversations(cfg: DatasetConfig, stats: LoadStats | None = None
                       ) -> Iterator[ConversationPlan]:
    """The dataset's conversation plans (`turns: all`), at most `cfg.limit` of them; `stats`
    counts conversations as prompts. `DatasetError` as for `iter_prompts`, for a dataset
    whose `turns` is not "all", and for a `sampling_mix` it cannot use (`check_mix`)."""
    if cfg.turns != "all":
        raise DatasetError(f"dataset {cfg.name!r}: conversation plans are read for turns: all, "
                           f"not turns: {cfg.turns}")
    check_mix(cfg)
    stats = stats if stats is not None else LoadStats()
    rows = mapped_stream(open_rows(cfg.path, cfg.split, cfg.subset, cfg.hub_timeout_s), cfg, stats)

    def read(row: Any, source: str) -> tuple[ConversationPlan, RowIdentity]:
        return conversation_plan(row, cfg.name, source)

    kept = admitted(rows, cfg.name, cfg.limit, stats, read)
    return (plan for plan, _ in kept)


def first_turn_prompt(plan: ConversationPlan) -> Prompt:
    """The conversation's first request as a prompt: its ID is the conversation's, its
    messages the first turn's context (what `--dry-run`, `check-format` and the probe see of
    a `turns: all` dataset)."""
    return Prompt(plan.id, plan.dataset, list(plan.turns[0].context), plan.tools, plan.source)


def first_turn_prompts(cfg: DatasetConfig, stats: LoadStats | None = None) -> Iterator[Prompt]:
    """`first_turn_prompt` of each of the dataset's conversations."""
    return (first_turn_prompt(plan) for plan in iter_conversations(cfg, stats))
