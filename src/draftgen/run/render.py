"""Prompts rendered as the model's format lays them out, within the model's context length."""

from __future__ import annotations

from draftgen.formats import Format, FormatError
from draftgen.formats.chat_template import TemplateDidNotFinish
from draftgen.types import Prompt


def render_each(fmt: Format, prompts: list[Prompt]) -> list[list[int] | FormatError]:
    """Prompt IDs for a batch; a prompt the format refuses gets its FormatError instead. A
    chat template that does not finish is raised: it would not finish on any prompt."""
    try:
        return list(fmt.render_prompts(prompts))
    except TemplateDidNotFinish:
        raise
    except FormatError:
        pass
    out: list[list[int] | FormatError] = []
    for prompt in prompts:
        try:
            out.append(fmt.render_prompt(prompt.messages, prompt.tools))
        except TemplateDidNotFinish:
            raise
        except FormatError as e:
            out.append(FormatError(f"{prompt.source or prompt.id}: {e}"))
    return out


class PromptTooLong(FormatError):
    """A prompt that leaves no room for an answer within `model.context_length`."""


def render_within(fmt: Format, prompts: list[Prompt], context_length: int | None
                  ) -> list[list[int] | FormatError]:
    """`render_each`; with a context length, a prompt that leaves no room for one answer token
    gets a `PromptTooLong` instead. A prompt whose text alone is certainly too long (a token
    covers at most the tokenizer's longest token's bytes) is refused without tokenizing it:
    tokenizing 100 MB of text would take minutes."""
    if context_length is None:
        return render_each(fmt, prompts)
    out: list[list[int] | FormatError] = [FormatError("not rendered")] * len(prompts)
    todo: list[int] = []
    longest = 0
    for i, prompt in enumerate(prompts):
        chars = sum(len(m["content"]) for m in prompt.messages
                    if isinstance(m.get("content"), str))
        if chars > context_length:
            longest = longest or max(map(len, fmt.tokenizer.bytes_to_id()), default=1)
            if chars > 2 * longest * context_length:  # 2: room for any normalizer
                out[i] = PromptTooLong(
                    f"{prompt.source or prompt.id}: prompt of {chars:,} characters is longer "
                    f"than model.context_length ({context_length:,} tokens); not sent")
                continue
        todo.append(i)
    rendered = render_each(fmt, [prompts[i] for i in todo])
    for i, ids in zip(todo, rendered, strict=True):
        if not isinstance(ids, FormatError) and len(ids) + 1 > context_length:
            ids = PromptTooLong(
                f"{prompts[i].source or prompts[i].id}: prompt of {len(ids):,} tokens leaves "
                f"no room for an answer in model.context_length ({context_length:,}); not sent")
        out[i] = ids
    return out
