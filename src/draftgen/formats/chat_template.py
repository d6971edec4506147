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

A template is code from the model's folder, so it runs within limits (`RenderLimits`): a
`range` of at most `MAX_RANGE` items (as transformers' sandbox), a time limit checked at every
loop iteration and call, an output size limit, and no `*`/`**` that builds a huge string or
number. A template past one of them raises `TemplateDidNotFinish`, which names the template's
file: it is the template at fault, not one conversation, so commands stop on it.

What this generic layer cannot know is flagged: the whitespace around the reasoning tags
(`whitespace_uncertain` when the fields have none at the seams) and tool calls
(`tool_calls_unsupported`: there is no generic native layout for them; the record keeps them in
`tool_calls`, but its IDs lack them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.runtime import Context
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment

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
_GUARD_FILTER = "draftgen_within_limits"
"""The filter put around every `for` loop's iterable: it counts the loop's steps against the
render's limits. Filters are looked up in the environment, so a template cannot shadow it."""
_MAX_POWER_BITS = 1 << 16
"""The largest integer `**` may build (bits): far above any template's arithmetic, far below
the minutes a huge power takes."""


class TemplateDidNotFinish(FormatError):
    """A chat template past a render limit (time, output size, range, recursion): the template
    is at fault whatever the conversation, so a command stops on it rather than trying it on
    every row."""


class _LimitReached(Exception):
    """Raised inside a render that went past a limit; `ChatTemplate.render` words it."""


@dataclass(slots=True)
class RenderLimits:
    """How far one render may go. Real templates take milliseconds and write a little more
    than the conversation; a template past these is looping or blowing up."""

    seconds: float = 10.0
    """Wall time per render, plus `seconds_per_mb` for each MB of conversation text."""
    seconds_per_mb: float = 1.0
    chars: int = 16 << 20
    """Output size per render (characters), plus `chars_per_input_char` per input character."""
    chars_per_input_char: int = 8


@dataclass(slots=True)
class _Budget:
    deadline: float
    seconds: float
    chars: int

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise _LimitReached(f"it ran for more than {self.seconds:.3g} s (a loop that does "
                                "not end, such as nested range()s?)")


_BUDGET: ContextVar[_Budget | None] = ContextVar("draftgen_template_budget", default=None)


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()


class _Counted:
    """A loop's iterable that checks the render's time limit at each step; `len` as the
    original's, so `loop.length` reads the same."""

    __slots__ = ("_items",)

    def __init__(self, items: Any) -> None:
        self._items = items

    def __iter__(self) -> Iterator[Any]:
        for item in self._items:
            _tick()
            yield item

    def __len__(self) -> int:
        return len(self._items)


def _bounded_range(*args: int) -> range:
    """The sandbox's `range` (at most `MAX_RANGE` items), refusing as a limit, not a crash."""
    items = range(*args)
    if len(items) > MAX_RANGE:
        raise _LimitReached(f"range() of {len(items):,} items is over the sandbox's limit "
                            f"of {MAX_RANGE:,}")
    return items


def _text_chars(value: Any, depth: int = 0) -> int:
    """The characters of the strings in a conversation or tool list (nested a few levels)."""
    if isinstance(value, str):
        return len(value)
    if depth > 8:
        return 0
    if isinstance(value, Mapping):
        return sum(_text_chars(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_text_chars(v, depth + 1) for v in value)
    return 0


class _LimitedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with every call and every loop step checked against the
    render's time limit and `*`/`**` unable to build a huge string or number."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(left, int) and isinstance(right, int) \
                and abs(left) > 1 and right * left.bit_length() > _MAX_POWER_BITS:
            raise _LimitReached(f"{left} ** {right} is too large a number")
        if operator == "*":
            _check_repeat(left, right)
        return super().call_binop(context, operator, left, right)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _tick()
        return super().call(context, obj, *args, **kwargs)


def _check_repeat(left: Any, right: Any) -> None:
    """`"x" * n` or `[..] * n` within the render's output limit."""
    seq, times = (left, right) if isinstance(right, int) else (right, left)
    budget = _BUDGET.get()
    if (budget is not None and isinstance(times, int) and isinstance(seq, str | list | tuple)
            and len(seq) * times > budget.chars):
        raise _LimitReached(f"a repetition of {len(seq) * times:,} items is over the output "
                            f"limit of {budget.chars:,} characters")


def _count_loop_steps(tree: nodes.Template) -> nodes.Template:
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Filter(loop.iter, _GUARD_FILTER, [], [], None, None,
                                 lineno=loop.iter.lineno)
    return tree


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

    limits: ClassVar[RenderLimits] = RenderLimits()

    def __init__(self, source: str, special_tokens: Mapping[str, str],
                 now: Callable[[], datetime] = datetime.now, origin: str = "") -> None:
        """`origin` names where the template comes from (its file) in errors."""
        env = _LimitedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[loopcontrols])
        env.filters["tojson"] = hf_tojson
        env.filters[_GUARD_FILTER] = _Counted
        env.globals["range"] = _bounded_range
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        self.special_tokens = dict(special_tokens)
        self.origin = origin
        where = f" in {origin}" if origin else ""
        self._name = f"the chat template{where}"
        try:
            self._template = env.from_string(_count_loop_steps(env.parse(source)))
        except TemplateError as e:
            raise FormatError(f"{self._name} does not compile: {e}") from None
        except (RecursionError, MemoryError, _LimitReached) as e:
            raise TemplateDidNotFinish(f"{self._name} does not compile: {_why(e)}") from None

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
        origin = str(jinja_file if jinja_file.is_file() else f"{config_file} (chat_template)")
        return cls(source, tokens, now, origin)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] | None,
        *,
        add_generation_prompt: bool,
        **kwargs: Any,
    ) -> str:
        """The template's text for a conversation, within `limits`. A template error or any
        exception the template's code raises is a FormatError (the template is input, not
        draftgen); a template past a limit is `TemplateDidNotFinish`."""
        limits = self.limits
        chars = _text_chars(messages) + _text_chars(tools)
        seconds = limits.seconds + limits.seconds_per_mb * chars / 1e6
        budget = _Budget(time.monotonic() + seconds, seconds,
                         limits.chars + limits.chars_per_input_char * chars)
        token = _BUDGET.set(budget)
        try:
            return self._written(budget, self._template.generate(
                messages=list(messages), tools=list(tools) if tools else None,
                documents=None,  # transformers passes it always: `documents is defined` holds
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens, **kwargs,
            ))
        except (_LimitReached, RecursionError, MemoryError) as e:
            raise TemplateDidNotFinish(f"{self._name} did not finish: {_why(e)}") from None
        except TemplateError as e:
            raise FormatError(f"{self._name} cannot render this conversation: {e}") from None
        except Exception as e:  # the template's own code failed (1/0, ...), not draftgen
            raise FormatError(f"{self._name} cannot render this conversation: "
                              f"{type(e).__name__}: {e}") from None
        finally:
            _BUDGET.reset(token)

    @staticmethod
    def _written(budget: _Budget, chunks: Iterable[str]) -> str:
        parts: list[str] = []
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if size > budget.chars:
                raise _LimitReached(f"it wrote more than {budget.chars:,} characters")
            budget.tick()
            parts.append(chunk)
        return "".join(parts)


def _why(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "it recursed too deep (a macro that calls itself without end?)"
    if isinstance(e, MemoryError):
        return "it ran out of memory"
    return str(e)


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
