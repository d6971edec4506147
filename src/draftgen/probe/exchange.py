"""The probe's requests and how they are sent.

Five small requests per backend: a plain question, one that invites reasoning, and three with a
tool definition that invite a call (one alone cannot tell a model that chose not to call from an
endpoint that ignores tools). Backends that take the prompt as IDs get it rendered by the
run's own model format; chat backends get the request body the run would send (same reasoning,
routing and logprobs settings), and the probe keeps the names of the fields the answer used
(which `RawAnswer` does not record).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from draftgen.backends import Backend
from draftgen.backends.base import RequestContext
from draftgen.formats import Format, FormatError
from draftgen.probe.model import RequestKind
from draftgen.scheduler import send_with_retries
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
        requests.append(ProbeRequest(kind, prompt, ids))
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


async def exchange(backend: Backend, req: ProbeRequest, max_tokens: int) -> Exchange:
    """One probe request, sent, read and retried as the run's are (`send_with_retries`:
    its bytes held against the bound on answers in flight, its engine IDs and text checked
    against `max_tokens`), retried at most MAX_RETRIES times; a chat answer's field names
    noted as they are read. Errors are returned."""
    wire = None if backend.capabilities.needs_prompt_ids else WireFields()
    ctx = RequestContext(observe=wire.note if wire is not None else None)
    try:
        raw, _ = await send_with_retries(backend, req.prompt, req.input_ids, max_tokens,
                                         ctx=ctx, max_retries=MAX_RETRIES)
    except BackendError as e:
        return Exchange(req, error=e)
    return Exchange(req, raw, wire)
