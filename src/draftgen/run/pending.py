"""What the run's queues hold: `Pending`, a prompt to send, or the next turn of a `turns: all`
conversation."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from draftgen.formats import FormatError
from draftgen.run.render import render_within
from draftgen.run.turns import Conversation
from draftgen.types import Prompt


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

    @classmethod
    def next_turn(cls, conversation: Conversation, row: int = -1) -> Pending:
        """The conversation's next turn as a request to queue (its prompt built, not yet
        rendered)."""
        return cls(conversation.plan.dataset, row, conversation.next_prompt(),
                   conversation=conversation)


def turns_queued(items: Iterable[Pending]) -> int:
    """The turns a queue's items stand for: one per prompt, every turn left of a
    conversation."""
    return sum(item.conversation.turns_left if item.conversation is not None else 1
               for item in items)


def render_turns(items: Sequence[Pending], prompts: Sequence[Prompt],
                 context_length: int | None) -> list[list[int] | FormatError]:
    """`plan.render_within` for turns of conversations, each in its conversation's format
    (one batch per format)."""
    out: list[list[int] | FormatError] = [FormatError("not rendered")] * len(items)
    by_format: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        assert item.conversation is not None
        by_format.setdefault(id(item.conversation.fmt), []).append(i)
    for indexes in by_format.values():
        fmt = items[indexes[0]].conversation.fmt  # type: ignore[union-attr]
        rendered = render_within(fmt, [prompts[i] for i in indexes], context_length)
        for i, ids in zip(indexes, rendered, strict=True):
            out[i] = ids
    return out
