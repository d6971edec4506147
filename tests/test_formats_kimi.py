"""Kimi formats. Kimi's tokenizer is not available offline: the text layer is tested exactly,
the token layer on the real Qwen3 BPE carrying Kimi's special tokens at their real IDs."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from draftgen.formats import Format, get_format
from draftgen.formats.kimi_tools import declare_tools, tools_typescript
from draftgen.testing.assets import KIMI_SPECIAL_TOKENS, family_tokenizer
from draftgen.tokenize import Tokenizer, self_check
from draftgen.tokenize.logprob_tokens import LogprobToken
from draftgen.types import Message, Prompt, RawAnswer, Tool, Usage

SYSTEM = (
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
    "<|im_end|>"
)
GEN = "<|im_assistant|>assistant<|im_middle|>"
END = "<|im_end|>"
SECTION = "<|tool_calls_section_begin|>"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return family_tokenizer("kimi")


@pytest.fixture(scope="module")
def k25(tok: Tokenizer) -> Format:
    return get_format("kimi-k2.5", tok)


@pytest.fixture(scope="module")
def k2t(tok: Tokenizer) -> Format:
    return get_format("kimi-k2-thinking", tok)


def call(name: str, args: str | dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if call_id is not None:
        out["id"] = call_id
    return out


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def section(*calls: tuple[str, str]) -> str:
    body = "".join(f"<|tool_call_begin|>{i}<|tool_call_argument_begin|>{a}<|tool_call_end|>"
                   for i, a in calls)
    return f"{SECTION}{body}<|tool_calls_section_end|>"


WEATHER: Tool = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["C", "F"]}, "city": {"type": "string",
                                                                  "description": "The city."}},
            "required": ["city"],
        },
    },
}
PARIS = call("get_weather", '{"city": "Paris"}', "call_abc")
TOKYO = call("get_weather", '{"city": "東京"}', "functions.get_weather:1")


# ---- prompts ---------------------------------------------------------------------------------


def test_prompt_layout(k25: Format, k2t: Format, tok: Tokenizer) -> None:
    turn = f"{SYSTEM}<|im_user|>user<|im_middle|>Hi{END}{GEN}"
    assert k25.prompt_text([user("Hi")], None) == f"{turn}<think>"
    assert k2t.prompt_text([user("Hi")], None) == turn
    plain = get_format("kimi-k2.5", tok, {"thinking": False})
    assert plain.prompt_text([user("Hi")], None).endswith(f"{GEN}<think></think>")
    own = [{"role": "system", "content": "Be terse."}, user("Hi")]
    assert k25.prompt_text(own, None).startswith(
        f"<|im_system|>system<|im_middle|>Be terse.{END}<|im_user|>user")
    assert get_format("kimi-k2", tok).name == "kimi-k2.5"
    ids = k25.render_prompt([user("Hi")], None)
    assert ids[-4:] == [163588, *tok.encode("assistant"), 163601, 163606]


def test_history_reasoning_and_tool_ids(k25: Format) -> None:
    messages = [
        user("Weather?"),
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "old turn"},
        user("Paris and Tokyo?"),
        {"role": "assistant", "content": "", "reasoning_content": "both",
         "tool_calls": [PARIS, TOKYO]},
        {"role": "tool", "tool_call_id": "call_abc", "name": "get_weather", "content": "21"},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "28"},
    ]
    text = k25.prompt_text(messages, None)
    expected_loop = (
        f"{GEN}<think>both</think>"
        + section(("functions.get_weather:0", '{"city": "Paris"}'),
                  ("functions.get_weather:1", '{"city": "東京"}'))
        + f"{END}<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n21{END}"
        + f"<|im_system|>tool<|im_middle|>## Return of functions.get_weather:1\n28{END}"
        + f"{GEN}<think>"
    )
    assert text.endswith(expected_loop)
    assert f"{GEN}<think></think>Sunny.{END}" in text  # completed turn: reasoning dropped
    assert "old turn" not in text


def test_tool_declaration(k25: Format, k2t: Format) -> None:
    ts = (
        "# Tools\n\n## functions\nnamespace functions {\n// Get the weather.\n"
        'type get_weather = (_: {\n  // The city.\n  city: string,\n  unit?: "C" | "F"\n'
        "}) => any;\n}\n"
    )
    assert k25.prompt_text([user("x")], [WEATHER]).startswith(
        f"<|im_system|>tool_declare<|im_middle|>{ts}{END}{SYSTEM}")
    compact = (
        '[{"function":{"description":"Get the weather.","name":"get_weather","parameters":'
        '{"properties":{"city":{"description":"The city.","type":"string"},"unit":{"enum":'
        '["C","F"]}},"required":["city"],"type":"object"}},"type":"function"}]'
    )
    assert k2t.prompt_text([user("x")], [WEATHER]).startswith(
        f"<|im_system|>tool_declare<|im_middle|>{compact}{END}")


def _fn(parameters: dict[str, Any], name: str = "f", description: str | None = None) -> Tool:
    fn: dict[str, Any] = {"name": name, "parameters": parameters}
    if description:
        fn["description"] = description
    return {"type": "function", "function": fn}


TS_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "empty": ({}, "type f = (_: {}) => any;"),
    "order_constraints_default": (
        {"type": "object", "required": ["b"], "properties": {
            "c": {"type": "integer", "minimum": 1, "maximum": 9, "default": 3},
            "a": {"type": "string", "maxLength": 5, "description": "line 1\n\nline 3"},
            "b": {"type": "boolean", "default": False}}},
        "type f = (_: {\n  // Default: False\n  b: boolean,\n  // line 1\n\n  // line 3\n"
        "  // maxLength: 5\n  a?: string,\n  // maximum: 9, minimum: 1\n  // Default: 3\n"
        "  c?: number\n}) => any;",
    ),
    "nested_array_union": (
        {"type": "object", "properties": {
            "o": {"type": "object", "description": "An object.",
                  "properties": {"x": {"type": ["string", "null"]}},
                  "additionalProperties": {"type": "number"}},
            "l": {"type": "array", "minItems": 1, "items": {"type": "string", "description": "s"}},
            "m": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
            "n": {"type": "array"}}},
        "type f = (_: {\n  // minItems: 1\n  l?: Array<\n    // s\n    string\n  >,\n"
        "  m?: Array<string | number>,\n  n?: Array<any>,\n  // An object.\n  o?: {\n"
        "    x?: string | null,\n    [k: string]: number\n  }\n}) => any;",
    ),
    "defs_and_refs": (
        {"type": "object", "$defs": {"Pt": {"type": "object", "description": "A point.",
                                             "properties": {"x": {"type": "number"}},
                                             "required": ["x"]}},
         "properties": {"p": {"$ref": "#/$defs/Pt"}}, "required": ["p"]},
        "// A point.\ninterface Pt {\n  x: number\n}\ntype f = (_: {\n  p: Pt\n}) => any;",
    ),
    "self_reference": (
        {"type": "object", "properties": {"name": {"type": "string"},
                                          "child": {"$ref": "#"}}, "required": ["name"]},
        "interface parameters {\n  child?: parameters,\n  name: string\n}\n"
        "type f = (_: parameters) => any;",
    ),
    "no_extra_properties": (
        {"type": "object", "properties": {}, "additionalProperties": False},
        "type f = (_: {\n  [k: string]: never\n}) => any;",
    ),
}


@pytest.mark.parametrize("case", sorted(TS_CASES))
def test_typescript_declarations(case: str) -> None:
    parameters, expected = TS_CASES[case]
    tools = [_fn(parameters)]
    text = declare_tools(tools, typescript=True)
    assert text == f"# Tools\n\n## functions\nnamespace functions {{\n{expected}\n}}\n"


def test_typescript_falls_back_to_json() -> None:
    bad = [_fn({"type": "object", "properties": {"a": {"type": "string", "enum": [1]}}})]
    assert declare_tools(bad, typescript=True).startswith('[{"function":')
    assert tools_typescript([{"type": "retrieval"}]) == ""
    described = tools_typescript([_fn({}, "g", "Does g.")])
    assert "// Does g.\ntype g = (_: {}) => any;" in described


# ---- answers ---------------------------------------------------------------------------------


def test_answer_layout(k25: Format, k2t: Format) -> None:
    a = k25.answer_text("Think.", "Hello!", None, finished=True)
    assert a.text == f"Think.</think>Hello!{END}" and a.flags == []
    b = k2t.answer_text("Think.", "Hello!", None, finished=True)
    assert b.text == f"<think>Think.</think>Hello!{END}"
    calls = k25.answer_text("R", "Checking.", [PARIS, TOKYO], finished=True)
    assert calls.text == (
        "R</think>Checking." + section(("functions.get_weather:0", '{"city": "Paris"}'),
                                       ("functions.get_weather:1", '{"city": "東京"}')) + END
    )
    assert calls.flags == ["tool_call_ids_rebuilt"]
    dict_args = k25.answer_text("R", "", [call("f", {"a": 1}, "functions.f:0")], finished=True)
    assert section(("functions.f:0", '{"a": 1}')) in dict_args.text


def test_tool_ids_continue_the_conversation(k25: Format) -> None:
    history = [user("Paris?"), {"role": "assistant", "content": "", "tool_calls": [PARIS]},
               {"role": "tool", "tool_call_id": "call_abc", "content": "21"}]
    prompt = Prompt(id="p", dataset="d", messages=history)
    raw = RawAnswer(reasoning="Now Tokyo.", content="", tool_calls=[call("get_weather", "{}", "x")],
                    finish_reason="tool_calls")
    text = k25.answer_in_context(raw, prompt)
    assert "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{}" in text.text
    assert "tool_call_ids_rebuilt" in text.flags


def test_tool_section_without_end_think(k25: Format, tok: Tokenizer) -> None:
    """Reasoning then only a tool section: the fields cannot say whether `</think>` was
    there; both texts are candidates and the engine's token count decides."""
    got = k25.answer_text("Need data.", None, [TOKYO], finished=True)
    tools = section(("functions.get_weather:1", '{"city": "東京"}'))
    assert got.text == f"Need data.</think>{tools}{END}"
    assert got.alternatives == [f"Need data.{tools}{END}"]
    assert got.flags == ["end_think_uncertain"]
    ids = tok.encode(f"Need data.{tools}{END}")
    raw = RawAnswer(reasoning="Need data.", content=None, tool_calls=[TOKYO], finish_reason="stop",
                    usage=Usage(completion_tokens=len(ids)))
    [rebuilt] = k25.rebuild_batch([raw])
    assert rebuilt.output_ids == ids and 163607 not in ids
    assert rebuilt.flags == ["layout_chosen_by_length"] and rebuilt.token_check == "length_ok"
    # Raw tool text left in content by a server without a tool parser: the same candidates.
    raw_text = k25.answer_text("Need data.", tools, None, finished=True)
    assert raw_text.candidates == got.candidates
    # With content before the section, `</think>` is certain.
    sure = k25.answer_text("Need data.", "Let me check.", [TOKYO], finished=True)
    assert sure.alternatives == [] and "</think>Let me check." + SECTION in sure.text


def test_parse_and_round_trip(k25: Format, k2t: Format) -> None:
    p = k25.parse_answer_text(f"R{section(('functions.f:0', '{}'))}{END}")
    assert (p.reasoning, p.content, p.finished) == ("R", "", True)
    assert p.tool_calls == [{"id": "functions.f:0", "type": "function",
                             "function": {"name": "f", "arguments": "{}"}}]
    for fmt in (k25, k2t):
        for reasoning, content, calls, finished in itertools.product(
            [None, "", "R", "multi\nline 世界"], [None, "", "C", "\n\nC"],
            [None, [TOKYO], [TOKYO, call("f", "{}", "functions.f:2")]], (True, False),
        ):
            built = fmt.answer_text(reasoning, content, calls, finished=finished)
            for text in built.candidates:
                parsed = fmt.parse_answer_text(text)
                again = fmt.answer_text(parsed.reasoning, parsed.content, parsed.tool_calls,
                                        finished=parsed.finished)
                assert text in again.candidates, (fmt.name, reasoning, content, calls, text)
                assert parsed.finished is finished


def test_truncation_and_stray_tokens(k25: Format, tok: Tokenizer) -> None:
    cut = k25.answer_text("Still thinking", None, None, finished=False)
    assert cut.text == "Still thinking"
    cut_content = k25.answer_text("R", "Partial", None, finished=False)
    assert cut_content.text == "R</think>Partial"
    stray, truncated = k25.rebuild_batch([
        RawAnswer(reasoning="R", content=f"Hi{END} there", finish_reason="stop"),
        RawAnswer(reasoning="R", content="Part", finish_reason="length"),
    ])
    assert "special_token_in_content" in stray.flags and stray.output_ids.count(163586) == 2
    assert 163586 not in truncated.output_ids
    in_content = k25.answer_text(None, "R</think>C", None, finished=True)
    assert in_content.text == f"R</think>C{END}" and "reasoning_in_content" in in_content.flags


def test_special_tokens_and_self_check(k25: Format, tok: Tokenizer) -> None:
    tokens = k25.special_tokens()
    assert tokens == {t: i for i, t in KIMI_SPECIAL_TOKENS.items()
                      if t not in ("[BOS]", "[EOS]")}
    self_check(tok, tokens)


def test_logprobs_pick_the_sampled_layout(k25: Format, tok: Tokenizer) -> None:
    """Logprobs over the whole answer but the stop token: the variant without `</think>` is
    the one they decode to; the stop token is appended because the answer finished."""
    tools = section(("functions.get_weather:1", '{"city": "東京"}'))
    ids = tok.encode(f"Need data.{tools}")
    logprobs = [LogprobToken(token="", id=i) for i in ids]
    raw = RawAnswer(reasoning="Need data.", tool_calls=[TOKYO], finish_reason="tool_calls",
                    logprobs=logprobs)
    [rebuilt] = k25.rebuild_batch([raw])
    assert rebuilt.output_ids == [*ids, 163586]
    assert rebuilt.token_check == "exact" and rebuilt.token_source == "native"
