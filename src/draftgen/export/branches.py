"""`turns: all` datasets exported as trajectories (docs/trajectories.md): a conversation's turns
grouped, cut by an excluded turn or by `--turn-dropout`, laid out by
`formats.trajectory.trajectory_layout` into one sequence per run of turns that extend into each
other; each sequence becomes one row, its mask on every sampled token of its turns.

A row's record is its sequence's last turn (whose prompt holds the earlier turns of the
sequence, so that prompt + answer are the sequence's IDs, and prompt messages + answer its
conversation), with `id` `{conversation}:branch-{i}`; the `Branch` beside it carries the mask
and where it came from. Memory: one dataset's kept turns are held while it is grouped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import msgspec
import orjson

from draftgen.export.checks import BrokenRow
from draftgen.export.select import uniform
from draftgen.formats.trajectory import (
    TurnTokens,
    mask_covers_sampled,
    trajectory_layout,
    turn_order_problems,
)
from draftgen.store.record import Record

AFTER_EXCLUDED = "after_excluded_turn"
"""The exclusion reason of a turn that follows an excluded turn of its conversation (no row
may hold a turn whose history it lacks)."""
TURN_DROPOUT = "turn_dropout"
"""The exclusion reason of a turn cut by `--turn-dropout`."""


@dataclass(frozen=True, slots=True)
class Branch:
    """One token sequence of a trajectory: what its row needs beyond its last turn's record."""

    conversation: str
    index: int
    layout: str
    """The conversation's layout: "sequence" (all its turns in one) or "branches"."""
    turns: list[int]
    loss_mask: list[int]
    cut: bool = False
    """The conversation was cut by `--turn-dropout`."""

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> Branch:
        return cls(**orjson.loads(data))


def dropout_turns(conversation: str, turns: int, p: float, seed: int) -> int:
    """How many leading turns `--turn-dropout P` keeps: with probability P (a seeded draw per
    conversation) the conversation is cut after N turns, N uniform in 1..turns-1, as
    speculators' turn dropout keeps the first N consecutive turns; else all of them."""
    if turns < 2 or p <= 0 or uniform(seed, "turn_dropout", conversation) >= p:
        return turns
    return 1 + math.floor(uniform(seed, "turn_dropout_n", conversation) * (turns - 1))


@dataclass
class StoredConversation:
    """A conversation's turns as read, in file order, and the first turn excluded."""

    turns: list[Record]
    excluded: int = 0
    """Turns excluded (each counted under its reason)."""
    excluded_from: int | None = None

    def exclude(self, turn: int) -> None:
        self.excluded += 1
        if self.excluded_from is None or turn < self.excluded_from:
            self.excluded_from = turn


def order_problem(conversation: str, turns: list[Record]) -> str | None:
    """Why the conversation's turns cannot be laid out (not 0..k once each, an end before the
    last), or None."""
    problems = turn_order_problems([(r.turn if isinstance(r.turn, int) else -1,
                                     r.end if isinstance(r.end, str) else None) for r in turns])
    found = sorted({p for ps in problems for p in ps})
    if not found:
        return None
    return f"conversation {conversation!r}: {', '.join(found)}"


def branches(conversation: str, turns: list[Record], cut: bool = False
             ) -> Iterator[tuple[Record, Branch]]:
    """The conversation's rows: per sequence of its layout, the last turn's record (as
    `{conversation}:branch-{i}`) and its `Branch`. Raises BrokenRow where a mask would not
    cover exactly the sampled tokens."""
    ordered = sorted(turns, key=lambda r: r.turn if isinstance(r.turn, int) else -1)
    tokens = [TurnTokens(r.input_ids, r.output_ids) for r in ordered]
    layout = trajectory_layout(tokens)
    for i, seq in enumerate(layout.sequences):
        if not mask_covers_sampled(tokens, seq):
            raise BrokenRow(f"conversation {conversation!r}, branch {i}: the loss mask does "
                            "not cover exactly the sampled tokens")
        last = ordered[seq.turns[-1]]
        record = msgspec.structs.replace(last, id=f"{conversation}:branch-{i}")
        yield record, Branch(conversation, i, layout.kind,
                             [_turn(ordered[k]) for k in seq.turns], seq.loss_mask, cut)


def _turn(record: Record) -> int:
    return record.turn if isinstance(record.turn, int) else 0


def kept_turns(conv: StoredConversation) -> list[Record]:
    """The turns before the first excluded one (all of them when none is), in turn order."""
    stop = conv.excluded_from
    return sorted((r for r in conv.turns if stop is None or _turn(r) < stop), key=_turn)


def group(records: Iterable[tuple[Record, str | None]]) -> dict[str, StoredConversation]:
    """(record, exclusion reason) by conversation, in first-seen order; an excluded turn cuts
    its conversation there."""
    out: dict[str, StoredConversation] = {}
    for record, reason in records:
        key = record.conversation if isinstance(record.conversation, str) else record.id
        conv = out.setdefault(key, StoredConversation([]))
        conv.turns.append(record)
        if reason is not None:
            conv.exclude(_turn(record))
    return out
