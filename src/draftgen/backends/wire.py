"""The chat-completion wire format as `msgspec` types: only the fields draftgen reads.

Decoding a whole answer into these types skips every other field (`object`, `created`,
`index`, `top_logprobs`, `native_finish_reason`, ...) without building it, and builds structs
that the garbage collector does not track: with logprobs, ~25 % less CPU than `orjson.loads`
followed by dict lookups (docs/benchmarks.md, client throughput).

The types are strict, and `decode_completion` gives None for a body they do not describe: not
JSON, not an object, a field of another type, a logprob entry that is not an object or whose
`bytes` are not integers (`openai_chat.answer_from_body` gives up on integers that are not byte
values). The caller then reads that body with the generic parse (`orjson` and dict lookups),
whose lenient rules and error messages stay the reference. Free-form values
(tool calls, reasoning details, usage, errors) are kept as `msgspec.Raw` and parsed by
`orjson` when read (`value`), exactly as the generic parse reads them.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

_ABSENT = msgspec.Raw()


class LogprobEntry(msgspec.Struct, gc=False):
    """One `logprobs.content[]` entry: the sampled token (its alternatives are not read)."""

    token: str = ""
    bytes: tuple[int, ...] | None = None
    """Byte values, checked when made `bytes` (a range check here costs more than that)."""
    id: int | None = None
    logprob: int | float | None = None
    """int or float as sent (the generic parse keeps an integral value an int)."""


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
    token_ids: list[int] | None = None
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
    prompt_token_ids: list[int] | None = None
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
