"""The chat-completion wire format as `msgspec` types: only the fields draftgen reads.

Decoding a whole answer into these types skips every other field (`object`, `created`,
`index`, `top_logprobs`, `native_finish_reason`, ...) without building it, and builds structs
that the garbage collector does not track: with logprobs, ~25 % less CPU than `orjson.loads`
followed by dict lookups (docs/benchmarks.md, client throughput).

The types are strict, and `decode_completion` gives None for a body they do not describe: not
JSON, not an object, a field of another type, a logprob entry that is not an object. A logprob
entry's `bytes` stay JSON text (`msgspec.Raw`), checked by `chat_logprobs.decoded_logprobs`, which
gives up on anything but lists of byte values. The caller then reads that body with the
generic parse (`orjson` and dict lookups), whose lenient rules and error messages stay the
reference. Free-form values (tool calls, reasoning details, usage, errors) are kept as
`msgspec.Raw` and parsed by `orjson` when read (`value`), exactly as the generic parse reads
them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import orjson

_ABSENT = msgspec.Raw()

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An integer that `orjson` reads as an int too: it reads one beyond 64 bits as a float, msgspec
as an int (its bounds must fit 64 signed bits, so a value in 2**63..2**64-1 goes to the generic
reading, which reads it alike)."""


class LogprobEntry(msgspec.Struct, gc=False):
    """One `logprobs.content[]` entry: the sampled token (its alternatives are not read).

    Neither its `token` text nor its `logprob` is decoded (a fifth less time for an answer's
    body): recovering IDs needs neither when the entries report IDs or their bytes are tokens'
    spellings, and `openai_chat.answer_from_body` reads them from the body when asked for."""

    bytes: msgspec.Raw = _ABSENT
    """The JSON text of the byte values, as sent (empty when absent): checked and read as
    bytes for all entries at once (`chat_logprobs.decoded_logprobs`), a third of the CPU of
    building a tuple of ints per entry and a `bytes` from each."""
    id: Int64 | None = None


class Logprobs(msgspec.Struct, gc=False):
    content: list[LogprobEntry] | None = None


class Message(msgspec.Struct, gc=False):
    """A choice's `message`."""

    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    reasoning_details: msgspec.Raw = _ABSENT
    tool_calls: msgspec.Raw = _ABSENT


class Choice(msgspec.Struct, gc=False):
    message: Message | None = None
    finish_reason: str | None = None
    token_ids: list[Int64] | None = None
    """vLLM's `return_token_ids`."""
    logprobs: Logprobs | None = None
    error: msgspec.Raw = _ABSENT
    """With `finish_reason: "error"`: what went wrong."""


class Completion(msgspec.Struct, gc=False):
    """A chat-completion body."""

    choices: list[Choice] | None = None
    usage: msgspec.Raw = _ABSENT
    provider: str | None = None
    model: str | None = None
    id: str | None = None
    prompt_token_ids: list[Int64] | None = None
    """vLLM's `return_token_ids`."""
    error: msgspec.Raw = _ABSENT
    """Present: an error body (OpenRouter sends them with status 200 and as SSE events)."""


_completion = msgspec.json.Decoder(Completion)


def decode_completion(raw: bytes) -> Completion | None:
    """`raw` as a `Completion`; None when the types do not describe it (see the module doc)."""
    try:
        return _completion.decode(raw)
    except msgspec.MsgspecError:
        return None


def value(raw: msgspec.Raw) -> Any:
    """A free-form field's value as `orjson` parses it; None when the field was absent."""
    return orjson.loads(memoryview(raw)) if raw else None


# ---- stream chunks -----------------------------------------------------------------------------


class ChunkChoice(msgspec.Struct, gc=False):
    """A stream chunk's choice: the message comes as a `delta`. Logprobs stay `Raw`, read by the
    generic `_logprobs_of` (a few entries per chunk; the stream's later events are then read
    generically, see `openai_chat.StreamAccumulator`)."""

    delta: Message | None = None
    finish_reason: str | None = None
    token_ids: list[Int64] | None = None
    """vLLM's `return_token_ids`: the chunk's tokens."""
    logprobs: msgspec.Raw = _ABSENT
    error: msgspec.Raw = _ABSENT
    """With `finish_reason: "error"`: what went wrong."""


class Chunk(msgspec.Struct, gc=False):
    """One SSE event's `data:` object in a chat stream."""

    choices: list[ChunkChoice] | None = None
    usage: msgspec.Raw = _ABSENT
    provider: str | None = None
    model: str | None = None
    id: str | None = None
    error: msgspec.Raw = _ABSENT
    """Present: an error event (the caller reads those generically)."""


chunk_decoder = msgspec.json.Decoder(Chunk)
"""`Chunk`s from UTF-8 (see `decode_chunk`)."""


def decode_chunk(raw: bytes) -> Chunk | None:
    """`raw` as a `Chunk`; None when the types do not describe it, and when it is not UTF-8:
    msgspec skips the fields it does not read without checking their bytes, where `orjson`
    refuses the whole event. (Both refuse a number beyond float range, except that msgspec skips
    one in a field it does not read: the one input on which the two readings differ.)"""
    if not is_utf8(raw, len(raw)):
        return None
    try:
        return chunk_decoder.decode(raw)
    except msgspec.MsgspecError:
        return None


def is_utf8(data: bytes, end: int) -> bool:
    """`data[:end]` is UTF-8: `orjson` refuses JSON that is not, msgspec does not check the
    bytes of the fields it skips (`decode_chunk`, and the stream reader for a read's lines)."""
    if data.isascii():
        return True
    try:
        str(memoryview(data)[:end], "utf-8")
    except UnicodeDecodeError:
        return False
    return True
