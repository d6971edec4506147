"""The faults the engine can inject: their kinds and wire behaviour, the error answers, and
the picker that chooses one per request (a directive in the prompt, else at random)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from draftgen.testing.fake_engine.kinds import BadRequest, Json
from draftgen.testing.fake_engine.language import TOOL_NAME

BILLED = frozenset({"408", "502", "error_body"})

_CALL_HEAD: Json = {"id": "call_0", "type": "function"}
BAD_TOOL_CALLS: dict[str, Any] = {
    "tool_name_null": [_CALL_HEAD | {"function": {"name": None, "arguments": "{}"}}],
    "tool_name_empty": [_CALL_HEAD | {"function": {"name": "", "arguments": "{}"}}],
    "tool_name_int": [_CALL_HEAD | {"function": {"name": 7, "arguments": "{}"}}],
    "tool_calls_dict": _CALL_HEAD | {"function": {"name": TOOL_NAME, "arguments": "{}"}},
    "tool_calls_string": f"{TOOL_NAME}(city='Paris')",
    "tool_calls_null_item": [None],
    "tool_call_no_function": [_CALL_HEAD],
}
"""Fault kinds answered with a malformed `tool_calls` (JSON: the message's; stream: one more
delta carrying it), the rest of the answer as usual."""

BAD_IDS: dict[str, list[Any]] = {
    "ids_negative": [-5, -1],
    "ids_not_int": ["x", 1.5, True, None],
    "ids_out_of_vocab": [999_999],
    "ids_huge": [10**12],
}
"""Fault kinds whose engine IDs (SGLang's `output_ids`, vLLM's `token_ids`) have these values
in place of the answer's middle IDs (an answer too short for them is lengthened)."""
TOO_MANY_IDS = "ids_too_many"
"""The fault kind whose engine IDs go on past the request's token limit: the answer's IDs, then
as many again as the limit allows (an engine that ignored `max_new_tokens`)."""
SHIFTED_IDS = "ids_shifted"
"""The fault kind whose engine IDs are each the vocabulary's previous ID but the last (the text
stays true): IDs in range that are not the answer's."""
IGNORES_MAX_TOKENS = "ignores_max_tokens"
"""The fault kind answered in full whatever the request's token limit: text, IDs and usage of
the whole sampled answer (an engine that ignores `max_tokens`)."""


@dataclass(frozen=True)
class ErrorSpec:
    """An error answer in OpenRouter's shape: `{"error": {"code", "message", "metadata"}}`."""

    status: int
    code: int
    message: str
    metadata: Json = field(default_factory=dict)
    retry_after: str | None = None


ERRORS: dict[str, ErrorSpec] = {
    "429": ErrorSpec(429, 429, "Rate limit exceeded"),
    "429ra": ErrorSpec(429, 429, "Rate limit exceeded", retry_after="1"),
    "retry_after_hour": ErrorSpec(429, 429, "Rate limit exceeded", retry_after="3600"),
    "402budget": ErrorSpec(
        402,
        402,
        "In-flight request budget exhausted; retry when requests complete",
        {"reason": "in_flight_budget_exhausted"},
        retry_after="1",
    ),
    "402credits": ErrorSpec(402, 402, "Insufficient credits", {"reason": "insufficient_credits"}),
    "400": ErrorSpec(400, 400, "Invalid request"),
    "401": ErrorSpec(401, 401, "No auth credentials found"),
    "403": ErrorSpec(403, 403, "Input was flagged by moderation", {"reasons": ["harassment"]}),
    "408": ErrorSpec(408, 408, "Request timed out"),
    "500": ErrorSpec(500, 500, "Internal Server Error"),
    "502": ErrorSpec(502, 502, "Provider returned error"),
    "503": ErrorSpec(
        503, 503, "No available provider meets your routing requirements", retry_after="1"
    ),
    "error_body": ErrorSpec(200, 502, "Provider returned error"),
}
"""Fault kinds answered with an error body. `error_body` is HTTP 200 with the error in the
body; 408, 502 and `error_body` are billed (their body carries `usage`)."""

FAULT_KINDS: dict[str, str] = {
    **{kind: f"HTTP {spec.status}, error code {spec.code}" for kind, spec in ERRORS.items()},
    "sse_error": "stream: some deltas, then a chunk with finish_reason 'error' and an 'error' "
    "field, then [DONE]; non-streaming: as error_body",
    "reset": "the connection is closed without any response",
    "reset_stream": "the stream (or the JSON body) starts, then the connection is aborted",
    "no_done": "stream: ends cleanly after some deltas, without a final chunk or [DONE]; "
    "non-streaming: a normal answer",
    "malformed": "HTTP 200, Content-Type application/json, a truncated (invalid) JSON body",
    "empty": "HTTP 200, empty content, no reasoning, completion_tokens 0, finish_reason stop",
    "slow": "the server sleeps an hour (cancelled when the client disconnects)",
    **{kind: f"HTTP 200, an answer whose tool_calls is {json.dumps(value)}"
       for kind, value in BAD_TOOL_CALLS.items()},
    "huge_body": "HTTP 200, a valid answer of `huge_body_mb` MB (content 'x' repeated): a JSON "
    "body sent in 1 MB writes, or a stream of 64 KB content deltas",
    "gzip_bomb": "HTTP 200, Content-Encoding gzip: a small body that inflates to a valid JSON "
    "answer of `huge_body_mb` MB (also for a stream request)",
    "huge_chunked": "HTTP 200, the `huge_body` JSON answer sent chunked, without a declared "
    "length, a megabyte a write (also for a stream request)",
    **{kind: f"HTTP 200, an answer whose engine IDs hold {json.dumps(values)}"
       for kind, values in BAD_IDS.items()},
    TOO_MANY_IDS: "HTTP 200, an answer whose engine IDs go on past the request's token limit "
    "(its IDs, then the limit's count more)",
    SHIFTED_IDS: "HTTP 200, an answer whose engine IDs are each moved to the vocabulary's "
    "previous ID but the last (its text true)",
    IGNORES_MAX_TOKENS: "HTTP 200, the whole sampled answer whatever the request's token "
    "limit (text, IDs and usage)",
}
"""Every fault kind, with its wire behaviour."""

_DIRECTIVE = re.compile(r"\[\[fault:([A-Za-z0-9_]+)(?:\*(\d+))?\]\]")
HUGE = frozenset({"huge_body", "gzip_bomb", "huge_chunked"})
HUGE_MARK = b"@@huge content@@"
"""Where a `HUGE` JSON answer puts its megabytes (its content's value)."""


def sent_ids(fault: str | None, ids: list[int], limit: int | None) -> list[Any]:
    """The answer's IDs as the engine reports them under `fault` (`BAD_IDS`, `TOO_MANY_IDS`):
    unchanged for any other fault."""
    if fault in BAD_IDS:
        bad = BAD_IDS[fault]
        middle = len(ids) // 2
        return [*ids[:middle], *bad, *ids[middle + len(bad):]]
    if fault == TOO_MANY_IDS and ids:
        extra = limit if limit is not None else len(ids)
        return [*ids, *(ids[n % len(ids)] for n in range(extra))]
    if fault == SHIFTED_IDS and ids:
        return [*(i - 1 if i > 0 else 1 for i in ids[:-1]), ids[-1]]
    return ids


class FaultPicker:
    """Chooses the fault for a request: a directive in the prompt first, else `fault_rates`."""

    def __init__(self, rates: Mapping[str, float], seed: int) -> None:
        self._rates = [(kind, p) for kind, p in rates.items() if p > 0]
        self._rng = random.Random(seed)
        self._directive_counts: Counter[tuple[str, str]] = Counter()

    def pick(self, label: str) -> str | None:
        match = _DIRECTIVE.search(label)
        if match:
            kind, times = match.group(1), match.group(2)
            if kind not in FAULT_KINDS:
                raise BadRequest(f"unknown fault kind {kind!r}; known: {sorted(FAULT_KINDS)}")
            if times is None:
                return kind
            counted = (label, kind)
            if self._directive_counts[counted] < int(times):
                self._directive_counts[counted] += 1
                return kind
        return self._random()

    def _random(self) -> str | None:
        if not self._rates:
            return None
        draw = self._rng.random()
        for kind, p in self._rates:
            if draw < p:
                return kind
            draw -= p
        return None
