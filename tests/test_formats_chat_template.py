"""`chat-template`: prompts from the tokenizer folder's own Jinja template, answers from
configured tokens; checked against the hand-written Qwen3 and DeepSeek-R1 formats, which are
themselves checked against the same templates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from draftgen.formats import Format, FormatError, get_format
from draftgen.formats.chat_template import ChatTemplate
from draftgen.testing.assets import cached_tokenizer, deepseek_r1_tokenizer_dir
from draftgen.tokenize import Tokenizer
from draftgen.types import Message, RawAnswer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Météo <b>",
                                            "parameters": {"type": "object", "properties": {}}}}
PARIS = {"id": "c0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

CONVERSATIONS: list[tuple[list[Message], list[Any] | None]] = [
    ([{"role": "user", "content": "What is 2+2?"}], None),
    ([{"role": "system", "content": "Be terse — 简洁"}, {"role": "user", "content": "Hi"}], None),
    ([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [PARIS]},
      {"role": "tool", "content": "sunny"}], [WEATHER]),
    ([{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!", "reasoning_content": "Greeting."},
      {"role": "user", "content": "Bye"}], None),
]


@pytest.fixture(scope="module")
def qwen_generic(qwen3_tok: Tokenizer) -> Format:
    return get_format("chat-template", qwen3_tok,
                      {"end_think_token": "</think>", "start_think_token": "<think>"})


@pytest.mark.parametrize("i", range(len(CONVERSATIONS)))
def test_prompt_equals_hand_written_formats(i: int, qwen_generic: Format,
                                            qwen3_tok: Tokenizer) -> None:
    messages, tools = CONVERSATIONS[i]
    assert qwen_generic.prompt_text(messages, tools) == get_format(
        "qwen3", qwen3_tok).prompt_text(messages, tools)
    r1_tok = cached_tokenizer(str(deepseek_r1_tokenizer_dir()))
    r1_generic = get_format("chat-template", r1_tok, {"generation_prompt_suffix": "<think>\n",
                                                      "end_think_token": "</think>"})
    r1 = get_format("deepseek-r1", r1_tok)
    if messages[-1]["role"] != "tool":  # after tool outputs R1 adds no generation prompt
        assert r1_generic.prompt_text(messages, tools) == r1.prompt_text(messages, tools)
    assert r1_generic.stop_token == "<｜end▁of▁sentence｜>"  # the config's eos_token


def test_template_kwargs(qwen3_tok: Tokenizer) -> None:
    fmt = get_format("chat-template", qwen3_tok, {"template_kwargs": {"enable_thinking": False}})
    assert fmt.prompt_text([{"role": "user", "content": "Hi"}], None).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_answers(qwen_generic: Format, qwen3_tok: Tokenizer) -> None:
    fmt = qwen_generic
    raw = fmt.answer_text("\nR\n", "\n\nHello!", None, finished=True)
    assert raw.text == "<think>\nR\n</think>\n\nHello!<|im_end|>" and raw.flags == []
    assert raw.text == get_format("qwen3", qwen3_tok).answer_text(
        "\nR\n", "\n\nHello!", None, finished=True).text
    stripped = fmt.answer_text("R", "Hello!", None, finished=True)
    assert stripped.text == "<think>R</think>Hello!<|im_end|>"
    assert stripped.flags == ["whitespace_uncertain"]
    assert fmt.answer_text(None, "Hi", None, finished=True).text == "Hi<|im_end|>"
    assert fmt.answer_text("\nR", None, None, finished=False).text == "<think>\nR"
    tools = fmt.answer_text("\nR\n", "\n\nOK", [PARIS], finished=True)
    assert "tool_calls_unsupported" in tools.flags
    p = fmt.parse_answer_text(raw.text)
    assert (p.reasoning, p.content, p.finished) == ("\nR\n", "\n\nHello!", True)
    [stray] = fmt.rebuild_batch([RawAnswer(reasoning="R", content="a<|im_end|>b",
                                           finish_reason="stop")])
    assert "special_token_in_content" in stray.flags


def test_prompt_opening_think(qwen3_tok: Tokenizer) -> None:
    """A template whose generation prompt opens the think block: the answer starts with the
    reasoning and `start_think_token` is not repeated."""
    fmt = get_format("chat-template", qwen3_tok, {
        "generation_prompt_suffix": "<think>\n", "end_think_token": "</think>",
        "start_think_token": "<think>"})
    assert fmt.answer_text("R\n", "\n\nC", None, finished=True).text == "R\n</think>\n\nC<|im_end|>"
    assert fmt.parse_answer_text("R\n</think>\n\nC").reasoning == "R\n"


def test_errors(qwen3_dir: Path, qwen3_tok: Tokenizer, tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="unknown format option 'stop'"):
        get_format("chat-template", qwen3_tok, {"stop": "x"})
    with pytest.raises(FormatError, match="wrong type"):
        get_format("chat-template", qwen3_tok, {"template_kwargs": "x"})
    shutil.copy(qwen3_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    folder_tok = cached_tokenizer(str(tmp_path))
    with pytest.raises(FormatError, match="has no chat template"):
        get_format("chat-template", folder_tok)
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('no tools here') }}")
    fmt = get_format("chat-template", folder_tok, {"stop_token": "<|im_end|>"})
    with pytest.raises(FormatError, match="no tools here"):
        fmt.prompt_text([{"role": "user", "content": "x"}], None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}],
        "bos_token": {"content": "<s>"}}))
    (tmp_path / "chat_template.jinja").unlink()
    named = ChatTemplate.from_folder(tmp_path)
    assert named is not None
    assert named.render([{"role": "user", "content": "x"}], None,
                        add_generation_prompt=True) == "<s>x"
