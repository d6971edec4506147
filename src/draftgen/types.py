"""The values that travel through the pipeline: Prompt → RawAnswer → Record.

Backends produce `RawAnswer` (what the wire said, never a model format); formats turn a
`RawAnswer` into token IDs; the store writes records as plain dicts built from these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from draftgen.errors import DraftgenError
from draftgen.redact import redact

if TYPE_CHECKING:
    from draftgen.tokenize.logprob_tokens import LogprobToken

Message = dict[str, Any]
"""An OpenAI-style chat message: {"role", "content", optional "reasoning_content", "tool_calls",
"tool_call_id", "name"}."""

Tool = dict[str, Any]
"""An OpenAI-style tool definition: {"type": "function", "function": {"name", "description",
"parameters"}}."""

TokenSource = Literal["native", "reconstructed"]
TokenCheck = Literal["exact", "length_ok", "length_mismatch", "unverifiable"]


@dataclass(slots=True)
class Prompt:
    """One prompt to answer: the conversation up to (not including) the first assistant turn."""

    id: str
    dataset: str
    messages: list[Message]
    tools: list[Tool] | None = None
    source: str = ""
    """Where it came from, for error messages: "path:line" or "path[row]"."""


Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class Usage(msgspec.Struct, kw_only=True, gc=False):
    """The token counts (and cost) the server reported for the answer, as reported: what a
    backend reads off the wire and what a record stores (`store.record.Record.usage`)."""

    prompt_tokens: Int64 | None = None
    """Tokens of the prompt."""
    completion_tokens: Int64 | None = None
    """Tokens of the answer, reasoning included."""
    reasoning_tokens: Int64 | None = None
    """Tokens of the reasoning."""
    cached_tokens: Int64 | None = None
    """Prompt tokens served from the server's prefix cache."""
    cost: float | None = None
    """What the API said the request cost (USD; OpenRouter `usage.cost`); None when not
    reported."""

    def as_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)


@dataclass(slots=True)
class RawAnswer:
    """What one backend call returned, in wire terms. No model-format knowledge here."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    provider: str | None = None
    """Upstream provider that served it (OpenRouter's top-level `provider`)."""
    quantization: str | None = None
    model: str | None = None
    request_id: str | None = None
    """The generation ID (OpenRouter `X-Generation-Id` / body `id`, SGLang `meta_info.id`)."""
    output_ids: list[int] | None = None
    """Answer token IDs reported by the engine (SGLang `output_ids`, vLLM `token_ids`)."""
    prompt_ids: list[int] | None = None
    """Prompt token IDs reported by the engine (vLLM `prompt_token_ids`), if any."""
    logprobs: Sequence[LogprobToken] | None = None
    """Per-token logprob entries (`tokenize.logprob_tokens.LogprobTokens` from the chat
    backends)."""
    stop_token_id: int | None = None
    """The stop token the engine matched, when it reports one (SGLang `finish_reason.matched`)."""
    text: str | None = None
    """Raw decoded text when the backend returns text rather than reasoning/content (SGLang)."""


class BackendError(DraftgenError):
    """A failed backend call. `retryable` errors are retried with back-off by the scheduler.

    `kind` is a short stable label used in failures.jsonl and status (e.g. "rate_limited",
    "server_error", "timeout", "connection", "bad_request", "auth", "payment", "moderation",
    "provider_error", "bad_response", "empty_answer").
    The message must never contain a secret.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
        usage: Usage | None = None,
        permanent_for_backend: bool = False,
    ) -> None:
        message = redact(message)  # servers echo request headers in error bodies
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after
        self.usage = usage
        """Billed usage reported with the error, if any (failed requests can be billed)."""
        self.permanent_for_backend = permanent_for_backend
        """The backend itself is unusable (out of credits, bad key): stop dispatching to it."""
        self.billed_unknown = False
        """The endpoint accepted the request (HTTP 200) and may have billed it, but its answer
        could not be read (a broken body, a stream cut): the bill is unknown."""
        self.past_max_tokens = False
        """The answer went on past its `max_tokens` (an engine that ignored it): what it was
        billed may pass the request's worst case, which it counts with the margin."""
        self.connection: str | None = None
        """A connection failure, in a few words ("connection refused", "connect timeout",
        "DNS lookup failed", "server disconnected": `backends.reach.connection_reason`);
        None when the server answered."""
        self.never_connected = False
        """No connection was made (refused, DNS, connect timeout): the server saw nothing, so
        nothing was processed or billed."""

    def __str__(self) -> str:
        status = f" (HTTP {self.status})" if self.status else ""
        return f"{self.kind}{status}: {self.message}"


@dataclass(slots=True)
class Rebuilt:
    """A format's answer to "what token IDs did the model emit?"."""

    output_ids: list[int]
    token_source: TokenSource
    token_check: TokenCheck
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    flags: list[str] = field(default_factory=list)
    """Defects and adjustments worth auditing, e.g. "whitespace_restored",
    "special_token_in_content", "stop_token_appended"."""
