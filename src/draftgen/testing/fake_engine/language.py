"""The fake model's language: sentences of words, numbers, punctuation, some unicode and
newlines, laid out as a Qwen3 model emits its answer (reasoning, content, a tool call)."""

from __future__ import annotations

import functools
import itertools
import json
import random

from draftgen.testing.fake_engine.kinds import Json, Layout

TOOL_NAME = "get_weather"
TOOL_ARGUMENTS: Json = {"city": "Paris"}

_WORD_LIST = """the a an of to and in is that it for on with as this be are by we can not at from
    model token answer draft value first then next check result number step case list because
    so if when which each two three time data method should would could think consider rule
    order prompt reason small large simple true false verify compute sum total count part"""
_RARE = ("café", "東京", "naïve", "Zürich", "日本語", "résumé", "€5", "π", "—", "✓", "🙂", "x²")
_INTEGER, _DECIMAL = "\0int", "\0dec"
_COMMON = tuple(_WORD_LIST.split())
_WORDS = (*_COMMON, *_RARE, _INTEGER, _DECIMAL)
_CUM_WEIGHTS = tuple(
    itertools.accumulate(
        (0.89 / len(_COMMON),) * len(_COMMON) + (0.04 / len(_RARE),) * len(_RARE) + (0.04, 0.03)
    )
)
_ENDINGS = (".", ".", ".", "?", "!", ":")
_SEPARATORS = (" ", " ", " ", " ", "\n", "\n\n", "\n- ")
_TOKENS_PER_SENTENCE = 13.5
"""Measured with the Qwen3 tokenizer (separator included)."""


def _word(rng: random.Random, word: str) -> str:
    if word == _INTEGER:
        return str(rng.randint(0, 9999))
    if word == _DECIMAL:
        return f"{rng.uniform(0, 100):.2f}"
    return word


def sentence(rng: random.Random) -> str:
    picks = rng.choices(_WORDS, cum_weights=_CUM_WEIGHTS, k=rng.randint(4, 14))
    words = [_word(rng, w) for w in picks]
    words[0] = words[0].capitalize()
    if len(words) > 6 and rng.random() < 0.5:
        words[rng.randint(1, len(words) - 2)] += ","
    return " ".join(words) + rng.choice(_ENDINGS)


@functools.cache
def _sentence_pool(size: int = 4096) -> tuple[str, ...]:
    rng = random.Random(20250501)
    return tuple(sentence(rng) for _ in range(size))


def fake_text(rng: random.Random, target_tokens: int) -> str:
    """Sentences of words, numbers, punctuation, some unicode and newlines; about
    `target_tokens` tokens long."""
    pool = _sentence_pool()
    count = max(1, round(target_tokens / _TOKENS_PER_SENTENCE))
    sentences = rng.choices(pool, k=count)
    separators = rng.choices(_SEPARATORS, k=count - 1)
    return "".join(itertools.chain.from_iterable(zip(sentences, [*separators, ""], strict=True)))


def edge_whitespace(rng: random.Random, reasoning: str, content: str) -> tuple[str, str]:
    choice = rng.randrange(4)
    if choice == 0:
        return "\n" + reasoning, content
    if choice == 1:
        return reasoning + "\n", content
    if choice == 2:
        return reasoning, " " + content
    return reasoning, content + "\n"


def _tool_block() -> str:
    call = json.dumps({"name": TOOL_NAME, "arguments": TOOL_ARGUMENTS}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def native_text(layout: Layout, reasoning: str, content: str, tool_call: bool = False) -> str:
    """The answer as the model emits it, end-of-turn token included."""
    if tool_call:
        content = content + ("\n" if content else "") + _tool_block()
    head = "<think>\n" if layout == "qwen3" else ""
    return f"{head}{reasoning}\n</think>\n\n{content}<|im_end|>"
