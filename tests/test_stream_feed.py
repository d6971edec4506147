"""StreamAccumulator.feed: SSE bytes cut anywhere give the same answer as whole lines."""

from __future__ import annotations

import orjson
import pytest

from draftgen.backends.openai_chat import StreamAccumulator


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
