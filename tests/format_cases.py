"""Fixed conversations for the differential format tests (tests/test_formats_oracles.py), each
with the answer that follows it: system prompts, multi-turn history with reasoning, tools with
nested schemas and one without parameters, single and parallel tool calls, tool results,
unicode, empty content, reasoning. Every field is a string (the templates concatenate them);
tool-call IDs have Kimi's `functions.NAME:IDX` form, which the other templates ignore."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city.\nUse metric units.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich."},
                "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
BOOKING = {
    "type": "function",
    "function": {
        "name": "book_trip",
        "description": "Book a trip — 预订旅行.",
        "parameters": {
            "type": "object",
            "properties": {
                "traveler": {
                    "type": "object",
                    "description": "Who travels.",
                    "properties": {
                        "name": {"type": "string"},
                        "age": {"type": "integer"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["name"],
                },
                "legs": {
                    "type": "array",
                    "description": "The legs, in order.",
                    "items": {
                        "type": "object",
                        "properties": {"from": {"type": "string"}, "to": {"type": "string"},
                                       "date": {"type": "string", "pattern": "^\\d{4}-\\d{2}"}},
                        "required": ["from", "to"],
                    },
                },
                "refundable": {"type": "boolean"},
            },
            "required": ["traveler", "legs"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                          "parameters": {"type": "object", "properties": {}}}}

TOOL_SETS: list[list[dict[str, Any]] | None] = [None, [WEATHER], [WEATHER, BOOKING, CLOCK],
                                                 [CLOCK]]

SYSTEMS: list[str | None] = [None, "You are a terse assistant.",
                             "Réponds en français. 回答要简洁。 🙂", ""]

USERS = ["What is 2+2?", "Héllo wörld 🌍 — ¿qué tal? 東京はどう？",
         "Line one\nLine two\n\n  indented <b>html</b> & \"quotes\"", ""]


def call(name: str, arguments: str, index: int) -> dict[str, Any]:
    return {"id": f"functions.{name}:{index}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def result(tool_call: dict[str, Any], content: str) -> Message:
    return {"role": "tool", "tool_call_id": tool_call["id"],
            "name": tool_call["function"]["name"], "content": content}


@dataclass
class Answer:
    reasoning: str | None
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> Message:
        out: Message = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


@dataclass
class Case:
    name: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    answer: Answer

    @property
    def after_tools(self) -> bool:
        return self.messages[-1]["role"] == "tool"


def _history(shape: str, user: str, n_calls: int) -> tuple[list[Message], int]:
    """The conversation for `shape`, and how many tool calls it holds."""
    paris = call("get_weather", '{"city": "Paris"}', 0)
    tokyo = call("get_weather", '{"city": "東京", "unit": "C"}', 1)
    if shape == "single":
        return [{"role": "user", "content": user}], 0
    if shape == "multi":
        return [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello! How can I help?",
                 "reasoning_content": "A greeting; answer politely."},
                {"role": "user", "content": user}], 0
    if shape == "tool_result":
        return [{"role": "user", "content": user},
                {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
                 "tool_calls": [paris]},
                result(paris, '{"temp": 21, "sky": "sunny"}')], 1
    if shape == "parallel_results":
        return [{"role": "user", "content": user},
                {"role": "assistant", "content": "Checking both.",
                 "reasoning_content": "Two cities: two calls.", "tool_calls": [paris, tokyo]},
                result(paris, "21°C"), result(tokyo, "28°C, humid")], 2
    if shape == "loop_done":
        return [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
                 "tool_calls": [paris]},
                result(paris, "21"),
                {"role": "assistant", "content": "It is 21°C in Paris.",
                 "reasoning_content": "Report it."},
                {"role": "user", "content": user}], 1
    raise AssertionError(shape)


def _answer(kind: str, first_index: int) -> Answer:
    if kind == "plain":
        return Answer(None, "The answer is 4.")
    if kind == "reasoning":
        return Answer("Add two and two.\nThat makes four.", "It is **4**. ✅")
    if kind == "unicode":
        return Answer("Multilingual: 日本語, émigré, 🌍.", "東京は晴れ — Zürich: 12°C.")
    if kind == "empty":
        return Answer("Nothing to add.", "")
    if kind == "call":
        return Answer("I need the weather.", "",
                      [call("get_weather", '{"city": "Berlin", "days": 2}', first_index)])
    if kind == "parallel":
        return Answer("Two lookups at once.", "Let me check.",
                      [call("get_weather", '{"city": "Oslo"}', first_index),
                       call("get_time", "{}", first_index + 1)])
    raise AssertionError(kind)


SHAPES = ["single", "multi", "tool_result", "parallel_results", "loop_done"]
ANSWERS = ["plain", "reasoning", "unicode", "empty", "call", "parallel"]


def cases() -> list[Case]:
    """46 conversations: every shape with every answer kind (30), the tool sets, system
    prompts and user texts rotating through them, and 16 more single/multi turns, one per
    system x tools combination."""
    out = []
    rotation = itertools.count()
    for shape, kind in itertools.product(SHAPES, ANSWERS):
        i = next(rotation)
        out.append(_case(f"{shape}-{kind}", shape, kind, SYSTEMS[i % 4], TOOL_SETS[(i // 2) % 4],
                         USERS[i % 4]))
    for j, (system, tools) in enumerate(itertools.product(SYSTEMS, TOOL_SETS)):
        shape = ("single", "multi")[j % 2]
        kind = ANSWERS[j % len(ANSWERS)] if tools else ANSWERS[j % 4]
        out.append(_case(f"extra{j}-{shape}-{kind}", shape, kind, system, tools, USERS[j % 4]))
    return out


def _case(name: str, shape: str, kind: str, system: str | None,
          tools: list[dict[str, Any]] | None, user: str) -> Case:
    messages, n_calls = _history(shape, user, 0)
    if n_calls and not tools:
        tools = [WEATHER]
    if kind in ("call", "parallel") and not tools:
        tools = [WEATHER, CLOCK]
    if system is not None:
        messages = [{"role": "system", "content": system}, *messages]
    return Case(name, messages, tools, _answer(kind, n_calls))
