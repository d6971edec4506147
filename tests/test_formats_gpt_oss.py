"""gpt-oss (harmony). Its tokenizer is not available offline: the text layer is tested exactly,
the token layer on the real Qwen3 BPE carrying harmony's special tokens at their real IDs.
The default renderer is checked against openai-harmony in test_formats_gpt_oss_harmony.py; the
`hf_template` texts below are the model's chat template as this project read it (the template
itself is not available offline)."""

from __future__ import annotations

import itertools
import sys
from datetime import datetime
from typing import Any

import pytest

from draftgen.formats import Format, FormatError, get_format
from draftgen.formats.chat_template import ChatTemplate
from draftgen.testing.assets import GPT_OSS_SPECIAL_TOKENS, family_tokenizer
from draftgen.tokenize import Tokenizer, self_check
from draftgen.tokenize.logprob_tokens import LogprobToken
from draftgen.types import Message, RawAnswer

SYSTEM = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return family_tokenizer("gpt-oss")


@pytest.fixture(scope="module")
def fmt(tok: Tokenizer) -> Format:
    return get_format("gpt-oss", tok, {"current_date": "2025-08-05"})


@pytest.fixture(scope="module")
def hf(tok: Tokenizer) -> Format:
    return get_format("gpt-oss", tok, {"current_date": "2025-08-05", "renderer": "hf_template"})


def call(name: str, args: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city."},
                "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
                "days": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["city"],
        },
    },
}
PARIS = call("get_weather", '{"city":"Paris"}')


# ---- prompts ---------------------------------------------------------------------------------


def test_prompt_plain(fmt: Format, hf: Format, tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be terse."}, user("Hi")]
    assert fmt.prompt_text(messages, None) == (
        f"{SYSTEM}<|end|><|start|>developer<|message|># Instructions\n\nBe terse.<|end|>"
        "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    )
    assert hf.prompt_text(messages, None) == (
        f"{SYSTEM}<|end|><|start|>developer<|message|># Instructions\n\nBe terse.\n\n<|end|>"
        "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    )
    ids = fmt.render_prompt([user("Hi")], None)
    assert ids[:2] == [200006, *tok.encode("system")]
    assert ids[-2:] == [200006, *tok.encode("assistant")]


def test_prompt_tools_and_history(fmt: Format, hf: Format) -> None:
    messages = [
        user("Weather in Paris?"),
        {"role": "assistant", "content": None, "reasoning_content": "Need the tool.",
         "tool_calls": [PARIS]},
        {"role": "tool", "content": "sunny"},
    ]
    assert fmt.prompt_text(messages, [WEATHER]).endswith(
        "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city":"Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>"
        "<|start|>assistant"
    )
    text = hf.prompt_text(messages, [WEATHER])
    assert text.startswith(SYSTEM + "\nCalls to these tools must go to the commentary channel: "
                           "'functions'.<|end|>")
    assert (
        "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
        "// Get the weather.\ntype get_weather = (_: {\n// The city.\ncity: string,\n"
        'unit?: "C" | "F", // default: C,\ndays?: number[],\n}) => any;\n\n'
        "} // namespace functions<|end|>"
    ) in text
    assert text.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
        '{"city": "Paris"}<|call|>'
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
        "<|start|>assistant"
    )
    closed = hf.prompt_text([*messages, {"role": "assistant", "content": "Sunny."},
                              user("Thanks")], None)
    assert "Need the tool." not in closed  # analysis dropped once a final answer follows
    assert "<|start|>assistant<|channel|>final<|message|>Sunny.<|end|>" in closed


def test_prompt_errors(fmt: Format, hf: Format, tok: Tokenizer) -> None:
    nested = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"o": {"type": "object", "properties": {}}}}}}
    assert "o?: {\n" in fmt.prompt_text([user("x")], [nested])  # openai-harmony renders it
    with pytest.raises(FormatError, match="chat template"):
        hf.prompt_text([user("x")], [nested])
    for f in (fmt, hf):
        with pytest.raises(FormatError, match="without a tool call"):
            f.prompt_text([user("x"), {"role": "tool", "content": "y"}], None)
    with pytest.raises(FormatError, match="YYYY-MM-DD"):
        get_format("gpt-oss", tok, {"current_date": "5 Aug"})
    with pytest.raises(FormatError, match="message 2 content must be a string"):  # its index
        fmt.prompt_text([{"role": "system", "content": "s"}, user("x"),
                         {"role": "user", "content": 5}], None)
    bad = {"type": "function", "function": {"name": "f", "parameters": "oops"}}
    with pytest.raises(FormatError, match="tool 'f': parameters: Input should be a valid dict"):
        fmt.prompt_text([user("x")], [bad])
    with pytest.raises(FormatError, match="history_reasoning must be one of drop_answered, "
                                          "current_turn"):
        get_format("gpt-oss", tok, {"history_reasoning": "keep"})
    with pytest.raises(FormatError, match="renderer must be one of harmony, hf_template"):
        get_format("gpt-oss", tok, {"renderer": "jinja"})
    with pytest.raises(FormatError, match="reasoning_effort must be one of low, medium, high"):
        get_format("gpt-oss", tok, {"reasoning_effort": "max"})


def test_prompt_without_openai_harmony(fmt: Format, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed without its dependencies (--no-deps), the format says what to do."""
    monkeypatch.setitem(sys.modules, "openai_harmony", None)  # import fails
    messages = [{"role": "system", "content": "A header not rendered before."}, user("x")]
    with pytest.raises(FormatError, match=r"openai-harmony==0\.0\.8 .* renderer: hf_template"):
        fmt.prompt_text(messages, None)


def test_prompt_from_the_model_template(tok: Tokenizer) -> None:
    """With the model's chat template the prompt is the template's, given the options."""
    fmt = get_format("gpt-oss", tok, {"reasoning_effort": "high", "current_date": "2025-01-02",
                                      "renderer": "hf_template"})
    fmt.template = ChatTemplate(  # type: ignore[attr-defined]
        "{{ strftime_now('%Y-%m-%d') }} {{ reasoning_effort }} {{ messages[0].content | tojson }}"
        "{% if add_generation_prompt %}<|start|>assistant{% endif %}", {},
        lambda: datetime(2025, 1, 2))
    assert fmt.prompt_text([user("é")], None) == '2025-01-02 high "é"<|start|>assistant'


# ---- answers ---------------------------------------------------------------------------------


def test_answer_layouts(fmt: Format) -> None:
    final = fmt.answer_text("Think.", "Hello!", None, finished=True)
    assert final.text == (
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant"
        "<|channel|>final<|message|>Hello!<|return|>"
    )
    tool = fmt.answer_text("Need it.", None, [PARIS], finished=True)
    assert tool.text == (
        "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
    )
    preamble = fmt.answer_text("R", "Let me look.", [PARIS], finished=True)
    assert "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant" in preamble.text
    assert preamble.flags == ["layout_uncertain"]
    two = fmt.answer_text("R", None, [PARIS, PARIS], finished=True)
    assert "multiple_tool_calls" in two.flags and two.text.count("<|call|>") == 2
    assert ("<|call|><|start|>assistant<|channel|>commentary to=functions.get_weather "
            in two.text)
    assert fmt.answer_text("R", "Hi", None, finished=False).text.endswith("final<|message|>Hi")
    assert fmt.answer_text("Still", None, None, finished=False).text == (
        "<|channel|>analysis<|message|>Still")
    assert "reasoning_missing" in fmt.answer_text(None, "Hi", None, finished=True).flags


def test_round_trip(fmt: Format) -> None:
    for reasoning, content, calls, finished in itertools.product(
        [None, "R", "multi\nline 世界"], [None, "", "C"], [None, [PARIS]], (True, False)
    ):
        built = fmt.answer_text(reasoning, content, calls, finished=finished)
        parsed = fmt.parse_answer_text(built.text)
        again = fmt.answer_text(parsed.reasoning, parsed.content, parsed.tool_calls,
                                finished=parsed.finished)
        assert again.text == built.text, (reasoning, content, calls, finished)
        if calls and content is not None:
            assert parsed.tool_calls is not None
    odd = "<|channel|>final<|message|>A<|end|><|start|>assistant<|channel|>weird<|message|>B"
    assert fmt.parse_answer_text(odd).content == odd


# ---- the token layer -------------------------------------------------------------------------


def test_special_tokens_and_self_check(fmt: Format, tok: Tokenizer) -> None:
    tokens = fmt.special_tokens()
    assert tokens == {t: i for i, t in GPT_OSS_SPECIAL_TOKENS.items()}
    self_check(tok, tokens)
    assert fmt.stop_tokens == ("<|return|>", "<|call|>")


def test_rebuild(fmt: Format, tok: Tokenizer) -> None:
    text = fmt.answer_text("Need it.", None, [PARIS], finished=True).text
    ids = tok.encode(text)
    assert ids[-1] == 200012
    native = RawAnswer(output_ids=ids[:-1], finish_reason="tool_calls", stop_token_id=200012)
    logprobs = RawAnswer(reasoning="Need it.", tool_calls=[PARIS], finish_reason="tool_calls",
                         logprobs=[LogprobToken(token="", id=i) for i in ids[:-1]])
    cut = RawAnswer(reasoning="R", content="Part", finish_reason="length")
    stray = RawAnswer(reasoning="R<|end|>", content="Hi", finish_reason="stop")
    a, b, c, d = fmt.rebuild_batch([native, logprobs, cut, stray])
    assert a.output_ids == ids and a.flags == ["stop_token_appended"]
    assert a.tool_calls is not None and a.tool_calls[0]["function"]["name"] == "get_weather"
    assert b.output_ids == ids and b.token_check == "exact"
    assert 200002 not in c.output_ids and 200012 not in c.output_ids
    assert "special_token_in_reasoning" in d.flags
