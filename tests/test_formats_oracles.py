"""Every family against its official reference (tests/oracles), over the fixed conversations
of tests/format_cases.py. The properties are stated in docs/formats.md:

1. prompt IDs == the official render's IDs (and the text too);
2. answer: what draftgen rebuilds from the answer's fields is what the template renders for
   that turn, so the answer IDs are the tokens the model emits: render(conversation + answer)
   == prompt + answer where the template keeps the turn intact, and the part after `</think>`
   where it drops the reasoning of the turn (DeepSeek);
3. parse(answer) gives back the message's reasoning, content and tool calls.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from draftgen.formats import Format, get_format
from draftgen.testing.assets import cached_tokenizer, deepseek_r1_tokenizer_dir, family_tokenizer
from draftgen.tokenize import Tokenizer
from draftgen.types import Prompt, RawAnswer, Usage
from tests import oracles
from tests.format_cases import Answer, Case, cases

CASES = cases()
IDS = [c.name for c in CASES]


def test_the_corpus_covers_what_the_issue_asks() -> None:
    assert len(CASES) >= 40
    flat = json.dumps([[c.messages, c.tools, c.answer.__dict__] for c in CASES],
                      ensure_ascii=False)
    for needle in ('"role": "system"', '"role": "tool"', '"items"', '"properties": {}',
                   "reasoning_content", "東京", '"content": ""'):
        assert needle in flat, needle
    assert any(len(c.answer.tool_calls) > 1 for c in CASES)
    assert any(sum(m["role"] == "tool" for m in c.messages) > 1 for c in CASES)


def prompt_of(case: Case) -> Prompt:
    return Prompt(id=case.name, dataset="oracle", messages=case.messages, tools=case.tools)


def rebuilt(fmt: Format, case: Case) -> tuple[str, list[int]]:
    """The answer's native text and IDs, as a run rebuilds them from the answer's fields."""
    a = case.answer
    raw = RawAnswer(reasoning=a.reasoning, content=a.content, tool_calls=a.tool_calls or None,
                    finish_reason="tool_calls" if a.tool_calls else "stop", usage=Usage())
    text = fmt.answer_in_context(raw, prompt_of(case)).text
    [record] = fmt.rebuild_batch([raw], [prompt_of(case)])
    assert fmt.tokenizer.decode(record.output_ids) == text
    return text, record.output_ids


def without_reasoning(case: Case) -> Case:
    """The case as a non-thinking model answers it: no reasoning."""
    return replace(case, answer=replace(case.answer, reasoning=None))


def assert_parses_back(fmt: Format, text: str, answer: Answer, *, keeps_reasoning: bool = True
                       ) -> None:
    parsed = fmt.parse_answer_text(text)
    assert parsed.finished
    if keeps_reasoning:
        assert (parsed.reasoning or "").strip("\n") == (answer.reasoning or "")
    assert (parsed.content or "").strip("\n") == answer.content
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls or []]
    want = [(c["function"]["name"], c["function"]["arguments"]) for c in answer.tool_calls]
    assert got == want


# ---- Qwen3 (hybrid and 2507 Thinking) --------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3(qwen3_tok: Tokenizer) -> Format:
    return get_format("qwen3", qwen3_tok)


@pytest.fixture(scope="module")
def qwen3_thinking(qwen3_tok: Tokenizer) -> Format:
    return get_format("qwen3-thinking", qwen3_tok)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("variant", ["qwen3", "qwen3-thinking"])
def test_qwen3(case: Case, variant: str, qwen3: Format, qwen3_thinking: Format) -> None:
    fmt = qwen3 if variant == "qwen3" else qwen3_thinking
    hf = oracles.qwen3_hf()
    # 2507 Thinking's template is the hybrid one with `<think>\n` after the generation prompt.
    opening = "<think>\n" if variant == "qwen3-thinking" else ""
    official = oracles.hf_render(hf, case.messages, case.tools, add_generation_prompt=True)
    assert fmt.prompt_text(case.messages, case.tools) == official + opening
    official_ids = oracles.hf_ids(hf, case.messages, case.tools, add_generation_prompt=True)
    prompt_ids = fmt.render_prompt(case.messages, case.tools)
    assert prompt_ids == official_ids + hf.encode(opening, add_special_tokens=False)

    text, answer_ids = rebuilt(fmt, case)
    whole = [*case.messages, case.answer.message()]
    full = oracles.hf_render(hf, whole, case.tools, add_generation_prompt=False)
    assert full == official + opening + text + "\n"
    full_ids = oracles.hf_ids(hf, whole, case.tools, add_generation_prompt=False)
    if not (opening and text.startswith("\n")):
        # (An empty reasoning's "\n" after the prompt's `<think>\n` is one token, "\n\n",
        # when the whole text is encoded; the model emitted two.)
        assert full_ids == prompt_ids + answer_ids + hf.encode("\n", add_special_tokens=False)
    assert_parses_back(fmt, text, case.answer)


# ---- DeepSeek-R1 and V3.1 --------------------------------------------------------------------


@pytest.fixture(scope="module")
def r1_tok() -> Tokenizer:
    return cached_tokenizer(str(deepseek_r1_tokenizer_dir()))


def _after_think(text: str) -> str:
    return text.partition("</think>")[2] if "</think>" in text else text


def _history_intact(case: Case, family: str) -> bool:
    """R1's template never resets its `is_first` flag: after one assistant turn with tool
    calls, a later one is rendered without `<｜Assistant｜>` (so the turn as history differs
    from the turn as generated; the prompt side still matches, see docs/formats.md)."""
    earlier_calls = any(m.get("tool_calls") for m in case.messages)
    return not (family == "deepseek-r1" and earlier_calls and case.answer.tool_calls)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_deepseek_r1(case: Case, r1_tok: Tokenizer) -> None:
    fmt = get_format("deepseek-r1", r1_tok)
    hf = oracles.deepseek_hf()
    official = oracles.hf_render(hf, case.messages, case.tools, add_generation_prompt=True)
    # The updated R1 template (and R1-0528) open the think block in the generation prompt;
    # the one in the tokenizer package does not (format option `think_prefill`).
    opening = "" if case.after_tools else "<think>\n"
    assert fmt.prompt_text(case.messages, case.tools) == official + opening
    original = get_format("deepseek-r1", r1_tok, {"think_prefill": False})
    assert original.prompt_text(case.messages, case.tools) == official
    official_ids = oracles.hf_ids(hf, case.messages, case.tools, add_generation_prompt=True)
    assert original.render_prompt(case.messages, case.tools) == official_ids

    text, answer_ids = rebuilt(fmt, case)
    turn = {**case.answer.message(), "content": case.answer.content}
    full = oracles.hf_render(hf, [*case.messages, turn], case.tools, add_generation_prompt=False)
    if _history_intact(case, "deepseek-r1"):
        assert full == official + _after_think(text)
        if "</think>" not in text:  # after tool outputs: the whole answer is the turn
            assert oracles.hf_ids(hf, [*case.messages, turn], case.tools,
                                  add_generation_prompt=False) == official_ids + answer_ids
    assert_parses_back(fmt, text, case.answer, keeps_reasoning=not case.after_tools)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_deepseek_v31(case: Case, thinking: bool, r1_tok: Tokenizer) -> None:
    case = case if thinking else without_reasoning(case)
    fmt = get_format("deepseek-v3.1", r1_tok, {"thinking": thinking})
    hf = oracles.deepseek_hf()
    template = oracles.deepseek_v31_template()

    def render(messages: list[dict[str, Any]], gen: bool, think: bool) -> str:
        return oracles.hf_render(hf, messages, case.tools, add_generation_prompt=gen,
                                 chat_template=template, thinking=think)

    official = render(case.messages, True, thinking)
    assert fmt.prompt_text(case.messages, case.tools) == official
    assert fmt.render_prompt(case.messages, case.tools) == oracles.hf_ids(
        hf, case.messages, case.tools, add_generation_prompt=True, chat_template=template,
        thinking=thinking)

    text, _ = rebuilt(fmt, case)
    # History turns are rendered as non-thinking turns (`<｜Assistant｜></think>content`).
    full = render([*case.messages, case.answer.message()], False, thinking)
    assert full == render(case.messages, True, False) + _after_think(text)
    if not thinking:
        assert full == official + text
    assert_parses_back(fmt, text, case.answer,
                       keeps_reasoning=thinking and not case.after_tools)


# ---- Kimi-K2.5 -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kimi_tok() -> Tokenizer:
    return family_tokenizer("kimi")


def _cookbook_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message as the cookbook's renderer takes it."""
    if message["role"] != "assistant":
        return dict(message)
    parts = []
    if message.get("reasoning_content") is not None:
        parts.append({"type": "thinking", "thinking": message["reasoning_content"]})
    parts.append({"type": "text", "text": message["content"]})
    out: dict[str, Any] = {"role": "assistant", "content": parts}
    if message.get("tool_calls"):
        out["tool_calls"] = [oracles.cookbook_tool_call(c) for c in message["tool_calls"]]
    return out


def _cookbook_conversation(case: Case, extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool declaration turn as the model's tokenizer builds it (keys deep-sorted, then
    Moonshot's TypeScript encoder), then the conversation; the renderer adds the default
    system turn when no system message follows."""
    head = []
    if case.tools:
        head.append({"role": "tool_declare",
                     "content": oracles.typescript_tools(_deep_sort(case.tools))})
    return head + [_cookbook_message(m) for m in [*case.messages, *extra]]


def _deep_sort(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_deep_sort(v) for v in value]
    return value


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_kimi_k25(case: Case, thinking: bool, kimi_tok: Tokenizer) -> None:
    case = case if thinking else without_reasoning(case)
    fmt = get_format("kimi-k2.5", kimi_tok, {"thinking": thinking})
    renderer = oracles.kimi_k25_renderer(kimi_tok, thinking=thinking)
    official_ids = renderer.build_generation_prompt(_cookbook_conversation(case, [])).to_ints()
    assert fmt.prompt_text(case.messages, case.tools) == kimi_tok.decode(official_ids)
    assert fmt.render_prompt(case.messages, case.tools) == official_ids

    text, answer_ids = rebuilt(fmt, case)
    # The answer as the turn being produced (its reasoning kept): header, then the output,
    # whose head is the prompt's tail (`<think>` or `<think></think>`).
    conversation = _cookbook_conversation(case, [case.answer.message()])
    turn = renderer.render_message(conversation[-1], oracles.cookbook_context(
        len(conversation) - 1, in_last_assistant_turn=True))
    turn_ids = [*turn.header.tokens, *(t for c in turn.output for t in c.tokens)]
    head = len(turn_ids) - len(answer_ids)
    assert official_ids[-head:] == turn_ids[:head]
    assert turn_ids[head:] == answer_ids
    if thinking:
        message, _ = renderer.parse_response(answer_ids)
        parts = message["content"] if isinstance(message["content"], list) else [
            {"type": "text", "text": message["content"]}]
        assert "".join(p.get("thinking", "") for p in parts) == (case.answer.reasoning or "")
        assert "".join(p.get("text", "") for p in parts) == case.answer.content
        calls = [(c.id, c.function.name, c.function.arguments)
                 for c in message.get("tool_calls", [])]
        assert calls == [(c["id"], c["function"]["name"], c["function"]["arguments"])
                         for c in case.answer.tool_calls]
    assert_parses_back(fmt, text, case.answer, keeps_reasoning=thinking)


@pytest.mark.parametrize("case", [c for c in CASES if c.tools], ids=[c.name for c in CASES
                                                                       if c.tools])
def test_kimi_tool_declaration_is_moonshots(case: Case, kimi_tok: Tokenizer) -> None:
    from draftgen.formats.kimi_tools import declare_tools

    assert case.tools is not None
    assert declare_tools(case.tools, typescript=True) == oracles.typescript_tools(
        _deep_sort(case.tools))


# ---- check-format's renderer is transformers' ---------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_jinja_renderer_is_transformers(case: Case) -> None:
    """`ChatTemplate` (what `chat-template` and `draftgen check-format` render a model's own
    template with) gives transformers' text on the Qwen3, R1 and V3.1 templates."""
    from draftgen.formats.chat_template import ChatTemplate
    from draftgen.testing.assets import qwen3_tokenizer_dir

    r1 = ChatTemplate.from_folder(deepseek_r1_tokenizer_dir())
    assert r1 is not None
    renderers = [
        (ChatTemplate.from_folder(qwen3_tokenizer_dir()), oracles.qwen3_hf(), None, {}),
        (r1, oracles.deepseek_hf(), None, {}),
        (ChatTemplate(oracles.deepseek_v31_template(), r1.special_tokens),
         oracles.deepseek_hf(), oracles.deepseek_v31_template(), {"thinking": True}),
    ]
    for ours, hf, template, kwargs in renderers:
        assert ours is not None
        for gen in (True, False):
            assert ours.render(case.messages, case.tools, add_generation_prompt=gen,
                               **kwargs) == oracles.hf_render(
                hf, case.messages, case.tools, add_generation_prompt=gen,
                chat_template=template, **kwargs)


def test_the_jinja_renderer_defines_documents_as_transformers_does() -> None:
    from draftgen.formats.chat_template import ChatTemplate

    source = "{% if documents is defined %}documents{% endif %}{{ messages[0].content }}"
    messages = [{"role": "user", "content": "Hi"}]
    assert ChatTemplate(source, {}).render(messages, None, add_generation_prompt=True) == (
        oracles.hf_render(oracles.qwen3_hf(), messages, None, add_generation_prompt=True,
                          chat_template=source))
