"""The fake engine (draftgen.testing.fake_engine): wire shapes, token exactness, faults, auth."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from draftgen.testing.fake_engine import ERRORS, FAULT_KINDS, ServerConfig, TestServer
from draftgen.tokenize import Tokenizer

IM_END = 151645
THINK_END = 151668
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
API_KEY = "sk-test-0123456789abcdef"


def _server(**overrides: Any) -> Iterator[TestServer]:
    with TestServer(ServerConfig(**overrides)) as server:
        yield server


@pytest.fixture(scope="module")
def openrouter() -> Iterator[TestServer]:
    yield from _server(mode="openrouter", prices=(0.5, 2.5), providers=["A", "B"])


@pytest.fixture(scope="module")
def vllm() -> Iterator[TestServer]:
    yield from _server(mode="vllm")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "test/qwen3", "messages": [{"role": "user", "content": text}], **extra}


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[str]:
    """The SSE lines of a streamed answer (blank separators dropped)."""
    async with session.post(url, json={**body, "stream": True}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        text = await resp.text()
    return [line for line in text.split("\n") if line]


def _chunks(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def _reassemble(chunks: list[dict[str, Any]], field: str) -> str:
    return "".join(c["choices"][0]["delta"].get(field) or "" for c in chunks if c.get("choices"))


def _native(message: dict[str, Any]) -> str:
    content = message["content"] or ""
    for call in message.get("tool_calls") or ():
        function = call["function"]
        body = {"name": function["name"], "arguments": json.loads(function["arguments"])}
        content += ("\n" if content else "") + f"<tool_call>\n{json.dumps(body)}\n</tool_call>"
    return f"<think>\n{message['reasoning']}\n</think>\n\n{content}<|im_end|>"


# ---- chat endpoint


async def test_chat_json_shape_and_exact_token_count(
    openrouter: TestServer, session: aiohttp.ClientSession, qwen3_tok: Tokenizer
) -> None:
    async with session.post(f"{openrouter.url}/api/v1/chat/completions", json=_chat("hi")) as r:
        assert r.status == 200
        body = await r.json()
        assert r.headers["X-Generation-Id"] == body["id"]
    assert body["id"].startswith("gen-")
    assert body["object"] == "chat.completion"
    assert body["provider"] in ("A", "B")
    choice = body["choices"][0]
    assert choice["finish_reason"] == choice["native_finish_reason"] == "stop"
    message = choice["message"]
    assert message["role"] == "assistant" and message["reasoning"] and message["content"]
    ids = qwen3_tok.encode(_native(message))
    usage = body["usage"]
    assert usage["completion_tokens"] == len(ids)
    assert usage["completion_tokens_details"]["reasoning_tokens"] == ids.index(THINK_END) + 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    expected_cost = (usage["prompt_tokens"] * 0.5 + usage["completion_tokens"] * 2.5) / 1e6
    assert usage["cost"] == pytest.approx(expected_cost)


async def test_answers_are_deterministic_per_prompt_and_seed(
    vllm: TestServer, session: aiohttp.ClientSession
) -> None:
    url = f"{vllm.url}/v1/chat/completions"
    first = await _post(session, url, _chat("same"))
    again = await _post(session, url, _chat("same"))
    seeded = await _post(session, url, _chat("same", seed=7))
    assert first["choices"][0]["message"] == again["choices"][0]["message"]
    assert first["choices"][0]["message"] != seeded["choices"][0]["message"]


async def test_stream_reassembles_the_json_answer(
    openrouter: TestServer, session: aiohttp.ClientSession
) -> None:
    url = f"{openrouter.url}/api/v1/chat/completions"
    body = _chat("stream me", logprobs=False)
    whole = await _post(session, url, body)
    lines = await _stream(session, url, body)
    assert lines[0] == ": OPENROUTER PROCESSING"
    assert lines[-1] == "data: [DONE]"
    chunks = _chunks(lines)
    message = whole["choices"][0]["message"]
    assert _reassemble(chunks, "reasoning") == message["reasoning"]
    assert _reassemble(chunks, "content") == message["content"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    *_, final, usage_chunk = chunks
    assert final["choices"][0]["finish_reason"] == "stop"
    assert usage_chunk["choices"] == []  # openrouter: usage without include_usage
    assert usage_chunk["usage"] == whole["usage"]


async def test_openai_stream_sends_usage_only_when_asked(
    vllm: TestServer, session: aiohttp.ClientSession
) -> None:
    url = f"{vllm.url}/v1/chat/completions"
    plain = _chunks(await _stream(session, url, _chat("usage?")))
    assert not any("usage" in c for c in plain)
    options = {"stream_options": {"include_usage": True}}
    asked = _chunks(await _stream(session, url, _chat("usage?", **options)))
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] > 0


async def test_vllm_token_ids_json_and_stream(
    vllm: TestServer, session: aiohttp.ClientSession, qwen3_tok: Tokenizer
) -> None:
    url = f"{vllm.url}/v1/chat/completions"
    body = _chat("ids please", return_token_ids=True)
    whole = await _post(session, url, body)
    token_ids = whole["choices"][0]["token_ids"]
    assert token_ids == qwen3_tok.encode(_native(whole["choices"][0]["message"]))
    assert token_ids[-1] == IM_END
    prompt_ids = whole["prompt_token_ids"]
    assert len(prompt_ids) == whole["usage"]["prompt_tokens"]
    assert qwen3_tok.decode(prompt_ids).endswith("<|im_start|>assistant\n")
    chunks = _chunks(await _stream(session, url, body))
    assert chunks[0]["prompt_token_ids"] == prompt_ids
    streamed = [i for c in chunks for i in c["choices"][0].get("token_ids", [])]
    assert streamed == token_ids


async def test_length_cut_on_chat(
    vllm: TestServer, session: aiohttp.ClientSession, qwen3_tok: Tokenizer
) -> None:
    body = _chat("cut", max_tokens=12, return_token_ids=True)
    answer = await _post(session, f"{vllm.url}/v1/chat/completions", body)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == len(choice["token_ids"]) == 12
    assert IM_END not in choice["token_ids"]
    assert choice["message"]["content"] == ""
    text = qwen3_tok.decode(choice["token_ids"])
    assert text == "<think>\n" + choice["message"]["reasoning"]


async def _json_and_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return await _post(session, url, body), _chunks(await _stream(session, url, body))


async def test_stream_matches_json_at_every_cut(session: aiohttp.ClientSession) -> None:
    """Wherever max_tokens cuts (inside a multi-byte character, next to a split token), the
    stream carries the same text and the same token IDs as the JSON answer."""
    with TestServer(mode="vllm", noncanonical_rate=1.0, edge_whitespace_rate=1.0) as server:
        url = f"{server.url}/v1/chat/completions"
        body = _chat("cuts", return_token_ids=True, seed=2)
        full = (await _post(session, url, body))["choices"][0]["token_ids"]
        cuts = range(1, 150)
        answers = await asyncio.gather(
            *(_json_and_stream(session, url, {**body, "max_tokens": n}) for n in cuts)
        )
    partial_characters = 0
    for n, (whole, chunks) in zip(cuts, answers, strict=True):
        choice = whole["choices"][0]
        assert choice["token_ids"] == full[:n]
        assert choice["finish_reason"] == ("length" if n < len(full) else "stop")
        streamed = [i for c in chunks for i in c["choices"][0].get("token_ids", [])]
        assert streamed == choice["token_ids"]
        for field in ("reasoning", "content"):
            assert _reassemble(chunks, field) == (choice["message"][field] or "")
        partial_characters += "\ufffd" in choice["message"]["reasoning"]
    assert partial_characters > 0, "no cut fell inside a character: pick another seed"


async def test_tool_call_json_and_stream(
    openrouter: TestServer, session: aiohttp.ClientSession, qwen3_tok: Tokenizer
) -> None:
    url = f"{openrouter.url}/api/v1/chat/completions"
    body = _chat("What is the weather in Paris?", tools=[WEATHER_TOOL])
    answer = await _post(session, url, body)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    native = _native(choice["message"])
    assert answer["usage"]["completion_tokens"] == len(qwen3_tok.encode(native))

    chunks = _chunks(await _stream(session, url, body))
    deltas = [
        d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert deltas[0]["id"] == call["id"] and deltas[0]["function"]["name"] == "get_weather"
    assert {d["index"] for d in deltas} == {0}
    assert "".join(d["function"]["arguments"] for d in deltas) == call["function"]["arguments"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_no_tool_call_without_tools(vllm: TestServer, session: aiohttp.ClientSession) -> None:
    answer = await _post(session, f"{vllm.url}/v1/chat/completions", _chat("weather in Paris?"))
    assert "tool_calls" not in answer["choices"][0]["message"]


async def test_logprobs_bytes_and_ids_cover_the_native_answer(
    vllm: TestServer, session: aiohttp.ClientSession
) -> None:
    body = _chat("logprobs café 東京", logprobs=True, top_logprobs=1, return_token_ids=True)
    answer = await _post(session, f"{vllm.url}/v1/chat/completions", body)
    choice = answer["choices"][0]
    entries = choice["logprobs"]["content"]
    assert [e["id"] for e in entries] == choice["token_ids"]
    data = b"".join(bytes(e["bytes"]) for e in entries)
    assert data == _native(choice["message"]).encode()
    assert all(e["logprob"] <= 0 and e["top_logprobs"][0]["token"] == e["token"] for e in entries)


async def test_logprob_entries_alike_whole_and_streamed(
    vllm: TestServer, session: aiohttp.ClientSession
) -> None:
    """Without `top_logprobs` the entries are spliced in as cached JSON text, sliced per
    chunk when streamed: the chunks' entries, end to end, are the whole answer's, which cover
    its token IDs and native bytes."""
    body = _chat("spliced logprobs café 東京", logprobs=True, return_token_ids=True)
    url = f"{vllm.url}/v1/chat/completions"
    answer = await _post(session, url, body)
    choice = answer["choices"][0]
    entries = choice["logprobs"]["content"]
    assert [e["id"] for e in entries] == choice["token_ids"]
    assert b"".join(bytes(e["bytes"]) for e in entries) == _native(choice["message"]).encode()
    assert all(e["top_logprobs"] == [] for e in entries)
    streamed = [e for c in _chunks(await _stream(session, url, body)) for ch in c["choices"]
                for e in (ch.get("logprobs") or {}).get("content") or ()]
    assert streamed == entries


@pytest.mark.parametrize(
    ("options", "check"),
    [
        ({"raw_slices": True}, lambda r, c: r.startswith("\n") and c.startswith("\n\n")),
        ({"strip_whitespace": True}, lambda r, c: r == r.strip() and c == c.strip()),
    ],
)
async def test_display_modes(
    session: aiohttp.ClientSession, options: dict[str, Any], check: Any
) -> None:
    with TestServer(**options) as server:
        for n in range(8):
            answer = await _post(session, f"{server.url}/v1/chat/completions", _chat(f"m{n}"))
            message = answer["choices"][0]["message"]
            assert check(message["reasoning"], message["content"])


@pytest.mark.parametrize("field", ["reasoning_content", "both", "none"])
async def test_reasoning_field_names(session: aiohttp.ClientSession, field: str) -> None:
    with TestServer(reasoning_field=field) as server:
        message = (await _post(session, f"{server.url}/v1/chat/completions", _chat("r")))[
            "choices"
        ][0]["message"]
    names = {"reasoning_content"} if field == "reasoning_content" else set()
    names |= {"reasoning", "reasoning_content"} if field == "both" else set()
    assert {k for k in message if k.startswith("reasoning")} == names


async def test_thinking_layout(session: aiohttp.ClientSession, qwen3_tok: Tokenizer) -> None:
    with TestServer(layout="qwen3-thinking") as server:
        answer = await _post(session, f"{server.url}/v1/chat/completions", _chat("2507"))
    message = answer["choices"][0]["message"]
    native = f"{message['reasoning']}\n</think>\n\n{message['content']}<|im_end|>"
    assert answer["usage"]["completion_tokens"] == len(qwen3_tok.encode(native))


async def test_models_endpoint(openrouter: TestServer, session: aiohttp.ClientSession) -> None:
    for path in ("/v1/models", "/api/v1/models"):
        async with session.get(openrouter.url + path) as resp:
            (model,) = (await resp.json())["data"]
        assert model["id"] == "test/qwen3"
        assert model["pricing"] == {"prompt": "0.0000005", "completion": "0.0000025"}
        assert model["context_length"] == 32768
    async with session.get(f"{openrouter.url}/health") as resp:
        assert resp.status == 200


async def test_generation_endpoint_reports_what_was_billed(
    openrouter: TestServer, session: aiohttp.ClientSession
) -> None:
    url = f"{openrouter.url}/api/v1"
    async with session.post(url + "/chat/completions", json=_chat("What is 2+2?")) as resp:
        generation = resp.headers["X-Generation-Id"]
        usage = (await resp.json())["usage"]
    async with session.get(url + "/generation", params={"id": generation}) as resp:
        record = (await resp.json())["data"]
    assert record["id"] == generation and record["total_cost"] == usage["cost"] > 0
    assert record["native_tokens_completion"] == usage["completion_tokens"]
    async with session.get(url + "/generation", params={"id": "gen-unknown"}) as resp:
        assert resp.status == 404


# ---- SGLang /generate


async def test_generate_returns_native_ids(
    vllm: TestServer, session: aiohttp.ClientSession, qwen3_tok: Tokenizer
) -> None:
    prompt = qwen3_tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096, "temperature": 0.6}}
    answer = await _post(session, f"{vllm.url}/generate", body)
    ids = answer["output_ids"]
    native = qwen3_tok.decode(ids)
    assert ids[-1] == IM_END and native.startswith("<think>\n") and "\n</think>\n\n" in native
    assert qwen3_tok.encode(native) == ids
    assert answer["text"] == native.removesuffix("<|im_end|>")
    meta = answer["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": IM_END}
    assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == len(ids)
    assert meta["cached_tokens"] == 0 and meta["e2e_latency"] >= 0

    by_text = await _post(session, f"{vllm.url}/generate", {**body, "text": "x", "input_ids": None})
    assert by_text["meta_info"]["prompt_tokens"] == 1


async def test_generate_tool_call(
    vllm: TestServer, session: aiohttp.ClientSession, qwen3_tok: Tokenizer
) -> None:
    prompt = (
        "<|im_start|>system\n# Tools\n\n<tools>\n{}\n</tools><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )
    body = {"input_ids": qwen3_tok.encode(prompt), "sampling_params": {"max_new_tokens": 4096}}
    answer = await _post(session, f"{vllm.url}/generate", body)
    native = qwen3_tok.decode(answer["output_ids"])
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert native.endswith(call + "<|im_end|>")


async def test_generate_length_cut_and_default_limit(
    vllm: TestServer, session: aiohttp.ClientSession
) -> None:
    body = {"input_ids": [9707], "sampling_params": {"max_new_tokens": 10}}
    answer = await _post(session, f"{vllm.url}/generate", body)
    assert len(answer["output_ids"]) == answer["meta_info"]["completion_tokens"] == 10
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    default = await _post(session, f"{vllm.url}/generate", {"input_ids": [9707]})
    assert len(default["output_ids"]) <= 128  # SGLang's default max_new_tokens


async def test_generate_can_omit_the_stop_id(session: aiohttp.ClientSession) -> None:
    body = {"input_ids": [9707], "sampling_params": {"max_new_tokens": 4096}}
    with TestServer(generate_omits_stop_id=True) as server:
        answer = await _post(session, f"{server.url}/generate", body)
    assert answer["output_ids"][-1] != IM_END
    assert answer["meta_info"]["finish_reason"]["matched"] == IM_END
    assert answer["meta_info"]["completion_tokens"] == len(answer["output_ids"]) + 1


async def test_noncanonical_split_keeps_text(
    session: aiohttp.ClientSession, qwen3_tok: Tokenizer
) -> None:
    with TestServer(noncanonical_rate=1.0) as server:
        body = {"input_ids": [9707], "sampling_params": {"max_new_tokens": 4096}}
        answer = await _post(session, f"{server.url}/generate", body)
        chat = await _post(session, f"{server.url}/v1/chat/completions", _chat("nc", logprobs=True))
        assert server.stats["faults"]["noncanonical"] == 2
    ids = answer["output_ids"]
    canonical = qwen3_tok.encode(qwen3_tok.decode(ids))
    assert ids != canonical and len(ids) == len(canonical) + 1
    assert answer["meta_info"]["completion_tokens"] == len(ids)
    entries = chat["choices"][0]["logprobs"]["content"]
    native = _native(chat["choices"][0]["message"])
    assert b"".join(bytes(e["bytes"]) for e in entries) == native.encode()
    assert [e["id"] for e in entries] != qwen3_tok.encode(native)
    assert chat["usage"]["completion_tokens"] == len(entries)


# ---- faults


async def _fault(
    session: aiohttp.ClientSession, server: TestServer, kind: str, **extra: Any
) -> aiohttp.ClientResponse:
    url = f"{server.url}/api/v1/chat/completions"
    resp = await session.post(url, json=_chat(f"[[fault:{kind}]] q", **extra))
    await resp.read()
    return resp


@pytest.mark.parametrize("kind", sorted(ERRORS))
async def test_error_faults(
    openrouter: TestServer, session: aiohttp.ClientSession, kind: str
) -> None:
    spec = ERRORS[kind]
    resp = await _fault(session, openrouter, kind)
    assert resp.status == spec.status
    assert resp.headers.get("Retry-After") == spec.retry_after
    body = await resp.json()
    assert "choices" not in body
    assert body["error"]["code"] == spec.code and body["error"]["message"]
    for key, value in spec.metadata.items():
        assert body["error"]["metadata"][key] == value
    billed = kind in ("408", "502", "error_body")
    assert ("usage" in body) == billed
    if billed:
        assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["cost"] > 0


async def test_sse_error_fault(openrouter: TestServer, session: aiohttp.ClientSession) -> None:
    url = f"{openrouter.url}/api/v1/chat/completions"
    lines = await _stream(session, url, _chat("[[fault:sse_error]] s"))
    chunks = _chunks(lines)
    assert lines[-1] == "data: [DONE]"
    assert chunks[-1]["choices"][0]["finish_reason"] == "error"
    assert chunks[-1]["error"]["code"] == 502
    assert any(c["choices"][0]["delta"].get("reasoning") for c in chunks[:-1])
    resp = await _fault(session, openrouter, "sse_error")
    assert resp.status == 200 and (await resp.json())["error"]["code"] == 502


async def test_no_done_fault(openrouter: TestServer, session: aiohttp.ClientSession) -> None:
    url = f"{openrouter.url}/api/v1/chat/completions"
    lines = await _stream(session, url, _chat("[[fault:no_done]] s"))
    assert "data: [DONE]" not in lines
    assert all(c["choices"][0]["finish_reason"] is None for c in _chunks(lines))


async def test_reset_faults(openrouter: TestServer, session: aiohttp.ClientSession) -> None:
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await _fault(session, openrouter, "reset")
    with pytest.raises(aiohttp.ClientPayloadError):
        await _fault(session, openrouter, "reset_stream")
    with pytest.raises(aiohttp.ClientPayloadError):
        await _fault(session, openrouter, "reset_stream", stream=True)


async def test_malformed_and_empty_faults(
    openrouter: TestServer, session: aiohttp.ClientSession
) -> None:
    resp = await _fault(session, openrouter, "malformed")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/json")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(await resp.read())
    body = await (await _fault(session, openrouter, "empty")).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == "" and choice["message"]["reasoning"] is None
    assert choice["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == 0


async def test_slow_fault_is_cancelled_when_the_client_leaves(
    openrouter: TestServer, session: aiohttp.ClientSession
) -> None:
    url = f"{openrouter.url}/api/v1/chat/completions"
    with pytest.raises(asyncio.TimeoutError):
        await session.post(url, json=_chat("[[fault:slow]] s"), timeout=aiohttp.ClientTimeout(0.3))
    for _ in range(100):
        if openrouter.stats["in_flight"] == 0:
            break
        await asyncio.sleep(0.02)
    assert openrouter.stats["in_flight"] == 0


async def test_counted_directive_fails_then_answers(
    openrouter: TestServer, session: aiohttp.ClientSession
) -> None:
    url = f"{openrouter.url}/api/v1/chat/completions"
    body = _chat("[[fault:429*2]] twice")
    statuses = []
    for _ in range(3):
        async with session.post(url, json=body) as resp:
            statuses.append(resp.status)
    assert statuses == [429, 429, 200]
    assert openrouter.stats["per_prompt"]["[[fault:429*2]] twice"] == 3


async def test_generate_directive_and_unknown_kind(
    vllm: TestServer, session: aiohttp.ClientSession, qwen3_tok: Tokenizer
) -> None:
    prompt = qwen3_tok.encode("<|im_start|>user\n[[fault:503]] x<|im_end|>\n")
    async with session.post(f"{vllm.url}/generate", json={"input_ids": prompt}) as resp:
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    async with session.post(f"{vllm.url}/v1/chat/completions", json=_chat("[[fault:nope]]")) as r:
        assert r.status == 400 and "unknown fault kind" in (await r.json())["error"]["message"]


async def test_random_fault_rates(session: aiohttp.ClientSession) -> None:
    with TestServer(fault_rates={"429": 1.0}) as server:
        async with session.post(f"{server.url}/v1/chat/completions", json=_chat("r")) as resp:
            assert resp.status == 429
        assert server.stats["faults"] == {"429": 1}
        assert server.stats["responses"] == {"429": 1}


def test_fault_kinds_are_documented_and_validated() -> None:
    assert set(ERRORS) < set(FAULT_KINDS)
    with pytest.raises(ValueError, match="unknown fault kinds"):
        ServerConfig(fault_rates={"bogus": 0.1})


# ---- auth, stats, process


async def test_auth_and_the_key_is_never_stored(session: aiohttp.ClientSession) -> None:
    with TestServer(api_key=API_KEY) as server:
        url = f"{server.url}/v1/chat/completions"
        async with session.post(url, json=_chat("a")) as resp:
            assert resp.status == 401 and API_KEY not in await resp.text()
        wrong = {"Authorization": "Bearer nope"}
        async with session.post(url, json=_chat("a"), headers=wrong) as resp:
            assert resp.status == 401 and "nope" not in await resp.text()
        good = {"Authorization": f"Bearer {API_KEY}"}
        async with session.post(url, json=_chat("a"), headers=good) as resp:
            assert resp.status == 200 and API_KEY not in await resp.text()
        async with session.get(f"{server.url}/stats") as resp:
            stats = await resp.text()
        assert API_KEY not in stats and "nope" not in stats
        assert json.loads(stats)["responses"] == {"401": 2, "200": 1}
        assert len(server.stats.bodies) == 1


async def test_stats_track_concurrency(vllm: TestServer, session: aiohttp.ClientSession) -> None:
    with TestServer(latency_s=0.2) as server:
        url = f"{server.url}/v1/chat/completions"
        await asyncio.gather(*(_post(session, url, _chat(f"c{n}")) for n in range(50)))
        stats = server.stats
        assert stats["max_in_flight"] == 50 and stats["in_flight"] == 0
        assert stats["requests"]["chat"] == 50 and len(stats["bodies"]) == 50


def test_command_line_server() -> None:
    env = {**os.environ, "TEST_SERVER_KEY": API_KEY}
    args = ["--port", "0", "--mode", "openrouter", "--prices", "0.5,2.5", "--latency", "0"]
    args += ["--fault-rate", "429=0", "--api-key-env", "TEST_SERVER_KEY", "--seed", "3"]
    command = [sys.executable, "-m", "draftgen.testing.fake_engine", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("LISTENING http://127.0.0.1:")
            answer = asyncio.run(_ask_with_key(line.split()[1]))
            assert answer["usage"]["cost"] > 0
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0


async def _ask_with_key(url: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        return await _post(session, f"{url}/api/v1/chat/completions", _chat("cli"))
