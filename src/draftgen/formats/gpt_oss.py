"""`gpt-oss`: OpenAI's harmony format.

The generation prompt ends with `<|start|>assistant`. An answer is a sequence of messages on
channels, each but the last closed by `<|end|>` and followed by `<|start|>assistant`:

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>final<|message|>CONTENT<|return|>

(one line: the break is for reading), or, for a tool call (the model stops at `<|call|>`):

    …<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>A<|call|>

Text preceding a tool call is a commentary preamble,
`<|channel|>commentary<|message|>CONTENT<|end|><|start|>assistant`, flagged `layout_uncertain`
(a server may also have returned it from the analysis channel). Several tool calls each end with
`<|call|>`, the next following `<|start|>assistant` (as openai-harmony renders them), flagged
`multiple_tool_calls`: the model emits one per answer.

Prompts (format option `renderer`):
- "harmony" (default): as vLLM renders them (`formats.harmony`: openai-harmony renders the
  system and developer messages, the turns follow its layout), with the options
  `reasoning_effort` (default "medium"), `model_identity`, `current_date` (YYYY-MM-DD; default
  today), `history_constrain` (past tool calls as `<|constrain|>json`, as the model emits
  them, instead of vLLM's `json`) and `history_reasoning` ("drop_answered": the reasoning
  before the last final answer is dropped; "current_turn": only the current turn's).
- "hf_template": the model's Hugging Face chat template (what SGLang's and llama.cpp's chat
  endpoints render): the template in the tokenizer folder when there is one, else that
  template written in Python here (tool parameters that are nested objects or `oneOf` unions
  need the template).
See docs/formats.md for the evidence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar

from draftgen.formats.base import AnswerText, Format, FormatError, ParsedAnswer, register
from draftgen.formats.chat_template import ChatTemplate, tokenizer_folder
from draftgen.formats.common import (
    ToolCall,
    add_flag,
    arguments_value,
    function_of,
    parsed_call,
    text_field,
    tojson,
)
from draftgen.formats.harmony import (
    CALL,
    CHANNEL,
    EFFORTS,
    END,
    HISTORY_REASONING,
    MESSAGE,
    START,
    render_prompt,
)
from draftgen.tokenize import Tokenizer
from draftgen.types import Message, Tool

RETURN = "<|return|>"
CONSTRAIN = "<|constrain|>"

NEXT = END + START + "assistant"
"""Between two messages of one answer."""
NEXT_CALL = CALL + START + "assistant"
"""Between a tool call and the next message of one answer (several parallel calls)."""
_SEPARATOR = re.compile(f"(?:{re.escape(END)}|{re.escape(CALL)}){re.escape(START)}assistant")
RENDERERS = ("harmony", "hf_template")
DEFAULT_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"
CHANNELS_LINE = (
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)
TOOLS_LINE = "\nCalls to these tools must go to the commentary channel: 'functions'."

_CALL_HEADER = re.compile(
    rf"commentary to=functions\.(?P<name>[^\s<]+) {re.escape(CONSTRAIN)}json\Z"
)
_SCALARS = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean"}


@register
class GptOss(Format):
    name = "gpt-oss"
    stop_token: ClassVar[str] = RETURN
    extra_stop_tokens: ClassVar[tuple[str, ...]] = (CALL,)
    answer_continuation: ClassVar[tuple[str, str] | None] = (CALL, START)
    end_think_token: ClassVar[str | None] = END
    """The analysis message (the reasoning) ends with `<|end|>`."""
    tool_tokens: ClassVar[tuple[str, ...]] = (CONSTRAIN,)
    control_tokens: ClassVar[tuple[str, ...]] = (START, MESSAGE, CHANNEL)
    option_types: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "reasoning_effort": str,
        "model_identity": str,
        "current_date": str,
        "renderer": str,
        "history_constrain": bool,
        "history_reasoning": str,
    }

    def __init__(self, tokenizer: Tokenizer, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(tokenizer, options)
        self.effort = self.options.get("reasoning_effort", "medium")
        self.identity = self.options.get("model_identity")
        date = self.options.get("current_date")
        try:
            self._today = datetime.strptime(date, "%Y-%m-%d") if date else None
        except ValueError:
            raise FormatError(f"gpt-oss: current_date must be YYYY-MM-DD, got {date!r}") from None
        self.renderer = self.options.get("renderer", "harmony")
        if self.renderer not in RENDERERS:
            raise FormatError(f"gpt-oss: format option renderer must be one of "
                              f"{', '.join(RENDERERS)}, got {self.renderer!r}")
        if self.renderer == "harmony" and self.effort not in EFFORTS:
            raise FormatError(f"gpt-oss: reasoning_effort must be one of "
                              f"{', '.join(EFFORTS)}, got {self.effort!r}")
        self.history_reasoning = self.options.get("history_reasoning", "drop_answered")
        if self.history_reasoning not in HISTORY_REASONING:
            raise FormatError(f"gpt-oss: history_reasoning must be one of "
                              f"{', '.join(HISTORY_REASONING)}, got {self.history_reasoning!r}")
        self.call_content_type = (CONSTRAIN + "json" if self.options.get("history_constrain")
                                  else "json")
        self.template = (ChatTemplate.from_folder(tokenizer_folder(tokenizer), self._now)
                         if self.renderer == "hf_template" else None)

    def _now(self) -> datetime:
        return self._today or datetime.now()

    # ---- prompt ----

    def prompt_text(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
        if not messages:
            raise FormatError("gpt-oss: a prompt needs at least one message")
        if self.renderer == "harmony":
            return render_prompt(
                messages, tools, effort=self.effort, date=f"{self._now():%Y-%m-%d}",
                identity=self.identity, call_content_type=self.call_content_type,
                history_reasoning=self.history_reasoning)
        if self.template is not None:
            extra = {"model_identity": self.identity} if self.identity else {}
            return self.template.render(messages, tools, add_generation_prompt=True,
                                        reasoning_effort=self.effort, **extra)
        return self._python_prompt(messages, tools) + START + "assistant"

    def _python_prompt(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
        system = (
            f"{self.identity or DEFAULT_IDENTITY}\nKnowledge cutoff: {KNOWLEDGE_CUTOFF}\n"
            f"Current date: {self._now():%Y-%m-%d}\n\nReasoning: {self.effort}\n\n"
            + CHANNELS_LINE + (TOOLS_LINE if tools else "")
        )
        parts = [f"{START}system{MESSAGE}{system}{END}"]
        first = messages[0].get("role")
        developer = ""
        turns = messages
        if first in ("system", "developer"):
            developer = text_field(messages[0].get("content"), "system content", self.name)
            turns = messages[1:]
        if developer or tools:
            body = f"# Instructions\n\n{developer}\n\n" if developer else ""
            body += "# Tools\n\n" + _namespace(tools) if tools else ""
            parts.append(f"{START}developer{MESSAGE}{body}{END}")
        parts.extend(_turns(turns))
        return "".join(parts)

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
        if reasoning is None:
            flags.append("reasoning_missing")
        calls = list(tool_calls or [])
        messages: list[str] = []
        if reasoning:
            messages.append(f"{CHANNEL}analysis{MESSAGE}{reasoning}")
        if calls:
            if content:
                add_flag(flags, "layout_uncertain")
                messages.append(f"{CHANNEL}commentary{MESSAGE}{content}")
            if len(calls) > 1:
                flags.append("multiple_tool_calls")
            messages.append(NEXT_CALL.join(self._call_message(c) for c in calls))
            stop = CALL
        elif content or finished:
            messages.append(f"{CHANNEL}final{MESSAGE}{content or ''}")
            stop = RETURN
        else:
            stop = ""
        text = NEXT.join(messages) + (stop if finished else "")
        return AnswerText(text, flags)

    def _call_message(self, call: ToolCall) -> str:
        name, args = function_of(call, self.name)
        return f"{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}{args}"

    # ---- parsing ----

    def parse_answer_text(self, text: str) -> ParsedAnswer:
        finished = text.endswith((RETURN, CALL))
        body = text[: -len(RETURN if text.endswith(RETURN) else CALL)] if finished else text
        reasoning: str | None = None
        content: str | None = None
        calls: list[ToolCall] = []
        for message in _SEPARATOR.split(body):
            header, sep, payload = message.removeprefix(CHANNEL).partition(MESSAGE)
            m = _CALL_HEADER.match(header)
            if not message.startswith(CHANNEL) or not sep:
                return ParsedAnswer(None, text, None, False)
            if header == "analysis" and reasoning is None and content is None and not calls:
                reasoning = payload
            elif header in ("final", "commentary") and content is None and not calls:
                content = payload
            elif m is not None:
                calls.append(parsed_call(m["name"], payload, len(calls)))
            else:
                return ParsedAnswer(None, text, None, False)
        parsed = ParsedAnswer(reasoning, content, calls or None, finished)
        again = self.answer_text(reasoning, content, calls or None, finished=finished)
        if again.text != text:
            return ParsedAnswer(None, text, None, finished)
        return parsed


# ---- the harmony prompt in Python ------------------------------------------------------------


def _turns(messages: Sequence[Message]) -> list[str]:
    out = []
    last_call: str | None = None
    for i, m in enumerate(messages):
        role = m.get("role")
        content = text_field(m.get("content"), f"{role} content", "gpt-oss")
        if role == "user":
            out.append(f"{START}user{MESSAGE}{content}{END}")
        elif role == "assistant" and "tool_calls" in m:
            out.append(_history_call(messages, i))
            last_call, _ = function_of((m.get("tool_calls") or [{}])[0], "gpt-oss")
        elif role == "assistant":
            out.append(f"{START}assistant{CHANNEL}final{MESSAGE}{content}{END}")
            last_call = None
        elif role == "tool":
            if last_call is None:
                raise FormatError(f"gpt-oss: message {i} is a tool result without a tool call")
            out.append(f"{START}functions.{last_call} to=assistant{CHANNEL}commentary{MESSAGE}"
                       f"{tojson(content)}{END}")
        elif role not in ("system", "developer"):  # later ones are dropped, as in the template
            raise FormatError(f"gpt-oss: unsupported message role {role!r} (message {i})")
    return out


def _history_call(messages: Sequence[Message], i: int) -> str:
    """A past tool call: its analysis kept only while no final answer follows it."""
    m = messages[i]
    calls = m.get("tool_calls") or []
    if not calls:
        raise FormatError(f"gpt-oss: message {i} has an empty tool_calls list")
    name, _ = function_of(calls[0], "gpt-oss")
    final_later = any(n.get("role") == "assistant" and "tool_calls" not in n
                      for n in messages[i + 1 :])
    thinking = m.get("thinking") or m.get("reasoning_content")
    content = m.get("content")
    if content and thinking:
        raise FormatError(f"gpt-oss: message {i} has both content and thinking with a tool call")
    analysis = content or thinking
    head = ""
    if analysis and not final_later:
        head = f"{START}assistant{CHANNEL}analysis{MESSAGE}{analysis}{END}"
    args = tojson(arguments_value(calls[0]))
    return (f"{head}{START}assistant to=functions.{name}{CHANNEL}commentary json{MESSAGE}"
            f"{args}{CALL}")


def _namespace(tools: Sequence[Tool]) -> str:
    out = ["## functions\n\nnamespace functions {\n\n"]
    for tool in tools:
        fn = tool.get("function") or {}
        out.append(f"// {fn.get('description') or ''}\ntype {fn.get('name')} = ")
        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        if not props:
            out.append("() => any;\n\n")
            continue
        required = params.get("required") or []
        out.append("(_: {\n")
        for name, spec in props.items():
            if spec.get("description"):
                out.append(f"// {spec['description']}\n")
            out.append(f"{name}{'' if name in required else '?'}: {_ts_type(name, spec)}")
            out.append(_default(spec) + ",\n")
        out.append("}) => any;\n\n")
    out.append("} // namespace functions")
    return "".join(out)


def _ts_type(name: str, spec: Mapping[str, Any]) -> str:
    t = spec.get("type")
    null = " | null" if spec.get("nullable") else ""
    if isinstance(t, list) and t:
        return " | ".join(map(str, t))
    if t == "array":
        items = spec.get("items")
        if items is None:
            return "any[]" + null
        inner = _SCALARS.get(items.get("type"))
        if inner is None:
            raise FormatError(f"gpt-oss: tool parameter {name!r}: arrays of non-scalar items "
                              "need the model's chat template in the tokenizer folder")
        return inner + "[]" + null
    if "oneOf" in spec or t == "object":
        raise FormatError(f"gpt-oss: tool parameter {name!r}: nested objects and oneOf need the "
                          "model's chat template in the tokenizer folder")
    if t == "string" and spec.get("enum"):
        return '"' + '" | "'.join(map(str, spec["enum"])) + '"'
    if t == "string":
        return "string" + null
    return _SCALARS.get(str(t), "any")


def _default(spec: Mapping[str, Any]) -> str:
    if "default" not in spec:
        return ""
    if spec.get("enum"):
        return f", // default: {spec['default']}"
    return f", // default: {tojson(spec['default'])}"
