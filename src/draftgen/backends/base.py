"""The backend interface and what every HTTP backend shares: the session, error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp
import orjson

from draftgen.backends.reach import check_reachable, connection_reason, never_connected
from draftgen.backends.router import wait_for_fleet
from draftgen.config import ModelConfig, SamplingConfig
from draftgen.config.backends import BackendConfig, Price
from draftgen.redact import keep_header_secrets, keep_url_secrets, redact
from draftgen.tokenize.base import vocabulary_problem
from draftgen.types import BackendError, Prompt, RawAnswer, Usage

if TYPE_CHECKING:
    from draftgen.tokenize import Tokenizer

ENGINE_IDLE_CLOSE_S = 5.0
"""How long the local engines keep an idle connection open: llama.cpp's server (cpp-httplib)
and uvicorn (vLLM, SGLang) both close it after 5 s."""
IDLE_REUSE_S = 3.0
"""A pooled connection idle longer than this is closed, not reused. Reusing one the server is
closing at that moment fails with "Can not write request body" or a disconnect, so the cap is
kept under ENGINE_IDLE_CLOSE_S with room for event-loop lag. A busy run never idles that long."""
HOSTED_IDLE_REUSE_S = 60.0
"""The same for a hosted API (`Capabilities.hosted`: OpenRouter), which keeps idle connections
far longer: after each pause (a rate limit, the $/minute budget) thousands of TLS handshakes
would cost CPU for nothing."""

WIRE_BASE_BYTES = 1 << 20
"""What an answer's body may hold whatever its length: headers of the JSON, its usage, error and
provider fields, the keep-alive comments of a long wait."""
WIRE_BYTES_PER_TOKEN = 1024
"""What one output token may take on the wire beside its spelling: a stream chunk's envelope
(id, model, provider, finish fields), a logprob entry's number, ID and field names."""
WIRE_BYTES_PER_PROMPT_TOKEN = 24
"""A prompt ID the engine echoes (vLLM's `prompt_token_ids`), with its comma and room."""
ESCAPED_BYTES_PER_BYTE = 6
"""The most a byte of text takes in JSON (`\\u00XX`)."""


def answer_byte_bound(max_tokens: int, prompt_tokens: int, longest_token_bytes: int,
                      alternatives: int = 0) -> int:
    """The most bytes an answer of at most `max_tokens` tokens can take on the wire: each
    token spelt by the longest token of the vocabulary, escaped, in the delta and in its
    logprob entry (and each of its `alternatives`), with a chunk's envelope; the prompt's
    IDs echoed; a fixed allowance. A body longer than this is an answer that ignored
    `max_tokens` (or no answer), refused while it is read."""
    spelt = ESCAPED_BYTES_PER_BYTE * longest_token_bytes * (2 + 2 * alternatives)
    return (WIRE_BASE_BYTES + prompt_tokens * WIRE_BYTES_PER_PROMPT_TOKEN
            + max_tokens * (spelt + WIRE_BYTES_PER_TOKEN))


def answer_text_problem(answer: RawAnswer, max_tokens: int,
                        longest_token_bytes: int | None) -> str | None:
    """Why the answer's text cannot be `max_tokens` tokens (more bytes than that many of the
    vocabulary's longest token spell); None if it can. Checked before it is tokenized: a
    100 MB text would otherwise be rebuilt into millions of IDs."""
    if longest_token_bytes is None:
        return None
    most = (max_tokens + 1) * longest_token_bytes
    texts = (answer.reasoning, answer.content, answer.text)
    if sum(len(t) for t in texts if t) <= most // 4:  # 4 bytes a character at most
        return None
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts if t)
    if size <= most:
        return None
    return (f"{size:,} bytes of text for max_tokens {max_tokens} (at most {most:,}: "
            f"{longest_token_bytes} bytes a token): the engine ignored the limit")


class AnswerBytes:
    """The bytes the run's answers hold while they are read and parsed, all backends and
    requests together: at most `limit` (the largest `max_in_flight_response_mb` of the run's
    backends: one bound for the process). Each answer's bytes are counted as they arrive
    (`ReadCount.add`) and given back when its request's `send` ends; the answer whose bytes
    would cross the limit fails as `memory_bound` instead of being read further, and one whose
    bytes pass what its `max_tokens` allows (`answer_byte_bound`) fails as `bad_response`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        """The most bytes held at once so far."""

    @contextlib.contextmanager
    def holding(self, answer_limit: int | None = None) -> Iterator[Held]:
        """Around one request: the bytes its answer is read into (counted by the `Held`
        given, `ReadCount`) count here until it ends; `answer_limit`: the most its answer
        may take (`answer_byte_bound`)."""
        held = Held(self, answer_limit)
        try:
            yield held
        finally:
            self.held -= held.bytes

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        self.peak = max(self.peak, self.held)
        return True


def share_answer_bytes(backends: Sequence[Backend]) -> None:
    """One bound for the answers the process holds while reading them, all backends together:
    the largest of their `max_in_flight_response_mb` (it was one bound per backend, so two
    backends held twice what either allowed)."""
    if not backends:
        return
    shared = AnswerBytes(max(b.answer_bytes.limit for b in backends))
    for backend in backends:
        backend.answer_bytes = shared


@dataclass(slots=True)
class Held:
    """What one request's answer holds of its backend's `AnswerBytes`."""

    budget: AnswerBytes
    answer_limit: int | None = None
    bytes: int = 0


@dataclass(slots=True)
class RequestContext:
    """What one request carries through `Backend.send` beside its prompt, given by its caller
    (the run, the probe) and read by the backend: one per request, never shared."""

    sampling: SamplingConfig | None = None
    """The request's sampling where it is not the run's (a conversation's draw from its
    dataset's `sampling_mix`)."""
    on_generation_id: Callable[[str], None] | None = None
    """Called with the answer's generation ID (OpenRouter's `X-Generation-Id`) as soon as its
    headers arrive, before its body, so that a request killed in flight can later be looked
    up by it."""
    observe: Callable[[Mapping[str, Any]], None] | None = None
    """Called with each message of a chat answer as it is read (a JSON answer's `message`, a
    stream's deltas): the probe notes which fields carried what."""
    held: Held | None = field(default=None, repr=False)
    """Set by `Backend.send` while the answer is read: its bytes held (`ReadCount`)."""

    def note_generation_id(self, headers: Mapping[str, str]) -> None:
        generation_id = headers.get("X-Generation-Id")
        if self.on_generation_id is not None and generation_id:
            self.on_generation_id(generation_id)


class ReadCount:
    """One answer's bytes as they arrive: at most `limit` (`max_response_mb`), and each byte
    held against its backend's `AnswerBytes` (`held`) while the request is under way."""

    def __init__(self, limit: int, held: Held | None = None) -> None:
        self.limit = limit
        self.seen = 0
        self.held = held

    def check(self, total: int) -> None:
        """BackendError when an answer of `total` bytes is past a bound, the smaller one
        deciding (as it would while the body is read): what its max_tokens allow, or
        `max_response_mb`. A declared Content-Length is judged as the body it announces."""
        answer_limit = self.held.answer_limit if self.held is not None else None
        if answer_limit is not None and answer_limit < self.limit and total > answer_limit:
            raise past_max_tokens(f"answer longer than its max_tokens allow "
                                  f"({answer_limit:,} bytes): not read further")
        if total > self.limit:
            raise too_large(self.limit)

    def add(self, n: int) -> None:
        self.seen += n
        self.check(self.seen)
        held = self.held
        if held is None:
            return
        if not held.budget.take(n):
            raise over_in_flight_bound(held.budget.limit)
        held.bytes += n


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend type's endpoint does, set once per backend class (`capabilities`) and
    read wherever behaviour depends on it, never the config's `type`. What only one API can be
    asked (a price listing, a bill) is a method the backend class overrides."""

    native_ids: bool
    """The backend reports the sampled token IDs (a chat endpoint: asked with
    `return_token_ids`)."""
    needs_prompt_ids: bool
    """The backend takes the prompt as token IDs rendered by draftgen's format."""
    reports_cost: bool = False
    """Each answer's usage says what it cost (`usage.cost`, asked for with
    `usage: {include: true}`)."""
    looks_up_bills: bool = False
    """What one generation cost can be asked afterwards by its ID (`billed_usd`), which arrives
    in the answer's headers before its body (`X-Generation-Id`): a request killed in flight is
    settled by it."""
    hosted: bool = False
    """A hosted API that keeps idle connections open far longer than a local engine: pooled
    connections are reused for HOSTED_IDLE_REUSE_S, not IDLE_REUSE_S."""


class Backend(ABC):
    """One endpoint. `send` returns a RawAnswer or raises BackendError."""

    capabilities: ClassVar[Capabilities]

    def __init__(self, cfg: BackendConfig, model: ModelConfig, sampling: SamplingConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.model = model
        self._sampling = sampling
        self._api_key = cfg.api_key()
        keep_header_secrets(cfg.headers)
        keep_url_secrets(cfg.url)
        self._session: aiohttp.ClientSession | None = None
        self._owns_session = True
        self.concurrency = cfg.concurrency
        """Requests in flight at most; a `fleet` backend's is set at start from its workers."""
        self.answer_bytes = AnswerBytes(int(cfg.max_in_flight_response_mb * 2**20))
        self.vocab_size: int | None = None
        """The target's vocabulary size, added tokens included (`use_vocabulary`): an engine
        ID at or above it is no token."""
        self.longest_token_bytes: int | None = None
        """The longest spelling of a token of the target's vocabulary (`use_vocabulary`): an
        answer longer than `max_tokens` of them is none (`answer_byte_bound`)."""

    @property
    def sampling(self) -> SamplingConfig:
        """The run's sampling (a request may carry its own: `RequestContext.sampling`)."""
        return self._sampling

    def use_session(self, session: aiohttp.ClientSession) -> None:
        """Send through `session` instead of the one `start` opens: backend tests give one
        that answers in process (`draftgen.testing.fake_session`, as httpx's MockTransport
        does). The backend does not close it."""
        self._session, self._owns_session = session, False

    async def start(self) -> None:
        if self.cfg.fleet is not None:
            self.concurrency = await wait_for_fleet(self.cfg, self.cfg.fleet, self._headers())
        if self._session is not None:  # given (`use_session`)
            return
        # One pool sized for the backend's concurrency: aiohttp's default of 100 connections
        # would silently cap a 2,000-request run.
        connector = aiohttp.TCPConnector(
            limit=self.concurrency + 16,
            limit_per_host=0,
            ttl_dns_cache=300,
            keepalive_timeout=HOSTED_IDLE_REUSE_S if self.capabilities.hosted else IDLE_REUSE_S,
        )
        self._owns_session = True
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers(),
            timeout=aiohttp.ClientTimeout(
                total=self.cfg.timeout_s, connect=self.cfg.connect_timeout_s
            ),
            json_serialize=lambda obj: orjson.dumps(obj).decode(),
            raise_for_status=False,
        )

    @property
    def base_url(self) -> str:
        """The backend's URL as configured (a managed llama-server's once started)."""
        return self.cfg.url or getattr(self, "url", "")

    async def check_reachable(self) -> None:
        """A connection to the backend's server opens (`reach.check_reachable`), else
        BackendUnreachable naming its URL and why."""
        await check_reachable(self.name, self.base_url, self.cfg.connect_timeout_s)

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    @property
    def max_response_bytes(self) -> int:
        return int(self.cfg.max_response_mb * 2**20)

    async def read_body(self, resp: aiohttp.ClientResponse,
                        ctx: RequestContext | None = None) -> bytes:
        """`read_capped` by this backend's `max_response_mb`, its bytes held as the
        request's (`ctx`)."""
        return await read_capped(resp, self.max_response_bytes,
                                 ctx.held if ctx is not None else None)

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": "draftgen", **self.cfg.headers}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError(f"backend {self.name!r} used before start()")
        return self._session

    def use_vocabulary(self, tokenizer: Tokenizer) -> None:
        """The target's tokenizer: the engine's IDs are checked against its size, and a
        backend that reads what the endpoint sends through it (the chat backends check logprob
        entries' bytes by its tokens' spellings) keeps what it needs."""
        self.vocab_size = tokenizer.vocab_size
        self.longest_token_bytes = tokenizer.longest_token_bytes

    def holding_answer(self, max_tokens: int, prompt_tokens: int
                       ) -> contextlib.AbstractContextManager[Held]:
        """Around reading one answer: its bytes held against the run's `answer_bytes`, and at
        most what `max_tokens` allows (once the vocabulary is known)."""
        limit = None
        if self.longest_token_bytes is not None:
            limit = answer_byte_bound(max_tokens, prompt_tokens, self.longest_token_bytes,
                                      self.logprob_alternatives())
        return self.answer_bytes.holding(limit)

    def logprob_alternatives(self) -> int:
        """How many alternatives each logprob entry of an answer may carry (a `top_logprobs`
        the config adds to the body)."""
        extra = {**self.sampling.extra, **getattr(self.cfg, "extra_body", {})}
        value = extra.get("top_logprobs", extra.get("top_logprobs_num", 0))
        return value if isinstance(value, int) and value > 0 else 0

    async def listed_price(self) -> Price | None:
        """The price the endpoint itself lists for the model, where it has such a listing."""
        return None

    async def listed_quantizations(self) -> dict[str, str]:
        """Each provider's quantization of the model, where the endpoint lists them (an API
        routing to several providers); {} otherwise."""
        return {}

    async def billed_usd(self, generation_id: str) -> float | None:
        """What the endpoint billed for one generation, where it can be asked
        (`capabilities.looks_up_bills`)."""
        return None

    async def send(self, prompt: Prompt, input_ids: list[int], max_tokens: int,
                   ctx: RequestContext | None = None) -> RawAnswer:
        """Send one prompt (`_send`) with what its caller gives it (`ctx`: its sampling, a
        callback for its generation ID, an observer of the answer), its answer's bytes held
        against `answer_bytes` while it is read, and the answer checked: the IDs the engine
        reported (`check_engine_ids`), its text against `max_tokens` (`check_answer_text`)."""
        ctx = ctx if ctx is not None else RequestContext()
        with self.holding_answer(max_tokens, len(input_ids)) as held:
            ctx.held = held
            try:
                answer = await self._send(prompt, input_ids, max_tokens, ctx)
            except BackendError as e:
                raise without_frames(e) from None
            finally:
                ctx.held = None
        check_engine_ids(answer, self.vocab_size, max_tokens)
        check_answer_text(answer, max_tokens, self.longest_token_bytes)
        return answer

    @abstractmethod
    async def _send(self, prompt: Prompt, input_ids: list[int], max_tokens: int,
                    ctx: RequestContext) -> RawAnswer:
        """Send one prompt and read its answer. `input_ids` is the prompt rendered by the run's
        model format."""

    async def post_json(self, url: str, body: Mapping[str, Any],
                        ctx: RequestContext | None = None) -> tuple[Any, Mapping[str, str]]:
        """POST a JSON body, return the parsed JSON answer and its headers; map every failure
        (HTTP status, error body, transport) to BackendError."""
        raw, headers = await self.post_bytes(url, body, ctx)
        with reading_billed_answer():
            return parse_json_body(raw), headers

    async def post_bytes(self, url: str, body: Mapping[str, Any],
                         ctx: RequestContext | None = None
                         ) -> tuple[bytes, Mapping[str, str]]:
        """POST a JSON body, return the answer's bytes and headers (for a backend that decodes
        them itself); map HTTP statuses and transport failures to BackendError."""
        try:
            async with self.session.post(url, data=orjson.dumps(body),
                                         headers={"Content-Type": "application/json"}) as resp:
                if ctx is not None:
                    ctx.note_generation_id(resp.headers)
                if resp.status != 200:
                    raise error_from_http(resp.status, await self.read_body(resp, ctx),
                                          resp.headers)
                with reading_billed_answer():
                    return await self.read_body(resp, ctx), resp.headers
        except BackendError:
            raise
        except Exception as e:
            raise transport_error(e) from None


async def read_capped(resp: aiohttp.ClientResponse, limit: int, held: Held | None = None
                      ) -> bytes:
    """The whole body, as long as it is at most `limit` bytes once decompressed; else
    `too_large` is raised as soon as it passes the limit, having kept no more than that (a
    2 GB body, or a gzip bomb, fails its request alone instead of the process)."""
    declared = resp.content_length
    count = ReadCount(limit, held)
    if declared is not None and "Content-Encoding" not in resp.headers:
        count.check(declared)
    chunks: list[bytes] = []
    async for data in resp.content.iter_any():
        count.add(len(data))
        chunks.append(data)
    return b"".join(chunks)


def without_frames(error: BackendError) -> BackendError:
    """`error` without its traceback and the exceptions it was raised from: their frames hold
    what the answer was being read into (a body's chunks up to `max_response_mb`), which would
    stay alive as long as the error does (a request backing off, the probe keeping it)."""
    error.__context__ = error.__cause__ = None
    return error.with_traceback(None)


def too_large(limit: int) -> BackendError:
    """An answer (a body, or a stream's bytes in all) over the backend's `max_response_mb`."""
    return BackendError("response_too_large", f"answer larger than {limit / 2**20:g} MB "
                        "(max_response_mb): not read further", retryable=False)


def over_in_flight_bound(limit: int) -> BackendError:
    """An answer whose bytes would take the backend's answers in flight past
    `max_in_flight_response_mb` together (`AnswerBytes`)."""
    return BackendError("memory_bound", f"answers being read would hold more than "
                        f"{limit / 2**20:g} MB together (max_in_flight_response_mb): this one "
                        "not read further", retryable=True)


def check_engine_ids(answer: RawAnswer, vocab_size: int | None, max_tokens: int) -> None:
    """The IDs an engine reported (`output_ids`) must be the answer's tokens: integers, each
    0 <= id < `vocab_size` (the target's, added tokens included; unchecked when None), at most
    `max_tokens` of them and the stop token; the prompt's IDs it reported (`prompt_ids`, stored
    where they differ from the rendered prompt) integers in the same range. Otherwise the
    answer fails alone as `bad_response`, billed by its usage, rather than being written as
    exact or breaking the batch it is rebuilt with."""
    for what, ids, most in (("token IDs", answer.output_ids, max_tokens),
                            ("prompt token IDs", answer.prompt_ids, None)):
        problem = None if ids is None else engine_ids_problem(ids, vocab_size, most)
        if problem is None:
            continue
        if most is not None and isinstance(ids, list) and len(ids) > most + 1:
            raise past_max_tokens(f"engine {what}: {problem}", answer.usage)
        raise BackendError("bad_response", f"engine {what}: {problem}", retryable=False,
                           usage=answer.usage)


REBUILT_SLACK = 0.02
"""IDs rebuilt from an answer's text may number a little more than the engine sampled (its text
encoded canonically, a stop token appended): up to this share of `max_tokens` (and 8 tokens)
beyond it is taken for that."""


def rebuilt_length_problem(n_ids: int, max_tokens: int) -> str | None:
    """Why `n_ids` IDs rebuilt from an answer's text cannot be an answer of `max_tokens`
    tokens (an engine that ignored the limit); None if they can (`REBUILT_SLACK`)."""
    most = max_tokens + 1 + max(8, int(max_tokens * REBUILT_SLACK))
    if n_ids <= most:
        return None
    return f"{n_ids:,} tokens for max_tokens {max_tokens} (at most {most:,} rebuilt)"


def check_answer_text(answer: RawAnswer, max_tokens: int,
                      longest_token_bytes: int | None) -> None:
    """An answer whose text is longer than `max_tokens` tokens can spell fails alone as
    `bad_response`, billed by its usage (`answer_text_problem`)."""
    problem = answer_text_problem(answer, max_tokens, longest_token_bytes)
    if problem is not None:
        raise past_max_tokens(problem, answer.usage)


def past_max_tokens(message: str, usage: Usage | None = None) -> BackendError:
    """An answer longer than its `max_tokens` allow: `bad_response`, never kept, its cost
    counted at least at the request's worst case with the margin (`past_max_tokens`)."""
    error = BackendError("bad_response", message, retryable=False, usage=usage)
    error.past_max_tokens = True
    return error


def engine_ids_problem(ids: Sequence[object], vocab_size: int | None,
                       max_tokens: int | None) -> str | None:
    """Why `ids` cannot be an answer's token IDs (see `check_engine_ids`; `max_tokens` None:
    any number of them); None if they can."""
    if not isinstance(ids, list):
        return f"not a list but {type(ids).__name__}"
    if max_tokens is not None and len(ids) > max_tokens + 1:
        return f"{len(ids)} of them for max_tokens {max_tokens} (at most one more, the stop token)"
    return vocabulary_problem(ids, vocab_size)


_UNREAD_KINDS = frozenset({"bad_response", "connection", "timeout", "incomplete_stream",
                           "response_too_large", "memory_bound"})
"""Errors that leave an accepted answer unread (not an error the endpoint answered with)."""


@contextlib.contextmanager
def reading_billed_answer() -> Iterator[None]:
    """Around reading an answer the endpoint accepted (HTTP 200): an answer that cannot be read
    (a broken body, a stream cut off) may well have been billed, so its error is marked
    `billed_unknown` unless it carries its usage."""
    try:
        yield
    except BackendError as e:
        e.billed_unknown = e.usage is None and e.kind in _UNREAD_KINDS
        raise
    except Exception as e:
        error = transport_error(e)
        error.billed_unknown = True
        raise error from None


def transport_error(e: BaseException) -> BackendError:
    """Connection failures (named as such: `reach.connection_reason`), timeouts and broken
    payloads: all retryable."""
    reason = connection_reason(e)
    if reason is not None:
        what = f"answer cut off: {type(e).__name__}" if isinstance(
            e, aiohttp.ClientPayloadError) else f"{reason}: {type(e).__name__}: {e}"
        error = BackendError("connection", what, retryable=True)
        error.connection, error.never_connected = reason, never_connected(e)
        return error
    if isinstance(e, asyncio.TimeoutError | TimeoutError):
        return BackendError("timeout", "request timed out", retryable=True)
    if isinstance(e, aiohttp.ClientError | OSError):
        return BackendError("connection", f"{type(e).__name__}: {e}", retryable=True)
    return BackendError("client_error", f"{type(e).__name__}: {e}", retryable=False)


def parse_json_body(raw: bytes) -> Any:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        snippet = redact(raw[:4096].decode("utf-8", "replace"))[:200]
        raise BackendError("bad_response", f"answer is not JSON: {snippet!r}",
                           retryable=True) from None
    if isinstance(data, dict) and data.get("error"):
        raise error_from_body(data, status=None)
    return data


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# status -> (kind, retryable, permanent_for_backend)
_STATUS_KINDS: dict[int, tuple[str, bool, bool]] = {
    400: ("bad_request", False, False),
    401: ("auth", False, True),
    402: ("payment", False, True),
    403: ("moderation", False, False),
    404: ("not_found", False, True),
    408: ("timeout", True, False),
    413: ("too_large", False, False),
    422: ("bad_request", False, False),
    429: ("rate_limited", True, False),
    500: ("server_error", True, False),
    502: ("provider_error", True, False),
    503: ("unavailable", True, False),
    504: ("timeout", True, False),
}


def classify(status: int | None, metadata: Mapping[str, Any] | None) -> tuple[str, bool, bool]:
    if status == 402 and (metadata or {}).get("reason") == "in_flight_budget_exhausted":
        # OpenRouter's prepaid in-flight budget: expected at high concurrency, a back-off.
        return "in_flight_budget", True, False
    if status is None:
        return "provider_error", True, False
    if status in _STATUS_KINDS:
        return _STATUS_KINDS[status]
    if status >= 500:
        return "server_error", True, False
    return "http_error", False, False


def _error_usage(body: Mapping[str, Any]) -> Usage | None:
    usage = body.get("usage")
    return parse_usage(usage) if isinstance(usage, dict) else None


def error_from_body(body: Mapping[str, Any], status: int | None,
                    headers: Mapping[str, str] | None = None) -> BackendError:
    """OpenRouter / OpenAI error body: {"error": {"code", "message", "metadata"}}."""
    err = body.get("error")
    if isinstance(err, str):
        err = {"message": err}
    if not isinstance(err, dict):
        err = {}
    code = err.get("code")
    effective = status if status and status != 200 else (code if isinstance(code, int) else None)
    metadata = err.get("metadata") if isinstance(err.get("metadata"), dict) else None
    kind, retryable, permanent = classify(effective, metadata)
    message = redact(str(err.get("message") or "error without message"))[:500]
    if metadata and metadata.get("provider_name"):
        message += f" (provider {metadata['provider_name']})"
    if metadata and metadata.get("reason"):
        message += f" [{metadata['reason']}]"
    return BackendError(
        kind, message, retryable=retryable, status=effective,
        retry_after=parse_retry_after((headers or {}).get("Retry-After")),
        usage=_error_usage(body), permanent_for_backend=permanent,
    )


def error_from_http(status: int, raw: bytes, headers: Mapping[str, str]) -> BackendError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and "error" in body:
        return error_from_body(body, status, headers)
    kind, retryable, permanent = classify(status, None)
    # Redacted before it is cut: a key cut in two would no longer be recognised.
    snippet = redact(raw[:4096].decode("utf-8", "replace"))[:200].strip()
    return BackendError(
        kind, snippet or f"HTTP {status}", retryable=retryable, status=status,
        retry_after=parse_retry_after(headers.get("Retry-After")),
        permanent_for_backend=permanent,
    )


def parse_usage(usage: Mapping[str, Any] | None) -> Usage:
    if not usage:
        return Usage()
    details = usage.get("completion_tokens_details") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    cost = usage.get("cost")
    return Usage(
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        reasoning_tokens=_int_or_none(details.get("reasoning_tokens")),
        cached_tokens=_int_or_none(prompt_details.get("cached_tokens")),
        cost=wire_cost(cost),
    )


def wire_cost(value: Any) -> float | None:
    """A cost as a provider sent it, as a float: a JSON number, or a numeric string ("0.0031":
    some providers quote their figures); None where there is none; NaN for anything else (a
    word, a list, `true`, a number past a float's range), which the budget refuses as no cost
    (`budget.counted_cost`). Whether the figure is plausible is the budget's question."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.strip()
        if not _NUMERIC.fullmatch(value):
            return math.nan
    elif isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    try:
        return float(value)
    except (OverflowError, ValueError):
        return math.nan


_NUMERIC = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
"""A decimal number as text: no `nan`, `inf` or hex, which `float()` would also take."""


def _int_or_none(value: Any) -> int | None:
    """A token count as sent: an integer in 0..2**63-1, or one written in ASCII digits
    ("120"); None for anything else (a negative or astronomic count is no count: the caller
    counts the tokens itself)."""
    if isinstance(value, str):
        text = value.strip()
        value = int(text) if text.isascii() and text.isdigit() else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None
