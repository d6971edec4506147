"""`chat-template`: the generic fallback for models nobody wrote a module for, and the Jinja
renderer other families use when the tokenizer folder carries the model's own template.

Prompts are rendered with the tokenizer folder's chat template (`chat_template.jinja`, else
`tokenizer_config.json`'s `chat_template`) the way transformers renders it: a sandboxed,
immutable Jinja environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, transformers' `tojson` (no HTML escaping, `ensure_ascii=False`), `raise_exception`,
`strftime_now`, and the special tokens (`bos_token`, `eos_token`, ...) from the config.

Answers are rebuilt as `[start_think] reasoning end_think content stop_token`, from format
options (config `model.format_options`):

- `stop_token` (default: the config's `eos_token`): the end-of-turn token the model emits;
- `end_think_token`, `start_think_token` (default: none): the reasoning tags, when it reasons.
  The answer opens `start_think_token` itself unless the generation prompt already ends with it;
- `generation_prompt_suffix` (default ""): appended to the rendered prompt (`<think>\\n` for a
  model whose template leaves the think tag to the server);
- `template_kwargs` (default {}): extra template variables (`enable_thinking: false`, ...).

What this generic layer cannot know is flagged: the whitespace around the reasoning tags
(`whitespace_uncertain` when the fields have none at the seams) and tool calls
(`tool_calls_unsupported`: there is no generic native layout for them; the record keeps them in
`tool_calls`, but its IDs lack them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from draftgen.formats.base import (
    WHITESPACE_UNCERTAIN,
    AnswerText,
    Format,
    FormatError,
    ParsedAnswer,
    register,
)
from draftgen.tokenize import Tokenizer
from draftgen.types import Message, Tool

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def hf_tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' replacement for Jinja's HTML-escaping `tojson`."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def tokenizer_folder(tokenizer: Tokenizer) -> Path:
    return tokenizer.path if tokenizer.path.is_dir() else tokenizer.path.parent


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A model's Jinja chat template, rendered as transformers renders it."""

    def __init__(self, source: str, special_tokens: Mapping[str, str],
                 now: Callable[[], datetime] = datetime.now) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = hf_tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        self.special_tokens = dict(special_tokens)
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            raise FormatError(f"the chat template does not compile: {e}") from None

    @classmethod
    def from_folder(cls, folder: Path, now: Callable[[], datetime] = datetime.now
                    ) -> ChatTemplate | None:
        """The folder's template (`chat_template.jinja` first, as recent transformers reads
        it), or None when it has none."""
        config: dict[str, Any] = {}
        config_file = folder / "tokenizer_config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except ValueError as e:
                raise FormatError(f"{config_file}: not JSON: {e}") from None
        source: Any = None
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            source = jinja_file.read_text(encoding="utf-8")
        else:
            source = config.get("chat_template")
            if isinstance(source, list):  # named templates: the default one
                source = next((t.get("template") for t in source
                               if isinstance(t, dict) and t.get("name") == "default"), None)
        if not isinstance(source, str):
            return None
        tokens = {k: t for k in _SPECIAL_TOKEN_KEYS if (t := _token_text(config.get(k)))}
        return cls(source, tokens, now)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] | None,
        *,
        add_generation_prompt: bool,
        **kwargs: Any,
    ) -> str:
        try:
            return self._template.render(
                messages=list(messages), tools=list(tools) if tools else None,
                documents=None,  # transformers passes it always: `documents is defined` holds
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens, **kwargs,
            )
        except TemplateError as e:
            raise FormatError(f"the chat template cannot render this conversation: {e}") from None


@register
class ChatTemplateFormat(Format):
    """Prompts from the tokenizer folder's own chat template; answers from configured tokens."""

    name = "chat-template"
    stop_token: ClassVar[str] = ""  # per instance, from the options
    option_types: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "stop_token": str,
        "end_think_token": str,
        "start_think_token": str,
        "generation_prompt_suffix": str,
        "template_kwargs": dict,
    }

    def __init__(self, tokenizer: Tokenizer, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(tokenizer, options)
        folder = tokenizer_folder(tokenizer)
        template = ChatTemplate.from_folder(folder)
        if template is None:
            raise FormatError(
                f"format 'chat-template': {folder} has no chat template (chat_template.jinja "
                "or tokenizer_config.json's chat_template)"
            )
        self.template = template
        stop = self.options.get("stop_token") or template.special_tokens.get("eos_token")
        if not stop:
            raise FormatError("format 'chat-template': set format option stop_token (the "
                              "tokenizer config names no eos_token)")
        self.stop_token = stop  # type: ignore[misc]
        self.end_think_token = self.options.get("end_think_token")  # type: ignore[misc]
        self.start_think = self.options.get("start_think_token")
        self.suffix = self.options.get("generation_prompt_suffix", "")
        self.kwargs = dict(self.options.get("template_kwargs", {}))
        self.control_tokens = (self.start_think,) if self.start_think else ()  # type: ignore[misc]
        self._prompt_opens_think = bool(self.start_think) and self.prompt_text(
            [{"role": "user", "content": "Hi"}], None
        ).rstrip().endswith(str(self.start_think))

    def prompt_text(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> str:
        if not messages:
            raise FormatError("chat-template: a prompt needs at least one message")
        text = self.template.render(messages, tools, add_generation_prompt=True, **self.kwargs)
        return text + self.suffix

    def answer_text(
        self,
        reasoning: str | None,
        content: str | None,
        tool_calls: Sequence[dict[str, Any]] | None,
        *,
        finished: bool,
    ) -> AnswerText:
        flags: list[str] = []
        if tool_calls:
            flags.append("tool_calls_unsupported")
        end = self.stop_token if finished else ""
        end_think = self.end_think_token
        thinks = bool(end_think) and (reasoning is not None or self._prompt_opens_think)
        if not thinks:
            if reasoning:
                flags.append("reasoning_dropped")
            return AnswerText((content or "") + end, flags)
        head = self.start_think if self.start_think and not self._prompt_opens_think else ""
        body = reasoning or ""
        if not (content or finished):
            return AnswerText(f"{head}{body}", flags)
        if (body and not body[-1].isspace()) or (content and not content[0].isspace()):
            flags.append(WHITESPACE_UNCERTAIN)
        return AnswerText(f"{head}{body}{end_think}{content or ''}{end}", flags)

    def parse_answer_text(self, text: str) -> ParsedAnswer:
        finished = bool(self.stop_token) and text.endswith(self.stop_token)
        if finished:
            text = text[: -len(self.stop_token)]
        end_think = self.end_think_token
        if not end_think:
            return ParsedAnswer(None, text, None, finished)
        if self.start_think and not self._prompt_opens_think:
            if not text.startswith(self.start_think):
                return ParsedAnswer(None, text, None, finished)
            text = text[len(self.start_think) :]
        head, sep, tail = text.partition(end_think)
        return ParsedAnswer(head, tail, None, finished) if sep else ParsedAnswer(
            text, None, None, finished)
