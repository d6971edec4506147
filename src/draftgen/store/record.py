"""`Record`: one answer as a line of `responses.jsonl`, the one type the run writes and every
reader (index, status, audit, export, report) reads.

The field order is the line's key order ("id" first, for people reading the file). `tools` and
`session` are left out of the line when unset; fields added after the first release have
defaults, so that older runs still read. `decode_record` checks every field's type, so that a
reader gets either a `Record` whose fields are what they say or a `RecordError` naming the field.

A `turns: all` turn whose prompt extends an earlier turn's record in the same file is written as
a `TurnLine` (`store.prompt_refs` decides, and reads it back as the whole `Record`): the
Record's fields, less `messages`, `tools` and `input_ids`, which `extends` replaces with what
the prompt adds to that earlier turn's.
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
    `logprobs_incomplete`, `engine_ids_not_text`, `stop_token_appended`,
    `provider_excluded_by_config`, `prompt_ids_differ_from_engine`, ..."""
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
    reported cost that is no cost: negative, not a number), `worst_case_report_implausible` (a
    cost no request could have: over `budget.IMPLAUSIBLE_RATIO` times its worst case); the last
    two count the request's worst case times `budget.LEARNING_MARGIN` (`draftgen status`
    counts them)."""
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


class Extends(msgspec.Struct, kw_only=True, gc=False):
    """A turn's prompt as the earlier turn of its conversation it extends, plus what it adds
    (a `TurnLine`'s `extends`): the whole prompt is that turn's `messages` + `messages`, its
    `tools`, and the first `keep` of its `input_ids` + `output_ids` + `input_ids`."""

    id: str
    """The extended turn's `id`."""
    at: Annotated[int, msgspec.Meta(ge=0)]
    """Where the extended turn's line starts in the same responses.jsonl (an earlier line)."""
    keep: Annotated[int, msgspec.Meta(ge=0)]
    """How many of the extended turn's prompt + answer IDs this prompt starts with (all of
    them where the template renders the answer back as sampled; fewer where it drops or
    re-renders part of the history)."""
    messages: list[dict[str, Any]]
    """The messages after the extended turn's."""
    input_ids: list[TokenId]
    """The prompt's IDs after the first `keep`."""


def _turn_line_fields() -> list[tuple[Any, ...]]:
    """Record's fields in its order, `extends` in place of `messages`, no `tools` nor
    `input_ids`."""
    out: list[tuple[Any, ...]] = []
    for f in msgspec.structs.fields(Record):
        if f.name == "messages":
            out.append(("extends", Extends))
        elif f.name not in PROMPT_FIELDS:
            default = (f.default if f.default is not msgspec.NODEFAULT
                       else msgspec.field(default_factory=f.default_factory)
                       if f.default_factory is not msgspec.NODEFAULT else msgspec.NODEFAULT)
            out.append((f.name, f.type) if default is msgspec.NODEFAULT
                       else (f.name, f.type, default))
    return out


PROMPT_FIELDS = ("messages", "tools", "input_ids")
"""The Record's fields that `Extends` stands for in a `TurnLine`."""
TurnLine = msgspec.defstruct("TurnLine", _turn_line_fields(), kw_only=True, gc=False)
"""A turn's line whose prompt extends an earlier turn's (see the module's docstring)."""
SHARED_FIELDS: tuple[str, ...] = tuple(f for f in Record.__struct_fields__
                                       if f not in PROMPT_FIELDS)
"""The fields a `TurnLine` holds as the `Record` does."""


class RecordError(DraftgenError):
    """A line of responses.jsonl that is not a record; the message names the field."""


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Record)
_TURN_DECODER = msgspec.json.Decoder(TurnLine)


def encode_record(record: Record) -> bytes:
    """The record as one JSON line's text, without the newline."""
    return _ENCODER.encode(record)


def decode_record(line: bytes | str) -> Record:
    """The record of one line; `RecordError` (naming the field, e.g. `$.input_ids[3]`) when the
    line is not JSON or a field is missing or of the wrong type, or is a `TurnLine` (read
    those through `store.prompt_refs.LineReader`, which knows their file)."""
    decoded = decode_line(line)
    if not isinstance(decoded, Record):
        raise RecordError(f"turn {decoded.id!r} extends turn {decoded.extends.id!r} of its "
                          "file: read it from its responses.jsonl")
    return decoded


def decode_line(line: bytes | str) -> Any:
    """The `Record` or `TurnLine` of one line (typed `Any`: `TurnLine` is built at import);
    `RecordError` naming the field when it is neither (the Record's error)."""
    try:
        return _DECODER.decode(line)
    except msgspec.DecodeError as e:
        error = e
    try:
        return _TURN_DECODER.decode(line)
    except msgspec.DecodeError:
        raise RecordError(f"not a record: {error}") from None


def encode_turn_line(record: Record, extends: Extends) -> bytes:
    """The line (without the newline) of a record whose prompt is `extends` of an earlier
    turn's (`store.prompt_refs` checks that it is)."""
    shared = {name: getattr(record, name) for name in SHARED_FIELDS}
    return _ENCODER.encode(TurnLine(**shared, extends=extends))


def encode_line(value: Record | Any) -> bytes:
    """A `Record`'s or `TurnLine`'s line, without the newline."""
    return _ENCODER.encode(value)


def extended(base: Record, line: Any) -> Record:
    """The whole record of a `TurnLine` whose `extends` names `base`."""
    ext: Extends = line.extends
    shared = {name: getattr(line, name) for name in SHARED_FIELDS}
    ids = base.input_ids[:ext.keep]
    ids.extend(base.output_ids[:ext.keep - len(ids)])
    ids.extend(ext.input_ids)
    return Record(**shared, messages=[*base.messages, *ext.messages], tools=base.tools,
                  input_ids=ids)


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
        return damaged(line, str(e))


def damaged(line: bytes | str, error: str) -> Damaged | None:
    """The line as a `Damaged` record failing with `error`; None when it is not a JSON
    object."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return Damaged(value, error) if isinstance(value, dict) else None


def record_as_dict(record: Record) -> dict[str, Any]:
    """The record as plain JSON values (what `orjson.loads` of its line gives)."""
    return msgspec.to_builtins(record)
