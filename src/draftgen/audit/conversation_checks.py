"""The audit of `turns: all` datasets as trajectories (docs/trajectories.md): each turn is an
answer audited as any other (`audit.engine`); here the conversation as a whole.

A dataset's turns are grouped by `conversation` (over every folder of a sharded run): the
turns written must be 0..k without gaps, each once, with at most one `end`, on the last turn,
each turn's `id` `{conversation}#{turn}`; and the layout of the trajectory's tokens
(`formats.trajectory.trajectory_layout`) is checked: each sequence's mask on exactly the
sampled tokens. Where a turn extends the previous one (its prompt starts with the previous
prompt and answer, token for token) the turns share a sequence; the report counts sequences,
branches and breaks as the layout finds them. A finding marks the line it is about, so that
`--quarantine` moves it like any failing answer.

Memory: the prompt and answer IDs of one dataset's turns are held while it is checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from draftgen.audit.checks import TRAJECTORY_PROBLEMS as TRAJECTORY_PROBLEMS
from draftgen.audit.engine import Chunk, chunk_lines, record_of
from draftgen.formats.trajectory import (
    TurnTokens,
    mask_covers_sampled,
    trajectory_layout,
    turn_order_problems,
)
from draftgen.store.prompt_refs import LineReader
from draftgen.store.record import Record


@dataclass
class TrajectoryAudit:
    """One dataset's trajectories: how many, laid out how, ended why."""

    conversations: int = 0
    turns: int = 0
    layouts: Counter[str] = field(default_factory=Counter)
    """Conversations per layout kind (sequence | branches)."""
    sequences: int = 0
    """Token sequences (branches) over all conversations."""
    breaks: int = 0
    """Turns whose next turn does not extend them."""
    ends: Counter[str] = field(default_factory=Counter)
    """Conversations per end reason; "" for those without one (pending or budget)."""

    def as_json(self) -> dict[str, Any]:
        return {"conversations": self.conversations, "turns": self.turns,
                "layouts": dict(self.layouts), "sequences": self.sequences,
                "breaks": self.breaks,
                "ends": {(k or "none"): n for k, n in self.ends.most_common()}}


BLOCK_BYTES = 64 << 20
"""How much of a responses file is read at a time."""


@dataclass(frozen=True)
class Finding:
    """Problems of one line of a responses file (the file's report key)."""

    key: str
    start: int
    end: int
    rid: str
    problems: list[str]


class TurnSpan(NamedTuple):
    """Where one turn's record lies in its responses file."""

    start: int
    stop: int
    conversation: str
    turn: int


@dataclass
class _Turn:
    key: str
    start: int
    stop: int
    record: Record

    @property
    def index(self) -> int:
        return self.record.turn if isinstance(self.record.turn, int) else -1

    @property
    def end(self) -> str | None:
        end = self.record.end
        return end if isinstance(end, str) else None


@dataclass(frozen=True)
class TrajectoryFile:
    """One responses file of a `turns: all` dataset: its report key and the bytes audited."""

    key: str
    dataset: str
    path: str
    stop: int


def audit_trajectories(files: Iterable[TrajectoryFile]
                       ) -> tuple[dict[str, TrajectoryAudit], list[Finding],
                                  dict[str, list[TurnSpan]]]:
    """Per dataset, its trajectories' summary; the findings, per line; per file (its report
    key), where each turn's line lies, in file order."""
    by_dataset: dict[str, dict[str, list[_Turn]]] = {}
    findings: list[Finding] = []
    lines: dict[str, list[TurnSpan]] = {}
    for f in files:
        conversations = by_dataset.setdefault(f.dataset, {})
        turn_lines = lines.setdefault(f.key, [])
        with LineReader(Path(f.path)) as reader:
            _read_turns(f, reader, conversations, turn_lines, findings)
    summaries = {}
    for dataset, conversations in by_dataset.items():
        summary = summaries[dataset] = TrajectoryAudit()
        for turns in conversations.values():
            findings.extend(_check_conversation(turns, summary))
    return summaries, findings, lines


def _read_turns(f: TrajectoryFile, reader: LineReader, conversations: dict[str, list[_Turn]],
                turn_lines: list[TurnSpan], findings: list[Finding]) -> None:
    """The file's turns, by conversation and in file order; a turn whose ID is not its
    conversation's and turn's is a finding."""
    for start, stop, line in _file_lines(f):
        record = record_of(reader, line, start) if line.strip() else None
        if not isinstance(record, Record):
            continue  # not a record: the per-answer audit reports it
        conversation = record.conversation
        if not isinstance(conversation, str) or not isinstance(record.turn, int) or (
                record.id != f"{conversation}#{record.turn}"):
            findings.append(Finding(f.key, start, stop, record.id, ["turn_id_mismatch"]))
            if not isinstance(conversation, str) or not isinstance(record.turn, int):
                continue
        conversations.setdefault(conversation, []).append(_Turn(f.key, start, stop, record))
        turn_lines.append(TurnSpan(start, stop, conversation, record.turn))


def _file_lines(f: TrajectoryFile, block: int = BLOCK_BYTES) -> Iterator[tuple[int, int, bytes]]:
    """The file's lines up to `f.stop`, read a block at a time."""
    start = 0
    while start < f.stop:
        lines = chunk_lines(Chunk(f.dataset, f.path, start, min(f.stop, start + block)))
        if not lines:
            if start + block >= f.stop:
                return
            block *= 2  # a line longer than the block
            continue
        yield from lines
        start = lines[-1][1]


def _check_conversation(turns: list[_Turn], summary: TrajectoryAudit) -> list[Finding]:
    summary.conversations += 1
    summary.turns += len(turns)
    order = turn_order_problems([(t.index, t.end) for t in turns])
    found = [Finding(t.key, t.start, t.stop, t.record.id, problems)
             for t, problems in zip(turns, order, strict=True) if problems]
    ends = [t.end for t in turns if t.end is not None]
    summary.ends[ends[-1] if ends else ""] += 1
    if found:
        return found  # no layout for turns that are not 0..k in a row
    ordered = sorted(turns, key=lambda t: t.index)
    tokens = [TurnTokens(t.record.input_ids, t.record.output_ids) for t in ordered]
    layout = trajectory_layout(tokens)
    summary.layouts[layout.kind] += 1
    summary.sequences += len(layout.sequences)
    summary.breaks += len(layout.breaks)
    if all(mask_covers_sampled(tokens, s) for s in layout.sequences):
        return []
    return [Finding(t.key, t.start, t.stop, t.record.id, ["mask_not_sampled"]) for t in ordered]
