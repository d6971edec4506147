"""Helpers shared by the model families: JSON as chat templates write it, message fields,
tool calls, the reasoning/content split, tool sections and layout alternatives."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from draftgen.formats.base import FormatError
from draftgen.types import Message

ToolCall = dict[str, Any]


def tojson(value: Any, *, compact: bool = False) -> str:
    """The template's `tojson` as transformers defines it (not Jinja's HTML-safe one);
    `compact` is `tojson(separators=(',', ':'))`."""
    if compact:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


def deep_sort(value: Any) -> Any:
    """Every mapping's keys sorted, recursively; lists keep their order."""
    if isinstance(value, dict):
        return {k: deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [deep_sort(v) for v in value]
    return value


def text_field(value: Any, what: str, family: str) -> str:
    """A message field as a template concatenates it; None (OpenAI's "no content") is ""."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise FormatError(f"{family}: {what} must be a string, got {type(value).__name__}")


def system_prompt(messages: Sequence[Message], family: str) -> str:
    """Every system message's content joined by a blank line (DeepSeek templates)."""
    return "\n\n".join(
        text_field(m.get("content"), "system content", family)
        for m in messages
        if m.get("role") == "system"
    )


def function_of(call: ToolCall, family: str) -> tuple[str, str]:
    """(name, arguments text) of an OpenAI tool call; dict arguments become JSON."""
    fn = call.get("function") or call
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"{family}: tool call without a function name: {call!r}")
    args = fn.get("arguments")
    if args is None:
        args = {}
    return name, args if isinstance(args, str) else tojson(args)


def arguments_value(call: ToolCall) -> Any:
    """The arguments as a value: a JSON string is parsed (as vLLM does before rendering a
    template), anything else is kept."""
    args = (call.get("function") or call).get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return {} if args is None else args


def parsed_call(name: str, arguments: str, index: int, call_id: str | None = None) -> ToolCall:
    return {
        "id": call_id or f"call_{index}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def add_flag(flags: list[str], flag: str) -> None:
    if flag not in flags:
        flags.append(flag)


def split_at(text: str, *markers: str) -> tuple[str, str, str] | None:
    """(before, marker, after) at the earliest of `markers`, or None when none occurs."""
    hits = [(text.find(m), m) for m in markers if m and m in text]
    if not hits:
        return None
    at, marker = min(hits)
    return text[:at], marker, text[at + len(marker) :]


def split_tool_section(
    content: str,
    begin: str,
    parse: Callable[[str], list[ToolCall] | None],
    render: Callable[[list[ToolCall]], str],
) -> tuple[str, list[ToolCall] | None]:
    """(content before the section, structured calls) when the text from the first `begin` to
    the end is a tool section that renders back to exactly itself; otherwise the content
    unchanged and None (tool text is never lost and never serialized twice)."""
    at = content.find(begin)
    if at < 0:
        return content, None
    calls = parse(content[at:])
    if calls is None or render(calls) != content[at:]:
        return content, None
    return content[:at], calls


def seam_variants(
    left: str, right: str, *, left_trail: str, right_lead: str
) -> list[tuple[str, str]]:
    """(left, right) as given, then with the whitespace a model usually writes at the seam
    added where there is none: the candidates when a provider may have stripped it and the
    format does not say what was there."""
    lefts = [left] + ([left + left_trail] if left and not left[-1].isspace() else [])
    rights = [right] + ([right_lead + right] if right and not right[0].isspace() else [])
    return list(itertools.product(lefts, rights))


def tool_call_regex(*parts: str) -> re.Pattern[str]:
    """A pattern from literal parts and named groups: `parts` alternate literal text and group
    names, starting with text."""
    out = []
    for i, part in enumerate(parts):
        out.append(re.escape(part) if i % 2 == 0 else f"(?P<{part}>.*?)")
    return re.compile("".join(out), re.S)
