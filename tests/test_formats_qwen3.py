"""Qwen3 formats against the real Qwen3 tokenizer and chat template (rendered with Jinja the way
transformers renders it)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from draftgen.formats import Format, FormatError, format_names, get_format
from draftgen.tokenize import Tokenizer, self_check
from draftgen.types import Message, Prompt, RawAnswer, Tool, Usage

Render = Callable[..., str]

# ---- the reference: the template as transformers renders it ---------------------------------


def hf_tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' override of Jinja's (HTML-escaping) `tojson`."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@pytest.fixture(scope="session")
def render(qwen3_dir: Path) -> Render:
    config = json.loads((qwen3_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = hf_tojson
    env.globals["raise_exception"] = _raise_exception
    template = env.from_string(config["chat_template"])

    def _render(
        messages: Sequence[Message], tools: Sequence[Tool] | None = None, *, gen: bool
    ) -> str:
        return template.render(messages=messages, tools=tools, add_generation_prompt=gen)

    return _render


@pytest.fixture(scope="session")
def hybrid(qwen3_tok: Tokenizer) -> Format:
    return get_format("qwen3", qwen3_tok)


@pytest.fixture(scope="session")
def thinking(qwen3_tok: Tokenizer) -> Format:
    return get_format("qwen3-thinking", qwen3_tok)


@pytest.fixture(scope="session", params=["qwen3", "qwen3-thinking"])
def fmt(request: pytest.FixtureRequest, qwen3_tok: Tokenizer) -> Format:
    return get_format(request.param, qwen3_tok)


def generation_suffix(fmt: Format) -> str:
    """What the 2507 Thinking template adds after the generation prompt."""
    return "<think>\n" if fmt.name == "qwen3-thinking" else ""


# ---- conversations --------------------------------------------------------------------------

WEATHER: Tool = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo d'une ville — 天气 <b>&</b>",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city"],
        },
    },
}
SEARCH: Tool = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


def call(name: str, arguments: str | dict[str, Any], idx: int = 0) -> dict[str, Any]:
    fn = {"name": name, "arguments": arguments}
    return {"id": f"call_{idx}", "type": "function", "function": fn}


def system(text: str) -> Message:
    return {"role": "system", "content": text}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def asst(content: str, **extra: Any) -> Message:
    return {"role": "assistant", "content": content, **extra}


def tool(content: str) -> Message:
    return {"role": "tool", "content": content}


PARIS = call("get_weather", {"city": "Paris"}, 0)
TOKYO = call("get_weather", '{"city": "東京", "unit": "C"}', 1)

PROMPTS: dict[str, tuple[list[Message], list[Tool] | None]] = {
    "single_user": ([user("What is 2+2?")], None),
    "system_user": ([system("You are terse."), user("Hi")], None),
    "multi_turn_plain": (
        [system("Be nice."), user("Hi"), asst("Hello! How can I help?"), user("Tell me a joke.")],
        None,
    ),
    "multi_turn_reasoning_content": (
        [
            user("Hi"),
            asst("Hello!", reasoning_content="The user greets me."),
            user("2+2?"),
            asst("4", reasoning_content="\nSimple arithmetic.\n"),
            user("Thanks"),
        ],
        None,
    ),
    "multi_turn_think_in_content": (
        [user("Hi"), asst("<think>\nGreeting.\n</think>\n\nHello!"), user("Bye")],
        None,
    ),
    "tools_declared": ([user("Weather in Paris?")], [WEATHER, SEARCH]),
    "tools_with_system": ([system("Use tools when useful."), user("Weather?")], [WEATHER]),
    "tool_loop_open": (
        [
            system("You help with weather."),
            user("Weather in Paris and Tokyo?"),
            asst("", reasoning_content="I need both cities.", tool_calls=[PARIS, TOKYO]),
            tool('{"temp": 21}'),
            tool('{"temp": 28, "note": "湿度高"}'),
        ],
        [WEATHER],
    ),
    "tool_loop_closed": (
        [
            user("Weather in Paris?"),
            asst("Let me check.", tool_calls=[PARIS]),
            tool("sunny"),
            asst("It is sunny.", reasoning_content="The tool said sunny."),
            user("And Tokyo?"),
            asst("", reasoning_content="Second lookup.", tool_calls=[TOKYO]),
            tool("rainy"),
            asst("Rainy.", reasoning_content=None),
            user("Thanks!"),
        ],
        [WEATHER, SEARCH],
    ),
    "tool_response_as_user": (
        [
            user("Search cats"),
            asst("", tool_calls=[call("search", {"q": "cats"})], reasoning_content="Search."),
            user("<tool_response>\ncats are mammals\n</tool_response>"),
        ],
        [SEARCH],
    ),
    "system_in_middle": (
        [user("Hi"), asst("Hello"), system("Switch to French."), user("Bye")],
        None,
    ),
    "unicode": (
        [system("Tu es un assistant — 助手 🚀"), user('héllo 世界 "quotes" <tag> & \\ \t tab\n')],
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(PROMPTS))
def test_prompt_equals_template(
    case: str, fmt: Format, render: Render, qwen3_tok: Tokenizer
) -> None:
    messages, tools = PROMPTS[case]
    expected = render(messages, tools, gen=True) + generation_suffix(fmt)
    got = fmt.prompt_text(messages, tools)
    assert got == expected
    assert fmt.render_prompt(messages, tools) == qwen3_tok.encode(expected)


def test_prompt_ends_with_generation_prompt(hybrid: Format, thinking: Format) -> None:
    messages = [user("Hi")]
    assert hybrid.prompt_text(messages, None).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert thinking.prompt_text(messages, None).endswith("<|im_start|>assistant\n<think>\n")


def test_tools_use_hf_tojson(hybrid: Format) -> None:
    text = hybrid.prompt_text([user("x")], [WEATHER])
    assert json.dumps(WEATHER, ensure_ascii=False) in text
    assert "\\u" not in text and "<b>&</b>" in text


def test_render_prompts_batch(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    prompts = [Prompt(id=k, dataset="t", messages=m, tools=t) for k, (m, t) in PROMPTS.items()]
    ids = hybrid.render_prompts(prompts)
    assert ids == [qwen3_tok.encode(hybrid.prompt_text(p.messages, p.tools)) for p in prompts]


def test_prompt_rejects_bad_input(hybrid: Format) -> None:
    with pytest.raises(FormatError):
        hybrid.prompt_text([], None)
    with pytest.raises(FormatError):
        hybrid.prompt_text([{"role": "developer", "content": "x"}, user("hi")], None)
    with pytest.raises(FormatError):
        hybrid.prompt_text([user("hi"), asst("", tool_calls=[{"function": {}}])], None)


def test_none_content_is_empty(hybrid: Format, render: Render) -> None:
    with_none = [user("Hi"), {"role": "assistant", "content": None, "tool_calls": [PARIS]}]
    with_empty = [user("Hi"), asst("", tool_calls=[PARIS])]
    assert hybrid.prompt_text(with_none, [WEATHER]) == render(with_empty, [WEATHER], gen=True)


# ---- cut property: prompt(prefix) + answer == the whole conversation ------------------------

FINALS: dict[str, tuple[str | None, str, list[dict[str, Any]] | None]] = {
    "plain": ("Two plus two is four.", "4", None),
    "raw_whitespace": ("\nTwo plus two.\n", "\n\n4", None),
    "no_reasoning": (None, "Hi there.", None),
    "empty_reasoning": ("", "Hi there.", None),
    "multiline": ("Step 1.\n\nStep 2.", "**Answer**\n\n- a\n- b", None),
    "tool_only": ("Need the weather.", "", [PARIS]),
    "tool_with_text": ("Need the weather.", "Let me check.", [PARIS]),
    "tool_with_raw_text": ("\nNeed it.\n", "\n\nLet me check.", [PARIS]),
    "parallel_tools": ("Both cities.", "", [PARIS, TOKYO]),
    "unicode": ("思考中… 🚀", "Réponse: 東京は晴れ", None),
}


@pytest.mark.parametrize("final", sorted(FINALS))
@pytest.mark.parametrize("case", ["single_user", "tool_loop_open", "tool_loop_closed", "unicode"])
def test_cut_property(
    case: str, final: str, fmt: Format, render: Render, qwen3_tok: Tokenizer
) -> None:
    if fmt.name == "qwen3-thinking" and FINALS[final][0] is None:
        pytest.skip("2507 Thinking models always reason")
    prefix, tools = PROMPTS[case]
    reasoning, content, calls = FINALS[final]
    if fmt.name == "qwen3-thinking" and reasoning and reasoning.startswith("\n"):
        reasoning = reasoning[1:]  # its raw form: the newline after <think> is in the prompt
    last: Message = {"role": "assistant", "content": content}
    if reasoning is not None:
        last["reasoning_content"] = reasoning
    if calls:
        last["tool_calls"] = calls
    full = render([*prefix, last], tools, gen=False)
    assert full.endswith("<|im_end|>\n")
    prompt = fmt.prompt_text(prefix, tools)
    answer = fmt.answer_text(reasoning, content, calls, finished=True)
    assert prompt + answer.text == full[:-1]
    if fmt.name == "qwen3-thinking" and not reasoning:
        # The prompt ends "<think>\n" and the answer starts "\n</think>": encoded as one text
        # the two newlines merge into one token, which a model cannot do across the boundary.
        return
    assert qwen3_tok.encode(prompt) + qwen3_tok.encode(answer.text) == qwen3_tok.encode(full[:-1])


def test_tool_loop_prompt_extends_previous_prompt(fmt: Format) -> None:
    """Inside a tool loop the template keeps the reasoning, so the next prompt is the previous
    prompt + the answer + the tool results."""
    messages, tools = PROMPTS["tool_loop_open"]
    first = fmt.prompt_text(messages[:2], tools)
    answer = fmt.answer_text("I need both cities.", None, [PARIS, TOKYO], finished=True)
    second = fmt.prompt_text(messages, tools)
    assert second.startswith(first + answer.text + "\n<|im_start|>user\n<tool_response>")


# ---- answer text ----------------------------------------------------------------------------


def test_special_tokens_and_self_check(fmt: Format, qwen3_tok: Tokenizer) -> None:
    tokens = fmt.special_tokens()
    assert tokens == {
        "<|im_end|>": 151645,
        "<|im_start|>": 151644,
        "<think>": 151667,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "</think>": 151668,
    }
    self_check(qwen3_tok, tokens)
    assert fmt.stop_token_id == 151645


def test_registry(qwen3_tok: Tokenizer) -> None:
    assert {"qwen3", "qwen3-thinking"} <= set(format_names())
    assert get_format("qwen3", qwen3_tok).name == "qwen3"


@pytest.mark.parametrize(
    ("raw", "stripped", "expected"),
    [
        (
            ("\nLet me think.\n", "\n\nHello!"),
            ("Let me think.", "Hello!"),
            "<think>\nLet me think.\n</think>\n\nHello!<|im_end|>",
        ),
        (("\n\n", "\n\nHello!"), (None, "Hello!"), "<think>\n\n</think>\n\nHello!<|im_end|>"),
        (("\n\n", "\n\nHello!"), ("", "Hello!"), "<think>\n\n</think>\n\nHello!<|im_end|>"),
        (("\nR\n", "\n\n"), ("R", None), "<think>\nR\n</think>\n\n<|im_end|>"),
    ],
)
def test_hybrid_raw_and_stripped_agree(
    hybrid: Format,
    raw: tuple[str, str],
    stripped: tuple[str | None, str | None],
    expected: str,
) -> None:
    a = hybrid.answer_text(*raw, None, finished=True)
    b = hybrid.answer_text(*stripped, None, finished=True)
    assert a.text == b.text == expected
    assert a.flags == []
    assert b.flags == ["whitespace_restored"]


def test_thinking_raw_and_stripped_agree(thinking: Format, qwen3_tok: Tokenizer) -> None:
    raw = thinking.answer_text("Let me think.\n", "\n\nHello!", None, finished=True)
    stripped = thinking.answer_text("Let me think.", "Hello!", None, finished=True)
    assert raw.text == stripped.text == "Let me think.\n</think>\n\nHello!<|im_end|>"
    assert raw.flags == [] and stripped.flags == ["whitespace_restored"]
    ids = qwen3_tok.encode(raw.text)
    assert ids[-1] == 151645 and 151668 in ids and 151667 not in ids


def test_thinking_missing_reasoning_flagged(thinking: Format) -> None:
    a = thinking.answer_text(None, "Hello!", None, finished=True)
    assert a.text == "\n</think>\n\nHello!<|im_end|>"
    assert "reasoning_missing" in a.flags


def test_hybrid_tokens(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    ids = qwen3_tok.encode(hybrid.answer_text("R", "C", [PARIS], finished=True).text)
    assert ids[0] == 151667 and 151668 in ids and 151657 in ids and 151658 in ids
    assert ids[-1] == 151645


def test_truncated_has_no_stop_token(fmt: Format) -> None:
    done = fmt.answer_text("R", "Partial answ", None, finished=False)
    assert not done.text.endswith("<|im_end|>")
    assert done.text.endswith("</think>\n\nPartial answ")
    in_reasoning = fmt.answer_text("\nStill thinking", None, None, finished=False)
    assert "</think>" not in in_reasoning.text and "<|im_end|>" not in in_reasoning.text
    assert in_reasoning.text.endswith("\nStill thinking")


def test_tool_calls_layout(hybrid: Format) -> None:
    weather = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    tokyo = '{"name": "get_weather", "arguments": {"city": "東京", "unit": "C"}}'
    only = hybrid.answer_text("R", None, [PARIS], finished=True).text
    assert only == f"<think>\nR\n</think>\n\n<tool_call>\n{weather}\n</tool_call><|im_end|>"
    text = hybrid.answer_text("R", "Checking.", [PARIS, TOKYO], finished=True).text
    assert text == (
        f"<think>\nR\n</think>\n\nChecking.\n<tool_call>\n{weather}\n</tool_call>\n"
        f"<tool_call>\n{tokyo}\n</tool_call><|im_end|>"
    )


def test_tool_calls_raw_and_stripped_agree(hybrid: Format) -> None:
    # vLLM's hermes parser leaves the text before <tool_call> in content, separator included.
    for raw_content, stripped_content in [("\n\n", None), ("\n\nChecking.\n", "Checking.")]:
        raw = hybrid.answer_text("\nR\n", raw_content, [PARIS], finished=True)
        stripped = hybrid.answer_text("R", stripped_content, [PARIS], finished=True)
        assert raw.text == stripped.text
        assert raw.flags == [] and stripped.flags == ["whitespace_restored"]


def test_raw_tool_text_in_content_not_doubled(fmt: Format) -> None:
    structured = fmt.answer_text("R", "Checking.", [PARIS], finished=True).text
    content = structured.split("</think>", 1)[1].removesuffix("<|im_end|>")
    assert content.startswith("\n\nChecking.\n<tool_call>")
    alone = fmt.answer_text("R", content, None, finished=True)
    assert alone.text == structured and alone.text.count("<tool_call>") == 1
    both = fmt.answer_text("R", content, [PARIS], finished=True)
    assert both.text == structured
    assert "tool_calls_in_content_and_structured" in both.flags


def test_reasoning_in_content_is_split(fmt: Format) -> None:
    # An engine without a reasoning parser puts the whole think block into content.
    expected = fmt.answer_text("\nR\n", "\n\nHello!", None, finished=True)
    head = "<think>" if fmt.name == "qwen3" else ""
    raw = f"{head}\nR\n</think>\n\nHello!" if head else "\nR\n</think>\n\nHello!"
    got = fmt.answer_text(None, raw, None, finished=True)
    assert got.text == expected.text
    assert "reasoning_in_content" in got.flags


# ---- parsing and the round trip -------------------------------------------------------------

REASONINGS = [
    None,
    "",
    "Let me think.",
    "\nLet me think.\n",
    "\nlead only",
    "trail only\n",
    "multi\n\nline 世界",
    "\n\n",
]
CONTENTS = [None, "", "Hello!", "\n\nHello!", "Line 1\nLine 2\n", "\n\nRaw with sep\n", "über 🚀"]
TOOL_SETS: list[list[dict[str, Any]] | None] = [
    None,
    [TOKYO],
    [PARIS],
    [PARIS, TOKYO],
    [call("search", {"q": 'a\nb "c" </x>'}), call("search", "{}")],
]


def test_round_trip(fmt: Format, qwen3_tok: Tokenizer) -> None:
    count = 0
    for reasoning, content, calls, finished in itertools.product(
        REASONINGS, CONTENTS, TOOL_SETS, (True, False)
    ):
        built = fmt.answer_text(reasoning, content, calls, finished=finished)
        parsed = fmt.parse_answer_text(built.text)
        again = fmt.answer_text(
            parsed.reasoning, parsed.content, parsed.tool_calls, finished=parsed.finished
        )
        case = (reasoning, content, calls, finished, built.text)
        assert again.text == built.text, case
        assert qwen3_tok.encode(again.text) == qwen3_tok.encode(built.text), case
        assert parsed.finished is finished, case
        assert again.flags == [], case
        if calls:
            assert parsed.tool_calls is not None, case
            assert [c["function"]["name"] for c in parsed.tool_calls] == [
                c["function"]["name"] for c in calls
            ]
            for got, want in zip(parsed.tool_calls, calls, strict=True):
                args = want["function"]["arguments"]
                expected = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                assert got["function"]["arguments"] == expected
                assert got["type"] == "function" and got["id"].startswith("call_")
        else:
            assert parsed.tool_calls is None, case
        count += 1
    assert count == len(REASONINGS) * len(CONTENTS) * len(TOOL_SETS) * 2


def test_parse_raw_slices(hybrid: Format, thinking: Format) -> None:
    p = hybrid.parse_answer_text("<think>\nR\n</think>\n\nHello!<|im_end|>")
    assert (p.reasoning, p.content, p.tool_calls, p.finished) == ("\nR\n", "\n\nHello!", None, True)
    p = thinking.parse_answer_text("R\n</think>\n\nHello!")
    assert (p.reasoning, p.content, p.finished) == ("R\n", "\n\nHello!", False)
    p = hybrid.parse_answer_text("<think>\nstill going")
    assert (p.reasoning, p.content) == ("\nstill going", None)
    p = thinking.parse_answer_text("still going")
    assert (p.reasoning, p.content) == ("still going", None)


def test_parse_tool_calls(hybrid: Format) -> None:
    text = hybrid.answer_text("R", "Checking.", [PARIS, TOKYO], finished=True).text
    p = hybrid.parse_answer_text(text)
    assert p.content == "\n\nChecking."
    assert p.tool_calls == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "東京", "unit": "C"}'},
        },
    ]


@pytest.mark.parametrize(
    "tail",
    [
        'Sure<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',  # no separator
        '\n<tool_call>\n{"arguments": {}, "name": "f"}\n</tool_call>',  # other key order
        '\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> trailing text',
        '\n<tool_call>\n{"name": "f", "arguments": {"a":',  # truncated mid-call
    ],
)
def test_unusual_tool_text_stays_in_content(hybrid: Format, tail: str) -> None:
    text = "<think>\nR\n</think>\n\n" + tail
    p = hybrid.parse_answer_text(text)
    assert p.tool_calls is None
    assert p.content == "\n\n" + tail
    assert hybrid.answer_text(p.reasoning, p.content, None, finished=p.finished).text == text


# ---- rebuild_batch (base.py's token layer with this format) ---------------------------------


def test_rebuild_native(fmt: Format, qwen3_tok: Tokenizer) -> None:
    text = fmt.answer_text("\nR\n", "\n\nChecking.", [PARIS], finished=True).text
    ids = qwen3_tok.encode(text)
    [rebuilt] = fmt.rebuild_batch([RawAnswer(output_ids=ids, finish_reason="stop")])
    assert rebuilt.token_source == "native" and rebuilt.token_check == "exact"
    assert rebuilt.output_ids == ids
    assert rebuilt.reasoning == "\nR\n"
    assert rebuilt.content == "\n\nChecking."
    assert rebuilt.tool_calls is not None
    assert rebuilt.tool_calls[0]["function"]["name"] == "get_weather"


def test_rebuild_native_appends_reported_stop(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    ids = qwen3_tok.encode("<think>\nR\n</think>\n\nHi")
    raw = RawAnswer(output_ids=ids, finish_reason="stop", stop_token_id=151645)
    [rebuilt] = hybrid.rebuild_batch([raw])
    assert rebuilt.output_ids == [*ids, 151645]
    assert rebuilt.flags == ["stop_token_appended"]
    assert rebuilt.content == "\n\nHi"


def test_rebuild_reconstructed_length_checks(fmt: Format, qwen3_tok: Tokenizer) -> None:
    expected = qwen3_tok.encode(fmt.answer_text("R", "Hello!", None, finished=True).text)
    n = len(expected)

    def raw(tokens: int | None, finish: str = "stop") -> RawAnswer:
        return RawAnswer(
            reasoning="R",
            content="Hello!",
            finish_reason=finish,
            usage=Usage(completion_tokens=tokens),
        )

    ok, bad, unknown, cut = fmt.rebuild_batch([raw(n), raw(n + 1), raw(None), raw(n, "length")])
    assert ok.output_ids == expected and ok.token_source == "reconstructed"
    assert ok.token_check == "length_ok"
    assert ok.flags == ["whitespace_restored"]
    assert bad.token_check == "length_mismatch"
    assert unknown.token_check == "unverifiable"
    assert cut.output_ids == expected[:-1] and cut.token_check == "length_mismatch"


def test_rebuild_mixed_batch_keeps_order(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    ids = qwen3_tok.encode("<think>\nA\n</think>\n\nnative<|im_end|>")
    answers = [
        RawAnswer(reasoning="B", content="text", finish_reason="stop"),
        RawAnswer(output_ids=ids, finish_reason="stop"),
        RawAnswer(reasoning="C", content="more", finish_reason="length"),
    ]
    a, b, c = hybrid.rebuild_batch(answers)
    assert a.content == "text" and a.token_source == "reconstructed"
    assert b.content == "\n\nnative" and b.token_source == "native"
    assert c.content == "more" and c.output_ids[-1] != 151645


def test_stray_stop_token_in_content_flagged(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    raw = RawAnswer(reasoning="R", content="Hi<|im_end|> there", finish_reason="stop")
    [rebuilt] = hybrid.rebuild_batch([raw])
    assert "special_token_in_content" in rebuilt.flags
    assert rebuilt.output_ids.count(151645) == 2
