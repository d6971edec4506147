"""Kimi formats: `kimi-k2.5` (alias `kimi-k2`) and `kimi-k2-thinking`.

Turns follow each other with no newline: `<|im_{class}|>{name or role}<|im_middle|>…<|im_end|>`
(class user, assistant, or system for every other role). Before them: the tool declarations in
a `<|im_system|>tool_declare<|im_middle|>…<|im_end|>` turn when there are tools, then a default
system turn ("You are Kimi, an AI assistant created by Moonshot AI.") when the conversation
does not start with a system message. An assistant turn is

    <think>REASONING</think>CONTENT[<|tool_calls_section_begin|>CALLS<|tool_calls_section_end|>]

with each call
`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>`
(IDX counts the calls of the whole conversation). Completed turns (up to the last assistant
turn without tool calls) keep `<think></think>` only; the turns of the current tool loop keep
their reasoning. A tool result is `<|im_system|>NAME<|im_middle|>## Return of ID\\n…<|im_end|>`.

- `kimi-k2.5`: the generation prompt is `<|im_assistant|>assistant<|im_middle|><think>`, so
  the answer starts with the reasoning; format option `thinking: false` gives `…<think></think>`
  (the answer is content only; the turns of the current tool loop still keep their reasoning,
  as tinker-cookbook's K2.5 renderer does). Tools are declared in
  TypeScript (see `kimi_tools`), as its tokenizer's `apply_chat_template` does.
- `kimi-k2-thinking`: the generation prompt stops at `<|im_middle|>`; the model writes
  `<think>` itself. Tools are declared as the key-sorted list in compact JSON.

The answer is `REASONING</think>CONTENT[tool section]<|im_end|>`. The model may open the tool
section without `</think>` (vLLM's Kimi reasoning parser takes the section as the end of the
reasoning), and the reasoning/content/tool_calls fields are the same either way: when nothing
stands between the reasoning and the tool section, both texts are candidates (the template's
layout, with `</think>`, first), flagged `end_think_uncertain`; the engine's token count or the
logprobs pick one. Tool-call IDs that are not `functions.NAME:IDX` (a provider rewrote them) are
rebuilt with the conversation-wide index and flagged `tool_call_ids_rebuilt`; the tool results'
`tool_call_id` follow. No whitespace is implied by this layout, so none is restored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from draftgen.formats.base import (
    AnswerText,
    Format,
    FormatError,
    ParsedAnswer,
    answer_finished,
    register,
)
from draftgen.formats.common import (
    ToolCall,
    add_flag,
    function_of,
    parsed_call,
    split_at,
    split_tool_section,
    text_field,
    tool_call_regex,
)
from draftgen.formats.kimi_tools import declare_tools
from draftgen.types import Message, Prompt, RawAnswer, Tool

IM_END = "<|im_end|>"
IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
THINK = "<think>"
END_THINK = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
TOOL_CALL_ID = re.compile(r"functions\.[\w.]+:\d+\Z")
END_THINK_UNCERTAIN = "end_think_uncertain"
IDS_REBUILT = "tool_call_ids_rebuilt"

_CALL = tool_call_regex(CALL_BEGIN, "id", ARG_BEGIN, "args", CALL_END)
_HEADERS = {"user": IM_USER, "assistant": IM_ASSISTANT}


def valid_call_id(call_id: Any) -> bool:
    return isinstance(call_id, str) and TOOL_CALL_ID.match(call_id) is not None


def call_name_from_id(call_id: str) -> str:
    """`functions.get_weather:0` → `get_weather` (as vLLM's Kimi tool parser reads it)."""
    return call_id.split(":")[0].split(".")[-1]


def count_tool_calls(messages: Sequence[Message]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


class _CallIds:
    """Native IDs for a conversation's tool calls, and the tool results' IDs that follow."""

    def __init__(self, messages: Sequence[Message], family: str) -> None:
        self.by_call: dict[int, str] = {}
        self.renamed: dict[str, str] = {}
        index = 0
        for m in messages:
            if m.get("role") != "assistant":
                continue
            for call in m.get("tool_calls") or []:
                given = call.get("id")
                native = native_call_id(call, index, family)
                self.by_call[id(call)] = native
                if isinstance(given, str) and given:
                    self.renamed[given] = native
                index += 1
        self._pending = list(self.by_call.values())

    def of_call(self, call: ToolCall) -> str:
        return self.by_call[id(call)]

    def of_result(self, message: Message) -> str:
        """A tool result's ID: its call's native ID; the next unanswered call's when it names
        none (as the template's queue does)."""
        given = message.get("tool_call_id")
        native = self.renamed.get(given) if isinstance(given, str) else None
        if native is None and not given and self._pending:
            native = self._pending[0]
        if native in self._pending:
            self._pending.remove(native)
        return native or text_field(given, "tool_call_id", "kimi")


def native_call_id(call: ToolCall, index: int, family: str) -> str:
    given = call.get("id")
    if valid_call_id(given):
        return str(given)
    name, _ = function_of(call, family)
    return f"functions.{name}:{index}"


class _KimiLayout(Format):
    stop_token: ClassVar[str] = IM_END
    end_think_token: ClassVar[str | None] = END_THINK
    tool_tokens: ClassVar[tuple[str, ...]] = (
        SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END,
    )
    control_tokens: ClassVar[tuple[str, ...]] = (
        IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE, THINK,
    )

    prompt_opens_think: ClassVar[bool]
    """True when the generation prompt ends with `<think>`."""
    typescript_tools: ClassVar[bool]

    @property
    def thinking(self) -> bool:
        return True

    # ---- prompt ----

    def prompt_text(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
        if not messages:
            raise FormatError(f"{self.name}: a prompt needs at least one message")
        ids = _CallIds(messages, self.name)
        parts = []
        if tools:
            declared = declare_tools(tools, typescript=self.typescript_tools)
            parts.append(f"{IM_SYSTEM}tool_declare{IM_MIDDLE}{declared}{IM_END}")
        if messages[0].get("role") != "system":
            parts.append(f"{IM_SYSTEM}system{IM_MIDDLE}{DEFAULT_SYSTEM}{IM_END}")
        done = _last_plain_assistant(messages)
        for i, m in enumerate(messages):
            parts.append(self._turn(m, ids, keep_reasoning=i > done))
        return "".join(parts) + f"{IM_ASSISTANT}assistant{IM_MIDDLE}{self._generation_suffix()}"

    def _generation_suffix(self) -> str:
        if not self.prompt_opens_think:
            return ""
        return THINK if self.thinking else THINK + END_THINK

    def _turn(self, m: Message, ids: _CallIds, *, keep_reasoning: bool) -> str:
        role = text_field(m.get("role"), "role", self.name)
        name = m.get("name") or role
        head = f"{_HEADERS.get(role, IM_SYSTEM)}{name}{IM_MIDDLE}"
        content = text_field(m.get("content"), f"{role} content", self.name)
        if role == "assistant":
            reasoning = m.get("reasoning_content") if keep_reasoning else None
            body = THINK + text_field(reasoning, "reasoning_content", self.name) + END_THINK
            body += content
            calls = m.get("tool_calls") or []
            if calls:
                body += self._section(calls, [ids.of_call(c) for c in calls])
        elif role == "tool":
            body = f"## Return of {ids.of_result(m)}\n{content}"
        else:
            body = content
        return head + body + IM_END

    def _section(self, calls: Sequence[ToolCall], call_ids: Sequence[str]) -> str:
        blocks = []
        for call, call_id in zip(calls, call_ids, strict=True):
            _, args = function_of(call, self.name)
            blocks.append(f"{CALL_BEGIN}{call_id}{ARG_BEGIN}{args}{CALL_END}")
        return SECTION_BEGIN + "".join(blocks) + SECTION_END

    # ---- answer ----

    def answer_in_context(self, raw: RawAnswer, prompt: Prompt | None) -> AnswerText:
        first_index = count_tool_calls(prompt.messages) if prompt is not None else 0
        return self._answer(raw.reasoning, raw.content, raw.tool_calls,
                            finished=answer_finished(raw), first_index=first_index)

    def answer_text(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[dict[str, Any]] | None,
        *,
        finished: bool,
    ) -> AnswerText:
        return self._answer(reasoning, content, tool_calls, finished=finished, first_index=0)

    def _answer(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[dict[str, Any]] | None,
        *,
        finished: bool,
        first_index: int,
    ) -> AnswerText:
        flags: list[str] = []
        if self.thinking and reasoning is None and content and END_THINK in content:
            reasoning, _, content = content.partition(END_THINK)
            reasoning = reasoning.removeprefix(THINK)
            flags.append("reasoning_in_content")
        calls = list(tool_calls or [])
        text = content or ""
        if calls and SECTION_BEGIN in text:
            flags.append("tool_calls_in_content_and_structured")
        elif calls:
            call_ids = [native_call_id(c, first_index + k, self.name)
                        for k, c in enumerate(calls)]
            if call_ids != [c.get("id") for c in calls]:
                flags.append(IDS_REBUILT)
            text += self._section(calls, call_ids)
        end = IM_END if finished else ""
        if not self.thinking:
            if reasoning:
                flags.append("reasoning_dropped")
            return AnswerText(text + end, flags)
        head = "" if self.prompt_opens_think else THINK
        if not (content or calls or finished):
            return AnswerText(head + (reasoning or ""), flags)
        closed = head + (reasoning or "") + END_THINK + text + end
        if text.startswith(SECTION_BEGIN):
            # Only a tool section after the reasoning: `</think>` may or may not be there.
            add_flag(flags, END_THINK_UNCERTAIN)
            open_ = head + (reasoning or "") + text + end
            return AnswerText(closed, flags, alternatives=[open_])
        return AnswerText(closed, flags)

    # ---- parsing ----

    def parse_answer_text(self, text: str) -> ParsedAnswer:
        finished = text.endswith(IM_END)
        if finished:
            text = text[: -len(IM_END)]
        reasoning: str | None = None
        content: str | None = text
        if self.thinking and (self.prompt_opens_think or text.startswith(THINK)):
            body = text if self.prompt_opens_think else text[len(THINK) :]
            cut = split_at(body, END_THINK, SECTION_BEGIN)
            if cut is None:
                reasoning, content = body, None
            else:
                before, marker, after = cut
                reasoning, content = before, after if marker == END_THINK else marker + after
        calls = None
        if content:
            content, calls = split_tool_section(content, SECTION_BEGIN, _parse_section,
                                                self._render_parsed)
        return ParsedAnswer(reasoning, content, calls, finished)

    def _render_parsed(self, calls: list[ToolCall]) -> str:
        return self._section(calls, [c["id"] for c in calls])


def _parse_section(section: str) -> list[ToolCall] | None:
    if not (section.startswith(SECTION_BEGIN) and section.endswith(SECTION_END)):
        return None
    inner = section[len(SECTION_BEGIN) : -len(SECTION_END)]
    calls = []
    for i, block in enumerate(inner.split(CALL_END)[:-1]):
        m = _CALL.fullmatch(block + CALL_END)
        if m is None:
            return None
        calls.append(parsed_call(call_name_from_id(m["id"]), m["args"], i, m["id"]))
    return calls or None


def _last_plain_assistant(messages: Sequence[Message]) -> int:
    """Index of the last assistant turn without tool calls (-1 if none): it and every turn
    before it are completed and drop their reasoning."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "assistant" and not m.get("tool_calls"):
            return i
    return -1


@register
class KimiK25(_KimiLayout):
    """Kimi-K2.5 (`kimi-k2` is an alias). Format option `thinking` (default true)."""

    name = "kimi-k2.5"
    aliases = ("kimi-k2",)
    prompt_opens_think = True
    typescript_tools = True
    option_types: ClassVar[dict[str, type | tuple[type, ...]]] = {"thinking": bool}

    @property
    def thinking(self) -> bool:
        return bool(self.options.get("thinking", True))


@register
class KimiK2Thinking(_KimiLayout):
    """Kimi-K2-Thinking: the model opens `<think>` itself; tools declared as compact JSON."""

    name = "kimi-k2-thinking"
    prompt_opens_think = False
    typescript_tools = False
