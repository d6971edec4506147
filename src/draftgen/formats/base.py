"""The model-format interface and registry.

A model family is one module that subclasses `Format` and implements the text layer:
how a prompt is rendered, how an answer's native text is rebuilt from reasoning + content +
tool calls, and how native answer text splits back into those parts. The token layer
(encoding, native IDs, the length check, special-token defects) is shared here.
Formats know model formats, never wire protocols.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from draftgen.tokenize import Tokenizer
from draftgen.types import Message, Prompt, RawAnswer, Rebuilt, TokenCheck, Tool

_REGISTRY: dict[str, type[Format]] = {}


class FormatError(Exception):
    """A format cannot be used with this tokenizer or this input."""


@dataclass(slots=True)
class AnswerText:
    """The native text of an answer, as the model would have emitted it."""

    text: str
    flags: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ParsedAnswer:
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finished: bool
    """True when the text ended with the stop token."""


def register(cls: type[Format]) -> type[Format]:
    """Class decorator: make a format available under `cls.name` (and `cls.aliases`)."""
    for key in (cls.name, *cls.aliases):
        _REGISTRY[key] = cls
    return cls


def format_names() -> list[str]:
    _import_builtin_formats()
    return sorted(_REGISTRY)


def get_format(name: str, tokenizer: Tokenizer) -> Format:
    _import_builtin_formats()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise FormatError(
            f"unknown model format {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return cls(tokenizer)


def _import_builtin_formats() -> None:
    # Importing the package registers every module in it.
    import draftgen.formats  # noqa: F401


class Format(ABC):
    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    stop_token: ClassVar[str]
    """The end-of-turn token the model emits when it finishes (e.g. "<|im_end|>")."""
    end_think_token: ClassVar[str | None] = None
    """The end-of-reasoning token ("</think>"), if the family reasons."""
    tool_tokens: ClassVar[tuple[str, ...]] = ()
    """Tokens that frame tool calls in the answer."""
    control_tokens: ClassVar[tuple[str, ...]] = ()
    """Other special tokens of the layout (turn markers); checked at start-up and flagged when
    they appear inside reasoning or content."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    # ---- text layer: each family implements these ---------------------------------------

    @abstractmethod
    def prompt_text(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
        """The native prompt text, ending with the generation prompt."""

    @abstractmethod
    def answer_text(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[dict[str, Any]] | None,
        *,
        finished: bool,
    ) -> AnswerText:
        """The answer's native text. `finished` False (finish_reason "length") means no stop
        token is appended."""

    @abstractmethod
    def parse_answer_text(self, text: str) -> ParsedAnswer:
        """Split native answer text (special tokens kept) into reasoning, content, tool calls."""

    # ---- token layer: shared --------------------------------------------------------------

    def special_tokens(self) -> dict[str, int]:
        """Every special token this format relies on, with its ID in this tokenizer."""
        names = [self.stop_token, *self.control_tokens, *self.tool_tokens]
        if self.end_think_token:
            names.append(self.end_think_token)
        out: dict[str, int] = {}
        for tok in names:
            tid = self.tokenizer.token_to_id(tok)
            if tid is None:
                raise FormatError(
                    f"format {self.name!r}: token {tok!r} is not in tokenizer "
                    f"{self.tokenizer.path}"
                )
            out[tok] = tid
        return out

    @property
    def stop_token_id(self) -> int:
        tid = self.tokenizer.token_to_id(self.stop_token)
        if tid is None:
            raise FormatError(f"format {self.name!r}: stop token {self.stop_token!r} unknown")
        return tid

    def render_prompts(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """Prompt token IDs for a batch (one encode_batch call)."""
        texts = [self.prompt_text(p.messages, p.tools) for p in prompts]
        return self.tokenizer.encode_batch(texts)

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> list[int]:
        return self.tokenizer.encode(self.prompt_text(messages, tools))

    def rebuild_batch(self, answers: Sequence[RawAnswer]) -> list[Rebuilt]:
        """Token IDs for a batch of answers: native where the engine gave them, else rebuilt
        from text and checked against the engine's token count."""
        out: list[Rebuilt | None] = [None] * len(answers)
        to_encode: list[tuple[int, AnswerText, RawAnswer]] = []
        for i, raw in enumerate(answers):
            if raw.output_ids is not None:
                out[i] = self._from_native(raw)
            else:
                finished = raw.finish_reason != "length"
                text = self.answer_text(raw.reasoning, raw.content, raw.tool_calls,
                                        finished=finished)
                to_encode.append((i, text, raw))
        if to_encode:
            encoded = self.tokenizer.encode_batch([t.text for _, t, _ in to_encode])
            for (i, text, raw), ids in zip(to_encode, encoded, strict=True):
                out[i] = Rebuilt(
                    output_ids=ids,
                    token_source="reconstructed",
                    token_check=_length_check(ids, raw.usage.completion_tokens),
                    reasoning=raw.reasoning,
                    content=raw.content,
                    tool_calls=raw.tool_calls,
                    flags=[*text.flags, *self._stray_special_tokens(raw)],
                )
        return [r for r in out if r is not None]

    def _from_native(self, raw: RawAnswer) -> Rebuilt:
        ids = list(raw.output_ids or [])
        flags: list[str] = []
        stop_id = self.stop_token_id
        if (
            raw.finish_reason == "stop"
            and raw.stop_token_id == stop_id
            and (not ids or ids[-1] != stop_id)
        ):
            # The engine reported which stop token it matched but left it out of the list.
            ids.append(stop_id)
            flags.append("stop_token_appended")
        reasoning, content, tool_calls = raw.reasoning, raw.content, raw.tool_calls
        if reasoning is None and content is None:
            parsed = self.parse_answer_text(self.tokenizer.decode(ids))
            reasoning, content, tool_calls = parsed.reasoning, parsed.content, parsed.tool_calls
        return Rebuilt(
            output_ids=ids,
            token_source="native",
            token_check="exact",
            reasoning=reasoning,
            content=content,
            tool_calls=tool_calls,
            flags=flags,
        )

    def _stray_special_tokens(self, raw: RawAnswer) -> list[str]:
        """A stop or end-of-reasoning token inside the text fields is a defect to flag."""
        markers = [self.stop_token, *self.control_tokens]
        if self.end_think_token:
            markers.append(self.end_think_token)
        flags = []
        for field_name, value in (("reasoning", raw.reasoning), ("content", raw.content)):
            if value and any(m in value for m in markers):
                flags.append(f"special_token_in_{field_name}")
        return flags


def _length_check(ids: Sequence[int], completion_tokens: int | None) -> TokenCheck:
    if completion_tokens is None:
        return "unverifiable"
    return "length_ok" if len(ids) == completion_tokens else "length_mismatch"
