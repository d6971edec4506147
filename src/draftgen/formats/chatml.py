"""ChatML: `chatml` (plain) and `smollm2` (SmolLM2's template, with its default system prompt).

The SmolLM2 default system prompt is handled by a dedicated format name, `smollm2`, rather
than by an option one has to remember; `chatml` also takes the option `default_system` for
other ChatML models whose templates inject one.

A turn is `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`; the generation prompt is
`<|im_start|>assistant\\n`; the answer is the content followed by `<|im_end|>`. No reasoning
and no tool-call layout: ChatML itself has neither.

`smollm2` is `chatml` plus what SmolLM2's chat template adds: when the conversation does not
open with a system message, the template inserts a system turn with `SMOLLM2_SYSTEM`
("You are a helpful AI assistant named SmolLM, trained by Hugging Face").
llama-server's chat endpoint renders that template, so the native path must render the same
prompt for both paths to see the same input.

Inputs the templates cannot render sensibly are handled as in the qwen3 module: a None content
is "" (the template raises); tools, and tool calls in history, raise FormatError (the template
drops them silently, which would train on a prompt the data does not describe).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from draftgen.formats.base import AnswerText, Format, FormatError, ParsedAnswer, register
from draftgen.types import Message, Tool

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def _text(value: Any, what: str, fmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise FormatError(f"{fmt}: {what} must be a string, got {type(value).__name__}")


@register
class ChatML(Format):
    """Plain ChatML: no default system prompt."""

    name = "chatml"
    stop_token: ClassVar[str] = IM_END
    control_tokens: ClassVar[tuple[str, ...]] = (IM_START,)
    default_system: ClassVar[str | None] = None
    """Inserted as a system turn when the conversation does not start with one. The format
    option `default_system` (config `model.format_options`) overrides it, for other ChatML
    models whose template injects one."""
    option_types: ClassVar[dict[str, type | tuple[type, ...]]] = {"default_system": str}

    def _default_system(self) -> str | None:
        options = getattr(self, "options", None) or {}
        return options.get("default_system", self.default_system)

    def prompt_text(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
        if not messages:
            raise FormatError(f"{self.name}: a prompt needs at least one message")
        if tools:
            raise FormatError(f"{self.name}: the format has no tool layout; this prompt has tools")
        parts = []
        system = self._default_system()
        if system is not None and messages[0].get("role") != "system":
            parts.append(f"{IM_START}system\n{system}{IM_END}\n")
        for i, m in enumerate(messages):
            role = m.get("role")
            if not isinstance(role, str) or not role:
                raise FormatError(f"{self.name}: message {i} has no role")
            if m.get("tool_calls"):
                raise FormatError(
                    f"{self.name}: message {i} has tool_calls; the format has no tool layout"
                )
            content = _text(m.get("content"), f"message {i} content", self.name)
            parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
        return "".join(parts) + f"{IM_START}assistant\n"

    def answer_text(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[dict[str, Any]] | None,
        *,
        finished: bool,
    ) -> AnswerText:
        flags: list[str] = []
        if reasoning:
            # A ChatML model has no reasoning layout; a server that split some off (a
            # reasoning parser on `<think>`) left no way to know how it was laid out.
            flags.append("reasoning_dropped")
        if tool_calls:
            flags.append("tool_calls_dropped")
        text = content or ""
        if finished:
            text += IM_END
        return AnswerText(text=text, flags=flags)

    def parse_answer_text(self, text: str) -> ParsedAnswer:
        finished = text.endswith(IM_END)
        if finished:
            text = text[: -len(IM_END)]
        return ParsedAnswer(reasoning=None, content=text, tool_calls=None, finished=finished)


@register
class SmolLM2(ChatML):
    """SmolLM2-Instruct: ChatML with the template's default system prompt."""

    name = "smollm2"
    default_system: ClassVar[str | None] = SMOLLM2_SYSTEM
