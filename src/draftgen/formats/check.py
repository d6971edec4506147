"""`draftgen check-format`: draftgen's prompt rendering against the model's own chat template.

The model folder's template (`chat_template.jinja`, else `tokenizer_config.json`'s) is rendered
as transformers renders it (`chat_template.ChatTemplate`), with the thinking switch the format
is set to (`thinking` and `enable_thinking`, the names templates read); both texts are encoded
with the run's tokenizer and compared token by token. Sample conversations cover the layouts
a format can get wrong (system prompt, multi-turn history, tools, a tool call and its result);
the user's dataset rows, tools included, are compared too. A difference is shown at its first
token, as IDs and as text, so that a user sees it before paying for a run. A template that does
not finish (`TemplateDidNotFinish`) stops the check with its one line rather than being tried
on every conversation. Where the format differs, each other registered format is tried the
same way (`matching_formats`), so that the one that matches can be named.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from draftgen.formats.base import Format, FormatError, format_names, get_format
from draftgen.formats.chat_template import (
    ChatTemplate,
    ChatTemplateFormat,
    TemplateDidNotFinish,
    tokenizer_folder,
)
from draftgen.store.runjson import TemplateCheck
from draftgen.tokenize.base import TokenizerError
from draftgen.types import Message, Prompt, Tool

_CONTEXT_TOKENS = 6
_CONTEXT_CHARS = 60

_WEATHER: Tool = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
_CALL = {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

Conversation = tuple[str, Sequence[Message], Sequence[Tool] | None]
"""What a comparison renders: its label, messages and tools."""

SAMPLES: list[Conversation] = [
    ("plain", [{"role": "user", "content": "What is 2+2?"}], None),
    ("system", [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Héllo — 東京?"}], None),
    ("multi-turn", [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}], None),
    ("tools", [{"role": "user", "content": "Weather in Paris?"}], [_WEATHER]),
    ("tool result", [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": "", "tool_calls": [_CALL]},
                     {"role": "tool", "tool_call_id": _CALL["id"], "name": "get_weather",
                      "content": "21°C, sunny"}], [_WEATHER]),
]


@dataclass(slots=True)
class Difference:
    token: int
    """Index of the first token that differs."""
    ours: list[tuple[int, str]]
    """draftgen's tokens from there (ID, text), a few."""
    theirs: list[tuple[int, str]]
    """The model template's tokens from there."""
    common_text: str
    """The end of the text both share before the difference."""
    ours_text: str
    theirs_text: str


@dataclass(slots=True)
class Comparison:
    label: str
    ours_tokens: int = 0
    theirs_tokens: int = 0
    difference: Difference | None = None
    error: str | None = None
    """Why one side could not render the conversation."""

    @property
    def identical(self) -> bool:
        return self.error is None and self.difference is None


def model_template(fmt: Format) -> ChatTemplate | None:
    """The chat template of the folder the format's tokenizer comes from; None if it has none."""
    return ChatTemplate.from_folder(tokenizer_folder(fmt.tokenizer))


def template_kwargs(fmt: Format) -> dict[str, Any]:
    """The template variables that say what the format is set to."""
    if isinstance(fmt, ChatTemplateFormat):
        return dict(fmt.kwargs)
    thinking = bool(getattr(fmt, "thinking", True))
    return {"thinking": thinking, "enable_thinking": thinking}


def compare(fmt: Format, template: ChatTemplate, label: str, messages: Sequence[Message],
            tools: Sequence[Tool] | None) -> Comparison:
    """One conversation's generation prompt, rendered both ways, compared token by token."""
    out = Comparison(label)
    try:
        ours = fmt.prompt_text(messages, tools)
    except TemplateDidNotFinish:
        raise
    except FormatError as e:
        out.error = f"draftgen cannot render it: {e}"
        return out
    try:
        theirs = template.render(messages, tools, add_generation_prompt=True,
                                 **template_kwargs(fmt))
    except TemplateDidNotFinish:
        raise
    except FormatError as e:
        out.error = f"the model's template cannot render it: {e}"
        return out
    ours_ids, theirs_ids = fmt.tokenizer.encode_batch([ours, theirs])
    out.ours_tokens, out.theirs_tokens = len(ours_ids), len(theirs_ids)
    if ours_ids != theirs_ids:
        out.difference = first_difference(fmt, ours_ids, theirs_ids)
    return out


def first_difference(fmt: Format, ours: list[int], theirs: list[int]) -> Difference:
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
              min(len(ours), len(theirs)))
    tok = fmt.tokenizer

    def pieces(ids: list[int]) -> list[tuple[int, str]]:
        return [(i, tok.decode([i])) for i in ids[at : at + _CONTEXT_TOKENS]]

    return Difference(
        token=at, ours=pieces(ours), theirs=pieces(theirs),
        common_text=tok.decode(ours[:at])[-_CONTEXT_CHARS:],
        ours_text=tok.decode(ours[at:])[:_CONTEXT_CHARS],
        theirs_text=tok.decode(theirs[at:])[:_CONTEXT_CHARS],
    )


def sample_conversations() -> list[Conversation]:
    return [(f"sample: {name}", messages, tools) for name, messages, tools in SAMPLES]


def prompt_conversations(prompts: Iterable[Prompt]) -> list[Conversation]:
    return [(f"{p.dataset} {p.source or p.id}", p.messages, p.tools) for p in prompts]


def compare_all(fmt: Format, template: ChatTemplate, conversations: Iterable[Conversation]
                ) -> list[Comparison]:
    return [compare(fmt, template, label, messages, tools)
            for label, messages, tools in conversations]


def compare_samples(fmt: Format, template: ChatTemplate) -> list[Comparison]:
    return compare_all(fmt, template, sample_conversations())


def matching_formats(fmt: Format, template: ChatTemplate,
                     conversations: Sequence[Conversation]) -> list[str]:
    """The other registered formats, at their default options, that render every one of
    `conversations` token for token as the template does. `chat-template` is never named: it
    renders the template itself. A format that cannot be built with this tokenizer, or
    cannot render a conversation, does not match."""
    names: list[str] = []
    tried: set[type[Format]] = {type(fmt), ChatTemplateFormat}
    for name in format_names():
        try:
            candidate = get_format(name, fmt.tokenizer)
        except (FormatError, TokenizerError):
            continue
        if type(candidate) in tried:  # an alias of one tried, or fmt's own
            continue
        tried.add(type(candidate))
        if _renders_all(candidate, template, conversations):
            names.append(candidate.name)
    return names


def _renders_all(fmt: Format, template: ChatTemplate,
                 conversations: Sequence[Conversation]) -> bool:
    try:
        return all(compare(fmt, template, label, messages, tools).identical
                   for label, messages, tools in conversations)
    except (FormatError, TokenizerError):  # a template that does not finish with its switch
        return False


def matches_line(fmt: Format, matches: Sequence[str]) -> str:
    """What `check-format` says of the formats that match, once the chosen one differs."""
    if not matches:
        return ("no other registered format renders them as the model's template does "
                "(format chat-template renders with the template itself)")
    named = (f"format {matches[0]} renders" if len(matches) == 1
             else f"formats {', '.join(matches)} render")
    return (f"{named} every one as the model's template does: set model.format: "
            f"{matches[0]} (instead of {fmt.name}) unless the difference is meant")


def first_rows(prompts: Iterable[Prompt], n: int) -> list[Prompt]:
    return list(itertools.islice(prompts, n))


def template_check(fmt: Format) -> TemplateCheck | None:
    """The format against the model's own template on the sample conversations, with the
    registered formats that match where it differs (None: the folder has no template): what
    a run records in its session and warns of, and `run --dry-run` and `probe` print."""
    try:
        template = model_template(fmt)
        if template is None:
            return None
        comparisons = compare_samples(fmt, template)
    except FormatError as e:
        return TemplateCheck(format=fmt.name, error=str(e))
    found = TemplateCheck(format=fmt.name, samples=len(comparisons))
    differing = [c for c in comparisons if not c.identical]
    if differing:
        first = differing[0]
        where = first.error or f"first difference at token {first.difference.token}"  # type: ignore[union-attr]
        found.differing, found.first = len(differing), f"{first.label}: {where}"
        found.matches = matching_formats(fmt, template, sample_conversations())
    return found


def disagreement_warning(fmt: Format) -> str | None:
    """`template_check`'s one-line warning (None when they agree or there is no template)."""
    found = template_check(fmt)
    return found.warning if found is not None else None


def describe(c: Comparison) -> list[str]:
    """The report lines of one comparison."""
    if c.error is not None:
        return [f"DIFFERS    {c.label}: {c.error}"]
    if c.difference is None:
        return [f"identical  {c.label} ({c.ours_tokens} tokens)"]
    d = c.difference
    return [
        f"DIFFERS    {c.label}: first difference at token {d.token} "
        f"(draftgen {c.ours_tokens} tokens, model template {c.theirs_tokens})",
        f"    draftgen:       {_tokens(d.ours)}",
        f"    model template: {_tokens(d.theirs)}",
        f"    text: …{d.common_text!r} then",
        f"      draftgen:       {d.ours_text!r}…",
        f"      model template: {d.theirs_text!r}…",
    ]


def _tokens(pieces: list[tuple[int, str]]) -> str:
    return " ".join(f"{i}={text!r}" for i, text in pieces) or "(end)"
