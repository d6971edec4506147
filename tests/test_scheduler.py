from __future__ import annotations

import asyncio
import math

import pytest

from draftgen.backends import make_backend
from draftgen.backends.openai_chat import OpenAIConfig
from draftgen.config import ModelConfig, SamplingConfig
from draftgen.scheduler import (
    PAUSE_LOG_INTERVAL_S,
    TOOLS,
    BackendSlots,
    NoBackendFits,
    NoBackendLeft,
    backoff_delay,
    send_with_retries,
)
from draftgen.types import BackendError, Prompt, RawAnswer

MODEL = ModelConfig(name="m", format="qwen3", tokenizer="unused")


def _backend(name: str, concurrency: int, priority: int = 0, **kw):
    cfg = OpenAIConfig(name=name, type="openai", url="http://127.0.0.1:1",
                       concurrency=concurrency, priority=priority, **kw)
    return make_backend(cfg, MODEL, SamplingConfig())


async def test_local_first_paid_only_when_local_is_saturated() -> None:
    local, paid = _backend("local", 2, priority=0), _backend("paid", 5, priority=1)
    slots = BackendSlots([paid, local])
    got = [await slots.acquire() for _ in range(4)]
    assert [b.name for b in got] == ["local", "local", "paid", "paid"]
    slots.release(local)
    assert (await slots.acquire()).name == "local"  # a freed local slot wins again


async def test_same_priority_shares_by_load_and_caps_hold() -> None:
    a, b = _backend("a", 2), _backend("b", 4)
    slots = BackendSlots([a, b])
    names = [(await slots.acquire()).name for _ in range(6)]
    assert names.count("a") == 2 and names.count("b") == 4
    waiter = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()  # every cap is full: it waits
    slots.release(a)
    assert (await asyncio.wait_for(waiter, 1)).name == "a"


async def test_disabled_backends_stop_receiving_and_none_left_raises() -> None:
    a, b = _backend("a", 1), _backend("b", 1)
    slots = BackendSlots([a, b])
    slots.disable(a, "out of credits")
    assert (await slots.acquire()).name == "b"
    slots.disable(b, "bad key")
    with pytest.raises(NoBackendLeft, match="out of credits"):
        await slots.acquire()


async def test_prompts_go_only_to_backends_fit_for_what_they_need() -> None:
    """A backend the probe found unsafe for tools takes plain prompts (first, by priority) but
    never a prompt with tools; with no fitting backend left, such a prompt has none."""
    unfit, good = _backend("unfit", 4, priority=0), _backend("good", 4, priority=1)
    slots = BackendSlots([unfit, good], {"unfit": TOOLS})
    assert (await slots.acquire()).name == "unfit"
    assert [(await slots.acquire(TOOLS)).name for _ in range(2)] == ["good", "good"]
    slots.disable(good, "bad key")
    with pytest.raises(NoBackendFits, match="unfit unsafe"):
        await slots.acquire(TOOLS)
    assert (await slots.acquire()).name == "unfit"


def test_a_pause_that_comes_and_goes_is_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _backend("a", 1)
    slots = BackendSlots([a])
    clock = [1000.0]
    monkeypatch.setattr("draftgen.scheduler.time.monotonic", lambda: clock[0])
    with caplog.at_level("INFO", logger="draftgen.scheduler"):
        for _ in range(50):  # a nearly spent budget: paused, unpaused as each request settles
            slots.pause(a, math.inf, "budget: settling")
            slots.unpause("budget: settling")
            clock[0] += 0.1
        slots.pause(a, 5, "cool-down")  # another reason is logged at once
        clock[0] += PAUSE_LOG_INTERVAL_S
        slots.pause(a, math.inf, "budget: settling")  # and the first again after a minute
    paused = [r.getMessage() for r in caplog.records if "paused" in r.getMessage()]
    assert paused == ["backend a paused: budget: settling", "backend a paused: cool-down",
                      "backend a paused: budget: settling"]


def test_backoff_grows_caps_and_honours_retry_after() -> None:
    assert 0.5 <= backoff_delay(0, 1.0, 60, None) <= 1.0
    assert 4.0 <= backoff_delay(3, 1.0, 60, None) <= 8.0
    assert backoff_delay(20, 1.0, 60, None) <= 60
    assert backoff_delay(0, 1.0, 60, 7.5) == 7.5


class _Flaky:
    """A backend double whose send fails with the given errors, then answers."""

    def __init__(self, errors: list[BackendError], **cfg) -> None:
        self.cfg = OpenAIConfig(name="f", type="openai", url="http://127.0.0.1:1",
                                backoff_base_s=0.001, backoff_max_s=0.01, **cfg)
        self.name = "f"
        self.errors = list(errors)
        self.calls = 0

    async def send(self, prompt, input_ids, max_tokens, ctx=None) -> RawAnswer:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return RawAnswer(content="ok")


PROMPT = Prompt(id="d/1", dataset="d", messages=[{"role": "user", "content": "hi"}])


async def test_retryable_errors_are_retried_then_answered() -> None:
    flaky = _Flaky([BackendError("rate_limited", "x", retryable=True, status=429),
                    BackendError("timeout", "x", retryable=True)])
    answer, retries = await send_with_retries(flaky, PROMPT, [1], 10)
    assert answer.content == "ok" and retries == 2 and flaky.calls == 3


async def test_permanent_errors_and_exhausted_retries_raise() -> None:
    flaky = _Flaky([BackendError("bad_request", "no", retryable=False, status=400)])
    with pytest.raises(BackendError, match="bad_request"):
        await send_with_retries(flaky, PROMPT, [1], 10)
    assert flaky.calls == 1
    flaky = _Flaky([BackendError("server_error", "x", retryable=True)] * 5, max_retries=2)
    with pytest.raises(BackendError, match="server_error"):
        await send_with_retries(flaky, PROMPT, [1], 10)
    assert flaky.calls == 3


async def test_retry_after_beyond_the_cap_is_not_waited_out() -> None:
    flaky = _Flaky([BackendError("rate_limited", "slow down", retryable=True, status=429,
                                 retry_after=3600)])
    with pytest.raises(BackendError, match="exceeds backoff_max_s"):
        await asyncio.wait_for(send_with_retries(flaky, PROMPT, [1], 10), 2)
    assert flaky.calls == 1
