"""Multi-turn trajectories (`turns: all`): every assistant turn of a conversation answered by
the target in order, each request's history holding the target's own earlier answers.

Three pieces the run calls, turn by turn:

- `turn_messages`: the prompt of the next turn. The history is the dataset's user turns (and
  the tool results it may keep, see below) with the target's earlier answers as assistant
  messages, their reasoning under `reasoning_content` (the key every family's template reads).
  What a template keeps of it is the format's business: `Format.prompt_text` renders history as
  the model's template does (Qwen3 drops the reasoning of turns before the last query, gpt-oss
  the analysis before the last final answer, DeepSeek-R1 every `<think>`, Kimi that of completed
  turns). Nothing here decides it.
- `end_after`: whether the trajectory goes on after an answer, and if not, why (`EndReason`).
  The dataset's tool results after an assistant turn answer the calls the dataset's turn made;
  they are fed back only when the target made the same calls (names, and arguments compared as
  parsed JSON, in order). Otherwise the trajectory ends there: nothing is ever fabricated.
  The target's calls are the backend's structured `tool_calls`, or, where it returned none (an
  engine without a tool-call parser leaves Qwen3's `<tool_call>{json}</tool_call>` in the
  content), those the format reads in the answer's tokens (`with_calls_read`).
- `trajectory_layout`: the token layout of the whole trajectory. Where the template keeps the
  history's tokens intact (prompt_k + output_k is a prefix of prompt_k+1), the turns share one
  `input_ids` + `loss_mask`, the mask 1 on exactly the sampled tokens; where it does not
  (reasoning dropped from history, a tool call re-rendered), a new branch starts, as
  speculators' trajectories do (one record per root-to-leaf branch).

Who uses them: the run walks each conversation (`run.turns`), the audit checks each one whole
(`audit.conversation_checks`), status counts them (`status.conversation_counts`), the export
writes one row per branch (`export.branches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from draftgen.errors import DraftgenError
from draftgen.formats.base import Format
from draftgen.formats.common import ToolCall, arguments_value
from draftgen.types import Message, Rebuilt, Tool

EndReason = Literal[
    "last_turn", "finish_length", "budget", "no_tool_call", "tool_call_differs",
    "unexpected_tool_call",
]
LAST_TURN: EndReason = "last_turn"
"""The dataset's conversation has no assistant turn left."""
FINISH_LENGTH: EndReason = "finish_length"
"""The answer was cut off by `max_tokens`: no later turn can follow a truncated one."""
BUDGET: EndReason = "budget"
"""A budget stopped the conversation (set by the run, never here)."""
NO_TOOL_CALL: EndReason = "no_tool_call"
"""The dataset's turn called tools, the target's did not: the dataset's results answer
nothing the target asked."""
TOOL_CALL_DIFFERS: EndReason = "tool_call_differs"
"""Both called tools, not the same ones (name or arguments): the dataset's results are not
the answers to the target's calls."""
UNEXPECTED_TOOL_CALL: EndReason = "unexpected_tool_call"
"""The target called a tool where the dataset's turn did not: the dataset has no result."""

LayoutKind = Literal["sequence", "branches"]


class TrajectoryError(DraftgenError):
    """A trajectory asked for something its turns do not allow (a turn after its end)."""


class PlannedTurn(Protocol):
    """One assistant turn of a dataset conversation, as the dataset plan gives it."""

    @property
    def context(self) -> Sequence[Message]:
        """The dataset's messages between the previous assistant turn and this one: the
        previous turn's tool results, then user (and system) messages."""

    @property
    def expected(self) -> Message | None:
        """The dataset's own assistant message for this turn (None where it has none): its
        tool calls are those the tool results at the head of the next turn's context
        answer."""


@dataclass(frozen=True, slots=True)
class TurnAnswer:
    """The target's answer to one turn, as rebuilt from what the engine returned."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] | None
    output_ids: list[int]
    finished: bool = True
    """False when the answer was cut off (`finish_reason` "length")."""

    @classmethod
    def from_rebuilt(cls, rebuilt: Rebuilt, *, finished: bool) -> TurnAnswer:
        return cls(rebuilt.reasoning, rebuilt.content, rebuilt.tool_calls,
                   list(rebuilt.output_ids), finished)

    def as_history(self) -> Message:
        """The answer as the assistant message of a later turn's history."""
        message: Message = {"role": "assistant", "content": self.content or ""}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = list(self.tool_calls)
        return message


def with_calls_read(fmt: Format, answer: TurnAnswer) -> TurnAnswer:
    """The answer with the tool calls its tokens hold where the backend returned them as text
    (no structured `tool_calls`): the format parses the answer as the model wrote it, and its
    reasoning, content and calls replace the backend's split. An answer with structured calls,
    or in whose text the format finds none, is returned as it is."""
    if answer.tool_calls or not answer.content or not answer.output_ids:
        return answer
    parsed = fmt.parse_answer_text(fmt.tokenizer.text_of(answer.output_ids))
    if not parsed.tool_calls:
        return answer
    return replace(answer, reasoning=parsed.reasoning, content=parsed.content,
                   tool_calls=list(parsed.tool_calls))


# ---- the tool-result rule ---------------------------------------------------------------------


def _call_key(call: ToolCall) -> tuple[Any, Any]:
    fn = call.get("function") or call
    return fn.get("name"), arguments_value(call)


def same_tool_calls(expected: Sequence[ToolCall] | None, made: Sequence[ToolCall] | None
                    ) -> bool:
    """Whether the target made the dataset's calls: the same names and arguments (parsed as
    JSON, so that spacing and key order do not matter), in the same order."""
    return [_call_key(c) for c in expected or []] == [_call_key(c) for c in made or []]


def _calls_of(message: Message | None) -> list[ToolCall]:
    return list((message or {}).get("tool_calls") or [])


def end_after(turn: PlannedTurn, answer: TurnAnswer, next_turn: PlannedTurn | None
              ) -> EndReason | None:
    """Why the trajectory ends with `answer` (the target's answer to `turn`), or None when
    `next_turn` may follow it."""
    if not answer.finished:
        return FINISH_LENGTH
    expected = _calls_of(turn.expected)
    if expected and not answer.tool_calls:
        return NO_TOOL_CALL
    if expected and not same_tool_calls(expected, answer.tool_calls):
        return TOOL_CALL_DIFFERS
    if answer.tool_calls and not expected:
        return UNEXPECTED_TOOL_CALL
    return LAST_TURN if next_turn is None else None


# ---- the next turn's prompt -------------------------------------------------------------------


def turn_messages(turns: Sequence[PlannedTurn], answers: Sequence[TurnAnswer]) -> list[Message]:
    """The prompt messages of turn `len(answers)`: every earlier turn's context with the
    target's answer after it, then this turn's context. The dataset's tool results name the
    dataset's call IDs; they are relinked to the target's calls (same calls, same order)."""
    k = len(answers)
    if k >= len(turns):
        raise TrajectoryError(f"turn {k}: the conversation has {len(turns)} turns to answer")
    messages: list[Message] = []
    for i, answer in enumerate(answers):
        reason = end_after(turns[i], answer, turns[i + 1])
        if reason is not None:
            raise TrajectoryError(f"turn {k}: the trajectory ended at turn {i} ({reason})")
    previous: tuple[PlannedTurn, TurnAnswer] | None = None
    for i in range(k + 1):
        messages.extend(_relinked(turns[i].context, previous))
        if i < k:
            messages.append(answers[i].as_history())
            previous = (turns[i], answers[i])
    return messages


def _relinked(context: Sequence[Message], previous: tuple[PlannedTurn, TurnAnswer] | None
              ) -> list[Message]:
    """The context, its tool results naming the target's call IDs where they named the
    dataset's (the calls are the same, in the same order: `end_after`)."""
    ids: dict[str, str] = {}
    if previous is not None:
        turn, answer = previous
        for dataset_call, target_call in zip(_calls_of(turn.expected), answer.tool_calls or [],
                                             strict=False):
            old, new = dataset_call.get("id"), target_call.get("id")
            if isinstance(old, str) and isinstance(new, str):
                ids[old] = new
    out = []
    for m in context:
        m = dict(m)
        if m.get("role") == "tool" and m.get("tool_call_id") in ids:
            m["tool_call_id"] = ids[m["tool_call_id"]]
        out.append(m)
    return out


def turn_prompt(fmt: Format, turns: Sequence[PlannedTurn], answers: Sequence[TurnAnswer],
                tools: Sequence[Tool] | None) -> tuple[list[Message], list[int]]:
    """The next turn's prompt messages and their token IDs, as `fmt` renders them."""
    messages = turn_messages(turns, answers)
    return messages, fmt.render_prompt(messages, tools)


# ---- the trajectory's tokens ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnTokens:
    """One answered turn: the IDs of its prompt and the IDs the target sampled."""

    prompt_ids: Sequence[int]
    output_ids: Sequence[int]


@dataclass(frozen=True, slots=True)
class MaskedSequence:
    """Token IDs with a loss mask: 1 on exactly the target's sampled tokens."""

    input_ids: list[int]
    loss_mask: list[int]
    turns: list[int]
    """The turns (indexes) whose answers this sequence holds."""


@dataclass(frozen=True, slots=True)
class TrajectoryLayout:
    kind: LayoutKind
    """"sequence": every turn in one `input_ids`; "branches": one sequence per run of turns
    whose history the template keeps intact."""
    sequences: list[MaskedSequence]
    breaks: list[int] = field(default_factory=list)
    """The turns k where prompt_k + output_k is not a prefix of prompt_k+1."""


def extends(turn: TurnTokens, next_turn: TurnTokens) -> bool:
    """Whether the next prompt starts with this turn's prompt and sampled answer, token for
    token (the template rendered the answer back as it was sampled)."""
    n = len(turn.prompt_ids) + len(turn.output_ids)
    head = next_turn.prompt_ids[:n]
    return len(head) == n and list(head) == [*turn.prompt_ids, *turn.output_ids]


def trajectory_layout(turns: Sequence[TurnTokens]) -> TrajectoryLayout:
    """The trajectory's token sequences: one where every turn extends into the next, else one
    branch per run of turns that do (a turn alone where neither neighbour extends)."""
    if not turns:
        raise TrajectoryError("a trajectory needs at least one answered turn")
    breaks = [k for k in range(len(turns) - 1) if not extends(turns[k], turns[k + 1])]
    starts = [0, *(k + 1 for k in breaks)]
    ends = [*(k + 1 for k in breaks), len(turns)]
    sequences = [_masked(turns, range(a, b)) for a, b in zip(starts, ends, strict=True)]
    return TrajectoryLayout("sequence" if not breaks else "branches", sequences, breaks)


def _masked(turns: Sequence[TurnTokens], run: range) -> MaskedSequence:
    """The run's last prompt and answer, the mask on each turn's answer where it sits (the
    run's turns extend into each other, so each answer is where its prompt ends)."""
    last = turns[run[-1]]
    input_ids = [*last.prompt_ids, *last.output_ids]
    mask = [0] * len(input_ids)
    for k in run:
        start = len(turns[k].prompt_ids)
        mask[start:start + len(turns[k].output_ids)] = [1] * len(turns[k].output_ids)
    return MaskedSequence(input_ids, mask, list(run))


# ---- reading a trajectory back (audit, export) ------------------------------------------------

TURN_MISSING = "turn_missing"
TURN_REPEATED = "turn_repeated"
END_NOT_LAST = "end_not_last"


def turn_order_problems(turns: Sequence[tuple[int, str | None]]) -> list[list[str]]:
    """A conversation's written turns, in file order, as (turn index, end): per turn, what is
    wrong with its place. The turns must be 0..k without gaps (`turn_missing` on the first one
    after a gap), each once (`turn_repeated` on a later copy), with at most one `end`, on the
    last turn (`end_not_last` on an end before the last turn, or a second one on it)."""
    problems: list[list[str]] = [[] for _ in turns]
    seen: set[int] = set()
    for i, (k, _) in enumerate(turns):
        if k in seen:
            problems[i].append(TURN_REPEATED)
        seen.add(k)
    for i, (k, _) in enumerate(turns):
        if k > 0 and k - 1 not in seen and TURN_REPEATED not in problems[i]:
            problems[i].append(TURN_MISSING)
    last = max((k for k, _ in turns), default=-1)
    last_ended = False
    for i, (k, end) in enumerate(turns):
        if end is None:
            continue
        if k != last or last_ended:
            problems[i].append(END_NOT_LAST)
        last_ended = last_ended or k == last
    return problems


def mask_covers_sampled(turns: Sequence[TurnTokens], sequence: MaskedSequence) -> bool:
    """Whether `sequence`'s mask is 1 on exactly its turns' sampled tokens, each answer where
    its prompt ends, and 0 everywhere else."""
    if len(sequence.loss_mask) != len(sequence.input_ids):
        return False
    expected = [0] * len(sequence.input_ids)
    for k in sequence.turns:
        start, output = len(turns[k].prompt_ids), list(turns[k].output_ids)
        if sequence.input_ids[start:start + len(output)] != output:
            return False
        if any(expected[start:start + len(output)]):
            return False  # two answers on the same tokens
        expected[start:start + len(output)] = [1] * len(output)
    return sequence.loss_mask == expected
