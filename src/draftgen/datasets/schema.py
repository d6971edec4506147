"""One row → the prompt conversation and its tools, whatever public schema the row uses.

The schema is detected per row, so a dataset may mix them:

- OpenAI `messages` (also under `conversations`/`conversation`/`prompt`): `{"role", "content"}`,
  content a string or a list of `{"type": "text", "text"}` parts;
- ShareGPT `conversations` (also under `messages`): `{"from", "value"}`;
- Alpaca: `instruction` + optional `input`;
- a single string field: `prompt`, `question`, `problem`, `query` or `input`;

plus a top-level `system`/`system_prompt` (prepended as a system message) and `tools` (a list,
or a JSON string of one). Null fields count as absent: Parquet/Arrow rows of a mixed dataset
carry every column, mostly null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from draftgen.datasets.errors import BadRowError, clip, type_name
from draftgen.types import Message, Tool

ROLE_ALIASES: dict[str, str] = {
    "user": "user",
    "human": "user",
    "system": "system",
    "developer": "system",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
}
"""Role names (OpenAI `role`, ShareGPT `from`, lower-cased) → OpenAI roles."""

CONVERSATION_FIELDS = ("messages", "conversations", "conversation")
SINGLE_PROMPT_FIELDS = ("prompt", "question", "problem", "query", "input")
SYSTEM_FIELDS = ("system", "system_prompt")
KEPT_STRING_FIELDS = ("name", "tool_call_id", "reasoning_content")
TEXT_PART_TYPES = ("text", "input_text")
TEXT_PART_SEPARATOR = "\n"
"""Between the text parts of one message's content (as vLLM joins them)."""


PromptTurns = Literal["first", "last"]
"""Which assistant turn a prompt answers (one prompt per row)."""
DatasetTurns = Literal["first", "last", "all"]
"""A dataset's `turns`: "all" reads the whole conversation (`datasets.conversations`)."""


@dataclass(slots=True)
class RowMessages:
    """A row's messages (its prompt part, or the whole conversation) and its tools."""

    messages: list[Message]
    tools: list[Tool] | None


def require_object(row: Any) -> dict[str, Any]:
    """`row` itself when it is an object (a dict); else `BadRowError`."""
    if not isinstance(row, dict):
        raise BadRowError(f"row must be a JSON object, got {type_name(row)}")
    return row


def conversation_from_row(row: dict[str, Any], turns: PromptTurns = "first") -> RowMessages:
    """The prompt of `row`; raises `BadRowError` saying what is wrong when there is none.

    `turns` "first": the conversation up to the first assistant turn (the default);
    "last": up to the last assistant turn, earlier turns kept as history (multi-turn sets)."""
    messages = _prompt_messages(row, turns)
    _prepend_system(messages, _system_text(row))
    _check_prompt(messages)
    return RowMessages(messages, parse_tools(row.get("tools")))


# ---------------------------------------------------------------------------------------------
# Schema detection


def whole_conversation_from_row(row: dict[str, Any]) -> RowMessages:
    """Every message of `row` (assistant turns, tool calls and results included), for
    `turns: all`; raises `BadRowError` when there is no user turn before the first assistant
    turn."""
    messages = _prompt_messages(row, "all")
    _prepend_system(messages, _system_text(row))
    first_answer = next((i for i, m in enumerate(messages) if m["role"] == "assistant"),
                        len(messages))
    _check_prompt(messages[:first_answer])
    _check_prompt(messages)
    return RowMessages(messages, parse_tools(row.get("tools")))


def _prompt_messages(row: dict[str, Any], turns: DatasetTurns) -> list[Message]:
    for field in CONVERSATION_FIELDS:
        value = row.get(field)
        if value is not None:
            return _prompt_turns(field, _require_list(field, value), turns)
    if row.get("instruction") is not None:
        return [_user_message(_alpaca_text(row))]
    for field in SINGLE_PROMPT_FIELDS:
        value = row.get(field)
        if value is None:
            continue
        if isinstance(value, str):
            return [_user_message(value)]
        if field == "prompt" and isinstance(value, list):
            return _prompt_turns(field, value, turns)
        expected = "a string or a list of messages" if field == "prompt" else "a string"
        raise BadRowError(f"field {field!r} must be {expected}, got {type_name(value)}")
    keys = sorted(str(k) for k in row)
    shown = keys if len(keys) <= 20 else [*keys[:20], "..."]
    raise BadRowError(f"unknown schema: keys {shown}")


def _require_list(field: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise BadRowError(f"field {field!r} must be a list, got {type_name(value)}")
    return value


def _user_message(content: str) -> Message:
    return {"role": "user", "content": content}


def _alpaca_text(row: dict[str, Any]) -> str:
    instruction = _optional_string(row, "instruction")
    extra_input = _optional_string(row, "input")
    if extra_input.strip():
        return instruction + "\n\n" + extra_input
    return instruction


def _optional_string(row: dict[str, Any], field: str) -> str:
    value = row.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRowError(f"field {field!r} must be a string, got {type_name(value)}")
    return value


def _system_text(row: dict[str, Any]) -> str | None:
    for field in SYSTEM_FIELDS:
        text = _optional_string(row, field)
        if text.strip():
            return text
    return None


def _prepend_system(messages: list[Message], system: str | None) -> None:
    if system is None:
        return
    first = messages[0] if messages else None
    if first and first["role"] == "system" and first["content"] == system:
        return
    messages.insert(0, {"role": "system", "content": system})


def _check_prompt(messages: list[Message]) -> None:
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise BadRowError("no user turn before the first assistant turn")
    if any(not m["content"].strip() for m in users):
        raise BadRowError("empty user content (nothing but whitespace)")


# ---------------------------------------------------------------------------------------------
# Messages


def _prompt_turns(field: str, raw_messages: list[Any], turns: DatasetTurns) -> list[Message]:
    """The normalized messages before the first (or last) assistant turn, later turns not
    read; with "all", every message."""
    messages: list[Message] = []
    for index, raw in enumerate(raw_messages):
        where = f"{field}[{index}]"
        if not isinstance(raw, dict):
            raise BadRowError(f"field {where!r} must be an object, got {type_name(raw)}")
        role = _role(raw, where)
        if role == "assistant" and turns == "first":
            break
        messages.append(_normalized_message(raw, role, where))
    while turns != "all" and messages and messages[-1]["role"] == "assistant":
        messages.pop()
    return messages


def _role(raw: dict[str, Any], where: str) -> str:
    key = "role" if raw.get("role") is not None else "from"
    value = raw.get(key)
    if value is None:
        raise BadRowError(f"field {where!r} has no 'role' (or 'from')")
    if not isinstance(value, str):
        raise BadRowError(f"field '{where}.{key}' must be a string, got {type_name(value)}")
    role = ROLE_ALIASES.get(value.strip().lower())
    if role is None:
        raise BadRowError(f"unknown role {clip(value, 40)!r} in {where}")
    return role


def _normalized_message(raw: dict[str, Any], role: str, where: str) -> Message:
    key = "content" if raw.get("content") is not None else "value"
    message: Message = {"role": role, "content": _content_text(raw.get(key), f"{where}.{key}")}
    for field in KEPT_STRING_FIELDS:
        value = raw.get(field)
        if value is None:
            continue
        if not isinstance(value, str):
            raise BadRowError(f"field '{where}.{field}' must be a string, got {type_name(value)}")
        message[field] = value
    tool_calls = raw.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list) or not all(isinstance(c, dict) for c in tool_calls):
            raise BadRowError(f"field '{where}.tool_calls' must be a list of objects")
        message["tool_calls"] = tool_calls
    return message


def _content_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        return TEXT_PART_SEPARATOR.join(
            _text_of_part(part, f"{where}[{i}]") for i, part in enumerate(value)
        )
    raise BadRowError(
        f"field {where!r} must be a string or a list of text parts, got {type_name(value)}"
    )


def _text_of_part(part: Any, where: str) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise BadRowError(f"field {where!r} must be a content part object, got {type_name(part)}")
    part_type = part.get("type") or "text"
    if part_type not in TEXT_PART_TYPES:
        raise BadRowError(
            f"field {where!r} is a {clip(str(part_type), 40)!r} part; only text parts are supported"
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise BadRowError(f"field '{where}.text' must be a string, got {type_name(text)}")
    return text


# ---------------------------------------------------------------------------------------------
# Tools


def parse_tools(value: Any) -> list[Tool] | None:
    """OpenAI-style tool definitions from a `tools` field (a list, or a JSON string of one);
    bare `{"name", "description", "parameters"}` functions are wrapped as
    `{"type": "function", "function": ...}`. None when there are none."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise BadRowError(
                f"field 'tools' is a string but not valid JSON: {clip(str(e))}"
            ) from None
    if not isinstance(value, list):
        raise BadRowError(
            f"field 'tools' must be a list (or a JSON string of a list), got {type_name(value)}"
        )
    return [_normalized_tool(tool, f"tools[{i}]") for i, tool in enumerate(value)] or None


def _normalized_tool(tool: Any, where: str) -> Tool:
    if not isinstance(tool, dict):
        raise BadRowError(f"field {where!r} must be an object, got {type_name(tool)}")
    function = tool.get("function")
    if function is None and _has_name(tool):
        return {"type": "function", "function": tool}
    if not isinstance(function, dict) or not _has_name(function):
        raise BadRowError(f"field {where!r} has no function name")
    if tool.get("type") is None:
        return {**tool, "type": "function"}
    return tool


def _has_name(function: dict[str, Any]) -> bool:
    name = function.get("name")
    return isinstance(name, str) and bool(name.strip())
