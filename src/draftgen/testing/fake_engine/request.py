"""What the engine reads from a chat request: its fields, the last user message (the prompt's
label for faults and counters), whether it asks for a tool call, and the prompt's tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from draftgen.testing.fake_engine.config import ServerConfig
from draftgen.testing.fake_engine.kinds import BadRequest, Json, Layout

_TOOL_DIRECTIVE = "[[tool_call]]"


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    text = "" if content is None else str(content)
    for call in message.get("tool_calls") or ():
        text += (
            "\n<tool_call>\n" + orjson.dumps(call.get("function", call)).decode() + "\n</tool_call>"
        )
    return text


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _message_text(message)
    return ""


def render_prompt(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], layout: Layout
) -> str:
    """A ChatML rendering close to Qwen3's template (used only to count prompt tokens)."""
    turns = [(str(m.get("role", "user")), _message_text(m)) for m in messages]
    if tools:
        system = turns.pop(0)[1] + "\n\n" if turns and turns[0][0] == "system" else ""
        listing = "\n".join(orjson.dumps(t).decode() for t in tools)
        turns.insert(0, ("system", f"{system}# Tools\n\n<tools>\n{listing}\n</tools>"))
    text = "".join(f"<|im_start|>{role}\n{body}<|im_end|>\n" for role, body in turns)
    return text + "<|im_start|>assistant\n" + ("<think>\n" if layout == "qwen3-thinking" else "")


def optional_int(body: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"{name} must be a non-negative integer")
        return value
    return None


@dataclass(frozen=True)
class ChatRequest:
    messages: list[Json]
    tools: list[Any]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    seed: Any
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    show_reasoning: bool

    @classmethod
    def parse(cls, body: Json) -> ChatRequest:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        if not all(isinstance(m, dict) for m in messages):
            raise BadRequest("each message must be an object")
        reasoning = body.get("reasoning")
        excluded = isinstance(reasoning, dict) and bool(reasoning.get("exclude"))
        return cls(
            messages=messages,
            tools=list(body.get("tools") or ()),
            stream=bool(body.get("stream")),
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            max_tokens=optional_int(body, "max_completion_tokens", "max_tokens"),
            seed=body.get("seed"),
            logprobs=bool(body.get("logprobs")),
            top_logprobs=optional_int(body, "top_logprobs") or 0,
            return_token_ids=bool(body.get("return_token_ids")),
            show_reasoning=not excluded and body.get("include_reasoning") is not False,
        )

    def wants_tool_call(self, label: str, tools_supported: bool = True) -> bool:
        return tools_supported and bool(self.tools) and asks_for_tool_call(label)


def declines(config: ServerConfig, label: str) -> bool:
    return bool(config.declines_tool_for) and config.declines_tool_for in label


def asks_for_tool_call(label: str) -> bool:
    return "weather" in label.lower() or _TOOL_DIRECTIVE in label
