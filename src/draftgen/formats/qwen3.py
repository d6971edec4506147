"""Qwen3 chat format: hybrid models (`qwen3`) and 2507 "Thinking" models (`qwen3-thinking`).

Both share one layout. An assistant turn, as the chat template renders it, is

    <|im_start|>assistant\\n<think>\\nREASONING\\n</think>\\n\\nCONTENT[\\n<tool_call>…]<|im_end|>

and the generation prompt is a prefix of it: `<|im_start|>assistant\\n` for hybrid models (the
model writes `<think>` itself), `<|im_start|>assistant\\n<think>\\n` for 2507 Thinking models.
The answer is the rest of the turn. The prompt is rendered in plain Python, character for
character what the Jinja template in the Qwen3 `tokenizer_config.json` renders.

Whitespace: engines (vLLM) return raw slices, so reasoning keeps the newline after `<think>` and
before `</think>`, and content keeps the two newlines after `</think>`; gateways strip them.
`answer_text` adds a layout newline only where the given text lacks it, and flags that as
"whitespace_restored". `parse_answer_text` returns raw slices, so that
`answer_text(**parse_answer_text(x)) == x` for every text `answer_text` produces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from draftgen.formats.base import AnswerText, Format, FormatError, ParsedAnswer, register
from draftgen.types import Message, Tool

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK = "<think>"
END_THINK = "</think>"
TOOL_CALL = "<tool_call>"
END_TOOL_CALL = "</tool_call>"
TOOL_RESPONSE = "<tool_response>"
END_TOOL_RESPONSE = "</tool_response>"

REASONING_LEAD = "\n"
"""Between `<think>` and the reasoning."""
REASONING_TRAIL = "\n"
"""Between the reasoning and `</think>`."""
CONTENT_LEAD = "\n\n"
"""Between `</think>` and the content."""
TOOL_SEP = "\n"
"""Before each `<tool_call>` (before the first one only when there is content)."""

_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_TOOL_CALL_BODY = re.compile(r'\{"name": "(?P<name>.*?)", "arguments": (?P<args>.*)\}\Z', re.S)

WHITESPACE_RESTORED = "whitespace_restored"


# ---- shared serialization -------------------------------------------------------------------


def tojson(value: Any) -> str:
    """The template's `tojson` as transformers defines it (not Jinja's HTML-safe one)."""
    return json.dumps(value, ensure_ascii=False)


def _text(value: Any, what: str) -> str:
    """A message field as the template concatenates it; None (OpenAI's "no content") is ""."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise FormatError(f"qwen3: {what} must be a string, got {type(value).__name__}")


def tool_call_text(call: dict[str, Any]) -> str:
    """One `<tool_call>` block, serialized as the template does."""
    fn = call.get("function") or call
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"qwen3: tool call without a function name: {call!r}")
    args = fn.get("arguments")
    args_text = args if isinstance(args, str) else tojson(args)
    return f'{TOOL_CALL}\n{{"name": "{name}", "arguments": {args_text}}}\n{END_TOOL_CALL}'


def tool_calls_text(calls: Sequence[dict[str, Any]], *, sep_first: bool) -> str:
    blocks = [tool_call_text(c) for c in calls]
    return (TOOL_SEP if sep_first else "") + TOOL_SEP.join(blocks)


# ---- prompt rendering (the chat template, in Python) -----------------------------------------


def _header(messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
    """The system turn: the tool declarations (with the system message inside) or the system
    message alone."""
    first = messages[0]
    system = None
    if first.get("role") == "system":
        system = _text(first.get("content"), "system content")
    if tools:
        parts = [f"{IM_START}system\n"]
        if system is not None:
            parts.append(system + "\n\n")
        parts.append(_TOOLS_HEAD)
        parts.extend("\n" + tojson(tool) for tool in tools)
        parts.append(_TOOLS_TAIL + f"{IM_END}\n")
        return "".join(parts)
    return "" if system is None else f"{IM_START}system\n{system}{IM_END}\n"


def _is_tool_response(content: str) -> bool:
    return content.startswith(TOOL_RESPONSE) and content.endswith(END_TOOL_RESPONSE)


def _last_query_index(messages: Sequence[Message]) -> int:
    """Index of the last user message that is a real query (not wrapped tool output)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and not _is_tool_response(_text(m.get("content"), "content")):
            return i
    return len(messages) - 1


def _split_history_reasoning(message: Message) -> tuple[str, str]:
    """(reasoning, content) of a history assistant turn, as the template derives them."""
    content = _text(message.get("content"), "assistant content")
    if message.get("reasoning_content") is not None:
        return _text(message["reasoning_content"], "reasoning_content"), content
    if END_THINK not in content:
        return "", content
    reasoning = content.split(END_THINK)[0].rstrip("\n").split(THINK)[-1].lstrip("\n")
    return reasoning, content.split(END_THINK)[-1].lstrip("\n")


def _assistant_turn(message: Message, *, show_reasoning: bool, is_last: bool) -> str:
    reasoning, content = _split_history_reasoning(message)
    if show_reasoning and (is_last or reasoning):
        think = reasoning.strip("\n")
        body = f"{THINK}{REASONING_LEAD}{think}{REASONING_TRAIL}{END_THINK}"
        body += CONTENT_LEAD + content.lstrip("\n")
    else:
        body = content
    calls = message.get("tool_calls")
    if calls:
        body += tool_calls_text(calls, sep_first=bool(content))
    return f"{IM_START}assistant\n{body}{IM_END}\n"


def _tool_turn(messages: Sequence[Message], i: int) -> str:
    """One tool result; consecutive results share one user turn."""
    opens = i == 0 or messages[i - 1].get("role") != "tool"
    closes = i == len(messages) - 1 or messages[i + 1].get("role") != "tool"
    content = _text(messages[i].get("content"), "tool content")
    return (
        (f"{IM_START}user" if opens else "")
        + f"\n{TOOL_RESPONSE}\n{content}\n{END_TOOL_RESPONSE}"
        + (f"{IM_END}\n" if closes else "")
    )


def render_history(messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
    """The conversation as the template renders it with `add_generation_prompt=False`.

    Differences from the template, all on inputs it cannot render sensibly: a None content is
    "" (the template raises), and an unknown role raises FormatError (the template drops the
    message silently).
    """
    if not messages:
        raise FormatError("qwen3: a prompt needs at least one message")
    parts = [_header(messages, tools)]
    query = _last_query_index(messages)
    last = len(messages) - 1
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "user" or (role == "system" and i > 0):
            parts.append(f"{IM_START}{role}\n{_text(message.get('content'), 'content')}{IM_END}\n")
        elif role == "assistant":
            parts.append(_assistant_turn(message, show_reasoning=i > query, is_last=i == last))
        elif role == "tool":
            parts.append(_tool_turn(messages, i))
        elif role != "system":
            raise FormatError(f"qwen3: unsupported message role {role!r} (message {i})")
    return "".join(parts)


# ---- answer parsing helpers -----------------------------------------------------------------


def _parse_tool_block(body: str, index: int) -> dict[str, Any] | None:
    m = _TOOL_CALL_BODY.match(body)
    if m is None:
        return None
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": m["name"], "arguments": m["args"]},
    }


def _parse_tool_section(section: str) -> list[dict[str, Any]] | None:
    """`<tool_call>…</tool_call>` blocks joined by TOOL_SEP, nothing else; None otherwise."""
    calls: list[dict[str, Any]] = []
    pos = 0
    while pos < len(section):
        if calls:
            if not section.startswith(TOOL_SEP, pos):
                return None
            pos += len(TOOL_SEP)
        opener = TOOL_CALL + "\n"
        if not section.startswith(opener, pos):
            return None
        end = section.find("\n" + END_TOOL_CALL, pos + len(opener))
        if end < 0:
            return None
        call = _parse_tool_block(section[pos + len(opener) : end], len(calls))
        if call is None:
            return None
        calls.append(call)
        pos = end + 1 + len(END_TOOL_CALL)
    return calls or None


def _content_before_tools(prefix: str) -> str:
    """The content as answer_text takes it, given the text before the first `<tool_call>`:
    the separating newline goes unless the content itself ends with a newline."""
    body = prefix.removeprefix(CONTENT_LEAD)
    if not body.endswith(TOOL_SEP):
        return prefix
    trimmed = body[: -len(TOOL_SEP)]
    if trimmed and not trimmed.endswith(TOOL_SEP):
        return prefix[: -len(TOOL_SEP)]
    return prefix


def _add_flag(flags: list[str], flag: str) -> None:
    if flag not in flags:
        flags.append(flag)


# ---- the formats ----------------------------------------------------------------------------


class _Qwen3Layout(Format):
    """What the two Qwen3 formats share; subclasses say where the generation prompt stops."""

    stop_token: ClassVar[str] = IM_END
    end_think_token: ClassVar[str | None] = END_THINK
    tool_tokens: ClassVar[tuple[str, ...]] = (TOOL_CALL, END_TOOL_CALL)
    control_tokens: ClassVar[tuple[str, ...]] = (IM_START, THINK)

    prompt_opens_think: ClassVar[bool]
    """True when the generation prompt ends with `<think>\\n` (the answer starts with the
    reasoning); False when the model writes `<think>` itself."""

    # ---- prompt ----

    def prompt_text(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
        suffix = THINK + REASONING_LEAD if self.prompt_opens_think else ""
        return f"{render_history(messages, tools)}{IM_START}assistant\n{suffix}"

    # ---- answer ----

    def answer_text(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[dict[str, Any]] | None,
        *,
        finished: bool,
    ) -> AnswerText:
        flags: list[str] = []
        if not reasoning and content and self._reasoning_in_content(content):
            reasoning, content = self._split_think(content)
            flags.append("reasoning_in_content")
        calls = list(tool_calls or [])
        closed = bool(content) or bool(calls) or finished
        text = self._reasoning_text(reasoning, closed=closed, flags=flags)
        if closed:
            text += self._content_text(content, calls, flags)
        if finished:
            text += IM_END
        return AnswerText(text=text, flags=flags)

    def _reasoning_text(self, reasoning: str | None, *, closed: bool, flags: list[str]) -> str:
        """`[<think>\\n]REASONING[\\n</think>]`: the think block, closed unless the answer was
        cut off inside it."""
        given = reasoning or ""
        if self.prompt_opens_think:
            if reasoning is None:
                flags.append("reasoning_missing")
            head, body = "", given
        elif given.startswith(REASONING_LEAD) or not given:
            head, body = THINK + REASONING_LEAD, given.removeprefix(REASONING_LEAD)
        else:
            _add_flag(flags, WHITESPACE_RESTORED)
            head, body = THINK + REASONING_LEAD, given
        if not closed:
            return head + body
        if not body.endswith(REASONING_TRAIL):
            if body:
                _add_flag(flags, WHITESPACE_RESTORED)
            body += REASONING_TRAIL
        return head + body + END_THINK

    def _content_text(
        self, content: str | None, calls: list[dict[str, Any]], flags: list[str]
    ) -> str:
        """What follows `</think>`: the content, then the tool calls unless the content already
        carries them as text."""
        text = content or ""
        if not text.startswith(CONTENT_LEAD):
            _add_flag(flags, WHITESPACE_RESTORED)
            text = CONTENT_LEAD + text
        if not calls:
            return text
        if TOOL_CALL in text:
            flags.append("tool_calls_in_content_and_structured")
            return text
        body = text.removeprefix(CONTENT_LEAD)
        return text + tool_calls_text(calls, sep_first=bool(body) and not body.endswith(TOOL_SEP))

    # ---- parsing ----

    def parse_answer_text(self, text: str) -> ParsedAnswer:
        finished = text.endswith(IM_END)
        if finished:
            text = text[: -len(IM_END)]
        reasoning, content = self._split_think(text)
        calls = None
        if content is not None and TOOL_CALL in content:
            content, calls = self._split_tool_calls(content)
        return ParsedAnswer(reasoning, content, calls, finished)

    def _split_tool_calls(self, content: str) -> tuple[str, list[dict[str, Any]] | None]:
        """Structured tool calls when they render back to exactly this text; otherwise the
        tool text stays in the content (never lost, never serialized twice)."""
        at = content.index(TOOL_CALL)
        calls = _parse_tool_section(content[at:])
        if calls is None:
            return content, None
        before = _content_before_tools(content[:at])
        if self._content_text(before, calls, []) != self._content_text(content, [], []):
            return content, None
        return before, calls

    def _split_think(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of answer text, split at the first `</think>`; raw slices."""
        head, sep, tail = text.partition(END_THINK)
        if self.prompt_opens_think:
            return (head, tail) if sep else (text, None)
        if head.startswith(THINK):
            return head[len(THINK) :], (tail if sep else None)
        return (head, tail) if sep else (None, text)

    def _reasoning_in_content(self, content: str) -> bool:
        """Content that holds the raw think block (an engine run without a reasoning parser)."""
        if self.prompt_opens_think:
            return END_THINK in content
        return content.startswith(THINK)


@register
class Qwen3(_Qwen3Layout):
    """Hybrid Qwen3 (thinking on): the model writes `<think>\\n…\\n</think>\\n\\n` itself."""

    name = "qwen3"
    prompt_opens_think = False


@register
class Qwen3Thinking(_Qwen3Layout):
    """Qwen3 2507 Thinking: the prompt ends with `<think>\\n`; the answer starts with reasoning."""

    name = "qwen3-thinking"
    prompt_opens_think = True
