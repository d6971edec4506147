"""One request path: what a caller gives a request (`RequestContext`: its sampling, a callback
for its generation ID, an observer of the answer as it is read) reaches the wire and comes back
through `Backend.send`, with no state in the task's context; backends run in process against
an injected session (`draftgen.testing.fake_session`)."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from draftgen.backends import make_backend
from draftgen.backends.base import RequestContext
from draftgen.config import ModelConfig, SamplingConfig
from draftgen.config.backends import parse_backend
from draftgen.testing.fake_session import FakeAnswer, FakeRequest, FakeSession
from draftgen.types import BackendError, Prompt

MODEL = ModelConfig(name="test/qwen3", format="qwen3", tokenizer="unused")
PROMPT = Prompt(id="p", dataset="d", messages=[{"role": "user", "content": "hi"}])
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def _message_answer(**message: Any) -> FakeAnswer:
    return FakeAnswer.json({"id": "gen-1", "model": "m", "usage": USAGE, "choices": [
        {"index": 0, "finish_reason": "stop",
         "message": {"role": "assistant", **message}}]}, **{"X-Generation-Id": "gen-1"})


def _stream_answer() -> FakeAnswer:
    deltas = [{"role": "assistant", "reasoning_content": "think"}, {"content": "Hel"},
              {"content": "lo"}]
    events = [{"id": "gen-2", "choices": [{"index": 0, "delta": d}]} for d in deltas]
    events.append({"id": "gen-2", "usage": USAGE,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return FakeAnswer.sse(events, **{"X-Generation-Id": "gen-2"})


def _backend(session: FakeSession, **cfg: Any) -> Any:
    backend = make_backend(parse_backend({"name": "b", "type": "openrouter",
                                          "url": "http://127.0.0.1:1/api/v1", **cfg}),
                           MODEL, SamplingConfig(temperature=0.6))
    backend.use_session(session)
    return backend


def _send(backend: Any, ctx: RequestContext | None = None, max_tokens: int = 16) -> Any:
    async def go() -> Any:
        await backend.start()
        try:
            return await backend.send(PROMPT, [1, 2, 3], max_tokens, ctx)
        finally:
            await backend.close()
    # A fresh context: whatever the request carries must come through `ctx`, not the task's.
    return contextvars.Context().run(asyncio.run, go())


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_what_the_caller_gives_a_request_reaches_the_wire_and_comes_back(stream: bool) -> None:
    session = FakeSession(lambda _: _stream_answer() if stream else _message_answer(
        content="Hello", reasoning_content="think"))
    backend = _backend(session, stream=stream)
    ids: list[str] = []
    seen: list[dict[str, Any]] = []
    ctx = RequestContext(sampling=SamplingConfig(temperature=0.1, seed=7),
                         on_generation_id=ids.append, observe=lambda m: seen.append(dict(m)))
    answer = _send(backend, ctx)
    body = session.requests[0].body
    assert (body["temperature"], body["seed"]) == (0.1, 7)  # the request's, not the run's 0.6
    assert ids == ["gen-2" if stream else "gen-1"]
    assert any(m.get("reasoning_content") == "think" for m in seen)
    assert (answer.content, answer.reasoning) == ("Hello", "think")
    assert backend.answer_bytes.held == 0 and backend.answer_bytes.peak > 0
    assert ctx.held is None


def test_a_request_without_a_context_is_sent_with_the_runs_sampling() -> None:
    session = FakeSession(lambda _: _message_answer(content="Hi"))
    assert _send(_backend(session)).content == "Hi"
    assert session.requests[0].body["temperature"] == 0.6


def test_an_injected_session_is_not_closed_by_the_backend() -> None:
    session = FakeSession(lambda _: _message_answer(content="Hi"))
    _send(_backend(session))
    assert not session.closed


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_answer_past_its_max_tokens_bytes_fails_in_process(stream: bool) -> None:
    """The bound on an answer's bytes comes with the request (`RequestContext.held`): a body
    past what max_tokens allows fails as `bad_response` while it is read."""
    huge = "x" * (3 << 20)

    def answer(_: FakeRequest) -> FakeAnswer:
        if stream:
            return FakeAnswer.sse([{"choices": [{"index": 0, "delta": {"content": huge}}]}])
        return _message_answer(content=huge)

    backend = _backend(FakeSession(answer), stream=stream)
    backend.longest_token_bytes = 16
    with pytest.raises(BackendError) as failed:
        _send(backend, max_tokens=4)
    assert failed.value.kind == "bad_response" and "max_tokens" in failed.value.message
    assert backend.answer_bytes.held == 0
