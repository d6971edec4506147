"""The model-format interface and registry.

A model family is one module that subclasses `Format` and implements the text layer:
how a prompt is rendered, how an answer's native text is rebuilt from reasoning + content +
tool calls, and how native answer text splits back into those parts. The token layer
(encoding, native IDs, the length check, special-token defects) is shared here.
Formats know model formats, never wire protocols.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from draftgen.errors import DraftgenError
from draftgen.formats.agreement import text_problems
from draftgen.tokenize import Tokenizer, last_logprob_id, logprob_ids
from draftgen.types import Message, Prompt, RawAnswer, Rebuilt, TokenCheck, Tool

_REGISTRY: dict[str, type[Format]] = {}


class FormatError(DraftgenError):
    """A format cannot be used with this tokenizer or this input."""


WHITESPACE_RESTORED = "whitespace_restored"
WHITESPACE_UNCERTAIN = "whitespace_uncertain"
LOGPROBS_INCOMPLETE = "logprobs_incomplete"
IDS_FROM_LOGPROBS = "ids_from_logprobs"
STOP_TOKEN_APPENDED = "stop_token_appended"
ENGINE_IDS_NOT_TEXT = "engine_ids_not_text"
"""The engine sent token IDs and text, and the IDs decode to another text: they are not the
answer's (however in range), so its IDs are rebuilt from the text and it is not `exact`."""
CHOSEN_BY_LENGTH = "layout_chosen_by_length"
UNCERTAIN_SUFFIX = "_uncertain"
"""Flags ending with this name a layout detail the text cannot settle (`whitespace_uncertain`,
`end_think_uncertain`); `AnswerText.alternatives` then holds the other plausible texts."""


@dataclass(slots=True)
class AnswerText:
    """The native text of an answer, as the model would have emitted it."""

    text: str
    flags: list[str] = field(default_factory=list)
    alternatives: list[str] = field(default_factory=list)
    """Other plausible native texts, when the fields cannot settle a layout detail (stripped
    whitespace, an omitted `</think>`). `text` is the preferred one. The token layer keeps the
    one whose length equals the engine's token count when exactly one does."""

    @property
    def candidates(self) -> list[str]:
        return [self.text, *(a for a in self.alternatives if a != self.text)]


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


def get_format(
    name: str, tokenizer: Tokenizer, options: Mapping[str, Any] | None = None
) -> Format:
    """The format registered under `name`, with its `options` (config `model.format_options`)."""
    _import_builtin_formats()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise FormatError(
            f"unknown model format {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return cls(tokenizer, options)


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
    extra_stop_tokens: ClassVar[tuple[str, ...]] = ()
    """Other tokens that end an answer (gpt-oss ends a tool call with `<|call|>`)."""
    answer_continuation: ClassVar[tuple[str, str] | None] = None
    """(stop token, next token): a stop token followed by that token inside an answer is not
    its end (gpt-oss: `<|call|><|start|>` between parallel tool calls)."""
    option_types: ClassVar[Mapping[str, type | tuple[type, ...]]] = {}
    """The options this format accepts (config `model.format_options`) and their types."""

    def __init__(self, tokenizer: Tokenizer, options: Mapping[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.options: dict[str, Any] = dict(options or {})
        self._check_options()

    def _check_options(self) -> None:
        for key, value in self.options.items():
            want = self.option_types.get(key)
            if want is None:
                known = ", ".join(sorted(self.option_types)) or "none"
                raise FormatError(
                    f"format {self.name!r}: unknown format option {key!r} (known: {known})"
                )
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise FormatError(
                    f"format {self.name!r}: format option {key!r} has the wrong type "
                    f"({type(value).__name__})"
                )

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

    def answer_in_context(self, raw: RawAnswer, prompt: Prompt | None) -> AnswerText:
        """The answer's native text, given the prompt it answers when the caller has it.

        Families whose answer layout depends on the prompt (Kimi's conversation-wide tool-call
        index, DeepSeek's turn after tool outputs) override this; `prompt` None means "a
        first turn"."""
        return self.answer_text(
            raw.reasoning, raw.content, raw.tool_calls, finished=answer_finished(raw)
        )

    # ---- token layer: shared --------------------------------------------------------------

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        return (self.stop_token, *self.extra_stop_tokens)

    def special_tokens(self) -> dict[str, int]:
        """Every special token this format relies on, with its ID in this tokenizer."""
        names = [*self.stop_tokens, *self.control_tokens, *self.tool_tokens]
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

    def rebuild_batch(
        self,
        answers: Sequence[RawAnswer],
        prompts: Sequence[Prompt | None] | None = None,
    ) -> list[Rebuilt]:
        """Token IDs for a batch of answers, in order of preference:

        1. native: IDs the engine reported (`output_ids`);
        2. native: IDs recovered from per-token logprobs, when they cover the whole answer
           (see `_ids_from_logprobs`);
        3. reconstructed: the native text encoded (one `encode_batch` call for the batch),
           checked against the engine's token count.

        `prompts[i]`, when given, is the prompt that `answers[i]` answers (see
        `answer_in_context`)."""
        if prompts is not None and len(prompts) != len(answers):
            raise ValueError("rebuild_batch: prompts and answers differ in length")
        out: list[Rebuilt | None] = [None] * len(answers)
        pending: list[tuple[int, AnswerText, RawAnswer]] = []
        for i, raw in enumerate(answers):
            native = self._from_native(raw) if raw.output_ids is not None else None
            if native is not None:
                out[i] = native
                continue
            text = self.answer_in_context(raw, prompts[i] if prompts is not None else None)
            if raw.output_ids is not None:
                text.flags.append(ENGINE_IDS_NOT_TEXT)
            if raw.logprobs:
                ids = self._ids_from_logprobs(raw, text)
                if ids is not None:
                    out[i] = self._from_logprobs(raw, ids)
                    if raw.output_ids is not None:
                        out[i].flags.append(ENGINE_IDS_NOT_TEXT)
                    continue
                text.flags.append(LOGPROBS_INCOMPLETE)
            pending.append((i, text, raw))
        if pending:
            texts = [c for _, t, _ in pending for c in t.candidates]
            encoded = iter(self.tokenizer.encode_batch(texts))
            for i, text, raw in pending:
                options = [next(encoded) for _ in text.candidates]
                out[i] = self._reconstructed(raw, text, options)
        return [r for r in out if r is not None]

    def _reconstructed(
        self, raw: RawAnswer, text: AnswerText, options: list[list[int]]
    ) -> Rebuilt:
        """The encoded candidate to keep: the preferred one, unless exactly one candidate has
        the engine's token count."""
        flags = list(text.flags)
        ids = options[0]
        n = raw.usage.completion_tokens
        if len(options) > 1 and n is not None:
            matching = [o for o in options if len(o) == n]
            if len(matching) == 1:
                ids = matching[0]
                flags = [f for f in flags if not f.endswith(UNCERTAIN_SUFFIX)]
                flags.append(CHOSEN_BY_LENGTH)
        return Rebuilt(
            output_ids=ids,
            token_source="reconstructed",
            token_check=_length_check(ids, n),
            reasoning=raw.reasoning,
            content=raw.content,
            tool_calls=raw.tool_calls,
            flags=[*flags, *self._stray_special_tokens(raw)],
        )

    def _ids_from_logprobs(self, raw: RawAnswer, text: AnswerText) -> list[int] | None:
        """The sampled IDs, from per-token logprobs, when they provably cover the whole answer.

        Complete means: every entry maps to one vocabulary ID (its `id`, else its bytes through
        the tokenizer's inverted byte table), and the IDs decode to exactly one of the answer's
        candidate native texts, either whole or less its final stop token. In the second case
        the answer finished (the candidate ends with a stop token only then) and the stop token
        is certain, so its ID is appended. Anything else (logprobs over the content only, none
        for the reasoning, an unknown token) is incomplete: None."""
        n = raw.usage.completion_tokens
        recovered = logprob_ids(self.tokenizer, raw.logprobs or [], n)
        if recovered is None:
            return None
        ids = recovered.ids
        decoded = (self.tokenizer.text_of(ids) if recovered.data is None
                   else self.tokenizer.text_of_bytes(ids, recovered.data))
        found: list[int] | None = None
        for candidate in text.candidates:
            if decoded == candidate:
                found = ids
                break
            for stop in self.stop_tokens:
                if candidate.endswith(stop) and decoded == candidate[: -len(stop)]:
                    stop_id = self.tokenizer.token_to_id(stop)
                    if stop_id is not None:
                        found = [*ids, stop_id]
                        break
            if found is not None:
                break
        if found is None:
            found = self._ids_matching_fields(raw, ids, decoded)
        # The engine's count must agree: an answer cut off inside a multi-byte character has
        # its last tokens in no logprob entry (llama-server holds them back) and its text cut
        # before them, so the IDs above decode to the text yet miss the tail.
        if found is not None and n is not None and len(found) != n:
            return None
        return found

    def _ids_matching_fields(self, raw: RawAnswer, ids: list[int], decoded: str
                             ) -> list[int] | None:
        """Logprob IDs whose text differs from every candidate only where the fields cannot
        say what the model wrote (newlines around reasoning and content, the spelling of tool
        call arguments): the logprobs are the better witness then. They must hold the same
        reasoning, content and tool names as the fields, or they cover only part of the
        answer (None)."""
        if answer_finished(raw) and not any(decoded.endswith(s) for s in self.stop_tokens):
            stop_id = self.tokenizer.token_to_id(self.stop_token)
            if stop_id is None:
                return None
            decoded, ids = decoded + self.stop_token, [*ids, stop_id]
        parsed = self.parse_answer_text(decoded)
        if not parsed.finished and answer_finished(raw):
            return None
        if _stripped(parsed.reasoning) != _stripped(raw.reasoning):
            return None
        if _stripped(parsed.content) != _stripped(raw.content):
            return None
        if _tool_names(parsed.tool_calls) != _tool_names(raw.tool_calls):
            return None
        return ids

    def _from_logprobs(self, raw: RawAnswer, ids: list[int]) -> Rebuilt:
        # Appended: the last ID is not the one the last logprob entry stands for (one entry can
        # stand for several IDs, see `ids_from_logprobs`, so the counts do not tell).
        appended = bool(ids) and last_logprob_id(self.tokenizer, raw.logprobs or []) != ids[-1]
        flags = [IDS_FROM_LOGPROBS, *([STOP_TOKEN_APPENDED] if appended else [])]
        return Rebuilt(
            output_ids=ids,
            token_source="native",
            token_check="exact",
            reasoning=raw.reasoning,
            content=raw.content,
            tool_calls=raw.tool_calls,
            flags=[*flags, *self._stray_special_tokens(raw)],
        )

    def _from_native(self, raw: RawAnswer) -> Rebuilt | None:
        """The engine's IDs, where they are the answer's: None where the engine sent text
        too and the IDs decode to another (`ids_are_text`)."""
        ids = list(raw.output_ids or [])
        flags: list[str] = []
        stop_ids = {self.tokenizer.token_to_id(t) for t in self.stop_tokens} - {None}
        if (
            answer_finished(raw)
            and raw.stop_token_id in stop_ids
            and (not ids or ids[-1] not in stop_ids)
        ):
            # The engine reported which stop token it matched but left it out of the list.
            ids.append(raw.stop_token_id)
            flags.append(STOP_TOKEN_APPENDED)
        reasoning, content, tool_calls = raw.reasoning, raw.content, raw.tool_calls
        if reasoning is None and content is None:
            parsed = self.parse_answer_text(self.tokenizer.text_of(ids))
            reasoning, content, tool_calls = parsed.reasoning, parsed.content, parsed.tool_calls
        elif not self.ids_are_text(ids, raw):
            return None
        return Rebuilt(
            output_ids=ids,
            token_source="native",
            token_check="exact",
            reasoning=reasoning,
            content=content,
            tool_calls=tool_calls,
            flags=flags,
        )

    def ids_are_text(self, ids: list[int], raw: RawAnswer) -> bool:
        """Whether `ids` decode to the answer's text fields, as the audit checks a record
        (`agreement.text_problems`); reasoning left in the content is split off first."""
        try:
            parsed = self.parse_answer_text(self.tokenizer.text_of(ids))
        except (FormatError, KeyError, ValueError):
            return False
        cut_off = not answer_finished(raw)
        sent = ParsedAnswer(raw.reasoning, raw.content, raw.tool_calls, True)
        if not text_problems(parsed, sent, [], cut_off):
            return True
        if raw.reasoning is None and raw.content:
            split = self.parse_answer_text(raw.content)
            sent = ParsedAnswer(split.reasoning, split.content, raw.tool_calls, True)
            return not text_problems(parsed, sent, [], cut_off)
        return False

    def _stray_special_tokens(self, raw: RawAnswer) -> list[str]:
        """A stop, turn or end-of-reasoning token inside the text fields is a defect to flag."""
        markers = [*self.stop_tokens, *self.control_tokens]
        if self.end_think_token:
            markers.append(self.end_think_token)
        flags = []
        for field_name, value in (("reasoning", raw.reasoning), ("content", raw.content)):
            if value and any(m in value for m in markers):
                flags.append(f"special_token_in_{field_name}")
        return flags


def _stripped(text: str | None) -> str:
    return (text or "").strip()


def _tool_names(calls: Sequence[dict[str, Any]] | None) -> list[str]:
    return [str((c.get("function") or c).get("name")) for c in calls or []]


def answer_finished(raw: RawAnswer) -> bool:
    """Whether the answer ended with an end-of-turn token: every finish but a cut-off.
    (`length` is the OpenAI spelling; SGLang's native API says the same.)"""
    return raw.finish_reason != "length"


def _length_check(ids: Sequence[int], completion_tokens: int | None) -> TokenCheck:
    if completion_tokens is None:
        return "unverifiable"
    return "length_ok" if len(ids) == completion_tokens else "length_mismatch"
