"""`Record`: one answer as a line of `responses.jsonl`, the one type the run writes and every
reader (index, status, audit, export, report) reads.

The field order is the line's key order ("id" first, for people reading the file). `tools` and
`session` are left out of the line when unset; fields added after the first release have
defaults, so that older runs still read. `decode_record` checks every field's type, so that a
reader gets either a `Record` whose fields are what they say or a `RecordError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import orjson

from draftgen.errors import DraftgenError

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class Usage(msgspec.Struct, kw_only=True, gc=False):
    """The token counts (and cost) the server reported for the answer, as reported."""

    prompt_tokens: Int64 | None = None
    completion_tokens: Int64 | None = None
    reasoning_tokens: Int64 | None = None
    cached_tokens: Int64 | None = None
    cost: float | None = None


class Record(msgspec.Struct, kw_only=True, gc=False):
    """One answer. README "What a record holds" documents each field (and is checked against
    this type by tests/test_record.py)."""

    id: str
    dataset: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | msgspec.UnsetType = msgspec.UNSET
    input_ids: list[TokenId]
    output_ids: list[TokenId]
    token_source: str
    token_check: str
    flags: list[str]
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str | None
    backend: str
    provider: str | None = None
    quantization: str | None = None
    model: str | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    cost_usd: NonNegative = 0.0
    cost_source: str = "unknown"
    request_id: str | None = None
    latency_s: float | None = None
    retries: int = 0
    created_at: float | None = None
    session: int | msgspec.UnsetType = msgspec.UNSET
    conversation: str | msgspec.UnsetType = msgspec.UNSET
    """`turns: all` datasets only (docs/trajectories.md): the conversation this turn belongs to."""
    turn: int | msgspec.UnsetType = msgspec.UNSET
    """The turn's index in its conversation's plan, from 0."""
    end: str | msgspec.UnsetType | None = msgspec.UNSET
    """Why the trajectory ends at this turn (`formats.trajectory.EndReason`); null: it goes on."""
    sampling: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    """The settings drawn from the dataset's `sampling_mix` for this conversation ({}: none)."""


FIELDS: tuple[str, ...] = Record.__struct_fields__


class RecordError(DraftgenError):
    """A line of responses.jsonl that is not a record; the message names the field."""


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Record)


def encode_record(record: Record) -> bytes:
    """The record as one JSON line's text, without the newline."""
    return _ENCODER.encode(record)


def decode_record(line: bytes | str) -> Record:
    """The record of one line; `RecordError` (naming the field, e.g. `$.input_ids[3]`) when the
    line is not JSON or a field is missing or of the wrong type."""
    try:
        return _DECODER.decode(line)
    except msgspec.DecodeError as e:
        raise RecordError(f"not a record: {e}") from None


@dataclass(frozen=True, slots=True)
class Damaged:
    """A line that is a JSON object but not a `Record` (a field missing or of the wrong type):
    the object as it is, for the readers that report such lines (audit, export)."""

    fields: dict[str, Any]
    error: str
    """`RecordError`'s message, naming the field."""

    @property
    def id(self) -> Any:
        return self.fields.get("id")


def read_record(line: bytes | str) -> Record | Damaged | None:
    """The record of one line; a `Damaged` for a JSON object that is not a record; None for a
    line that is not a JSON object."""
    try:
        return decode_record(line)
    except RecordError as e:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        return Damaged(value, str(e)) if isinstance(value, dict) else None


def record_as_dict(record: Record) -> dict[str, Any]:
    """The record as plain JSON values (what `orjson.loads` of its line gives)."""
    return msgspec.to_builtins(record)
