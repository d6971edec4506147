"""Typed decoding of chat answers (`backends/wire.py`): `answer_from_body` gives what the
generic reading (`answer_from_json`) gives, answers and errors alike, on the test server's
answers in every shape it sends and on bodies the types do not describe; and the IDs from the
logprob columns are the engine's."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import msgspec
import orjson
import pytest

from draftgen.backends import wire
from draftgen.backends.base import parse_json_body
from draftgen.backends.openai_chat import (
    StreamAccumulator,
    answer_from_body,
    answer_from_json,
)
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import (
    Tokenizer,
    TokenSpellings,
    ids_from_logprobs,
    last_logprob_id,
    logprob_ids,
)
from draftgen.tokenize.logprob_tokens import LogprobTokens
from draftgen.types import BackendError
from tests.readings import outcome

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
QUESTIONS: list[tuple[str, list[Any] | None]] = [
    ("explain binary search, café 東京 🙂", None),
    ("What is the weather in Paris?", [WEATHER_TOOL]),
]
SHAPES: dict[str, dict[str, Any]] = {
    "openrouter": {"mode": "openrouter", "prices": (0.5, 2.5), "noncanonical_rate": 0.3},
    "reasoning_content": {"mode": "openrouter", "reasoning_field": "reasoning_content"},
    "both_fields": {"mode": "openrouter", "reasoning_field": "both"},
    "reasoning_details": {"mode": "openrouter", "reasoning_field": "reasoning_details"},
    "hidden_reasoning": {"mode": "openrouter", "reasoning_field": "none"},
    "vllm": {"mode": "vllm", "noncanonical_rate": 0.3},
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def server(request: pytest.FixtureRequest) -> Iterator[TestServer]:
    with TestServer(**SHAPES[request.param]) as s:
        yield s


def _fetch(server: TestServer, question: str, tools: list[Any] | None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"model": "test/qwen3",
                            "messages": [{"role": "user", "content": question}],
                            "usage": {"include": True}, "return_token_ids": True, **extra}
    if tools:
        body["tools"] = tools

    async def post() -> bytes:
        async with aiohttp.ClientSession() as session, session.post(
                f"{server.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            return await resp.read()

    return asyncio.run(post())


def _generic(raw: bytes) -> tuple[Any, ...]:
    return outcome(lambda: answer_from_json(parse_json_body(raw), {}))


def _typed(raw: bytes) -> tuple[Any, ...]:
    return outcome(lambda: answer_from_body(raw, {}))


# ---- the test server's answers ----------------------------------------------------------------


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize(("question", "tools"), QUESTIONS)
def test_whole_answers_read_alike(server: TestServer, question: str, tools: list[Any] | None,
                                  logprobs: bool) -> None:
    raw = _fetch(server, question, tools, logprobs=logprobs)
    decoded = wire.decode_completion(raw)
    assert decoded is not None and not decoded.error  # the typed reading, not the fallback
    typed, generic = _typed(raw), _generic(raw)
    assert typed[0] == "answer" and typed == generic
    answer = typed[1]
    assert isinstance(answer.logprobs, LogprobTokens) == logprobs
    if logprobs:
        assert len(answer.logprobs) > 0
        assert all(isinstance(b, bytes) for b in answer.logprobs.bytes)


def _fed(raw: bytes, size: int) -> tuple[Any, ...]:
    """A stream read through `StreamAccumulator.feed` in reads of `size` bytes."""
    def read() -> Any:
        acc = StreamAccumulator()
        if not any(acc.feed(raw[i : i + size]) for i in range(0, len(raw), size)):
            acc.feed_end()
        return acc.finish()
    return outcome(read)


def _by_lines(raw: bytes) -> tuple[Any, ...]:
    """The generic reading of a stream: every line through `feed_line` (orjson)."""
    def read() -> Any:
        acc = StreamAccumulator()
        any(acc.feed_line(line) for line in raw.split(b"\n"))
        return acc.finish()
    return outcome(read)


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize(("question", "tools"), QUESTIONS)
def test_streamed_answers_read_alike(server: TestServer, question: str, tools: list[Any] | None,
                                     logprobs: bool) -> None:
    """Every event of the server's streams is read through the `wire` types, and gives what the
    generic reading gives, whatever the network reads."""
    raw = _fetch(server, question, tools, logprobs=logprobs, stream=True,
                 stream_options={"include_usage": True})
    events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: {")]
    assert len(events) > 5 and all(wire.decode_chunk(e) is not None for e in events)
    generic = _by_lines(raw)
    assert generic[0] == "answer" and (generic[1].logprobs is not None) == logprobs
    for size in [1, 5, 1024, 4096, len(raw)]:
        assert _fed(raw, size) == generic, size


def test_logprob_columns_give_the_engine_ids(qwen3_tok: Tokenizer) -> None:
    """vLLM's own `token_ids` against the IDs recovered from the logprob columns, with the
    entries' `id` and without (bytes through the inverted byte table)."""
    with TestServer(mode="vllm", noncanonical_rate=0.5) as server:
        for question, tools in QUESTIONS:
            answer = answer_from_body(_fetch(server, question, tools, logprobs=True), {})
            assert isinstance(answer.logprobs, LogprobTokens) and answer.output_ids
            n = answer.usage.completion_tokens
            assert ids_from_logprobs(qwen3_tok, answer.logprobs, n) == answer.output_ids
            answer.logprobs.ids[:] = [None] * len(answer.logprobs)
            assert ids_from_logprobs(qwen3_tok, answer.logprobs, n) == answer.output_ids


# ---- bodies the types do not describe -------------------------------------------------------


def _body(choice: dict[str, Any] | None = None, **top: Any) -> bytes:
    choice = choice if choice is not None else {
        "message": {"content": "ab"}, "finish_reason": "stop"}
    return orjson.dumps({"id": "gen-1", "model": "m", "choices": [choice], **top})


def _entries(*entries: Any) -> dict[str, Any]:
    return {"message": {"content": "ab"}, "finish_reason": "stop",
            "logprobs": {"content": list(entries)}}


ENTRY = {"token": "a", "bytes": [97], "id": 64, "logprob": -0.5}
ODD_BODIES: dict[str, bytes] = {
    "not JSON": b"<html>bad gateway</html>",
    "cut off": _body()[:-7],
    "not an object": b"[1, 2]",
    "null": b"null",
    "no choices": orjson.dumps({"id": "x", "choices": []}),
    "choices null": orjson.dumps({"choices": None}),
    "choice not an object": orjson.dumps({"choices": ["junk"]}),
    "second choice not an object": orjson.dumps({"choices": [
        {"message": {"content": "ab"}, "finish_reason": "stop"}, "junk"]}),
    "message a string": _body({"message": "hello", "finish_reason": "stop"}),
    "content a number": _body({"message": {"content": 5, "reasoning": "r"},
                               "finish_reason": "stop"}),
    "content a number, nothing else": _body({"message": {"content": 5},
                                             "finish_reason": "stop"}),
    "reasoning a list": _body({"message": {"content": "ab", "reasoning": ["x"],
                                           "reasoning_content": "rc"}, "finish_reason": "stop"}),
    "reasoning details": _body({"message": {"content": "ab", "reasoning_details": [
        {"type": "reasoning.text", "text": "one "}, "junk", {"text": 5}, {"text": "two"}]},
        "finish_reason": "stop"}),
    "reasoning details encrypted": _body({"message": {"content": "ab", "reasoning_details": [
        {"type": "reasoning.encrypted", "data": "..."}]}, "finish_reason": "stop"}),
    "tool calls empty": _body({"message": {"content": "ab", "tool_calls": []},
                               "finish_reason": "stop"}),
    # orjson reads an integer beyond 64 bits as a float, msgspec as an int: the raw value.
    "tool calls with a huge number": b'{"choices": [{"finish_reason": "tool_calls", "message": '
                                     b'{"tool_calls": [{"id": "c", "function": {"name": "f"}, '
                                     b'"n": 123456789012345678901234567890}]}}]}',
    "finish_reason a number": _body({"message": {"content": "ab"}, "finish_reason": 1}),
    "finish_reason error": _body({"message": {"content": ""}, "finish_reason": "error",
                                  "error": {"code": 502, "message": "upstream died",
                                            "metadata": {"provider_name": "P"}}}),
    "finish_reason error, no error": _body({"message": {"content": ""},
                                            "finish_reason": "error"}),
    "error in a 200": orjson.dumps({"error": {"code": 429, "message": "slow down"},
                                    "usage": {"prompt_tokens": 3, "cost": 0.001}}),
    "error a string": orjson.dumps({"error": "boom"}),
    "error null": _body(error=None),
    "error empty": _body(error={}),
    "usage a list": _body(usage=[1]),
    "usage wrong types": _body(usage={"prompt_tokens": "3", "completion_tokens": True,
                                      "cost": "0.1", "completion_tokens_details": None}),
    "usage complete": _body(usage={"prompt_tokens": 3, "completion_tokens": 2, "cost": 1,
                                   "completion_tokens_details": {"reasoning_tokens": 1},
                                   "prompt_tokens_details": {"cached_tokens": 2}}),
    "id a number": _body(id=7),
    "token_ids not numbers": _body({"message": {"content": "ab"}, "finish_reason": "stop",
                                    "token_ids": ["a"]}),
    "logprobs a list": _body({"message": {"content": "ab"}, "finish_reason": "stop",
                              "logprobs": []}),
    "logprobs content null": _body({"message": {"content": "ab"}, "finish_reason": "stop",
                                    "logprobs": {"content": None}}),
    "logprobs content empty": _body(_entries()),
    "entry not an object": _body(_entries(ENTRY, "junk", None, {"token": "b"})),
    "entry token null": _body(_entries({"token": None, "logprob": -1})),
    "entry id true": _body(_entries({"token": "a", "id": True})),
    "entry logprob a string": _body(_entries({"token": "a", "logprob": "-inf"})),
    "entry logprob an int": _body(_entries({"token": "a", "logprob": -1})),
    **{f"entry bytes {bad!r}": _body(_entries(ENTRY, {"token": "b", "bytes": bad}))
       for bad in ([256], [-1], "abc", 5, [1.5], [True])},
    # Every entry's bytes are read as one string (`chat_logprobs._joined_bytes`): what it must
    # leave to the reading entry by entry.
    **{f"entry bytes {bad!r} alone": _body(_entries({"token": "b", "bytes": bad}))
       for bad in (5, [256], [1000], [[1]], [True], [], [0, 255], None, [1e300])},
    "entry bytes a huge integer": _body(_entries({"token": "b", "bytes": [7]})).replace(
        b"[7]", b"[123456789012345678901234567890]"),
    "entry bytes nested, then a number": _body(_entries(
        {"token": "a", "bytes": [1, [2]]}, {"token": "b", "bytes": 5})),
    "entry bytes null": _body(_entries(ENTRY, {"token": "b", "bytes": None}, ENTRY)),
    "entry bytes absent": _body(_entries(ENTRY, {"token": "b", "id": 65}, ENTRY)),
    "entry bytes absent between empty lists": _body(_entries(
        {"token": "", "bytes": []}, {"token": "b"}, {"token": "", "bytes": []})),
    "entry bytes empty lists": _body(_entries(
        {"token": "", "bytes": []}, ENTRY, {"token": "", "bytes": []}, {"token": "", "bytes": []})),
    "entry bytes spaced": b'{"choices": [{"finish_reason": "stop", "message": {"content": "ab"}, '
                          b'"logprobs": {"content": [{"token": "a", "bytes": [ 97 , 98 ]}, '
                          b'{"token": "", "bytes": [ ]}, {"token": "b", "bytes": [\n98]}]}}]}',
    # Integers beyond 64 bits, where IDs are read: orjson reads them as floats.
    "token_ids beyond 64 bits": _body({"message": {"content": "ab"}, "finish_reason": "stop",
                                       "token_ids": [7]}).replace(
        b"[7]", b"[18446744073709551616]"),
    "prompt_token_ids beyond 64 bits": _body(prompt_token_ids=[7]).replace(
        b"[7]", b"[-9223372036854775809]"),
    "entry id beyond 64 bits": _body(_entries({"token": "a", "id": 7})).replace(
        b'"id":7', b'"id":18446744073709551616'),
    "unknown fields everywhere": orjson.dumps({
        "id": "gen-1", "object": "chat.completion", "created": 1, "system_fingerprint": None,
        "new_thing": {"nested": [1, {"deep": None}]}, "choices": [{
            "index": 0, "native_finish_reason": "stop", "finish_reason": "stop", "extra": [1],
            "message": {"role": "assistant", "content": "ab", "refusal": None, "annotations": []},
            "logprobs": {"refusal": None, "content": [
                {**ENTRY, "top_logprobs": [{"token": "b", "logprob": -2, "bytes": [98]}],
                 "future": {"x": 1}}]}}]}),
}


@pytest.mark.parametrize("name", sorted(ODD_BODIES))
def test_odd_bodies_read_as_the_generic_reading_reads_them(name: str) -> None:
    raw = ODD_BODIES[name]
    assert _typed(raw) == _generic(raw)


def _spelling(rng: random.Random) -> tuple[bytes | None, bool]:
    """A random entry's `bytes` as JSON text (None: absent) and whether it is a byte list."""
    values = [rng.choice([0, 9, 10, 32, 99, 100, 199, 200, 249, 250, 255])
              for _ in range(rng.randrange(5))]
    kind = rng.choices(["compact", "spaced", "null", "absent", "bad"], [20, 3, 1, 1, 2])[0]
    if kind == "compact":
        return orjson.dumps(values), True
    if kind == "spaced":  # an empty one ("[ ]") is left to the reading entry by entry
        return b"[ " + b" ,\n".join(b"%d" % v for v in values) + b" ]", bool(values)
    if kind == "null":
        return b"null", False
    if kind == "absent":
        return None, False
    return rng.choice([b"[256]", b"[300,1]", b"[1000]", b"[01]", b"[-0]", b"[1.0]", b"[1e2]",
                       b"[true]", b"[[1]]", b"[1,[2]]", b"7", b'"ab"', b"[null]", b"{}"]), False


def test_random_byte_spellings_read_as_the_generic_reading_reads_them() -> None:
    """Answers whose entries spell their bytes every way (compact, spaced, null, absent, not
    byte values): the typed reading gives what the generic one gives, and keeps the bytes as
    sent exactly when every entry's are a list of byte values."""
    rng = random.Random(11)
    for _ in range(400):
        spelled = [_spelling(rng) for _ in range(rng.randrange(1, 6))]
        entries = b",".join(b'{"token":"t","id":7' + (b"" if text is None else b',"bytes":'
                                                      + text) + b"}" for text, _ in spelled)
        raw = (b'{"choices":[{"finish_reason":"stop","message":{"content":"ab"},'
               b'"logprobs":{"content":[' + entries + b"]}}]}")
        generic = _generic(raw)
        try:
            answer = answer_from_body(raw, {})
        except (BackendError, ValueError):
            answer = None
        if answer is not None and answer.logprobs is not None and all(ok for _, ok in spelled):
            sent = answer.logprobs.sent_bytes()
            assert sent is not None, raw
            assert sent.joined == b"".join(generic[1].logprobs.bytes), raw
        assert _typed(raw) == generic, raw


def test_a_logprob_beyond_float_range_is_not_read() -> None:
    """The one body the two readings now read apart: the typed reading does not decode the
    logprob values (msgspec skips them unchecked), the generic one refuses the body (orjson
    refuses the number). The values of such an answer read as None."""
    raw = _body(_entries({**ENTRY, "logprob": 0.25}, ENTRY)).replace(b"0.25", b"-1e400")
    outcome = _generic(raw)
    assert outcome[:2] == ("error", "bad_response") and outcome[2].startswith("answer is not JSON")
    answer = answer_from_body(raw, {})
    assert answer.logprobs is not None and answer.logprobs.logprobs == [None, None]
    assert answer.logprobs.bytes == [b"a", b"a"] and answer.logprobs.ids == [64, 64]
    assert answer.logprobs.tokens == ["", ""]  # nor their tokens


def test_unknown_fields_never_leave_the_typed_reading() -> None:
    decoded = wire.decode_completion(ODD_BODIES["unknown fields everywhere"])
    assert decoded is not None and decoded.choices
    logprobs = decoded.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content == [wire.LogprobEntry(msgspec.Raw(b"[97]"), 64)]


@pytest.mark.parametrize(("name", "kind", "message"), [
    ("not JSON", "bad_response", "answer is not JSON"),
    ("not an object", "bad_response", "answer is not a JSON object"),
    ("no choices", "bad_response", "answer has no choices"),
    ("entry bytes [256]", "bad_response", r"logprobs\.content\[1\]\.bytes"),
    ("error in a 200", "rate_limited", "slow down"),
    ("finish_reason error", "provider_error", r"upstream died \(provider P\)"),
])
def test_errors_name_what_is_wrong(name: str, kind: str, message: str) -> None:
    with pytest.raises(BackendError, match=message) as err:
        answer_from_body(ODD_BODIES[name], {})
    assert err.value.kind == kind


# ---- logprob bytes read through the target's spellings ------------------------------------------


@pytest.mark.parametrize(("question", "tools"), QUESTIONS)
def test_answers_read_through_spellings_alike(server: TestServer, qwen3_tok: Tokenizer,
                                              question: str, tools: list[Any] | None) -> None:
    """The test server's answers read with the target's spellings: what the generic reading
    gives, every entry's bytes known by its token's spelling, the same IDs recovered."""
    raw = _fetch(server, question, tools, logprobs=True)
    spellings = TokenSpellings(qwen3_tok)
    answer, generic = answer_from_body(raw, {}, spellings), _generic(raw)
    assert answer.logprobs is not None
    sent = answer.logprobs.sent_bytes()
    assert sent is not None and sent.ids is not None
    n = answer.usage.completion_tokens
    assert logprob_ids(qwen3_tok, answer.logprobs, n) == logprob_ids(
        qwen3_tok, generic[1].logprobs, n)
    assert outcome(lambda: answer_from_body(raw, {}, spellings)) == generic


def _spelled_entry(rng: random.Random, tok: Tokenizer, tid: int, rid: int | None
                   ) -> tuple[bytes, str]:
    """One entry of token `tid` reporting ID `rid`, its bytes spelled one of the ways endpoints
    send them (or get wrong), and how."""
    data = tok.id_to_bytes(tid) or b""
    compact = orjson.dumps(list(data))
    how = rng.choices(["compact", "spaced", "other token", "not bytes", "absent", "null"],
                      [30, 2, 2, 1, 1, 1])[0]
    spelled = {"compact": compact, "spaced": compact.replace(b",", b", "),
               "other token": orjson.dumps(list(tok.id_to_bytes(tid + 1) or b"x")),
               "not bytes": b"[256]", "absent": b"", "null": b"null"}[how]
    token = f"token_id:{tid + 2}" if rng.random() < 0.05 else data.decode("utf-8", "replace")
    return (b'{"token":' + orjson.dumps(token) + (b',"bytes":' + spelled if spelled else b"")
            + b',"logprob":-0.5' + (b"" if rid is None else b',"id":%d' % rid) + b"}"), how


def test_random_entries_read_through_spellings_alike(qwen3_tok: Tokenizer) -> None:
    """Answers whose entries report their IDs, or none, or some, right or wrong, and spell
    their bytes compactly, spaced, as another token, not as bytes, or not at all: read with the
    target's spellings they give what the generic reading gives, and the same IDs; the bytes
    are known by spelling exactly when every entry is spelled compactly and the IDs, where
    reported, are the spelled tokens' (all reported or none)."""
    rng = random.Random(5)
    spellings = TokenSpellings(qwen3_tok)
    vocab = [t for t in range(0, 151_000, 7) if qwen3_tok.id_to_bytes(t)
             and qwen3_tok.id_to_bytes(t + 1)]
    seen: Counter[bool] = Counter()
    for _ in range(300):
        tids = [rng.choice(vocab) for _ in range(rng.randrange(1, 6))]
        report = rng.choice(["all", "none", "some", "wrong"])
        parts, hows, reported = [], [], []
        for i, tid in enumerate(tids):
            rid = {"all": tid, "none": None, "some": tid if i % 2 else None,
                   "wrong": tid + (i == 0)}[report]
            entry, how = _spelled_entry(rng, qwen3_tok, tid, rid)
            parts.append(entry)
            hows.append(how)
            reported.append(rid)
        raw = (b'{"choices":[{"finish_reason":"stop","message":{"content":"ab"},'
               b'"logprobs":{"content":[' + b",".join(parts) + b"]}}]}")
        generic = _generic(raw)
        assert outcome(lambda raw=raw: answer_from_body(raw, {}, spellings)) == generic, raw
        if generic[0] != "answer":
            continue
        reference = generic[1].logprobs
        read = [answer_from_body(raw, {}, spellings).logprobs for _ in range(2)]
        sent = read[0].sent_bytes()
        known = set(hows) == {"compact"} and reported in (tids, [None] * len(tids))
        assert (sent is not None and sent.ids == tids) == known, raw
        seen[known] += 1
        assert logprob_ids(qwen3_tok, read[0]) == logprob_ids(qwen3_tok, reference), raw
        assert last_logprob_id(qwen3_tok, read[1]) == last_logprob_id(qwen3_tok, reference), raw
    assert seen[True] > 50 and seen[False] > 50
