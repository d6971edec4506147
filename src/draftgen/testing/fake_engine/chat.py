"""The chat completions endpoint's answers, as OpenAI, OpenRouter and vLLM send them: the JSON
body, and the SSE stream (role, reasoning, content and tool-call deltas, the final and usage
chunks, `[DONE]`, OpenRouter's comment lines), with the faults that change them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import orjson

from draftgen.testing.fake_engine.answers import Completion, StreamPiece, ToolCall
from draftgen.testing.fake_engine.config import ServerConfig
from draftgen.testing.fake_engine.faults import (
    BAD_IDS,
    BAD_TOOL_CALLS,
    HUGE,
    HUGE_MARK,
    SHIFTED_IDS,
    TOO_MANY_IDS,
    sent_ids,
)
from draftgen.testing.fake_engine.kinds import Json
from draftgen.testing.fake_engine.request import ChatRequest
from draftgen.testing.fake_engine.shapes import ReplyContext, echoed, usage_json


def _reasoning_value(name: str, text: str | None) -> Any:
    """A reasoning field's value: the text, or for `reasoning_details` a one-entry list."""
    if name != "reasoning_details" or text is None:
        return text
    return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]


def _reasoning_fields(config: ServerConfig, shown: bool) -> tuple[str, ...]:
    if not shown or config.reasoning_field == "none":
        return ()
    if config.reasoning_field == "both":
        return ("reasoning", "reasoning_content")
    return (config.reasoning_field,)


def _delta(
    piece: StreamPiece, call: ToolCall | None, reasoning_fields: tuple[str, ...]
) -> Json | None:
    if piece.kind == "role":
        return {"role": "assistant", "content": ""}
    if piece.kind == "reasoning":
        return {name: _reasoning_value(name, piece.text) for name in reasoning_fields} or None
    if piece.kind == "content":
        return {"content": piece.text}
    assert call is not None
    if piece.kind == "tool_head":
        head = {"index": 0, "id": call.id, "type": "function"}
        return {"tool_calls": [head | {"function": {"name": call.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": 0, "function": {"arguments": piece.text}}]}


def _sse(obj: Json) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
_SSE_COMMENT = b": OPENROUTER PROCESSING\n\n"


@dataclass(frozen=True)
class ChatReply:
    """Builds the chat endpoint's JSON answer and SSE chunks for one request."""

    config: ServerConfig
    req: ChatRequest
    ctx: ReplyContext
    comp: Completion
    fault: str | None = None

    @property
    def token_ids(self) -> bool:
        return self.req.return_token_ids and self.config.mode != "openrouter"

    @functools.cached_property
    def ids(self) -> list[Any]:
        """The answer's IDs as `token_ids` reports them (changed by an ID fault)."""
        return sent_ids(self.fault, self.comp.ids, self.req.max_tokens)

    @property
    def ids_fault(self) -> str | None:
        return self.fault if self.fault in BAD_IDS or self.fault in (TOO_MANY_IDS, SHIFTED_IDS) \
            else None

    def head(self, obj: str) -> Json:
        ctx = self.ctx
        return {
            "id": ctx.gen_id,
            "object": obj,
            "created": ctx.created,
            "model": self.config.model,
            "provider": ctx.provider,
        }

    def usage(self) -> Json:
        comp = self.comp
        return usage_json(
            len(self.ctx.prompt_ids),
            len(comp.ids),
            comp.reasoning_tokens,
            self.config.price,
            self.config.reported_cost,
            self.config.cost_as_text,
        )

    @property
    def sends_logprobs(self) -> bool:
        return self.req.logprobs and self.config.logprobs_scope != "none"

    def logprobs(self, start: int, end: int) -> Json:
        if self.config.logprobs_scope == "content":
            start = max(start, self.comp.reasoning_tokens)
        if self.req.top_logprobs > 0:
            entries = (self.comp.logprob_entry(n) for n in range(start, end))
            return {"content": [e | {"top_logprobs": [_top(e)]} for e in entries]}
        return {"content": self.comp.logprob_entries(start, end)}

    def message(self) -> Json:
        comp = self.comp
        content: str | None = comp.content
        if comp.tool_call is not None and not content:
            content = "" if self.config.mode == "openrouter" else None
        message: Json = {"role": "assistant", "content": content}
        for name in _reasoning_fields(self.config, self.req.show_reasoning):
            message[name] = _reasoning_value(name, comp.reasoning)
        if comp.tool_call is not None and not self.config.tool_parser_drops:
            message["tool_calls"] = [comp.tool_call.as_json()]
        if self.fault in BAD_TOOL_CALLS:
            message["tool_calls"] = BAD_TOOL_CALLS[self.fault]
        if self.fault in HUGE:
            message["content"] = HUGE_MARK.decode()  # `huge_pieces` puts the megabytes there
        return message

    def json(self) -> Json:
        finish = self.comp.finish_reason
        choice: Json = {
            "index": 0,
            "message": self.message(),
            "finish_reason": finish,
            "native_finish_reason": finish,
        }
        if self.sends_logprobs:
            choice["logprobs"] = self.logprobs(0, len(self.comp.ids))
        body = self.head("chat.completion") | {"choices": [choice], "usage": self.usage()}
        if self.token_ids:
            choice["token_ids"] = self.ids
            body["prompt_token_ids"] = self.ctx.prompt_ids
        return body

    def choice(self, delta: Json, start: int, end: int, finish: str | None = None) -> Json:
        """A chunk's choice: the delta and the token IDs [start, end) it carries."""
        choice: Json = {"index": 0, "delta": delta, "finish_reason": finish}
        if finish is not None:
            choice["native_finish_reason"] = finish
        if self.token_ids:
            choice["token_ids"] = self.ids[start:end]
        end = min(end, len(self.comp.ids))  # `ids_too_many`'s extra IDs have no entries
        if self.sends_logprobs and end > start:
            choice["logprobs"] = self.logprobs(start, end)
        return choice

    def chunk(self, choices: list[Json], **extra: Any) -> bytes:
        return _sse(self.head("chat.completion.chunk") | {"choices": choices} | extra)

    def delta_events(self) -> tuple[list[bytes], int]:
        """The role chunk, then reasoning, content and tool-call deltas (no final chunk), and
        how many token IDs they carry."""
        fields = _reasoning_fields(self.config, self.req.show_reasoning)
        shape = ("deltas", fields, self.token_ids, self.req.logprobs, self.req.top_logprobs > 0,
                 self.ids_fault)
        choices, carried = self.comp.memo(shape, lambda: self._delta_choices(fields))
        # Only the head (id, created, provider) differs between requests for one answer.
        prefix = self._prefix()
        events = [prefix + choice + b"]}\n\n" for choice in choices]
        if self.token_ids and events:
            prefix = self._prefix(prompt_token_ids=self.ctx.prompt_ids)
            events[0] = prefix + choices[0] + b"]}\n\n"
        return events, carried

    def _prefix(self, **extra: Any) -> bytes:
        """`data: {"id": ..., "choices":[` for a chunk of this request."""
        head = orjson.dumps(self.head("chat.completion.chunk") | extra)
        return b"data: " + head[:-1] + b',"choices":['

    def _delta_choices(self, fields: tuple[str, ...]) -> tuple[list[bytes], int]:
        choices: list[bytes] = []
        carried = 0
        for piece in self.comp.stream_plan(self.config.stream_tokens_per_chunk):
            if piece.kind.startswith("tool") and self.config.tool_parser_drops:
                continue
            delta = _delta(piece, self.comp.tool_call, fields)
            if delta is not None:
                choices.append(orjson.dumps(self.choice(delta, carried, piece.end)))
                carried = piece.end
        return choices, carried

    def closing_events(self, carried: int) -> list[bytes]:
        """The final chunk (finish_reason, the IDs not carried yet), the usage chunk when
        due, and [DONE]."""
        comp = self.comp
        events = [self.chunk([self.choice({}, carried, len(self.ids), comp.finish_reason)])]
        if self.req.include_usage or self.config.mode == "openrouter":
            events.append(self.chunk([], usage=self.usage()))
        return [*events, SSE_DONE]

    def fault_events(self, carried: int) -> list[bytes]:
        """The events a fault adds after the deltas: a malformed tool call, or `huge_body`'s
        64 KB content deltas (one event, repeated)."""
        if self.fault in BAD_TOOL_CALLS:
            delta = {"tool_calls": BAD_TOOL_CALLS[self.fault]}
            return [self.chunk([self.choice(delta, carried, carried)])]
        if self.fault == "huge_body":
            filler = self.chunk([self.choice({"content": "x" * (64 << 10)}, carried, carried)])
            return [filler] * (self.config.huge_body_mb * 16)
        return []

    def error_event(self, auth: str = "") -> bytes:
        """`auth`: the request's Authorization header, echoed when `config.echo_auth`."""
        error = {"code": 502, "message": echoed("Provider returned error", auth, self.config)}
        error["metadata"] = {"provider_name": self.ctx.provider}
        return self.chunk([self.choice({"content": ""}, 0, 0, "error")], error=error)


def _top(entry: Json) -> Json:
    return {"token": entry["token"], "logprob": entry["logprob"], "bytes": entry["bytes"]}


def generation_json(reply: ChatReply) -> Json:
    """What OpenRouter's `GET /api/v1/generation` reports of an answer (the fields draftgen
    reads, and a few more)."""
    usage = reply.usage()
    return {
        "id": reply.ctx.gen_id,
        "model": reply.config.model,
        "provider_name": reply.ctx.provider,
        "total_cost": usage.get("cost", 0.0),
        "tokens_prompt": usage["prompt_tokens"],
        "tokens_completion": usage["completion_tokens"],
        "native_tokens_prompt": usage["prompt_tokens"],
        "native_tokens_completion": usage["completion_tokens"],
        "native_tokens_reasoning": usage["completion_tokens_details"]["reasoning_tokens"],
    }


def with_comments(events: list[bytes], every: int = 16) -> list[bytes]:
    out = [_SSE_COMMENT]
    for n, event in enumerate(events, 1):
        out.append(event)
        if n % every == 0:
            out.append(_SSE_COMMENT)
    return out
