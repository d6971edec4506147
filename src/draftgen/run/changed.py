"""Answered prompts whose dataset row changed under the same ID since they were answered (a row
edited between sessions): a resume counts them, records the count in run.json and, with
`draftgen run --reask-changed`, moves their answers to quarantine.jsonl (`store.quarantine_move`,
never deleted) so that they are asked again with the row as it is now.

Each answer keeps the messages and tools it was asked with; their `content_digest` is compared
with the row's. Single-turn datasets only: a `turns: all` answer's messages are its
conversation so far."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from draftgen.datasets import PromptTable
from draftgen.datasets.ids import content_digest
from draftgen.store import RunLayout
from draftgen.store.quarantine_move import MovedLine, move_lines

log = logging.getLogger("draftgen")

PROMPT_CHANGED = "prompt_changed"
"""Why `--reask-changed` moved an answer to quarantine.jsonl."""


class _Asked(msgspec.Struct):
    """What an answer was asked: the fields of a record read here."""

    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


_DECODER = msgspec.json.Decoder(_Asked)


@dataclass
class Answered:
    """Per answered ID of a responses file: the digest of the content it was asked with (its
    last answer's) and where its lines are."""

    digests: dict[str, bytes] = field(default_factory=dict)
    lines: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def read_answered(path: Path) -> Answered:
    """The responses file's answers (complete lines that are records; others skipped)."""
    out = Answered()
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return out
    with f:
        start = 0
        for line in f:
            end = start + len(line)
            if line.endswith(b"\n"):
                try:
                    asked = _DECODER.decode(line)
                except msgspec.DecodeError:
                    asked = None
                if asked is not None:
                    out.digests[asked.id] = content_digest(asked.messages, asked.tools)
                    out.lines.setdefault(asked.id, []).append((start, end))
            start = end
    return out


def changed_prompts(table: PromptTable, answered: Answered) -> list[str]:
    """The IDs of the table's answered prompts whose row now holds other content."""
    rows = [row for row, rid in enumerate(table.ids) if rid in answered.digests]
    changed = []
    for prompt in table.load(rows):
        if content_digest(prompt.messages, prompt.tools) != answered.digests[prompt.id]:
            changed.append(prompt.id)
    return changed


def reask(layout: RunLayout, dataset: str, answered: Answered, ids: list[str]) -> int:
    """Move the answers of `ids` to quarantine.jsonl (the caller holds the run's lock); how
    many lines were moved."""
    spans = sorted(span for rid in ids for span in answered.lines.get(rid, []))
    if not spans:
        return 0
    moved, _ = move_lines(layout.root, dataset,
                          [MovedLine(s, e, [PROMPT_CHANGED]) for s, e in spans])
    return moved
