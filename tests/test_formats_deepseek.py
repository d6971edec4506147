"""DeepSeek-R1 and V3.1 formats against the real DeepSeek-R1 tokenizer and chat template."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from draftgen.formats import Format, FormatError, get_format
from draftgen.formats.chat_template import ChatTemplate
from draftgen.testing.assets import cached_tokenizer, deepseek_r1_tokenizer_dir
from draftgen.tokenize import Tokenizer, self_check
from draftgen.tokenize.logprob_tokens import LogprobToken
from draftgen.types import Message, Prompt, RawAnswer, Tool, Usage

EOS = "<｜end▁of▁sentence｜>"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return cached_tokenizer(str(deepseek_r1_tokenizer_dir()))


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    """R1's own template, rendered as transformers renders it."""
    t = ChatTemplate.from_folder(deepseek_r1_tokenizer_dir())
    assert t is not None
    return t


@pytest.fixture(scope="module")
def r1(tok: Tokenizer) -> Format:
    return get_format("deepseek-r1", tok)


@pytest.fixture(scope="module")
def v31(tok: Tokenizer) -> Format:
    return get_format("deepseek-v3.1", tok)


def call(name: str, args: str, idx: int = 0) -> dict[str, Any]:
    return {"id": f"call_{idx}", "type": "function", "function": {"name": name, "arguments": args}}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def asst(content: str | None, **extra: Any) -> Message:
    return {"role": "assistant", "content": content, **extra}


def tool(text: str) -> Message:
    return {"role": "tool", "content": text}


PARIS = call("get_weather", '{"city": "Paris"}')
TOKYO = call("get_weather", '{"city": "東京"}', 1)
WEATHER: Tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}

CONVERSATIONS: dict[str, list[Message]] = {
    "single_user": [user("What is 2+2?")],
    "system_user": [{"role": "system", "content": "Be terse."}, user("Hi")],
    "two_systems": [{"role": "system", "content": "A."}, user("Hi"),
                    {"role": "system", "content": "B."}, user("Bye")],
    "multi_turn_think_in_content": [user("Hi"), asst("Greeting.</think>\n\nHello!"),
                                    user("2+2?")],
    "tool_loop_open": [user("Weather in Paris and Tokyo?"), asst(None, tool_calls=[PARIS, TOKYO]),
                       tool('{"temp": 21}'), tool("湿度高")],
    "tool_loop_closed": [user("Weather?"), asst("Checking.", tool_calls=[PARIS]), tool("sunny"),
                         asst("It is sunny."), user("And Tokyo?")],
    "second_tool_turn": [user("Paris?"), asst(None, tool_calls=[PARIS]), tool("sunny"),
                         asst("Sunny."), user("Tokyo?"), asst(None, tool_calls=[TOKYO]),
                         tool("rainy")],
    "unicode": [user('héllo 世界 "quotes" <tag> & \\ \t tab\n 🚀')],
}


@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_r1_prompt_equals_template(
    case: str, r1: Format, template: ChatTemplate, tok: Tokenizer
) -> None:
    messages = CONVERSATIONS[case]
    rendered = template.render(messages, [WEATHER], add_generation_prompt=True)
    # The updated R1 template opens the think block in the generation prompt; the packaged
    # (original) one stops at <｜Assistant｜>. After tool outputs neither adds anything.
    expected = rendered + ("<think>\n" if rendered.endswith("<｜Assistant｜>") else "")
    got = r1.prompt_text(messages, [WEATHER])
    assert got == expected
    assert r1.render_prompt(messages, [WEATHER]) == tok.encode(expected)
    assert got.startswith("<｜begin▁of▁sentence｜>")


def test_r1_history_without_generation_prompt(r1: Format, template: ChatTemplate) -> None:
    messages = [*CONVERSATIONS["tool_loop_closed"][:-1]]
    history, after_tools = r1._render_history(messages)  # type: ignore[attr-defined]
    assert history == template.render(messages, None, add_generation_prompt=False)
    assert not after_tools


def test_special_tokens_and_self_check(r1: Format, v31: Format, tok: Tokenizer) -> None:
    tokens = r1.special_tokens()
    assert tokens["<｜end▁of▁sentence｜>"] == 1 and tokens["</think>"] == 128799
    assert tokens["<｜tool▁calls▁begin｜>"] == 128806 and tokens["<｜tool▁sep｜>"] == 128814
    assert v31.special_tokens() == tokens
    self_check(tok, tokens)


def test_v31_prompts(tok: Tokenizer, v31: Format) -> None:
    plain = get_format("deepseek-v3.1", tok, {"thinking": False})
    bos = "<｜begin▁of▁sentence｜>"
    assert v31.prompt_text([user("Hi")], None) == f"{bos}<｜User｜>Hi<｜Assistant｜><think>"
    assert plain.prompt_text([user("Hi")], None) == f"{bos}<｜User｜>Hi<｜Assistant｜></think>"
    loop = v31.prompt_text(CONVERSATIONS["tool_loop_closed"], None)
    assert loop == (
        f"{bos}<｜User｜>Weather?<｜Assistant｜></think>Checking.<｜tool▁calls▁begin｜>"
        '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        f"<｜tool▁calls▁end｜>{EOS}<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>"
        f"It is sunny.{EOS}<｜User｜>And Tokyo?<｜Assistant｜><think>"
    )
    after_tools = v31.prompt_text(CONVERSATIONS["tool_loop_open"], None)
    assert after_tools.endswith("<｜tool▁output▁begin｜>湿度高<｜tool▁output▁end｜>")
    with pytest.raises(FormatError, match="wrong type"):
        get_format("deepseek-v3.1", tok, {"thinking": "no"})
    with pytest.raises(FormatError, match="unknown format option"):
        get_format("deepseek-r1", tok, {"thinking": False})


def test_v31_cut_property(tok: Tokenizer) -> None:
    """Non-thinking: prompt(prefix) + answer == the conversation with the answer."""
    plain = get_format("deepseek-v3.1", tok, {"thinking": False})
    prefix = CONVERSATIONS["tool_loop_closed"]
    answer = plain.answer_text(None, "Rainy.", None, finished=True).text
    full, _ = plain._render_history([*prefix, asst("Rainy.")])  # type: ignore[attr-defined]
    assert plain.prompt_text(prefix, None) + answer == full


# ---- answers ---------------------------------------------------------------------------------


def test_r1_answer_layout(r1: Format, tok: Tokenizer) -> None:
    raw = r1.answer_text("Let me think\n", "\n\nFour.", None, finished=True)
    assert raw.text == f"Let me think\n</think>\n\nFour.{EOS}" and raw.flags == []
    ids = tok.encode(raw.text)
    assert ids[-1] == 1 and 128799 in ids and 128798 not in ids
    cut = r1.answer_text("Still thinking", None, None, finished=False)
    assert cut.text == "Still thinking"
    partial = r1.answer_text("R\n", "\n\nPart", None, finished=False)
    assert partial.text == "R\n</think>\n\nPart"


def test_r1_stripped_whitespace_is_flagged_not_invented(r1: Format, tok: Tokenizer) -> None:
    stripped = r1.answer_text("Let me think", "Four.", None, finished=True)
    assert stripped.text == f"Let me think</think>Four.{EOS}"  # as given: nothing certain
    assert stripped.flags == ["whitespace_uncertain"]
    assert f"Let me think\n</think>\n\nFour.{EOS}" in stripped.alternatives
    # The engine's token count picks the layout when exactly one candidate has it.
    raw_ids = tok.encode(f"Let me think\n</think>\n\nFour.{EOS}")
    answer = RawAnswer(reasoning="Let me think", content="Four.", finish_reason="stop",
                       usage=Usage(completion_tokens=len(raw_ids)))
    [rebuilt] = r1.rebuild_batch([answer])
    assert rebuilt.output_ids == raw_ids
    assert rebuilt.flags == ["layout_chosen_by_length"]
    assert rebuilt.token_check == "length_ok"
    [unknown] = r1.rebuild_batch([RawAnswer(reasoning="Let me think", content="Four.")])
    assert unknown.flags == ["whitespace_uncertain"] and unknown.token_check == "unverifiable"


def test_tool_call_layouts(r1: Format, v31: Format) -> None:
    text = r1.answer_text("R\n", "\n\nChecking.", [PARIS, TOKYO], finished=True).text
    assert text == (
        "R\n</think>\n\nChecking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        'get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>'
        'function<｜tool▁sep｜>get_weather\n```json\n{"city": "東京"}\n```<｜tool▁call▁end｜>'
        f"<｜tool▁calls▁end｜>{EOS}"
    )
    text = v31.answer_text("R", "", [PARIS, TOKYO], finished=True).text
    assert text == (
        "R</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>'
        f'{{"city": "東京"}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>{EOS}'
    )
    structured = v31.answer_text("R", None, [call("f", {"a": 1})], finished=True)  # type: ignore[arg-type]
    assert '<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜>' in structured.text


def test_raw_tool_text_not_doubled(r1: Format, v31: Format) -> None:
    for fmt in (r1, v31):
        structured = fmt.answer_text("R\n", "\n\nOK.", [PARIS], finished=True).text
        content = structured.split("</think>", 1)[1].removesuffix(EOS)
        alone = fmt.answer_text("R\n", content, None, finished=True)
        both = fmt.answer_text("R\n", content, [PARIS], finished=True)
        assert alone.text == both.text == structured
        assert "tool_calls_in_content_and_structured" in both.flags


def test_answer_after_tool_outputs(r1: Format, v31: Format) -> None:
    """After tool outputs the templates add no generation prompt: no think block is open."""
    prompt = Prompt(id="p", dataset="d", messages=CONVERSATIONS["tool_loop_open"])
    for fmt in (r1, v31):
        text = fmt.answer_in_context(RawAnswer(content="Sunny, 21°C.", finish_reason="stop"),
                                     prompt)
        assert text.text == f"Sunny, 21°C.{EOS}"
        first = fmt.answer_in_context(RawAnswer(content="Hi", finish_reason="stop"), None)
        assert first.text.endswith(f"</think>Hi{EOS}")


REASONINGS = [None, "", "R", "R\n", "multi\n\nline 世界"]
CONTENTS = [None, "", "C", "\n\nC", "über 🚀"]
TOOLS: list[list[dict[str, Any]] | None] = [None, [PARIS], [PARIS, TOKYO]]


@pytest.mark.parametrize("name", ["deepseek-r1", "deepseek-v3.1"])
def test_round_trip(name: str, tok: Tokenizer) -> None:
    fmt = get_format(name, tok)
    for reasoning, content, calls, finished in itertools.product(
        REASONINGS, CONTENTS, TOOLS, (True, False)
    ):
        built = fmt.answer_text(reasoning, content, calls, finished=finished)
        parsed = fmt.parse_answer_text(built.text)
        again = fmt.answer_text(parsed.reasoning, parsed.content, parsed.tool_calls,
                                finished=parsed.finished)
        case = (reasoning, content, calls, finished, built.text)
        assert again.text == built.text, case
        assert parsed.finished is finished, case
        if calls and (content or finished or reasoning is not None):
            assert parsed.tool_calls is not None, case
            assert [c["function"]["arguments"] for c in parsed.tool_calls] == [
                c["function"]["arguments"] for c in calls], case


def test_unusual_tool_text_stays_in_content(v31: Format) -> None:
    text = "R</think>Hi<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\":"
    p = v31.parse_answer_text(text)
    assert p.tool_calls is None and p.content == text.split("</think>")[1]


# ---- the token layer -------------------------------------------------------------------------


def test_truncated_and_stray_stop(r1: Format, tok: Tokenizer) -> None:
    cut, stray = r1.rebuild_batch([
        RawAnswer(reasoning="R\n", content="\n\nPart", finish_reason="length"),
        RawAnswer(reasoning="R\n", content=f"\n\nHi{EOS} there", finish_reason="stop"),
    ])
    assert 1 not in cut.output_ids
    assert "special_token_in_content" in stray.flags and stray.output_ids.count(1) == 2


def test_native_ids_and_logprobs(r1: Format, tok: Tokenizer) -> None:
    text = r1.answer_text("R\n", "\n\nDone.", [PARIS], finished=True).text
    ids = tok.encode(text)
    [native] = r1.rebuild_batch([RawAnswer(output_ids=ids, finish_reason="tool_calls")])
    assert native.token_check == "exact" and native.reasoning == "R\n"
    assert native.tool_calls is not None
    assert native.tool_calls[0]["function"]["name"] == "get_weather"
    logprobs = [LogprobToken(token="", id=i) for i in ids[:-1]]
    [recovered] = r1.rebuild_batch([RawAnswer(reasoning="R\n", content="\n\nDone.",
                                              tool_calls=[PARIS], finish_reason="tool_calls",
                                              logprobs=logprobs)])
    assert recovered.output_ids == ids and recovered.token_source == "native"
    assert recovered.flags == ["ids_from_logprobs", "stop_token_appended"]


def test_r1_without_think_prefill(tok: Tokenizer) -> None:
    """`think_prefill: false` (R1's packaged template): the prompt stops at `<｜Assistant｜>`
    and the answer carries the `<think>\\n` the model writes; parsing gives the fields back."""
    fmt = get_format("deepseek-r1", tok, {"think_prefill": False})
    assert fmt.prompt_text([{"role": "user", "content": "Hi"}], None).endswith("<｜Assistant｜>")
    text = fmt.answer_text("Greet.\n", "\n\nHello!", None, finished=True).text
    assert text == "<think>\nGreet.\n</think>\n\nHello!<｜end▁of▁sentence｜>"
    parsed = fmt.parse_answer_text(text)
    assert (parsed.reasoning, parsed.content, parsed.finished) == ("Greet.\n", "\n\nHello!", True)
    assert fmt.answer_text("Still thinking", None, None, finished=False).text == (
        "<think>\nStill thinking")


def test_a_finished_answer_without_end_think_is_content(v31: Format) -> None:
    parsed = v31.parse_answer_text("Done.<｜end▁of▁sentence｜>")
    assert (parsed.reasoning, parsed.content) == (None, "Done.")
    cut = v31.parse_answer_text("Still thinking")
    assert (cut.reasoning, cut.content) == ("Still thinking", None)
