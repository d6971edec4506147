"""OpenAI-compatible chat completions: the `openai` type, and the base of the other chat types
(`openrouter`, `vllm`: their modules) and of llama-server's chat endpoint (`ChatBackendConfig`:
the keys every chat type takes).

JSON and SSE answers; reasoning read from `reasoning`, `reasoning_content` or
`reasoning_details`; errors inside a 200 body or an SSE event are errors, not answers.

A whole answer is read twice over: `answer_from_body` decodes its bytes into the `wire` types
(what `send` uses: less event-loop CPU per answer with logprobs), and falls back to the generic
reading, `answer_from_json` (orjson, dict lookups, lenient about field types), for any body those
types do not describe; the generic reading is the reference for what is kept and for every
error. Streams are read the same way, event by event (`StreamAccumulator._take_typed`,
falling back to the generic `feed_line` for any event the `wire` chunk types do not describe):
~40 % less CPU per streamed answer. With logprobs, the entries' bytes are checked for the whole
answer at once (by the target's token spellings when the runner gave the backend its tokenizer)
and their other columns read only when asked for (`decoded_logprobs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import msgspec
import orjson

from draftgen.backends import wire
from draftgen.backends.base import (
    Backend,
    Capabilities,
    ReadCount,
    RequestContext,
    error_from_body,
    error_from_http,
    parse_json_body,
    parse_usage,
    reading_billed_answer,
    transport_error,
)
from draftgen.backends.chat_logprobs import decoded_logprobs, logprobs_of
from draftgen.config import ModelConfig, SamplingConfig
from draftgen.config.backends import BackendConfigBase, register
from draftgen.tokenize import Tokenizer, TokenSpellings
from draftgen.tokenize.logprob_tokens import LogprobTokens
from draftgen.types import BackendError, Prompt, RawAnswer
from draftgen.urls import join_url, url_path


class ChatBackendConfig(BackendConfigBase):
    """What the OpenAI-compatible chat endpoints take (and llama.cpp's, with `endpoint: chat`)."""

    reasoning: dict[str, Any] | None = None
    """The `reasoning` request object; default {"enabled": true} on openrouter."""
    stream: bool = False
    """Ask for the answer as a stream of server-sent events."""
    logprobs: bool = True
    """Chat backends: ask for per-token logprobs, from which the sampled token IDs are
    recovered exactly where they cover the whole answer."""

    @property
    def request_reasoning(self) -> dict[str, Any] | None:
        """The `reasoning` object each request carries (None: none)."""
        return self.reasoning


@register
class OpenAIConfig(ChatBackendConfig):
    type: Literal["openai"]

    def backend_class(self) -> type[Backend]:
        return OpenAIChatBackend


def chat_url(base: str) -> str:
    """`base` is an OpenAI base URL; "/v1" is added when the user gave the server root (its
    query string kept: `urls.join_url`)."""
    if not url_path(base).rstrip("/").endswith("/v1"):
        return join_url(base, "/v1/chat/completions")
    return join_url(base, "/chat/completions")


class OpenAIChatBackend(Backend):
    """`type: openai`: an OpenAI-compatible chat endpoint; the other chat types subclass it."""

    capabilities = Capabilities(native_ids=False, needs_prompt_ids=False)
    cfg: ChatBackendConfig

    def __init__(self, cfg: ChatBackendConfig, model: ModelConfig,
                 sampling: SamplingConfig) -> None:
        super().__init__(cfg, model, sampling)
        assert cfg.url is not None, "validated: only a llamacpp backend may lack a url"
        self.url = chat_url(cfg.url)
        self._spellings: TokenSpellings | None = None

    def use_vocabulary(self, tokenizer: Tokenizer) -> None:
        super().use_vocabulary(tokenizer)
        if self.cfg.logprobs:
            self._spellings = TokenSpellings(tokenizer)

    def build_body(self, prompt: Prompt, max_tokens: int,
                   sampling: SamplingConfig | None = None) -> dict[str, Any]:
        """The request's body; `sampling`: the request's own, else the run's."""
        s = sampling or self.sampling
        body: dict[str, Any] = {
            "model": self.model.name,
            "messages": prompt.messages,
            "max_tokens": max_tokens,
        }
        for key in ("temperature", "top_p", "top_k", "seed"):
            value = getattr(s, key)
            if value is not None:
                body[key] = value
        if prompt.tools:
            body["tools"] = prompt.tools
        if self.cfg.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self.capabilities.reports_cost:
            body["usage"] = {"include": True}
        if self.cfg.request_reasoning:
            body["reasoning"] = self.cfg.request_reasoning
        if self.cfg.provider_routing:
            body["provider"] = self.cfg.provider_routing
        if self.capabilities.native_ids:
            body["return_token_ids"] = True
        if self.cfg.logprobs:
            # Only the sampled token's entry is read, so no `top_logprobs`: the default (no
            # alternatives) of OpenAI, vLLM and SGLang. Asking for one doubled each entry:
            # a third of a logprobs answer's bytes and half its JSON objects.
            body["logprobs"] = True
        body.update(s.extra)
        body.update(self.cfg.extra_body)
        return body

    async def _send(self, prompt: Prompt, input_ids: list[int], max_tokens: int,
                    ctx: RequestContext) -> RawAnswer:
        body = self.build_body(prompt, max_tokens, ctx.sampling)
        if not self.cfg.stream:
            raw, headers = await self.post_bytes(self.url, body, ctx)
            with reading_billed_answer():
                return self._answer_of_body(raw, headers, ctx)
        try:
            async with self.session.post(self.url, data=orjson.dumps(body),
                                         headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    raise error_from_http(resp.status, await self.read_body(resp, ctx),
                                          resp.headers)
                ctx.note_generation_id(resp.headers)
                with reading_billed_answer():
                    return await self._read_answer(resp, ctx)
        except BackendError:
            raise
        except Exception as e:
            raise transport_error(e) from None

    def _answer_of_body(self, raw: bytes, headers: Mapping[str, str], ctx: RequestContext
                        ) -> RawAnswer:
        answer = answer_from_body(raw, headers, self._spellings)
        if ctx.observe is not None:
            observe_message(raw, ctx.observe)
        return answer

    async def _read_answer(self, resp: aiohttp.ClientResponse, ctx: RequestContext
                           ) -> RawAnswer:
        if resp.content_type == "application/json":
            # Not a stream: an error body sent with 200, or a server that ignores
            # "stream": read it as the JSON answer it is.
            return self._answer_of_body(await self.read_body(resp, ctx), resp.headers, ctx)
        acc = StreamAccumulator(request_id=resp.headers.get("X-Generation-Id"),
                                observe=ctx.observe)
        count = ReadCount(self.max_response_bytes, ctx.held)
        # Whatever arrived, split into lines here: an await per network read instead
        # of one per SSE line (about 3x less event-loop time per streamed answer).
        async for data in resp.content.iter_any():
            count.add(len(data))
            if acc.feed(data):
                break
        else:
            acc.feed_end()
        return acc.finish()


def observe_message(raw: bytes, observe: Callable[[Mapping[str, Any]], None]) -> None:
    """Show `observe` the message of a chat-completion body (`RequestContext.observe`)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    choices = data.get("choices") if isinstance(data, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        observe(message if isinstance(message, dict) else {})


def _reasoning_of(message: Mapping[str, Any]) -> str | None:
    for key in ("reasoning", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str):
            return value
    return _details_text(message.get("reasoning_details"))


def _message_reasoning(message: wire.Message) -> str | None:
    """`_reasoning_of` a decoded message (its text fields are str or None)."""
    if message.reasoning is not None:
        return message.reasoning
    if message.reasoning_content is not None:
        return message.reasoning_content
    return _details_text(wire.value(message.reasoning_details))


def _details_text(details: Any) -> str | None:
    """The text of OpenRouter's `reasoning_details` entries, if any has text."""
    if isinstance(details, list):
        texts = [d.get("text") for d in details
                 if isinstance(d, dict) and isinstance(d.get("text"), str)]
        if texts:
            return "".join(texts)
    return None


def _bad_delta(problem: str) -> BackendError:
    return BackendError("bad_response", f"stream: {problem}", retryable=True)


def _check_finish(finish_reason: Any, error: Any) -> None:
    """`finish_reason: "error"`: raise the choice's `error`."""
    if finish_reason == "error":
        err = error if isinstance(error, dict) else {}
        raise error_from_body({"error": err or {"message": "finish_reason error"}}, None)


def answer_from_json(data: Any, headers: Mapping[str, str]) -> RawAnswer:
    if not isinstance(data, dict):
        raise BackendError("bad_response", "answer is not a JSON object", retryable=True)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BackendError("bad_response", "answer has no choices", retryable=True)
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    finish_reason = choice.get("finish_reason")
    _check_finish(finish_reason, choice.get("error"))
    answer = RawAnswer(
        reasoning=_reasoning_of(message),
        content=message.get("content") if isinstance(message.get("content"), str) else None,
        tool_calls=message.get("tool_calls") or None,
        finish_reason=finish_reason,
        usage=parse_usage(data.get("usage")),
        provider=data.get("provider"),
        model=data.get("model"),
        request_id=headers.get("X-Generation-Id") or data.get("id"),
        output_ids=choice.get("token_ids"),
        prompt_ids=data.get("prompt_token_ids"),
        logprobs=logprobs_of(choice),
    )
    check_answer(answer)
    return answer


_EMPTY_MESSAGE = wire.Message()


def answer_from_body(raw: bytes, headers: Mapping[str, str],
                     spellings: TokenSpellings | None = None) -> RawAnswer:
    """`answer_from_json` of a chat-completion body, read through the `wire` types when they
    describe it, else parsed generically (errors, unexpected types). `spellings`: the target's,
    to read logprob entries' bytes by (see `decoded_logprobs`)."""
    body = wire.decode_completion(raw)
    if body is None or body.error or not body.choices:
        return answer_from_json(parse_json_body(raw), headers)
    choice = body.choices[0]
    _check_finish(choice.finish_reason, wire.value(choice.error))
    try:
        logprobs = decoded_logprobs(choice.logprobs, raw, spellings)
    except ValueError:  # not byte values: the generic reading names the entry
        return answer_from_json(parse_json_body(raw), headers)
    message = choice.message or _EMPTY_MESSAGE
    answer = RawAnswer(
        reasoning=_message_reasoning(message),
        content=message.content,
        tool_calls=wire.value(message.tool_calls) or None,
        finish_reason=choice.finish_reason,
        usage=parse_usage(wire.value(body.usage)),
        provider=body.provider,
        model=body.model,
        request_id=headers.get("X-Generation-Id") or body.id,
        output_ids=choice.token_ids,
        prompt_ids=body.prompt_token_ids,
        logprobs=logprobs,
    )
    check_answer(answer)
    return answer


def check_answer(answer: RawAnswer) -> None:
    """An answer with nothing in it, or with tool calls no model format can lay out, is a
    failed request (billed by its usage), not an answer: it fails alone, before the batch of
    answers it would be rebuilt with."""
    if not (answer.reasoning or answer.content or answer.tool_calls or answer.output_ids):
        raise BackendError("empty_answer", "answer has no reasoning, content or tool calls",
                           retryable=True, usage=answer.usage)
    problem = tool_calls_problem(answer.tool_calls)
    if problem is not None:
        raise BackendError("bad_response", problem, retryable=True, usage=answer.usage)


def tool_calls_problem(calls: Any) -> str | None:
    """Why a message's `tool_calls` cannot be the model's tool calls; None when absent, or a
    list of objects whose `function` object has a `name` (a non-empty string). Arguments are
    not judged: the formats lay out any (the probe reports ones that are not JSON objects)."""
    if calls is None:
        return None
    if not isinstance(calls, list):
        return f"tool_calls is {_json_kind(calls)}, not a list"
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            return f"tool_calls[{i}] is {_json_kind(call)}, not an object"
        function = call.get("function")
        if not isinstance(function, dict):
            return f"tool_calls[{i}] has no function object"
        name = function.get("name")
        if not isinstance(name, str) or not name:
            return f"tool_calls[{i}].function.name is {_json_kind(name)}, not a function name"
    return None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    names = {bool: "a boolean", int: "a number", float: "a number", list: "a list",
             dict: "an object"}
    return names.get(type(value), type(value).__name__)


_CHUNK_FIELDS = ("id", "model", "provider", "usage")
"""Stream chunk fields kept for the answer: the last non-null value of each."""


@dataclass
class StreamAccumulator:
    """Reassembles an SSE chat stream into one RawAnswer."""

    request_id: str | None = None
    observe: Callable[[Mapping[str, Any]], None] | None = None
    """Shown each delta as it is read (`RequestContext.observe`): the generic reading then
    takes every event, as the typed one builds no dict."""
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    logprobs: LogprobTokens = field(default_factory=LogprobTokens)
    finish_reason: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    _partial: list[bytes] = field(default_factory=list, repr=False)
    """The start of a line whose end has not arrived yet."""
    _typed: bool = field(default=True, repr=False)
    """Events are read through the `wire` types (`_take_typed`); False once one had logprobs:
    the types keep those as JSON text that orjson then parses, which costs more than the
    generic reading of the whole event."""

    def __post_init__(self) -> None:
        if self.observe is not None:
            self._typed = False

    def feed(self, data: bytes) -> bool:
        """Take the stream's bytes as they arrive (lines may be cut anywhere); True once
        `[DONE]` arrived."""
        if b"\n" not in data:
            self._partial.append(data)
            return False
        if self._partial:
            self._partial.append(data)
            data = b"".join(self._partial)
            self._partial.clear()
        lines = data.split(b"\n")
        last = lines.pop()
        if last:
            self._partial.append(last)
        # Most lines are the blank one after each event or a `data: {...}` event the `wire`
        # types describe: those are taken here; `feed_line` reads every other line. UTF-8 is
        # checked once for the read's whole lines, not once per event.
        utf8 = self._typed and wire.is_utf8(data, len(data) - len(last))
        take_typed, feed_line = self._take_typed, self.feed_line
        for line in lines:
            if not line or (utf8 and self._typed and line.startswith(b"data: {")
                            and take_typed(line)):
                continue
            if feed_line(line):
                return True
        return False

    def feed_end(self) -> bool:
        """The stream ended: take its last line if it had no newline."""
        if not self._partial:
            return False
        line = b"".join(self._partial)
        self._partial.clear()
        return self.feed_line(line)

    def feed_line(self, line: bytes) -> bool:
        """Take one SSE line; True once `[DONE]` arrived."""
        line = line.strip()
        if not line or line.startswith(b":") or not line.startswith(b"data:"):
            return False  # blank separators, comments (": OPENROUTER PROCESSING"), event names
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise BackendError("bad_response", "stream chunk is not JSON", retryable=True) from None
        self._take_chunk(chunk)
        return False

    def _take_typed(self, line: bytes) -> bool:
        """Take a `data: {...}` line of UTF-8 through the `wire` types: what `feed_line` takes
        from it, for less than half its CPU (msgspec builds no dict; a struct's fields are read
        faster than a dict's keys). False, having taken nothing, when the types do not
        describe it or it is an error event; False too when orjson refuses a free-form value
        in it, as it then refuses the whole event. `feed_line` reads the line then, so every
        error is the generic reading's, raised at the same event.

        `_take_chunk` and `_take_choice` in one function, free-form fields parsed only when
        present: this runs once per event, about once per answer token."""
        try:
            chunk = wire.chunk_decoder.decode(line[6:])
        except msgspec.MsgspecError:
            return False
        if chunk.error:
            return False
        data = self.data
        try:
            if chunk.id is not None:
                data["id"] = chunk.id
            if chunk.model is not None:
                data["model"] = chunk.model
            if chunk.provider is not None:
                data["provider"] = chunk.provider
            if chunk.usage and (usage := wire.value(chunk.usage)) is not None:
                data["usage"] = usage
            for choice in chunk.choices or ():
                delta = choice.delta
                if delta is not None:
                    # `_message_reasoning`, inlined: this runs for every event.
                    reasoning = delta.reasoning
                    if reasoning is None:
                        reasoning = delta.reasoning_content
                        if reasoning is None and delta.reasoning_details:
                            reasoning = _details_text(wire.value(delta.reasoning_details))
                    if reasoning:
                        self.reasoning.append(reasoning)
                    if delta.content is not None:
                        self.content.append(delta.content)
                    if delta.tool_calls:
                        for call in wire.value(delta.tool_calls) or ():
                            self._merge_tool_call(call)
                if choice.token_ids is not None:
                    self.token_ids.extend(choice.token_ids)
                if choice.logprobs and (logprobs := wire.value(choice.logprobs)) is not None:
                    self._typed = False
                    logprobs_of({"logprobs": logprobs}, into=self.logprobs)
                if choice.finish_reason:
                    self.finish_reason = choice.finish_reason
                    _check_finish(choice.finish_reason, wire.value(choice.error))
        except orjson.JSONDecodeError:
            # A free-form value orjson refuses (a number beyond float range) makes it refuse
            # the whole event: `feed_line` raises the generic reading's error for it.
            return False
        return True

    def _take_chunk(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise BackendError("bad_response", "stream chunk is not an object", retryable=True)
        if chunk.get("error"):
            raise error_from_body(chunk, None)
        data = self.data
        for key in _CHUNK_FIELDS:
            value = chunk.get(key)
            if value is not None:
                data[key] = value
        for choice in chunk.get("choices") or ():
            self._take_choice(choice)

    def _take_choice(self, choice: Mapping[str, Any]) -> None:
        # Once per SSE event (about one per answer token): the fewest lookups that keep the
        # meaning of every field.
        delta = choice.get("delta")
        if delta and self.observe is not None and isinstance(delta, dict):
            self.observe(delta)
        if delta:
            reasoning = _reasoning_of(delta)
            if reasoning:
                self.reasoning.append(reasoning)
            content = delta.get("content")
            if isinstance(content, str):
                self.content.append(content)
            for call in delta.get("tool_calls") or ():
                self._merge_tool_call(call)
        token_ids = choice.get("token_ids")
        if isinstance(token_ids, list):
            self.token_ids.extend(token_ids)
        if choice.get("logprobs") is not None:
            logprobs_of(choice, into=self.logprobs)
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            self.finish_reason = finish_reason
            _check_finish(finish_reason, choice.get("error"))

    def _merge_tool_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            raise _bad_delta(f"a tool_calls delta is {_json_kind(call)}, not an object")
        index = call.get("index", len(self.tool_calls))
        fn = call.get("function") or {}
        if not isinstance(index, int) or not isinstance(fn, dict):
            raise _bad_delta("a tool_calls delta has no integer index or no function object")
        slot = self.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id"):
            slot["id"] = call["id"]
        for key in ("name", "arguments"):
            piece = fn.get(key)
            if piece is not None and not isinstance(piece, str):
                raise _bad_delta(f"a tool_calls delta's function.{key} is {_json_kind(piece)}, "
                                 "not a string")
            if piece:
                slot["function"][key] += piece

    def finish(self) -> RawAnswer:
        if not self.done or self.finish_reason is None:
            raise BackendError("incomplete_stream", "stream ended before [DONE]",
                               retryable=True, usage=parse_usage(self.data.get("usage")))
        answer = RawAnswer(
            reasoning="".join(self.reasoning) if self.reasoning else None,
            content="".join(self.content) if self.content else None,
            tool_calls=[self.tool_calls[i] for i in sorted(self.tool_calls)] or None,
            finish_reason=self.finish_reason,
            usage=parse_usage(self.data.get("usage")),
            provider=self.data.get("provider"),
            model=self.data.get("model"),
            request_id=self.request_id or self.data.get("id"),
            output_ids=self.token_ids or None,
            logprobs=self.logprobs or None,
        )
        check_answer(answer)
        return answer

