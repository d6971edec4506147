"""One line of a dataset's index (`store.index`) and its binary row (`store.columns`): what
status, budgets and resume need of a record, and where the record ends in responses.jsonl."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from draftgen.store.record import Record


@dataclass(slots=True)
class IndexEntry:
    id: str
    end: int
    """Byte offset just past this record's line in responses.jsonl."""
    backend: str | None
    provider: str | None
    out: int
    """Output tokens stored (len(output_ids))."""
    reasoning: int | None
    cost: float
    finish: str | None
    check: str | None
    t: float | None
    lat: float | None
    quant: str | None = None
    """The upstream quantization (absent from indexes written before it was added)."""
    conversation: str | None = None
    """`turns: all`: the record's `conversation` (absent from other records' entries, and from
    indexes written before it was added)."""
    turn: int | None = None
    """`turns: all`: the record's `turn`."""
    end_reason: str | None = None
    """`turns: all`: the record's `end` (why the trajectory ends there; None: it goes on)."""

    def to_json(self) -> bytes:
        turn = {} if self.conversation is None else {
            "conversation": self.conversation, "turn": self.turn, "end_reason": self.end_reason}
        return orjson.dumps({
            "id": self.id, "end": self.end, "backend": self.backend, "provider": self.provider,
            "out": self.out, "reasoning": self.reasoning, "cost": self.cost,
            "finish": self.finish, "check": self.check, "t": self.t, "lat": self.lat,
            "quant": self.quant, **turn,
        }, option=orjson.OPT_APPEND_NEWLINE)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IndexEntry:
        g = data.get  # positional: a million entries are read at each resume
        return cls(g("id"), g("end"), g("backend"), g("provider"), g("out"), g("reasoning"),
                   g("cost"), g("finish"), g("check"), g("t"), g("lat"), g("quant"),
                   g("conversation"), g("turn"), g("end_reason"))

    @property
    def has_turn(self) -> bool:
        """Whether the entry holds its record's trajectory fields (a `turns: all` record's,
        in an index written since they were added)."""
        return isinstance(self.conversation, str) and isinstance(self.turn, int)


def entry_for(record: Record | dict[str, Any], end: int) -> IndexEntry:
    """The index entry of a record whose line ends at byte `end` of its data file: a `Record`
    as the run writes it, or a line read back as JSON (which may be of an older schema)."""
    if isinstance(record, Record):
        return IndexEntry(
            id=record.id, end=end, backend=record.backend, provider=record.provider,
            out=len(record.output_ids), reasoning=record.usage.reasoning_tokens,
            cost=float(record.cost_usd), finish=record.finish_reason,
            check=record.token_check, t=record.created_at, lat=record.latency_s,
            quant=record.quantization, **_turn_fields(record.conversation, record.turn,
                                                      record.end),
        )
    usage = record.get("usage") or {}
    return IndexEntry(
        id=record["id"], end=end, backend=record.get("backend"),
        provider=record.get("provider"), out=len(record.get("output_ids") or ()),
        reasoning=usage.get("reasoning_tokens"), cost=float(record.get("cost_usd") or 0.0),
        finish=record.get("finish_reason"), check=record.get("token_check"),
        t=record.get("created_at"), lat=record.get("latency_s"),
        quant=record.get("quantization"),
        **_turn_fields(record.get("conversation"), record.get("turn"), record.get("end")),
    )


def _turn_fields(conversation: Any, turn: Any, end: Any) -> dict[str, Any]:
    """A record's trajectory fields as the entry's, where it has them."""
    if not isinstance(conversation, str) or not isinstance(turn, int) or isinstance(turn, bool):
        return {}
    return {"conversation": conversation, "turn": turn,
            "end_reason": end if isinstance(end, str) else None}
