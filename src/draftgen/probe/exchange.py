"""The probe's requests and how they are sent.

Five small requests per backend: a plain question, one that invites reasoning, and three with a
tool definition that invite a call (one alone cannot tell a model that chose not to call from an
endpoint that ignores tools). Backends that take the prompt as IDs get it rendered by the
run's own model format; chat backends get the request body the run would send (same reasoning,
routing and logprobs settings), and the probe keeps the names of the fields the answer used
(which `RawAnswer` does not record).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from draftgen.backends import Backend
from draftgen.backends.base import (
    ReadCount,
    check_answer_text,
    check_engine_ids,
    error_from_http,
    transport_error,
    without_frames,
)
from draftgen.backends.openai_chat import OpenAIChatBackend, StreamAccumulator, answer_from_json
from draftgen.formats import Format, FormatError
from draftgen.probe.model import RequestKind
from draftgen.scheduler import backoff_delay
from draftgen.types import BackendError, Prompt, RawAnswer

PROBE_DATASET = "(probe)"
MAX_RETRIES = 2
"""Retries of one probe request on retryable errors (at most; the backend's own max_retries
and backoff_max_s still apply)."""

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}

_QUESTIONS: list[tuple[RequestKind, str]] = [
    ("plain", "In one short sentence: what is the capital of France?"),
    ("reasoning", "Think it through step by step, then give only the result: what is 17 × 23?"),
    *(("tool", f"What is the weather in {city} right now? Call the get_weather tool to find "
       "out.") for city in ("Paris", "Tokyo", "Lima")),
]


@dataclass(frozen=True)
class ProbeRequest:
    kind: RequestKind
    prompt: Prompt
    input_ids: list[int]
    """The prompt rendered by the run's format (sent as-is to ID endpoints; used to price
    answers whose usage lacks prompt_tokens)."""
    vocab_size: int
    """The format's vocabulary size: the engine's IDs are checked against it, as the run
    checks them (`check_engine_ids`), whether or not the backend was given the vocabulary."""


def probe_requests(fmt: Format) -> tuple[list[ProbeRequest], list[str]]:
    """The requests, and notes on the ones left out (a format without a tool layout)."""
    requests: list[ProbeRequest] = []
    notes: list[str] = []
    for n, (kind, question) in enumerate(_QUESTIONS):
        tools = [WEATHER_TOOL] if kind == "tool" else None
        prompt = Prompt(f"probe-{kind}-{n}", PROBE_DATASET,
                        [{"role": "user", "content": question}], tools)
        try:
            ids = fmt.render_prompt(prompt.messages, prompt.tools)
        except FormatError as e:
            note = f"{kind} request not sent: {e}"
            if note not in notes:
                notes.append(note)
            continue
        requests.append(ProbeRequest(kind, prompt, ids, fmt.tokenizer.vocab_size))
    return requests, notes


@dataclass
class WireFields:
    """The chat answer's field names, which `RawAnswer` merges away."""

    reasoning: list[str] = field(default_factory=list)
    """Fields that carried reasoning text, in the order first seen."""
    encrypted: bool = False
    """`reasoning_details` came with entries but no text (encrypted or summarised away)."""

    def note(self, message: Mapping[str, Any]) -> None:
        for key in ("reasoning", "reasoning_content"):
            value = message.get(key)
            if isinstance(value, str) and value:
                self._add(key)
        details = message.get("reasoning_details")
        if isinstance(details, list) and details:
            if any(isinstance(d, dict) and isinstance(d.get("text"), str) and d["text"]
                   for d in details):
                self._add("reasoning_details")
            else:
                self.encrypted = True

    def _add(self, name: str) -> None:
        if name not in self.reasoning:
            self.reasoning.append(name)


@dataclass
class Exchange:
    request: ProbeRequest
    raw: RawAnswer | None = None
    wire: WireFields | None = None
    """Chat endpoints only."""
    error: BackendError | None = None


@dataclass
class _RecordingStream(StreamAccumulator):
    wire: WireFields = field(default_factory=WireFields)

    def _take_choice(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self.wire.note(delta)
        super()._take_choice(choice)


async def _chat_once(backend: OpenAIChatBackend, req: ProbeRequest, max_tokens: int
                     ) -> tuple[RawAnswer, WireFields]:
    body = backend.build_body(req.prompt, max_tokens)
    if not backend.cfg.stream:
        data, headers = await backend.post_json(backend.url, body)
        wire = WireFields()
        choices = data.get("choices") if isinstance(data, dict) else None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            wire.note(message if isinstance(message, dict) else {})
        return answer_from_json(data, headers), wire
    try:
        async with backend.session.post(backend.url, data=orjson.dumps(body),
                                        headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                raise error_from_http(resp.status, await backend.read_body(resp), resp.headers)
            acc = _RecordingStream(request_id=resp.headers.get("X-Generation-Id"))
            count = ReadCount(backend.max_response_bytes)
            async for line in resp.content:
                count.add(len(line))
                if acc.feed_line(line):
                    break
            return acc.finish(), acc.wire
    except BackendError:
        raise
    except Exception as e:
        raise transport_error(e) from None


async def _once(backend: Backend, req: ProbeRequest, max_tokens: int
                ) -> tuple[RawAnswer, WireFields | None]:
    """One answer, read as the run reads it: its bytes held against the backend's bound on
    answers in flight, the engine's IDs checked."""
    wire: WireFields | None = None
    if isinstance(backend, OpenAIChatBackend):
        with backend.holding_answer(max_tokens, len(req.input_ids)):
            try:
                raw, wire = await _chat_once(backend, req, max_tokens)
            except BackendError as e:
                raise without_frames(e) from None
        check_answer_text(raw, max_tokens, backend.longest_token_bytes)
    else:
        raw = await backend.send(req.prompt, req.input_ids, max_tokens)
    check_engine_ids(raw, req.vocab_size, max_tokens)
    return raw, wire


async def exchange(backend: Backend, req: ProbeRequest, max_tokens: int) -> Exchange:
    """One probe request, retried a little on retryable errors; errors are returned."""
    cfg = backend.cfg
    retries = min(MAX_RETRIES, cfg.max_retries)
    attempt = 0
    while True:
        try:
            raw, wire = await _once(backend, req, max_tokens)
            return Exchange(req, raw, wire)
        except BackendError as e:
            too_long = e.retry_after is not None and e.retry_after > cfg.backoff_max_s
            if not e.retryable or e.permanent_for_backend or attempt >= retries or too_long:
                return Exchange(req, error=e)
            await asyncio.sleep(backoff_delay(attempt, cfg.backoff_base_s, cfg.backoff_max_s,
                                              e.retry_after))
            attempt += 1
