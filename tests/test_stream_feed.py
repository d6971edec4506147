"""StreamAccumulator.feed: SSE bytes cut anywhere give the same answer as whole lines, and
its typed reading of events (`wire.decode_chunk`) gives what the generic reading (`feed_line`)
gives, answers and errors alike, on every kind of event and on events the types do not
describe."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson
import pytest

from draftgen.backends import wire
from draftgen.backends.openai_chat import StreamAccumulator
from tests.readings import outcome


def _sse(final_newline: bool = True) -> bytes:
    events = [b": OPENROUTER PROCESSING\n\n"]
    for i, (field, text) in enumerate([("reasoning", "Let me think"), ("reasoning", " a bit."),
                                       ("content", "Hello"), ("content", ", wörld")]):
        chunk = {"id": "gen-1", "model": "m", "choices": [
            {"index": 0, "delta": {field: text}, "finish_reason": None}]}
        sep = b"\r\n\r\n" if i % 2 else b"\n\n"
        events.append(b"data: " + orjson.dumps(chunk) + sep)
    final = {"id": "gen-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 7}}
    events.append(b"data: " + orjson.dumps(final) + b"\n\n")
    events.append(b"data: [DONE]" + (b"\n\n" if final_newline else b""))
    return b"".join(events)


def _by_lines(stream: bytes) -> StreamAccumulator:
    acc = StreamAccumulator()
    for line in stream.split(b"\n"):
        if acc.feed_line(line):
            break
    return acc


@pytest.mark.parametrize("final_newline", [True, False])
def test_feed_any_split_matches_lines(final_newline: bool) -> None:
    stream = _sse(final_newline)
    want = _by_lines(stream).finish()
    for size in [1, 2, 3, 7, 64, len(stream)]:
        acc = StreamAccumulator()
        done = False
        for i in range(0, len(stream), size):
            if acc.feed(stream[i : i + size]):
                done = True
                break
        if not done:
            assert acc.feed_end() is True
        got = acc.finish()
        assert (got.reasoning, got.content, got.finish_reason, got.usage) == (
            want.reasoning, want.content, want.finish_reason, want.usage)
        assert got.content == "Hello, wörld" and got.reasoning == "Let me think a bit."


def test_feed_end_without_done_is_incomplete() -> None:
    stream = _sse().split(b"data: [DONE]")[0]
    acc = StreamAccumulator()
    assert acc.feed(stream) is False
    assert acc.feed_end() is False
    with pytest.raises(Exception, match="before \\[DONE\\]"):
        acc.finish()


# ---- the typed reading against the generic one ------------------------------------------------


def _generic(stream: bytes) -> tuple[Any, ...]:
    """The reference: every line through `feed_line`, which reads each event with orjson."""
    return outcome(lambda: _by_lines(stream).finish())


def _fed(stream: bytes, cuts: list[int]) -> tuple[Any, ...]:
    """`stream` through `feed`, as network reads ending at `cuts`."""
    def read() -> Any:
        acc = StreamAccumulator()
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            if acc.feed(stream[start:end]):
                break
        else:
            acc.feed_end()
        return acc.finish()
    return outcome(read)


def _event(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else orjson.dumps(payload))


def _chunk(rng: random.Random, **choice: Any) -> dict[str, Any]:
    """An OpenRouter-like chunk with one choice; the fields draftgen does not read included."""
    chunk: dict[str, Any] = {
        "id": "gen-17960-a050ea11438e46779802", "object": "chat.completion.chunk",
        "created": 1796056579, "model": "test/qwen3",
        "choices": [{"index": 0, "finish_reason": None, **choice}]}
    if rng.random() < 0.5:
        chunk["provider"] = rng.choice(["P", "Q"])
    return chunk


TEXTS = ["Hello", ", wörld", " 東京 🙂", ' a "quoted" \\ path\n', "", "\u2028 x", "e400 1e5"]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 3)))


def _plain_event(rng: random.Random) -> bytes:
    """An event the `wire` types describe."""
    kind = rng.randrange(11)
    if kind == 0:
        return _event(_chunk(rng, delta={"role": "assistant", "content": ""}))
    if kind == 1:
        field = rng.choice(["reasoning", "reasoning_content"])
        return _event(_chunk(rng, delta={field: _text(rng)}))
    if kind == 2:
        return _event(_chunk(rng, delta={"reasoning": None, "reasoning_content": _text(rng)}))
    if kind == 3:
        details = [{"type": "reasoning.text", "text": _text(rng)}, {"type": "reasoning.encrypted"}]
        return _event(_chunk(rng, delta={"reasoning_details": details}))
    if kind == 4:
        return _event(_chunk(rng, delta={"content": _text(rng)}, token_ids=[rng.randrange(9)]))
    if kind == 5:
        call: dict[str, Any] = {"index": rng.randrange(2), "function": {"arguments": '{"c'}}
        if rng.random() < 0.5:
            call.update(id=f"call_{rng.randrange(9)}", type="function")
            call["function"]["name"] = "get_weather"
        return _event(_chunk(rng, delta={"tool_calls": [call]}))
    if kind == 6:
        entry = {"token": "a", "bytes": [97], "id": 64, "logprob": -0.5, "top_logprobs": []}
        return _event(_chunk(rng, delta={"content": "a"}, logprobs={"content": [entry]}))
    if kind == 7:
        return _event(_chunk(rng, delta={}, finish_reason=rng.choice(["stop", "length"])))
    if kind == 8:
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "cost": 0.5,
                 "completion_tokens_details": {"reasoning_tokens": 3}}
        return _event({**_chunk(rng), "choices": [], "usage": usage})
    if kind == 9:  # JSON whitespace, escapes, unknown fields everywhere
        return (b'data: { "id" : "gen-2" ,"choices":[ {"delta":{"content":"x\\ud83d\\ude42'
                b'\\u00e9\\"\\\\","refusal":null,"extra":[1,{"y":2.5e3}]},'
                b'"native_finish_reason":null} ] , "usage" : null }\r')
    return _event(_chunk(rng, delta=None))


ODD_EVENTS: dict[str, bytes] = {
    # valid JSON, mostly of shapes the types do not describe: the generic reading decides
    "content a number": _event({"choices": [{"delta": {"content": 5, "reasoning": "r"}}]}),
    "reasoning a list": _event({"choices": [{"delta": {"reasoning": ["x"],
                                                       "reasoning_content": "rc"}}]}),
    "delta a string": _event({"choices": [{"delta": "hello"}]}),
    "delta false": _event({"choices": [{"delta": False, "finish_reason": "stop"}]}),
    "delta empty list": _event({"choices": [{"delta": []}]}),
    "choices a string": _event({"choices": "abc"}),
    "choices false": _event({"id": "x", "choices": False}),
    "choice null": _event({"choices": [None]}),
    "chunk a list": _event([1, 2]),
    "chunk null": b"data: null",
    "id a number": _event({"id": 7, "choices": []}),
    "model null": _event({"model": None, "choices": []}),
    "finish_reason a number": _event({"choices": [{"delta": {}, "finish_reason": 1}]}),
    "finish_reason empty": _event({"choices": [{"delta": {}, "finish_reason": ""}]}),
    "token_ids strings": _event({"choices": [{"delta": {"content": "a"}, "token_ids": ["a"]}]}),
    "token_ids a float": _event({"choices": [{"delta": {}, "token_ids": [1.0]}]}),
    "token_ids beyond 64 bits": b'data: {"choices":[{"token_ids":[123456789012345678901234567890,'
                                b'-9223372036854775809,18446744073709551615]}]}',
    "token_ids not a list": _event({"choices": [{"token_ids": 5}]}),
    "tool_calls a string": _event({"choices": [{"delta": {"tool_calls": "ab"}}]}),
    "tool_calls with a huge number": b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,'
                                     b'"function":{"name":"f"},"n":123456789012345678901234567890}'
                                     b']}}]}',
    "logprobs a list": _event({"choices": [{"delta": {"content": "a"}, "logprobs": []}]}),
    "logprob entry bytes bad": _event({"choices": [{"delta": {"content": "a"}, "logprobs": {
        "content": [{"token": "a", "bytes": [97]}, {"token": "b", "bytes": [256]}]}}]}),
    "logprob entry not an object": _event({"choices": [{"logprobs": {"content": ["x", None]}}]}),
    "usage a list": _event({"choices": [], "usage": [1]}),
    "usage null": _event({"choices": [], "usage": None}),
    "duplicate keys": b'data: {"choices":[{"delta":{"content":"a","content":"b"}}],"id":"a",'
                      b'"id":null}',
    # error events, and what only looks like one
    "error event": _event({"error": {"code": 429, "message": "slow down"},
                           "usage": {"prompt_tokens": 3, "cost": 0.001}}),
    "error a string": _event({"error": "boom"}),
    "error null": _event({"error": None, "choices": [{"delta": {"content": "x"}}]}),
    "error empty": _event({"error": {}, "choices": [{"delta": {"content": "x"}}]}),
    "error false": _event({"error": False, "choices": [{"delta": {"content": "x"}}]}),
    "finish_reason error": _event({"choices": [{"delta": {}, "finish_reason": "error", "error": {
        "code": 502, "message": "upstream died", "metadata": {"provider_name": "P"}}}]}),
    "finish_reason error, no error": _event({"choices": [{"delta": {},
                                                          "finish_reason": "error"}]}),
    # not JSON, or not JSON to orjson
    "not JSON": b"data: {bad",
    "cut off": _event({"choices": [{"delta": {"content": "abc"}}]})[:-5],
    "empty data": b"data:",
    "two objects": b'data: {"choices":[]},{"choices":[]}',
    "invalid UTF-8 in an unread field": b'data: {"object":"\xff\xfe","choices":[]}',
    "invalid UTF-8 in content": b'data: {"choices":[{"delta":{"content":"a\xc3"}}]}',
    "encoded surrogate": b'data: {"x":"\xed\xa0\x80","choices":[]}',
    "lone surrogate escape": b'data: {"x":"\\ud800","choices":[]}',
    "control character in a string": b'data: {"x":"a\x01b","choices":[]}',
    "NaN": b'data: {"x":NaN,"choices":[]}',
    "trailing comma": b'data: {"choices":[],}',
    "number beyond float range in usage": b'data: {"choices":[],"usage":{"cost":1e400}}',
    "number beyond float range in tool_calls": b'data: {"choices":[{"delta":{"tool_calls":'
                                               b'[{"index":0,"n":-2e308}]}}]}',
    # lines the typed reading leaves to `feed_line`
    "no space after data:": b'data:{"choices":[{"delta":{"content":"n"}}]}',
    "a byte before the object": b'data:x{"choices":[{"delta":{"content":"n"}}]}',
    "space before data:": b' data: {"choices":[{"delta":{"content":"s"}}]}',
    "form feed after the event": _event({"choices": [{"delta": {"content": "f"}}]}) + b"\x0c",
    "tab after the event": _event({"choices": [{"delta": {"content": "t"}}]}) + b"\t",
    "event name": b"event: message",
    "comment": b": OPENROUTER PROCESSING",
    "other field": b"id: 5",
    "done early": b"data: [DONE]",
    "done spaced": b"data:  [DONE] ",
}


def _random_stream(rng: random.Random, odd: float) -> bytes:
    """Events of every kind, with a share `odd` of `ODD_EVENTS`, mostly ending in `[DONE]`."""
    names = sorted(ODD_EVENTS)
    events = [b": OPENROUTER PROCESSING"]
    for _ in range(rng.randint(1, 30)):
        if rng.random() < odd:
            events.append(ODD_EVENTS[rng.choice(names)])
        else:
            events.append(_plain_event(rng))
    events.append(_event(_chunk(rng, delta={}, finish_reason="stop")))
    if rng.random() < 0.9:
        events.append(b"data: [DONE]")
    if rng.random() < 0.2:
        events.append(_event({"error": {"message": "after [DONE]"}}))
    seps = [b"\n\n", b"\r\n\r\n", b"\n", b"\n\n\n"]
    stream = b"".join(e + rng.choice(seps) for e in events)
    return stream if rng.random() < 0.8 else stream.rstrip(b"\r\n")


def _cuts(rng: random.Random, n: int) -> list[int]:
    """Read boundaries: network-sized reads, or cuts anywhere."""
    if rng.random() < 0.5:
        cuts, at = [], 0
        while (at := at + rng.randint(1, 4096)) < n:
            cuts.append(at)
        return cuts
    return sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, 40))))


@pytest.mark.parametrize("odd", [0.0, 0.05, 0.3])
def test_typed_reading_matches_the_generic_one(odd: float) -> None:
    rng = random.Random(f"stream-{odd}")
    outcomes: Counter[tuple[Any, ...]] = Counter()
    for _ in range(300):
        stream = _random_stream(rng, odd)
        want = _generic(stream)
        outcomes[want[:3] if want[0] == "error" else want[:1]] += 1
        for _ in range(3):
            cuts = _cuts(rng, len(stream))
            assert _fed(stream, cuts) == want, (stream, cuts)
    # Answers each time (or, where the tool-call deltas never named the function, a bad
    # response); the odd events give crashes and errors of many kinds.
    unnamed = sum(n for key, n in outcomes.items()
                  if key[:2] == ("error", "bad_response") and "function.name" in key[2])
    assert outcomes[("answer",)] + unnamed > (200 if not odd else 20), outcomes
    if odd:
        assert outcomes[("crash",)] and len(outcomes) > 8, outcomes


MUTATIONS = b'{}[]:,"\\ 0123456789+-.tfnalrsu\xff\xc3\xa9\x80\x01\x0c\tx'
"""Bytes the mutated events get: JSON's own, literals' letters, bytes that are not UTF-8,
control characters. Not `e`/`E`: a number beyond float range (`"created":1e400`) in a field
draftgen does not read is the one event the readings differ on (see `wire.decode_chunk`)."""


def _mutated(rng: random.Random, event: bytes) -> bytes:
    """`event` with one to three bytes deleted, inserted or replaced after its `data: `."""
    out = bytearray(event)
    for _ in range(rng.randint(1, 3)):
        at, byte = rng.randrange(6, len(out)), rng.choice(MUTATIONS)
        edit = rng.randrange(3)
        if edit == 0:
            del out[at]
        elif edit == 1:
            out.insert(at, byte)
        else:
            out[at] = byte
    return bytes(out)


def test_mutated_events_read_alike() -> None:
    """Plain events with a few bytes changed: mostly not JSON any more, sometimes JSON of
    another shape; the typed reading falls back on each exactly where it must."""
    rng = random.Random(11)
    outcomes: Counter[str] = Counter()
    for _ in range(3000):
        events = [_plain_event(rng) for _ in range(3)]
        at = rng.randrange(3)
        events[at] = _mutated(rng, events[at])
        stream = b"\n\n".join([*events, _event(_chunk(rng, finish_reason="stop")),
                                b"data: [DONE]", b""])
        want = _generic(stream)
        outcomes[want[0] if want[0] != "error" else want[2]] += 1
        assert _fed(stream, _cuts(rng, len(stream))) == want, stream
    assert outcomes["answer"] > 500 and outcomes["stream chunk is not JSON"] > 500, outcomes


@pytest.mark.parametrize("name", sorted(ODD_EVENTS))
def test_odd_event_read_as_the_generic_reading_reads_it(name: str) -> None:
    """Each odd event between two plain ones, in one read and cut at every byte."""
    rng = random.Random(name)
    stream = b"\n\n".join([_plain_event(rng), ODD_EVENTS[name], _plain_event(rng),
                            _event(_chunk(rng, delta={"content": "z"}, finish_reason="stop")),
                            b"data: [DONE]", b""])
    want = _generic(stream)
    assert _fed(stream, []) == want
    for at in range(1, len(stream)):
        assert _fed(stream, [at]) == want, at


def _lines_read_generically(stream: bytes, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The lines of `stream` that reach `feed_line` when it is fed in random reads; the answer
    is checked against the generic reading's."""
    generic: list[bytes] = []
    feed_line = StreamAccumulator.feed_line

    def counted(self: StreamAccumulator, line: bytes) -> bool:
        generic.append(line)
        return feed_line(self, line)

    want = _generic(stream)
    with monkeypatch.context() as patch:
        patch.setattr(StreamAccumulator, "feed_line", counted)
        assert _fed(stream, _cuts(random.Random(len(stream)), len(stream))) == want
    assert want[0] == "answer"
    return generic


def test_plain_events_never_reach_the_generic_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The typed reading is the one taken: only lines that are not `data: {...}` events go to
    `feed_line`."""
    rng = random.Random(7)
    events = [e for e in (_plain_event(rng) for _ in range(400)) if b'"logprobs"' not in e]
    assert len(events) > 300 and all(wire.decode_chunk(e[6:]) is not None for e in events)
    stream = b"\n\n".join([b": OPENROUTER PROCESSING", b"event: x", *events,
                            _event(_chunk(rng, finish_reason="stop")), b"data: [DONE]", b""])
    assert _lines_read_generically(stream, monkeypatch) == [
        b": OPENROUTER PROCESSING", b"event: x", b"data: [DONE]"]


def test_events_after_logprobs_are_read_generically(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once an event had logprobs, the stream's next events go to `feed_line` (cheaper for
    them than the types, which keep logprobs as JSON text); the ones before did not."""
    rng = random.Random(8)
    entry = {"token": "a", "bytes": [97], "id": 64, "logprob": -0.5}
    before, after = [_event(_chunk(rng, delta={"content": str(i)})) for i in range(2)]
    with_logprobs = _event(_chunk(rng, delta={"content": "a"}, logprobs={"content": [entry]}))
    last = _event(_chunk(rng, delta={}, finish_reason="stop"))
    stream = b"\n\n".join([before, with_logprobs, after, last, b"data: [DONE]", b""])
    assert _lines_read_generically(stream, monkeypatch) == [after, last, b"data: [DONE]"]


def test_first_error_of_a_read_is_raised() -> None:
    """One read holding plain events, an error event, more events and a second error: the
    first error is raised, as when the lines are read one by one."""
    rng = random.Random(3)
    first = _event({"error": {"code": 429, "message": "first"}})
    second = _event({"error": {"code": 500, "message": "second"}})
    stream = b"\n\n".join([*(_plain_event(rng) for _ in range(5)), first,
                            *(_plain_event(rng) for _ in range(5)), second, b"data: [DONE]", b""])
    want = _generic(stream)
    assert want[:3] == ("error", "rate_limited", "first")
    assert _fed(stream, []) == want
