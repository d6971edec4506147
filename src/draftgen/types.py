"""The values that travel through the pipeline: Prompt → RawAnswer → Record.

Backends produce `RawAnswer` (what the wire said, never a model format); formats turn a
`RawAnswer` into token IDs; the store writes records as plain dicts built from these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar, overload

import msgspec

from draftgen.errors import DraftgenError
from draftgen.redact import redact

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
class LogprobToken:
    """One sampled token as an endpoint's logprobs describe it."""

    token: str
    bytes: bytes | list[int] | None = None
    """The token's bytes: the wire's list of byte values, which the chat backends keep as
    `bytes` (a list per token kept the garbage collector busy)."""
    id: int | None = None
    """Present when the endpoint reports it (llama.cpp; vLLM `return_tokens_as_token_ids`)."""
    logprob: float | None = None


_T = TypeVar("_T")
EntryBytes = bytes | list[int] | None
"""An entry's bytes: the wire's list of byte values, or `bytes` made of it."""
_Column = list[_T] | Callable[[], list[_T]]
"""A column, or a function that reads it when it is first asked for."""


@dataclass(frozen=True, slots=True)
class SentBytes:
    """An answer's logprob entries' bytes as the endpoint sent them (`LogprobTokens`)."""

    joined: bytes
    """Every entry's byte values end to end."""
    spelled: bytes
    """Each entry's byte values as the JSON text sent, joined by "|": `b"[60,116]|[10]"`."""
    ids: list[int] | None = None
    """The vocabulary IDs whose bytes the entries' are, entry by entry, when the backend read
    them through the target's spellings (`tokenize.TokenSpellings`): each entry's bytes were
    then sent exactly as that token's compact spelling, and its reported `id`, if any, is it."""
    may_name_ids: bool = True
    """Whether an entry without `id` may spell its `token` as vLLM's `token_id:N`, which names
    its ID (False: every entry reports its `id`, or the answer's body does not hold that
    text)."""


class LogprobTokens(Sequence[LogprobToken]):
    """An answer's logprob entries as parallel columns, one list per field, instead of one
    object per token: an answer has hundreds of entries and thousands of answers are in flight,
    so per-token objects cost the event loop their construction and kept the garbage collector
    re-scanning them (docs/benchmarks.md, client throughput). Reads as a sequence of
    `LogprobToken`, each built when asked for.

    The `tokens`, `bytes` and `logprobs` columns can be given as functions that read them,
    called when the column is first asked for: the chat backends read the IDs as they decode an
    answer and leave the rest to whoever needs it (recovering IDs reads no logprob value, no
    token text when the entries report IDs or their bytes are tokens' spellings, and no entry's
    bytes when the `sent_bytes` they keep match the IDs). The `ids` column gives the length."""

    __slots__ = ("_bytes", "_logprobs", "_sent", "_tokens", "ids")

    def __init__(self, tokens: _Column[str] | None = None,
                 bytes: _Column[EntryBytes] | None = None,
                 ids: list[int | None] | None = None,
                 logprobs: _Column[float | None] | None = None, *,
                 sent: SentBytes | None = None) -> None:
        if ids is None:
            if callable(tokens):
                raise ValueError("LogprobTokens: a deferred tokens column needs the ids column")
            ids = [None] * len(tokens or ())
        self.ids = ids
        n = len(ids)
        self._tokens = tokens if tokens is not None else [""] * n
        self._bytes = bytes if bytes is not None else [None] * n
        self._logprobs = logprobs if logprobs is not None else [None] * n
        self._sent = sent
        if not all(len(c) == n for c in (self._tokens, self._bytes, self._logprobs)
                   if isinstance(c, list)):
            raise ValueError("LogprobTokens: columns of different lengths")

    @property
    def tokens(self) -> list[str]:
        if not isinstance(self._tokens, list):
            self._tokens = self._read(self._tokens)
        return self._tokens

    @tokens.setter
    def tokens(self, column: list[str]) -> None:
        self._tokens = column

    @property
    def bytes(self) -> list[EntryBytes]:
        """Each entry's bytes. Handing the column out drops `sent_bytes`: the caller may
        change it."""
        self._sent = None
        if not isinstance(self._bytes, list):
            self._bytes = self._read(self._bytes)
        return self._bytes

    @bytes.setter
    def bytes(self, column: list[EntryBytes]) -> None:
        self._bytes, self._sent = column, None

    @property
    def logprobs(self) -> list[float | None]:
        if not isinstance(self._logprobs, list):
            self._logprobs = self._read(self._logprobs)
        return self._logprobs

    @logprobs.setter
    def logprobs(self, column: list[float | None]) -> None:
        self._logprobs = column

    def _read(self, read: Callable[[], list[_T]]) -> list[_T]:
        column = read()
        if len(column) != len(self.ids):
            raise ValueError("LogprobTokens: columns of different lengths")
        return column

    def sent_bytes(self) -> SentBytes | None:
        """The entries' bytes as the endpoint sent them, when whoever made the columns kept
        them (the chat backends read every entry's bytes as one string, and build the column
        only when asked); None otherwise, and once the `bytes` column was handed out."""
        return self._sent

    @classmethod
    def of(cls, entries: Iterable[LogprobToken]) -> LogprobTokens:
        out = cls()
        for e in entries:
            out.append(e)
        return out

    def append(self, entry: LogprobToken) -> None:
        self.tokens.append(entry.token)
        self.bytes.append(entry.bytes)
        self.ids.append(entry.id)
        self.logprobs.append(entry.logprob)

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> LogprobToken: ...

    @overload
    def __getitem__(self, index: slice) -> LogprobTokens: ...

    def __getitem__(self, index: int | slice) -> LogprobToken | LogprobTokens:
        if isinstance(index, slice):
            return LogprobTokens(self.tokens[index], self.bytes[index], self.ids[index],
                                 self.logprobs[index])
        return LogprobToken(self.tokens[index], self.bytes[index], self.ids[index],
                            self.logprobs[index])

    def __iter__(self) -> Iterator[LogprobToken]:
        return map(LogprobToken, self.tokens, self.bytes, self.ids, self.logprobs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LogprobTokens):
            return (self.tokens, self.bytes, self.ids, self.logprobs) == (
                other.tokens, other.bytes, other.ids, other.logprobs)
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"LogprobTokens({list(self)!r})"


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
    """Per-token logprob entries (`LogprobTokens` from the chat backends)."""
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
