"""Logprobs as columns (`LogprobTokens`), and the request without `top_logprobs`: the same
IDs, labels and records as one `LogprobToken` per entry and `top_logprobs: 1` gave; and whole
runs with the typed decoding (`backends/wire.py`) store what the generic reading stored."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from draftgen.backends import make_backend, openai_chat
from draftgen.backends.base import parse_json_body
from draftgen.backends.openai_chat import (
    StreamAccumulator,
    answer_from_body,
    answer_from_json,
)
from draftgen.config import ModelConfig, SamplingConfig
from draftgen.config.backends import parse_backend
from draftgen.formats import get_format
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import Tokenizer
from draftgen.tokenize.logprob_tokens import LogprobToken, LogprobTokens, SentBytes
from draftgen.types import BackendError, Prompt, RawAnswer
from tests.e2e_helpers import (
    fast_backend,
    mixed_rows,
    read_records,
    run_config,
    write_config,
    write_jsonl,
)

MODEL = ModelConfig(name="test/qwen3", format="qwen3", tokenizer="unused")
PROMPT = Prompt(id="p", dataset="d", messages=[{"role": "user", "content": "hi"}])
QUESTIONS = ["logprobs café 東京 🙂", "explain binary search", "weather in Paris?"]


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer(mode="openrouter", noncanonical_rate=0.3) as s:
        yield s


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "test/qwen3", "messages": [{"role": "user", "content": text}],
            "usage": {"include": True}, "reasoning": {"enabled": True}, **extra}


async def _bodies(url: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as session, session.post(
            f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        return await resp.read()


def _fetch(server: TestServer, text: str, **extra: Any) -> bytes:
    return asyncio.run(_bodies(server.url, _chat(text, **extra)))


def _per_entry(data: dict[str, Any]) -> list[LogprobToken]:
    """The former parse: one LogprobToken per entry, the wire's byte lists as they are."""
    entries = data["choices"][0]["logprobs"]["content"]
    return [LogprobToken(e.get("token", ""), e.get("bytes"), e.get("id"), e.get("logprob"))
            for e in entries if isinstance(e, dict)]


def _streamed(body: bytes) -> RawAnswer:
    acc = StreamAccumulator()
    assert acc.feed(body) or acc.feed_end()
    return acc.finish()


def _backend(type_: str, **kw: Any) -> Any:
    cfg = parse_backend({"name": "b", "type": type_, "url": "http://127.0.0.1:1", **kw})
    return make_backend(cfg, MODEL, SamplingConfig())


# ---- the request ---------------------------------------------------------------------------


@pytest.mark.parametrize("type_", ["openai", "openrouter", "vllm"])
def test_chat_flavours_ask_for_the_sampled_entries_only(type_: str) -> None:
    body = _backend(type_, logprobs=True).build_body(PROMPT, 16)
    assert body["logprobs"] is True and "top_logprobs" not in body
    assert "logprobs" not in _backend(type_, logprobs=False).build_body(PROMPT, 16)


def test_llamacpp_chat_asks_for_the_least_that_gets_entries() -> None:
    # llama-server reads top_logprobs as n_probs: 20 when absent, no entries with 0.
    body = _backend("llamacpp", endpoint="chat").build_body(PROMPT, 16)
    assert body["logprobs"] is True and body["top_logprobs"] == 1


def test_extra_body_still_sets_top_logprobs() -> None:
    for type_ in ("openrouter", "llamacpp"):
        kw = {"endpoint": "chat"} if type_ == "llamacpp" else {}
        body = _backend(type_, extra_body={"top_logprobs": 3}, **kw).build_body(PROMPT, 16)
        assert body["top_logprobs"] == 3


# ---- the parse -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", QUESTIONS)
def test_columns_hold_what_one_object_per_entry_held(server: TestServer, text: str) -> None:
    raw = _fetch(server, text, logprobs=True, top_logprobs=1)
    answer = answer_from_json(orjson.loads(raw), {})
    want = _per_entry(orjson.loads(raw))
    assert isinstance(answer.logprobs, LogprobTokens)
    assert len(answer.logprobs) == len(want) > 0
    assert [(e.token, e.id, e.logprob) for e in answer.logprobs] == [
        (e.token, e.id, e.logprob) for e in want]
    assert [e.bytes for e in answer.logprobs] == [bytes(e.bytes or b"") for e in want]
    assert all(isinstance(b, bytes) for b in answer.logprobs.bytes)


@pytest.mark.parametrize("text", QUESTIONS)
def test_top_logprobs_change_nothing_read(server: TestServer, text: str) -> None:
    with_top = answer_from_json(orjson.loads(
        _fetch(server, text, logprobs=True, top_logprobs=1)), {})
    without = answer_from_json(orjson.loads(_fetch(server, text, logprobs=True)), {})
    assert with_top.logprobs == without.logprobs
    assert (with_top.reasoning, with_top.content, with_top.tool_calls, with_top.usage) == (
        without.reasoning, without.content, without.tool_calls, without.usage)


@pytest.mark.parametrize("text", QUESTIONS)
def test_streamed_logprobs_equal_the_json_ones(server: TestServer, text: str) -> None:
    whole = answer_from_json(orjson.loads(_fetch(server, text, logprobs=True)), {})
    streamed = _streamed(_fetch(server, text, logprobs=True, stream=True,
                                stream_options={"include_usage": True}))
    assert streamed.logprobs == whole.logprobs
    assert (streamed.reasoning, streamed.content, streamed.usage) == (
        whole.reasoning, whole.content, whole.usage)


def test_entries_that_are_not_objects_are_left_out() -> None:
    data = {"choices": [{"message": {"content": "ab"}, "finish_reason": "stop", "logprobs": {
        "content": [{"token": "a", "bytes": [97], "id": 64, "logprob": -0.5}, "junk", None,
                    {"token": "b", "logprob": -1.0}]}}]}
    lp = answer_from_json(data, {}).logprobs
    assert list(lp or []) == [LogprobToken("a", b"a", 64, -0.5),
                              LogprobToken("b", None, None, -1.0)]


@pytest.mark.parametrize("bad", [[256], [-1], "abc", 5, [1.5]])
def test_bad_bytes_name_the_entry(bad: Any) -> None:
    data = {"choices": [{"message": {"content": "ab"}, "finish_reason": "stop", "logprobs": {
        "content": [{"token": "a", "bytes": [97]}, {"token": "b", "bytes": bad}]}}]}
    with pytest.raises(BackendError, match=r"logprobs\.content\[1\]\.bytes") as err:
        answer_from_json(data, {})
    assert err.value.kind == "bad_response" and err.value.retryable


def test_logprob_tokens_read_as_a_sequence() -> None:
    entries = [LogprobToken("a", b"a", 1, -0.1), LogprobToken("b", None, None, None),
               LogprobToken("c", b"c", 3, -0.3)]
    lp = LogprobTokens.of(entries)
    assert len(lp) == 3 and list(lp) == entries and lp == entries
    assert lp[-1] == entries[-1] and lp[0] == entries[0]
    assert lp[1:] == entries[1:] and isinstance(lp[1:], LogprobTokens)
    assert lp != entries[:2] and lp != "abc"
    with pytest.raises(IndexError):
        lp[3]
    with pytest.raises(ValueError, match="different lengths"):
        LogprobTokens(["a", "b"], [b"a"], [1, 2], [0.0, 0.0])


def test_deferred_columns_are_read_once_when_asked_for() -> None:
    reads: list[str] = []

    def read(name: str, column: list[Any]) -> Callable[[], list[Any]]:
        return lambda: reads.append(name) or column

    sent = SentBytes(b"ab", b"[97]|[98]")
    lp = LogprobTokens(["a", "b"], read("bytes", [b"a", b"b"]), [1, None],
                       read("logprobs", [-0.1, -0.2]), sent=sent)
    assert len(lp) == 2 and lp.ids == [1, None] and lp.tokens == ["a", "b"] and not reads
    assert lp.sent_bytes() is sent
    assert lp.logprobs == [-0.1, -0.2] and lp.logprobs == [-0.1, -0.2]
    assert reads == ["logprobs"] and lp.sent_bytes() is sent
    assert lp.bytes == [b"a", b"b"] and lp[1] == LogprobToken("b", b"b", None, -0.2)
    assert reads == ["logprobs", "bytes"]
    assert lp.sent_bytes() is None  # handed out: whoever holds the column may change it
    lp = LogprobTokens(["a"], [b"a"], [1], [0.0], sent=sent)
    lp.bytes = [b"x"]
    assert lp.sent_bytes() is None and lp == [LogprobToken("a", b"x", 1, 0.0)]
    short = LogprobTokens(["a", "b"], read("bytes", [b"a"]), [1, 2])
    with pytest.raises(ValueError, match="different lengths"):
        short.bytes  # noqa: B018  # read now


# ---- the IDs -------------------------------------------------------------------------------


def test_rebuilt_ids_and_labels_equal_from_columns_and_from_entries(
        server: TestServer, qwen3_tok: Tokenizer) -> None:
    fmt = get_format("qwen3", qwen3_tok)
    for text in QUESTIONS:
        raw = _fetch(server, text, logprobs=True, top_logprobs=1)
        new = answer_from_json(orjson.loads(raw), {})
        old = answer_from_json(orjson.loads(raw), {})
        old.logprobs = _per_entry(orjson.loads(raw))  # byte lists, one object per entry
        lazy = answer_from_body(raw, {})  # columns read when asked for (`send`'s reading)
        got, want, got_lazy = fmt.rebuild_batch([new, old, lazy])
        assert got == want == got_lazy
        assert (got.token_source, got.token_check) == ("native", "exact")
        assert "ids_from_logprobs" in got.flags


VOLATILE = {"request_id", "created_at", "latency_s", "started_at", "finished_at"}


def _stable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in VOLATILE}
            for r in sorted(records, key=lambda r: r["id"])]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_records_equal_with_and_without_top_logprobs(
        tmp_path: Path, qwen3_dir: Path, stream: bool) -> None:
    """Whole runs: the request as it was (`top_logprobs: 1`) and as it is; records equal."""
    data = write_jsonl(tmp_path / "data" / "mixed.jsonl", mixed_rows(60))
    runs: dict[str, list[dict[str, Any]]] = {}
    with TestServer(mode="openrouter", noncanonical_rate=0.3) as server:
        for name, extra in (("before", {"top_logprobs": 1}), ("after", {})):
            cfg = write_config(tmp_path / name, qwen3_dir, backends=[
                fast_backend("or", "openrouter", server.url + "/api/v1", concurrency=16,
                             stream=stream, extra_body=extra)],
                datasets=[{"name": "mixed", "path": str(data)}])
            assert run_config(cfg).status == "completed"
            runs[name] = sorted(read_records(tmp_path / name / "run", "mixed"),
                                key=lambda r: r["id"])
    before, after = _stable(runs["before"]), _stable(runs["after"])
    assert len(before) == len(after) == 60
    assert before == after
    assert all("ids_from_logprobs" in r["flags"] for r in after)


@pytest.mark.slow
@pytest.mark.parametrize("logprobs", [True, False])
def test_records_equal_with_typed_and_generic_decoding(
        tmp_path: Path, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, logprobs: bool) -> None:
    """Whole runs: answers read through the `wire` types (what `send` does) and through the
    generic reading (orjson and dict lookups, as before); records equal."""
    data = write_jsonl(tmp_path / "data" / "mixed.jsonl", mixed_rows(40))
    runs: dict[str, list[dict[str, Any]]] = {}
    with TestServer(mode="openrouter", noncanonical_rate=0.3, prices=(0.5, 2.5)) as server:
        for name in ("typed", "generic"):
            if name == "generic":
                monkeypatch.setattr(openai_chat, "answer_from_body", lambda raw, headers, _:
                                    answer_from_json(parse_json_body(raw), headers))
            cfg = write_config(tmp_path / name, qwen3_dir, backends=[
                fast_backend("or", "openrouter", server.url + "/api/v1", concurrency=16,
                             logprobs=logprobs)],
                datasets=[{"name": "mixed", "path": str(data)}])
            assert run_config(cfg).status == "completed"
            runs[name] = _stable(read_records(tmp_path / name / "run", "mixed"))
    assert len(runs["typed"]) == 40
    assert runs["typed"] == runs["generic"]
    assert all(("ids_from_logprobs" in r["flags"]) == logprobs for r in runs["typed"])
    assert any(r["tool_calls"] for r in runs["typed"])
