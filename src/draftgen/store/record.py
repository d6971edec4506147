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
from draftgen.types import Usage

TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class Record(msgspec.Struct, kw_only=True, gc=False):
    """One answer. Each field's docstring is its row in docs/record.md (scripts/gen_docs.py
    writes the page from this type; tests/test_docs.py fails when the page is stale)."""

    id: str
    """The prompt's stable ID (the row's own `id`, else a content hash); `turns: all`:
    `{conversation}#{turn}`."""
    dataset: str
    """The dataset's name."""
    messages: list[dict[str, Any]]
    """The prompt, as OpenAI-shaped messages."""
    tools: list[dict[str, Any]] | msgspec.UnsetType = msgspec.UNSET
    """The tools the prompt declared; only when the row had them."""
    input_ids: list[TokenId]
    """The prompt rendered in the model's native format (the engine's own IDs when it reports
    them)."""
    output_ids: list[TokenId]
    """The answer's token IDs: reasoning, end-of-reasoning, content, tool calls, stop token (no
    stop token when truncated)."""
    token_source: str
    """`native` (engine-reported, or recovered from logprobs) or `reconstructed` (rebuilt from
    text)."""
    token_check: str
    """`exact` (engine IDs), `length_ok` (rebuilt, length equals the engine's count: not proof),
    `length_mismatch` (rebuilt, certainly not what was sampled), `unverifiable`."""
    flags: list[str]
    """What to audit: `whitespace_restored`, `special_token_in_content`, `ids_from_logprobs`,
    `logprobs_incomplete`, `stop_token_appended`, `provider_excluded_by_config`,
    `prompt_ids_differ_from_engine`, ..."""
    reasoning: str | None
    """The answer's reasoning as text."""
    content: str | None
    """The answer's content as text."""
    tool_calls: list[dict[str, Any]] | None
    """The answer's tool calls (OpenAI shape)."""
    finish_reason: str | None
    """`stop`, `length`, `tool_calls`, ..."""
    backend: str
    """The backend that served it."""
    provider: str | None = None
    """Who served it, where the API reports it (OpenRouter's provider)."""
    quantization: str | None = None
    """The quantization the provider reported."""
    model: str | None = None
    """The model name the server reported."""
    usage: Usage = msgspec.field(default_factory=Usage)
    """The server's counts, as reported: `prompt_tokens`, `completion_tokens`,
    `reasoning_tokens`, `cached_tokens`, `cost`."""
    cost_usd: NonNegative = 0.0
    """What the request cost (counted against `budget.usd`): the answer's, plus any billed
    failed attempts before it."""
    cost_source: str = "unknown"
    """`reported` (`usage.cost` at or above the price: believed), `priced` (none reported, or
    one below the price: usage times the backend's price), `worst_case_report_refused` (a
    reported cost that is no cost: negative, not a number: counted at the request's worst case;
    `draftgen status` counts them)."""
    request_id: str | None = None
    """The generation ID (OpenRouter `X-Generation-Id`, SGLang `meta_info.id`)."""
    latency_s: float | None = None
    """Seconds the request took, retries included."""
    retries: int = 0
    """Retries used."""
    created_at: float | None = None
    """Unix time the record was written."""
    session: int | msgspec.UnsetType = msgspec.UNSET
    """The index of the run.json session that wrote it (whose `settings` audit judges it by);
    absent in records from before it was added."""
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
