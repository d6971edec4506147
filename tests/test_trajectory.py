"""formats.trajectory (`turns: all`) on real tokenizers, against the official renderers
(tests/oracles: transformers' `apply_chat_template` with the models' own templates, openai-harmony
for gpt-oss, tinker-cookbook's Kimi-K2.5 renderer):

1. the prompt of turn k, its history holding the target's own earlier answers, is the official
   render of that history;
2. the layout: one `input_ids` where every prompt_k + output_k is a prefix of prompt_k+1, a
   branch per run of such turns where the template changes the history (reasoning dropped, a
   call re-rendered), as the templates say;
3. the mask covers exactly the sampled tokens: its sum is the outputs' length, and its spans
   are each answer's output, token for token;
4. the tool-result rule, both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from draftgen.datasets.conversations import ConversationPlan, conversation_plan
from draftgen.formats import Format, get_format
from draftgen.formats.trajectory import (
    FINISH_LENGTH,
    LAST_TURN,
    NO_TOOL_CALL,
    TOOL_CALL_DIFFERS,
    UNEXPECTED_TOOL_CALL,
    EndReason,
    MaskedSequence,
    TrajectoryError,
    TrajectoryLayout,
    TurnAnswer,
    TurnTokens,
    end_after,
    same_tool_calls,
    trajectory_layout,
    turn_messages,
    turn_prompt,
)
from draftgen.testing.assets import cached_tokenizer, deepseek_r1_tokenizer_dir, family_tokenizer
from draftgen.tokenize import Tokenizer
from draftgen.types import Message, Prompt, RawAnswer, Usage
from tests import oracles
from tests.test_formats_gpt_oss_harmony import DATE, assistant, conversation, expected_prompt, u
from tests.test_formats_gpt_oss_harmony import enc as enc  # the fixture
from tests.test_formats_oracles import _cookbook_message

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def call(call_id: str, city: str, spacing: str = " ") -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city":{spacing}"{city}"}}'}}


def said(content: str, reasoning: str | None = None,
         tool_calls: list[dict[str, Any]] | None = None) -> Message:
    m: Message = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if tool_calls:
        m["tool_calls"] = tool_calls
    return m


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def tool_result(call_id: str, text: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": text}


def plan(*messages: Message, tools: list[dict[str, Any]] | None = None) -> ConversationPlan:
    row: dict[str, Any] = {"messages": list(messages)}
    if tools:
        row["tools"] = tools
    conversation, _ = conversation_plan(row, "chat", "test:1")
    return conversation


CHAT = plan({"role": "system", "content": "You are terse."}, user("Hi"),
            said("Hello!", "greet"), user("What is 2+2?"), said("4", "add"),
            user("Thanks"), said("You're welcome.", "polite"))
"""Three user turns: the dataset's answers are replaced by the target's."""

TOOL_LOOP_MESSAGES = [user("Weather in Paris, then Tokyo?"),
                      said("", "Paris first.", [call("d1", "Paris")]), tool_result("d1", "21C"),
                      said("", "Now Tokyo.", [call("d2", "Tokyo")]), tool_result("d2", "28C"),
                      said("Paris 21C, Tokyo 28C.", "Report."), user("Thanks!"),
                      said("Welcome.", "Close.")]
"""One query answered through two tool calls, then a second query."""
TOOL_LOOP = plan(*TOOL_LOOP_MESSAGES, tools=[WEATHER])


@dataclass
class Say:
    """What the target answers at one turn."""

    content: str
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finished: bool = True


CHAT_SAYS = [Say("Hey there.", "A greeting."), Say("It is 4.", "Two plus two."),
             Say("Any time.", "Be kind.")]
LOOP_SAYS = [Say("", "Look up Paris.", [call("functions.get_weather:0", "Paris", "")]),
             Say("", "Then Tokyo.", [call("functions.get_weather:1", "Tokyo", "")]),
             Say("Paris: 21C. Tokyo: 28C.", "Both known."), Say("You're welcome!", "Done.")]
"""The target's calls are the dataset's, spelled without spaces and with other IDs."""


@dataclass
class Walk:
    """A trajectory regenerated turn by turn."""

    prompts: list[list[Message]]
    answers: list[TurnAnswer]
    tokens: list[TurnTokens]
    end: EndReason | None


def regenerate(fmt: Format, conversation: ConversationPlan, says: Sequence[Say],
               ids_of: Callable[[str], list[int]] | None = None) -> Walk:
    """Each turn's prompt from the history so far, the target's answer rebuilt into its
    sampled IDs as a run rebuilds it, until the trajectory ends. `ids_of` re-encodes prompt
    and answer texts in another vocabulary (gpt-oss: o200k_harmony)."""
    walk = Walk([], [], [], None)
    turns = conversation.turns
    for k, say in enumerate(says):
        messages, prompt_ids = turn_prompt(fmt, turns, walk.answers, conversation.tools)
        prompt = Prompt(f"t{k}", "chat", messages, conversation.tools)
        raw = RawAnswer(reasoning=say.reasoning, content=say.content, tool_calls=say.tool_calls,
                        finish_reason="stop" if say.finished else "length", usage=Usage())
        [rebuilt] = fmt.rebuild_batch([raw], [prompt])
        answer = TurnAnswer.from_rebuilt(rebuilt, finished=say.finished)
        if ids_of is not None:
            prompt_ids = ids_of(fmt.prompt_text(messages, conversation.tools))
            answer = TurnAnswer(answer.reasoning, answer.content, answer.tool_calls,
                                ids_of(fmt.tokenizer.decode(answer.output_ids)), answer.finished)
        walk.prompts.append(messages)
        walk.answers.append(answer)
        walk.tokens.append(TurnTokens(prompt_ids, answer.output_ids))
        walk.end = end_after(turns[k], answer, turns[k + 1] if k + 1 < len(turns) else None)
        if walk.end is not None:
            break
    return walk


def masked_spans(seq: MaskedSequence) -> list[list[int]]:
    spans: list[list[int]] = []
    inside = False
    for token, bit in zip(seq.input_ids, seq.loss_mask, strict=True):
        if bit and not inside:
            spans.append([])
        if bit:
            spans[-1].append(token)
        inside = bool(bit)
    return spans


def assert_mask_is_exact(walk: Walk, layout: TrajectoryLayout,
                         decode: Callable[[list[int]], str]) -> None:
    """Every turn in exactly one sequence; each sequence's mask on exactly its turns'
    sampled tokens."""
    assert [k for seq in layout.sequences for k in seq.turns] == list(range(len(walk.tokens)))
    for seq in layout.sequences:
        assert set(seq.loss_mask) <= {0, 1} and len(seq.loss_mask) == len(seq.input_ids)
        outputs = [list(walk.tokens[k].output_ids) for k in seq.turns]
        assert sum(seq.loss_mask) == sum(len(o) for o in outputs)
        assert masked_spans(seq) == outputs
        assert [decode(s) for s in masked_spans(seq)] == [decode(o) for o in outputs]
        last = walk.tokens[seq.turns[-1]]
        assert seq.input_ids == [*last.prompt_ids, *last.output_ids]


def assert_history_is_the_targets(walk: Walk) -> None:
    """Turn k's prompt holds the target's answers 0..k-1, as assistant messages."""
    for k, messages in enumerate(walk.prompts):
        history = [m for m in messages if m["role"] == "assistant"]
        assert history == [a.as_history() for a in walk.answers[:k]]


# ---- Qwen3: transformers' apply_chat_template with the model's own template -----------------


@pytest.fixture(scope="module")
def qwen3(qwen3_tok: Tokenizer) -> Format:
    return get_format("qwen3", qwen3_tok)


def assert_qwen3_prompts_are_official(fmt: Format, walk: Walk, tools: Any) -> None:
    hf = oracles.qwen3_hf()
    for messages, tokens in zip(walk.prompts, walk.tokens, strict=True):
        assert fmt.prompt_text(messages, tools) == oracles.hf_render(
            hf, messages, tools, add_generation_prompt=True)
        assert list(tokens.prompt_ids) == oracles.hf_ids(hf, messages, tools,
                                                         add_generation_prompt=True)


@pytest.mark.parametrize("reasoning", [True, False], ids=["reasoning", "no-reasoning"])
def test_qwen3_chat_branches_at_every_new_query(reasoning: bool, qwen3: Format) -> None:
    """Qwen3 drops the think block of turns before the last query: no prompt extends the one
    before it, so each turn is its own branch. An answer without reasoning too: the hybrid
    model still writes an empty `<think>\n\n</think>\n\n`, which the history drops."""
    says = CHAT_SAYS if reasoning else [Say(s.content) for s in CHAT_SAYS]
    walk = regenerate(qwen3, CHAT, says)
    assert qwen3.tokenizer.decode(walk.answers[0].output_ids).startswith("<think>\n")
    assert walk.end == LAST_TURN and len(walk.answers) == 3
    assert_history_is_the_targets(walk)
    assert_qwen3_prompts_are_official(qwen3, walk, None)
    assert "<think>" not in qwen3.prompt_text(walk.prompts[2], None)  # dropped
    layout = trajectory_layout(walk.tokens)
    assert layout.kind == "branches" and layout.breaks == [0, 1]
    assert [s.turns for s in layout.sequences] == [[0], [1], [2]]
    assert_mask_is_exact(walk, layout, qwen3.tokenizer.decode)


def test_qwen3_tool_loop_is_one_sequence_until_the_next_query(qwen3: Format) -> None:
    """Within one query Qwen3 keeps each turn's reasoning and calls as sampled: the loop is
    one sequence; the next query drops the loop's reasoning and starts a branch."""
    walk = regenerate(qwen3, TOOL_LOOP, LOOP_SAYS)
    assert walk.end == LAST_TURN and len(walk.answers) == 4
    assert_history_is_the_targets(walk)
    assert_qwen3_prompts_are_official(qwen3, walk, TOOL_LOOP.tools)
    # The dataset's tool results follow, relinked to the target's call IDs; its calls are the
    # target's, as the target spelled them.
    results = [m for m in walk.prompts[2] if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in results] == [
        ("functions.get_weather:0", "21C"), ("functions.get_weather:1", "28C")]
    assert '{"city":"Paris"}' in qwen3.prompt_text(walk.prompts[1], TOOL_LOOP.tools)
    layout = trajectory_layout(walk.tokens)
    assert layout.kind == "branches" and layout.breaks == [2]
    assert [s.turns for s in layout.sequences] == [[0, 1, 2], [3]]
    assert_mask_is_exact(walk, layout, qwen3.tokenizer.decode)


def test_qwen3_one_query_loop_is_a_single_sequence(qwen3: Format) -> None:
    loop = plan(*TOOL_LOOP_MESSAGES[:6], tools=[WEATHER])
    walk = regenerate(qwen3, loop, LOOP_SAYS[:3])
    layout = trajectory_layout(walk.tokens)
    assert walk.end == LAST_TURN
    assert layout.kind == "sequence" and layout.breaks == []
    [seq] = layout.sequences
    assert sum(seq.loss_mask) == sum(len(t.output_ids) for t in walk.tokens)
    assert_mask_is_exact(walk, layout, qwen3.tokenizer.decode)



# ---- DeepSeek: R1's template (tokenizer package) and V3.1's, through transformers -------------


@pytest.fixture(scope="module")
def r1_tok() -> Tokenizer:
    return cached_tokenizer(str(deepseek_r1_tokenizer_dir()))


def test_deepseek_r1_drops_think_from_history_so_every_turn_branches(r1_tok: Tokenizer
                                                                      ) -> None:
    fmt = get_format("deepseek-r1", r1_tok)
    walk = regenerate(fmt, CHAT, CHAT_SAYS)
    assert walk.end == LAST_TURN
    assert_history_is_the_targets(walk)
    hf = oracles.deepseek_hf()
    for messages in walk.prompts:  # the updated template's generation prompt opens <think>
        official = oracles.hf_render(hf, messages, None, add_generation_prompt=True)
        assert fmt.prompt_text(messages, None) == official + "<think>\n"
        assert "Two plus two." not in official
    layout = trajectory_layout(walk.tokens)
    assert layout.kind == "branches" and layout.breaks == [0, 1]
    assert_mask_is_exact(walk, layout, r1_tok.decode)


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_deepseek_v31_history_is_intact_only_without_thinking(thinking: bool,
                                                               r1_tok: Tokenizer) -> None:
    """V3.1 renders history turns as non-thinking turns (`<｜Assistant｜></think>content`):
    a non-thinking trajectory is one sequence, a thinking one branches at every turn."""
    fmt = get_format("deepseek-v3.1", r1_tok, {"thinking": thinking})
    says = CHAT_SAYS if thinking else [Say(s.content) for s in CHAT_SAYS]
    walk = regenerate(fmt, CHAT, says)
    assert walk.end == LAST_TURN
    hf, template = oracles.deepseek_hf(), oracles.deepseek_v31_template()
    for messages, tokens in zip(walk.prompts, walk.tokens, strict=True):
        assert fmt.prompt_text(messages, None) == oracles.hf_render(
            hf, messages, None, add_generation_prompt=True, chat_template=template,
            thinking=thinking)
        assert list(tokens.prompt_ids) == oracles.hf_ids(
            hf, messages, None, add_generation_prompt=True, chat_template=template,
            thinking=thinking)
    layout = trajectory_layout(walk.tokens)
    if thinking:
        assert layout.kind == "branches" and layout.breaks == [0, 1]
    else:
        assert layout.kind == "sequence" and [s.turns for s in layout.sequences] == [[0, 1, 2]]
    assert_mask_is_exact(walk, layout, r1_tok.decode)


# ---- gpt-oss: openai-harmony on o200k_harmony ------------------------------------------------


def test_gpt_oss_prompts_are_openai_harmonys_and_every_turn_branches(enc: Any) -> None:
    """The analysis of answered turns is dropped and a final answer's `<|return|>` is fed back
    as `<|end|>`: no turn's tokens survive into the next prompt as sampled."""
    fmt = get_format("gpt-oss", family_tokenizer("gpt-oss"), {"current_date": DATE})

    def ids_of(text: str) -> list[int]:
        return list(enc.encode(text, allowed_special="all"))

    walk = regenerate(fmt, CHAT, CHAT_SAYS, ids_of)
    assert walk.end == LAST_TURN
    assert_history_is_the_targets(walk)
    a0, a1 = walk.answers[0], walk.answers[1]
    official = conversation("third turn", ({"role": "system", "content": "You are terse."}, []),
                            u("Hi"), assistant(a0.content, a0.reasoning), u("What is 2+2?"),
                            assistant(a1.content, a1.reasoning), u("Thanks"),
                            instructions="You are terse.")
    assert list(walk.tokens[2].prompt_ids) == list(expected_prompt(enc, official))
    assert "Two plus two." not in fmt.prompt_text(walk.prompts[2], None)
    layout = trajectory_layout(walk.tokens)
    assert layout.kind == "branches" and layout.breaks == [0, 1]
    assert_mask_is_exact(walk, layout, enc.decode_utf8)


# ---- Kimi-K2.5: tinker-cookbook's renderer ---------------------------------------------------


@pytest.fixture(scope="module")
def kimi_tok() -> Tokenizer:
    return family_tokenizer("kimi")


KIMI_CASES = [("thinking", "chat", [0, 1]), ("thinking", "loop", [2]),
              ("no-thinking", "chat", []), ("no-thinking", "loop", [])]


@pytest.mark.parametrize(("mode", "shape", "breaks"), KIMI_CASES,
                         ids=[f"{m}-{s}" for m, s, _ in KIMI_CASES])
def test_kimi_k25_keeps_the_current_loops_reasoning(mode: str, shape: str, breaks: list[int],
                                                    kimi_tok: Tokenizer) -> None:
    """Kimi keeps the reasoning of the current tool loop and drops that of completed turns:
    thinking, a chat branches at every turn and a loop runs intact to its final answer;
    without thinking (`<think></think>` in the prompt) every turn extends into the next."""
    thinking = mode == "thinking"
    fmt = get_format("kimi-k2.5", kimi_tok, {"thinking": thinking})
    conversation, says = (CHAT, CHAT_SAYS) if shape == "chat" else (
        plan(*TOOL_LOOP_MESSAGES), LOOP_SAYS)
    if not thinking:
        says = [Say(s.content, None, s.tool_calls) for s in says]
    walk = regenerate(fmt, conversation, says)
    assert walk.end == LAST_TURN
    renderer = oracles.kimi_k25_renderer(kimi_tok, thinking=thinking)
    for messages, tokens in zip(walk.prompts, walk.tokens, strict=True):
        official = renderer.build_generation_prompt([_cookbook_message(m) for m in messages])
        assert list(tokens.prompt_ids) == official.to_ints()
    layout = trajectory_layout(walk.tokens)
    assert layout.breaks == breaks
    assert layout.kind == ("branches" if breaks else "sequence")
    assert_mask_is_exact(walk, layout, kimi_tok.decode)


# ---- the tool-result rule --------------------------------------------------------------------


def _answer(tool_calls: list[dict[str, Any]] | None = None, finished: bool = True
            ) -> TurnAnswer:
    return TurnAnswer("r", "", tool_calls, [1, 2, 3], finished)


def test_tool_results_follow_only_the_same_calls() -> None:
    first, second = TOOL_LOOP.turns[0], TOOL_LOOP.turns[1]
    same = call("x", "Paris", "")
    assert end_after(first, _answer([same]), second) is None
    assert end_after(first, _answer([call("x", "Lyon")]), second) == TOOL_CALL_DIFFERS
    assert end_after(first, _answer([same, same]), second) == TOOL_CALL_DIFFERS
    other_name = {"id": "x", "type": "function",
                  "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}
    assert end_after(first, _answer([other_name]), second) == TOOL_CALL_DIFFERS
    assert end_after(first, _answer(None), second) == NO_TOOL_CALL
    final, follow_up = TOOL_LOOP.turns[2], TOOL_LOOP.turns[3]
    assert end_after(final, _answer([same]), follow_up) == UNEXPECTED_TOOL_CALL
    assert end_after(final, _answer(None, finished=False), follow_up) == FINISH_LENGTH
    assert end_after(follow_up, _answer(None), None) == LAST_TURN


def test_same_tool_calls_compares_arguments_as_json() -> None:
    spaced = call("a", "Paris", " ")
    as_dict = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    reordered = {"function": {"name": "f", "arguments": '{"b": 1, "a": [1, 2]}'}}
    assert same_tool_calls([spaced], [call("b", "Paris", "")])
    assert same_tool_calls([spaced], [as_dict])
    assert same_tool_calls([reordered], [{"function": {"name": "f",
                                                       "arguments": '{"a":[1,2],"b":1}'}}])
    assert not same_tool_calls([reordered], [{"function": {"name": "f",
                                                           "arguments": '{"a":[2,1],"b":1}'}}])
    assert not same_tool_calls([spaced, as_dict], [as_dict])


def test_no_turn_follows_an_ended_trajectory() -> None:
    differs = _answer([call("x", "Lyon")])
    with pytest.raises(TrajectoryError, match=r"ended at turn 0 \(tool_call_differs"):
        turn_messages(TOOL_LOOP.turns, [differs])
    with pytest.raises(TrajectoryError, match="4 turns to answer"):
        turn_messages(TOOL_LOOP.turns, [_answer([call("x", "Paris")])] * 4)


def test_layout_on_plain_ids() -> None:
    intact = [TurnTokens([1, 2], [3, 4]), TurnTokens([1, 2, 3, 4, 5], [6]),
              TurnTokens([1, 2, 3, 4, 5, 6, 7], [8, 9])]
    layout = trajectory_layout(intact)
    assert layout.kind == "sequence"
    assert layout.sequences == [MaskedSequence([1, 2, 3, 4, 5, 6, 7, 8, 9],
                                               [0, 0, 1, 1, 0, 1, 0, 1, 1], [0, 1, 2])]
    changed = [intact[0], TurnTokens([1, 2, 9, 5], [6]), intact[2]]
    layout = trajectory_layout(changed)
    assert layout.kind == "branches" and layout.breaks == [0, 1]
    assert [s.loss_mask for s in layout.sequences] == [[0, 0, 1, 1], [0, 0, 0, 0, 1],
                                                       [0, 0, 0, 0, 0, 0, 0, 1, 1]]
    with pytest.raises(TrajectoryError):
        trajectory_layout([])
