"""A local fake inference engine that speaks the real wire protocols, for tests and benchmarks.

It serves, on loopback:

- `POST /v1/chat/completions` and `POST /api/v1/chat/completions`: OpenAI chat completions as
  OpenRouter and vLLM answer them (JSON and SSE streaming, reasoning fields, structured tool
  calls, `usage` with cost, vLLM's `return_token_ids`, `logprobs` with `bytes` and `id`);
- `POST /generate`: SGLang's native endpoint (`input_ids` or `text` in, `output_ids` out);
- `GET /v1/models`, `GET /api/v1/models`, `GET /health`, and `GET /stats` (counters for tests);
- `GET /api/v1/generation?id=...`: OpenRouter's record of one chat answer (`total_cost`, token
  counts), known from the moment the answer starts, also when the client went away.

The answers come from a deterministic fake model that uses the real Qwen3 tokenizer: for a
prompt (and the request's `seed`) it writes some reasoning and some content, lays them out as a
Qwen3 model would emit them, and reports the tokenizer's encoding of that text as the native
output IDs. Layout "qwen3" (hybrid models, the model writes `<think>` itself)::

    "<think>\\n" + reasoning + "\\n</think>\\n\\n" + content + "<|im_end|>"

Layout "qwen3-thinking" (2507 Thinking models, `<think>\\n` ends the prompt)::

    reasoning + "\\n</think>\\n\\n" + content + "<|im_end|>"

A tool-call answer (the request has `tools`, or for `/generate` the prompt has `<tools>`, and
the last user message says "weather" or holds the directive `[[tool_call]]`) puts
``content + ("\\n" if content) + "<tool_call>\\n{...}\\n</tool_call>"`` where the content goes;
the call is always `get_weather` with `{"city": "Paris"}`.

How the chat endpoint shows reasoning and content (`ServerConfig`):

- default: reasoning is exactly the text between `<think>\\n` and `\\n</think>`, content the text
  after `</think>\\n\\n` (without `<|im_end|>`; for a tool call, without the `\\n<tool_call>...`
  block). Re-wrapping them in the layout above gives the native text back exactly.
- `raw_slices=True`: what vLLM's Qwen3 reasoning parser returns: reasoning is everything
  between `<think>` and `</think>` (so it starts and ends with a newline) and content is
  everything after `</think>` (it starts with `\\n\\n`).
- `strip_whitespace=True`: both `.strip()`ed, as some gateways do. This loses information for
  the answers whose own text begins or ends with whitespace (`edge_whitespace_rate`).
- `reasoning_field`, `tool_call_display` (structured `tool_calls`, or the raw tool block left
  in the content), `tools_supported=False` (tools ignored), `logprobs_scope` (all tokens,
  content tokens only, none): the endpoint behaviours `draftgen probe` tells apart.

Token IDs: `usage.completion_tokens` is always the number of IDs the engine reports (vLLM's
`token_ids`, SGLang's `output_ids`, the `logprobs` entries), except that with
`generate_omits_stop_id` the matched stop ID is counted but left out of `output_ids`. With
`noncanonical_rate`, one token of an answer is replaced by two vocabulary tokens with the same
bytes, as an engine can sample: the text is unchanged, the reported IDs differ from
re-encoding it. A `max_tokens` cut keeps
the first IDs (finish_reason "length", no `<|im_end|>`); a cut inside a UTF-8 character shows
U+FFFD at the end of the text.

Faults are injected either at random (`ServerConfig.fault_rates`, drawn per request from an RNG
seeded with `ServerConfig.seed`) or by a directive in the last user message (for `/generate`: in
the last user turn of the decoded prompt): `[[fault:KIND]]` fails every time, `[[fault:KIND*N]]`
fails the first N requests with that last user message. See `FAULT_KINDS` for the kinds and
their wire behaviour.

Use `TestServer` in-process (a context manager running the server on its own thread), or run
`python -m draftgen.testing.server --port 0 ...`, which prints `LISTENING http://HOST:PORT`.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import bisect
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import itertools
import json
import os
import random
import re
import signal
import sys
import threading
import time
import uuid
import zlib
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Generic, Literal, NamedTuple, TypeVar, cast, get_args

import orjson
from aiohttp import web
from tokenizers import Tokenizer as HFTokenizer

from draftgen.testing.assets import qwen3_tokenizer_dir
from draftgen.tokenize import OffLoopBatcher

Layout = Literal["qwen3", "qwen3-thinking"]
Mode = Literal["openai", "openrouter", "vllm"]
ReasoningField = Literal["reasoning", "reasoning_content", "both", "reasoning_details", "none"]
ToolCallDisplay = Literal["structured", "content"]
LogprobsScope = Literal["all", "content", "none"]
Json = dict[str, Any]
Span = tuple[int, int]
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")

TOOL_NAME = "get_weather"
TOOL_ARGUMENTS: Json = {"city": "Paris"}

_BILLED = frozenset({"408", "502", "error_body"})

_CALL_HEAD: Json = {"id": "call_0", "type": "function"}
BAD_TOOL_CALLS: dict[str, Any] = {
    "tool_name_null": [_CALL_HEAD | {"function": {"name": None, "arguments": "{}"}}],
    "tool_name_empty": [_CALL_HEAD | {"function": {"name": "", "arguments": "{}"}}],
    "tool_name_int": [_CALL_HEAD | {"function": {"name": 7, "arguments": "{}"}}],
    "tool_calls_dict": _CALL_HEAD | {"function": {"name": TOOL_NAME, "arguments": "{}"}},
    "tool_calls_string": f"{TOOL_NAME}(city='Paris')",
    "tool_calls_null_item": [None],
    "tool_call_no_function": [_CALL_HEAD],
}
"""Fault kinds answered with a malformed `tool_calls` (JSON: the message's; stream: one more
delta carrying it), the rest of the answer as usual."""


@dataclass(frozen=True)
class ErrorSpec:
    """An error answer in OpenRouter's shape: `{"error": {"code", "message", "metadata"}}`."""

    status: int
    code: int
    message: str
    metadata: Json = field(default_factory=dict)
    retry_after: str | None = None


ERRORS: dict[str, ErrorSpec] = {
    "429": ErrorSpec(429, 429, "Rate limit exceeded"),
    "429ra": ErrorSpec(429, 429, "Rate limit exceeded", retry_after="1"),
    "retry_after_hour": ErrorSpec(429, 429, "Rate limit exceeded", retry_after="3600"),
    "402budget": ErrorSpec(
        402,
        402,
        "In-flight request budget exhausted; retry when requests complete",
        {"reason": "in_flight_budget_exhausted"},
        retry_after="1",
    ),
    "402credits": ErrorSpec(402, 402, "Insufficient credits", {"reason": "insufficient_credits"}),
    "400": ErrorSpec(400, 400, "Invalid request"),
    "401": ErrorSpec(401, 401, "No auth credentials found"),
    "403": ErrorSpec(403, 403, "Input was flagged by moderation", {"reasons": ["harassment"]}),
    "408": ErrorSpec(408, 408, "Request timed out"),
    "500": ErrorSpec(500, 500, "Internal Server Error"),
    "502": ErrorSpec(502, 502, "Provider returned error"),
    "503": ErrorSpec(
        503, 503, "No available provider meets your routing requirements", retry_after="1"
    ),
    "error_body": ErrorSpec(200, 502, "Provider returned error"),
}
"""Fault kinds answered with an error body. `error_body` is HTTP 200 with the error in the
body; 408, 502 and `error_body` are billed (their body carries `usage`)."""

FAULT_KINDS: dict[str, str] = {
    **{kind: f"HTTP {spec.status}, error code {spec.code}" for kind, spec in ERRORS.items()},
    "sse_error": "stream: some deltas, then a chunk with finish_reason 'error' and an 'error' "
    "field, then [DONE]; non-streaming: as error_body",
    "reset": "the connection is closed without any response",
    "reset_stream": "the stream (or the JSON body) starts, then the connection is aborted",
    "no_done": "stream: ends cleanly after some deltas, without a final chunk or [DONE]; "
    "non-streaming: a normal answer",
    "malformed": "HTTP 200, Content-Type application/json, a truncated (invalid) JSON body",
    "empty": "HTTP 200, empty content, no reasoning, completion_tokens 0, finish_reason stop",
    "slow": "the server sleeps an hour (cancelled when the client disconnects)",
    **{kind: f"HTTP 200, an answer whose tool_calls is {json.dumps(value)}"
       for kind, value in BAD_TOOL_CALLS.items()},
    "huge_body": "HTTP 200, a valid answer of `huge_body_mb` MB (content 'x' repeated): a JSON "
    "body sent in 1 MB writes, or a stream of 64 KB content deltas",
    "gzip_bomb": "HTTP 200, Content-Encoding gzip: a small body that inflates to a valid JSON "
    "answer of `huge_body_mb` MB (also for a stream request)",
}
"""Every fault kind, with its wire behaviour."""

_DIRECTIVE = re.compile(r"\[\[fault:([A-Za-z0-9_]+)(?:\*(\d+))?\]\]")
_TOOL_DIRECTIVE = "[[tool_call]]"
_LABEL_CHARS = 200
"""`stats["per_prompt"]` keys are the last user message, cut to this length."""


# --------------------------------------------------------------------------------------------
# Configuration


class Prices(NamedTuple):
    """USD per million tokens."""

    prompt: float
    completion: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1e6


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    """0: pick a free port."""
    tokenizer_path: str | Path | None = None
    """A tokenizer.json (or a folder with one); None: the genuine Qwen3 tokenizer."""
    layout: Layout = "qwen3"
    model: str = "test/qwen3"
    mode: Mode = "openai"
    """"openrouter": SSE comment lines, usage chunk always sent, `return_token_ids` ignored,
    empty content of a tool-call answer is "" (else null). "openai" and "vllm" are the same:
    usage chunk only with `stream_options.include_usage`, vLLM's `return_token_ids` honoured.
    All modes send `provider`, `native_finish_reason` and (with prices) `usage.cost`."""
    api_key: str | None = None
    """None: no auth. Else every endpoint but /health and /stats wants `Bearer <key>`."""
    providers: list[str] = field(default_factory=lambda: ["TestProvider"])
    prices: Prices | tuple[float, float] | Mapping[str, float] | None = None
    """USD per million tokens (prompt, completion); when set, usage carries `cost`."""
    reported_cost: float | str | None = None
    """With `prices`: sent as every answer's `usage.cost` (and the generation record's
    `total_cost`) instead of the priced cost: 0 (as OpenRouter reports bring-your-own-key
    requests), a negative or absurd number, or a non-number such as "NaN"."""
    latency_s: float = 0.0
    """Sleep before answering each chat or generate request."""
    reasoning_tokens: tuple[int, int] = (30, 300)
    """Approximate range of the fake model's reasoning length."""
    content_tokens: tuple[int, int] = (20, 200)
    strip_whitespace: bool = False
    raw_slices: bool = False
    reasoning_field: ReasoningField = "reasoning"
    """Where the chat endpoint puts reasoning: `reasoning`, `reasoning_content`, both,
    `reasoning_details` (OpenRouter's list of `{"type": "reasoning.text", "text"}` entries), or
    nowhere ("none": hidden, though its tokens are still counted in `usage`)."""
    tool_call_display: ToolCallDisplay = "structured"
    """"structured": `message.tool_calls` (a tool parser on), the tool block left out of the
    content. "content": no tool parser: the raw `<tool_call>…</tool_call>` text stays in the
    content (exactly as sampled) and finish_reason is "stop"."""
    tools_supported: bool = True
    declines_tool_for: str = ""
    """Set: the model answers a tool request whose last user message holds this text without
    calling the tool (its own choice: the endpoint passes tools through)."""
    tool_parser_drops: bool = False
    """The endpoint's tool parser loses the calls: finish_reason "tool_calls", no
    `tool_calls`, the tool block gone from the content."""
    """False: the request's `tools` are ignored (a provider that drops them): no tool calls."""
    logprobs_scope: LogprobsScope = "all"
    """What `logprobs: true` covers: every output token ("all"), only the tokens after
    `</think>` ("content"), or nothing ("none": no logprobs field at all)."""
    quantizations: dict[str, str] = field(default_factory=dict)
    """Provider name -> quantization, listed by `GET /api/v1/models/MODEL/endpoints` as
    OpenRouter does (providers not named here are listed as "unknown")."""
    edge_whitespace_rate: float = 0.2
    """Share of answers whose reasoning or content begins or ends with whitespace."""
    noncanonical_rate: float = 0.0
    """Share of answers where one token is replaced by a non-canonical split of its bytes."""
    generate_omits_stop_id: bool = False
    generate_default_max_new_tokens: int | None = 128
    """SGLang's default when `sampling_params.max_new_tokens` is absent."""
    fault_rates: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    stream_tokens_per_chunk: int = 4
    stream_interval_s: float = 0.0
    """Sleep between groups of SSE chunks."""
    cache_size: int = 4096
    backlog: int = 4096
    context_length: int = 32768
    huge_body_mb: int = 64
    """The size of the `huge_body` and `gzip_bomb` answers."""
    echo_auth: bool = False
    """Error bodies (401 and every error fault) echo the request's Authorization header in
    their message, as careless servers do."""

    def __post_init__(self) -> None:
        if isinstance(self.prices, Mapping):
            self.prices = Prices(self.prices["prompt"], self.prices["completion"])
        elif self.prices is not None:
            self.prices = Prices(*self.prices)
        _check_choice("layout", self.layout, get_args(Layout))
        _check_choice("mode", self.mode, get_args(Mode))
        _check_choice("reasoning_field", self.reasoning_field, get_args(ReasoningField))
        _check_choice("tool_call_display", self.tool_call_display, get_args(ToolCallDisplay))
        _check_choice("logprobs_scope", self.logprobs_scope, get_args(LogprobsScope))
        unknown = sorted(set(self.fault_rates) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {sorted(FAULT_KINDS)}")
        if not self.providers:
            raise ValueError("providers must not be empty")
        for name in ("reasoning_tokens", "content_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be a range (low, high) with 1 <= low <= high")

    @property
    def price(self) -> Prices | None:
        return self.prices if isinstance(self.prices, Prices) else None

    @property
    def display(self) -> Literal["exact", "raw", "strip"]:
        if self.strip_whitespace:
            return "strip"
        return "raw" if self.raw_slices else "exact"

    def tokenizer_file(self) -> Path:
        path = Path(self.tokenizer_path or qwen3_tokenizer_dir())
        return path / "tokenizer.json" if path.is_dir() else path


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, not {value!r}")


# --------------------------------------------------------------------------------------------
# Vocabulary: token bytes both ways


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE table, inverted: vocabulary character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return {c: b for b, c in chars.items()}


@dataclass(frozen=True)
class Vocab:
    tokenizer: HFTokenizer
    token_bytes: dict[int, bytes]
    """Every ID's bytes: byte-level tokens through the byte decoder, added tokens as UTF-8."""
    added: frozenset[int]
    special: frozenset[int]
    by_bytes: dict[bytes, int]
    """Bytes -> ID for the byte-level (not added) tokens."""
    char_starts: dict[int, int]
    """Per ID: how many UTF-8 characters start in its bytes."""
    continues: frozenset[int]
    """The IDs whose bytes begin inside a UTF-8 character (a continuation byte)."""
    stop_ids: frozenset[int]
    """`<|im_end|>` and `<|endoftext|>` (the engine stops on them)."""
    think_end: int | None
    """The ID of `</think>`, when it is a single token."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def text(self, ids: Sequence[int], skip_special: bool = False) -> str:
        if skip_special:
            ids = [i for i in ids if i not in self.special]
        data = b"".join(map(self.token_bytes.__getitem__, ids))
        return data.decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=4)
def load_vocab(path: Path) -> Vocab:
    """Load a byte-level BPE tokenizer and its byte tables (cached per path: ~1 s)."""
    tokenizer = HFTokenizer.from_file(str(path))
    added = tokenizer.get_added_tokens_decoder()
    decoder = _byte_decoder()
    token_bytes = {
        i: added[i].content.encode() if i in added else bytes(decoder[c] for c in piece)
        for piece, i in tokenizer.get_vocab(with_added_tokens=True).items()
    }
    by_bytes = {b: i for i, b in token_bytes.items() if i not in added}
    special = frozenset(i for i, tok in added.items() if tok.special)
    char_starts = {i: sum(not _is_continuation(b) for b in data) for i, data in token_bytes.items()}
    continues = frozenset(i for i, data in token_bytes.items() if _is_continuation(data[0]))
    stops = (tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>"))
    return Vocab(
        tokenizer,
        token_bytes,
        frozenset(added),
        special,
        by_bytes,
        char_starts,
        continues,
        stop_ids=frozenset(i for i in stops if i is not None),
        think_end=tokenizer.token_to_id("</think>"),
    )


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


# --------------------------------------------------------------------------------------------
# The fake model's language

_WORD_LIST = """the a an of to and in is that it for on with as this be are by we can not at from
    model token answer draft value first then next check result number step case list because
    so if when which each two three time data method should would could think consider rule
    order prompt reason small large simple true false verify compute sum total count part"""
_RARE = ("café", "東京", "naïve", "Zürich", "日本語", "résumé", "€5", "π", "—", "✓", "🙂", "x²")
_INTEGER, _DECIMAL = "\0int", "\0dec"
_COMMON = tuple(_WORD_LIST.split())
_WORDS = (*_COMMON, *_RARE, _INTEGER, _DECIMAL)
_CUM_WEIGHTS = tuple(
    itertools.accumulate(
        (0.89 / len(_COMMON),) * len(_COMMON) + (0.04 / len(_RARE),) * len(_RARE) + (0.04, 0.03)
    )
)
_ENDINGS = (".", ".", ".", "?", "!", ":")
_SEPARATORS = (" ", " ", " ", " ", "\n", "\n\n", "\n- ")
_TOKENS_PER_SENTENCE = 13.5
"""Measured with the Qwen3 tokenizer (separator included)."""


def _word(rng: random.Random, word: str) -> str:
    if word == _INTEGER:
        return str(rng.randint(0, 9999))
    if word == _DECIMAL:
        return f"{rng.uniform(0, 100):.2f}"
    return word


def _sentence(rng: random.Random) -> str:
    picks = rng.choices(_WORDS, cum_weights=_CUM_WEIGHTS, k=rng.randint(4, 14))
    words = [_word(rng, w) for w in picks]
    words[0] = words[0].capitalize()
    if len(words) > 6 and rng.random() < 0.5:
        words[rng.randint(1, len(words) - 2)] += ","
    return " ".join(words) + rng.choice(_ENDINGS)


@functools.cache
def _sentence_pool(size: int = 4096) -> tuple[str, ...]:
    rng = random.Random(20250501)
    return tuple(_sentence(rng) for _ in range(size))


def fake_text(rng: random.Random, target_tokens: int) -> str:
    """Sentences of words, numbers, punctuation, some unicode and newlines; about
    `target_tokens` tokens long."""
    pool = _sentence_pool()
    count = max(1, round(target_tokens / _TOKENS_PER_SENTENCE))
    sentences = rng.choices(pool, k=count)
    separators = rng.choices(_SEPARATORS, k=count - 1)
    return "".join(itertools.chain.from_iterable(zip(sentences, [*separators, ""], strict=True)))


def _edge_whitespace(rng: random.Random, reasoning: str, content: str) -> tuple[str, str]:
    choice = rng.randrange(4)
    if choice == 0:
        return "\n" + reasoning, content
    if choice == 1:
        return reasoning + "\n", content
    if choice == 2:
        return reasoning, " " + content
    return reasoning, content + "\n"


def _tool_block() -> str:
    call = json.dumps({"name": TOOL_NAME, "arguments": TOOL_ARGUMENTS}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def native_text(layout: Layout, reasoning: str, content: str, tool_call: bool = False) -> str:
    """The answer as the model emits it, end-of-turn token included."""
    if tool_call:
        content = content + ("\n" if content else "") + _tool_block()
    head = "<think>\n" if layout == "qwen3" else ""
    return f"{head}{reasoning}\n</think>\n\n{content}<|im_end|>"


# --------------------------------------------------------------------------------------------
# Answers: the full sampled IDs, and the views a request sees (cut, split, displayed)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """JSON text, as OpenAI sends it."""

    def as_json(self) -> Json:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class Regions:
    """Where the parts of an answer's text are (character offsets)."""

    reasoning: Span
    content: Span
    closed: bool
    """The reasoning ended with `</think>`."""
    tool: Span | None = None


def split_regions(text: str, layout: Layout) -> Regions:
    start = len("<think>") if layout == "qwen3" and text.startswith("<think>") else 0
    end_tag = text.find("</think>", start)
    if end_tag < 0:
        return Regions((start, len(text)), (len(text), len(text)), closed=False)
    rest = end_tag + len("</think>")
    end = len(text) - len("<|im_end|>") if text.endswith("<|im_end|>") else len(text)
    tool_start = text.find("<tool_call>", rest, end)
    tool_end = text.find("</tool_call>", max(tool_start, rest), end)
    if tool_start < 0 or tool_end < 0:
        return Regions((start, end_tag), (rest, end), closed=True)
    tool = (tool_start, tool_end + len("</tool_call>"))
    return Regions((start, end_tag), (rest, tool_start), closed=True, tool=tool)


def _strip_span(text: str, span: Span) -> Span:
    start, end = span
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def display_spans(
    text: str, regions: Regions, layout: Layout, display: Literal["exact", "raw", "strip"]
) -> tuple[Span, Span]:
    """The reasoning and content the chat endpoint shows (see the module docstring)."""
    if display == "raw":
        return regions.reasoning, regions.content
    if display == "strip":
        return _strip_span(text, regions.reasoning), _strip_span(text, regions.content)
    (rs, re_), (cs, ce) = regions.reasoning, regions.content
    if layout == "qwen3" and rs < re_ and text[rs] == "\n":
        rs += 1
    if regions.closed and re_ > rs and text[re_ - 1] == "\n":
        re_ -= 1
    if text.startswith("\n\n", cs) and cs + 2 <= ce:
        cs += 2
    if regions.tool is not None and ce > cs and text[ce - 1] == "\n":
        ce -= 1
    return (rs, re_), (cs, ce)


def char_ends(vocab: Vocab, ids: Sequence[int]) -> list[int]:
    """The character offset in `vocab.text(ids)` where each token's text ends. A character
    split across tokens belongs to the token that completes it, as engines stream it."""
    ends = list(itertools.accumulate(map(vocab.char_starts.__getitem__, ids)))
    held_back = map(vocab.continues.__contains__, ids[1:])
    for n in itertools.compress(range(len(ends)), held_back):
        ends[n] -= 1
    return ends


def _logprob(token_id: int, position: int) -> float:
    return -((token_id * 2654435761 + position * 40503) % 4000) / 1000.0


@dataclass(frozen=True)
class StreamPiece:
    """One planned SSE delta. Its chunk carries the token IDs from where the previous shown
    delta stopped up to `end` (IDs of hidden text, such as `<think>`, ride along)."""

    kind: Literal["role", "reasoning", "content", "tool_head", "tool_args"]
    text: str
    end: int


class Completion:
    """One answer as a request sees it: the sampled IDs cut to the request's limits, their
    text, and what the chat endpoint shows."""

    def __init__(
        self,
        vocab: Vocab,
        ids: list[int],
        finish: Literal["stop", "length"],
        layout: Layout,
        display: Literal["exact", "raw", "strip"],
        call_id: str,
        noncanonical: bool = False,
        tool_display: ToolCallDisplay = "structured",
    ) -> None:
        self.vocab = vocab
        self.ids = ids
        self.noncanonical = noncanonical
        """One token of the sampled answer was split non-canonically (before any cut)."""
        self.text = vocab.text(ids)
        self.matched_stop = ids[-1] if finish == "stop" and ids else None
        regions = split_regions(self.text, layout)
        self.regions = regions
        self.reasoning_span, self.content_span = display_spans(self.text, regions, layout, display)
        self.tool_call = _parse_tool_call(self.text, regions.tool, call_id)
        if tool_display == "content" and regions.tool is not None:
            # No tool parser: the tool block is part of the content, as sampled.
            self.content_span = (self.content_span[0], regions.tool[1])
            self.tool_call = None
        self.finish_reason = "tool_calls" if self.tool_call and finish == "stop" else finish
        self.reasoning_tokens = self._count_reasoning_tokens()
        self._memo: dict[Hashable, Any] = {}

    def memo(self, key: Hashable, build: Callable[[], T]) -> T:
        """`build()`, computed once per key for this answer (answers are cached, so what a
        request derives from one can be too)."""
        if key not in self._memo:
            self._memo[key] = build()
        return cast(T, self._memo[key])

    @functools.cached_property
    def char_ends(self) -> list[int]:
        return char_ends(self.vocab, self.ids)

    def _tokens_through(self, char_offset: int) -> int:
        """How many tokens it takes to cover the text up to `char_offset`."""
        return bisect.bisect_left(self.char_ends, char_offset) + 1

    def _count_reasoning_tokens(self) -> int:
        """The tokens up to and including `</think>` (all of them when it is missing)."""
        if not self.regions.closed:
            return len(self.ids)
        think_end = self.vocab.think_end
        if think_end is not None and think_end in self.ids:
            return self.ids.index(think_end) + 1
        return self._tokens_through(self.regions.reasoning[1] + len("</think>"))

    @property
    def reasoning(self) -> str | None:
        start, end = self.reasoning_span
        return self.text[start:end] if self.ids else None

    @property
    def content(self) -> str:
        start, end = self.content_span
        return self.text[start:end]

    def logprob_entries(self, start: int, end: int) -> Json:
        """The entries of tokens `start` to `end` as one JSON array, spliced into a body as it
        is written. The entries' JSON text is kept with the cached answer, joined, with where
        each one starts: ~25 kB per answer, where the entries as dicts took ~170 kB (a
        benchmark's cache of 21,000 answers grew the server past 12 GB) and one `orjson.dumps`
        per entry ~4 kB each (orjson does not shrink its output buffer)."""
        joined, starts = self.memo("logprobs", self._joined_entries)
        return orjson.Fragment(b"[" + joined[starts[start] : starts[end] - 1] + b"]")

    def _joined_entries(self) -> tuple[bytes, array.array[int]]:
        texts = [orjson.dumps(self.logprob_entry(n)) for n in range(len(self.ids))]
        starts = array.array("q", itertools.accumulate((len(t) + 1 for t in texts), initial=0))
        return b",".join(texts), starts

    def logprob_entry(self, position: int) -> Json:
        token_id = self.ids[position]
        data = self.vocab.token_bytes[token_id]
        return {
            "token": data.decode("utf-8", errors="replace"),
            "logprob": _logprob(token_id, position),
            "bytes": list(data),
            "id": token_id,
            "top_logprobs": [],
        }

    def stream_plan(self, tokens_per_chunk: int) -> list[StreamPiece]:
        return self.memo(("plan", tokens_per_chunk), lambda: self._make_plan(tokens_per_chunk))

    def _make_plan(self, group: int) -> list[StreamPiece]:
        """Deltas of about `group` tokens: each group of tokens gives the part of its text
        that falls in the shown reasoning, then the part in the shown content."""
        counts = [*range(group, len(self.ids), group), len(self.ids)]
        bounds = [self.char_ends[count - 1] for count in counts] if self.ids else []
        plan = [StreamPiece("role", "", 0)]
        spans: tuple[tuple[Literal["reasoning", "content"], Span], ...] = (
            ("reasoning", self.reasoning_span),
            ("content", self.content_span),
        )
        for kind, (start, stop) in spans:
            if start >= stop:
                continue
            first = bisect.bisect_right(bounds, start)
            last = bisect.bisect_left(bounds, stop)
            cuts = itertools.pairwise([start, *bounds[first:last], stop])
            for count, (a, b) in zip(counts[first : last + 1], cuts, strict=True):
                if a < b:
                    plan.append(StreamPiece(kind, self.text[a:b], count))
        if self.tool_call is not None:
            plan += self._tool_pieces()
        return plan

    def _tool_pieces(self) -> list[StreamPiece]:
        assert self.tool_call is not None and self.regions.tool is not None
        tool_end = self._tokens_through(self.regions.tool[1])
        arguments = self.tool_call.arguments
        cut = len(arguments) // 2
        return [
            StreamPiece("tool_head", "", tool_end),
            StreamPiece("tool_args", arguments[:cut], tool_end),
            StreamPiece("tool_args", arguments[cut:], tool_end),
        ]


def _parse_tool_call(text: str, span: Span | None, call_id: str) -> ToolCall | None:
    if span is None:
        return None
    inner = text[span[0] + len("<tool_call>") : span[1] - len("</tool_call>")]
    try:
        call = json.loads(inner)
        name, arguments = call["name"], call["arguments"]
    except (ValueError, KeyError, TypeError):
        return None
    return ToolCall(call_id, str(name), json.dumps(arguments, ensure_ascii=False))


def empty_completion(vocab: Vocab, config: ServerConfig) -> Completion:
    return Completion(vocab, [], "stop", config.layout, config.display, "call_empty")


class LRU(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)
        return value


def _digest(*parts: object) -> bytes:
    return hashlib.blake2b(
        orjson.dumps(parts, option=orjson.OPT_SORT_KEYS), digest_size=16
    ).digest()


@dataclass(frozen=True)
class AnswerKey:
    seed: bytes
    """Digest of the prompt, the request's seed and the server's seed."""
    tool_call: bool


class FakeModel:
    """Writes the answers. Tokenization runs off the event loop, in batches; answers and
    prompt encodings are cached (LRU)."""

    def __init__(self, config: ServerConfig, vocab: Vocab) -> None:
        self.config = config
        self.vocab = vocab
        self._encode = OffLoopBatcher(vocab.encode_batch, max_batch=128)
        self._encodings: LRU[bytes, list[int]] = LRU(config.cache_size)
        self._answers: LRU[AnswerKey, tuple[list[int], bool]] = LRU(config.cache_size)
        self._completions: LRU[tuple[AnswerKey, int | None, frozenset[int]], Completion] = LRU(
            config.cache_size
        )

    async def encode(self, text: str) -> list[int]:
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        ids = self._encodings.get(key)
        if ids is None:
            ids = self._encodings.put(key, await self._encode(text))
        return ids

    async def completion(
        self, key: AnswerKey, max_tokens: int | None, stop_ids: frozenset[int]
    ) -> Completion:
        cache_key = (key, max_tokens, stop_ids)
        done = self._completions.get(cache_key)
        if done is not None:
            return done
        sampled = self._answers.get(key)
        if sampled is None:
            sampled = self._answers.put(key, await self._sample(key))
        ids, noncanonical = sampled
        cut, finish = _cut(ids, max_tokens, stop_ids)
        call_id = "call_" + key.seed.hex()[:24]
        config = self.config
        completion = Completion(
            self.vocab, cut, finish, config.layout, config.display, call_id, noncanonical,
            config.tool_call_display,
        )
        return self._completions.put(cache_key, completion)

    async def _sample(self, key: AnswerKey) -> tuple[list[int], bool]:
        """The answer's sampled IDs, and whether one token was split non-canonically."""
        rng = random.Random(key.seed)
        text = self._write(rng, key.tool_call)
        ids = list(await self._encode(text))
        split = rng.random() < self.config.noncanonical_rate and _split_one_token(
            self.vocab, ids, rng
        )
        return ids, split

    def _write(self, rng: random.Random, tool_call: bool) -> str:
        config = self.config
        reasoning = fake_text(rng, rng.randint(*config.reasoning_tokens))
        if tool_call:
            content = _sentence(rng) if rng.random() < 0.5 else ""
        else:
            content = fake_text(rng, rng.randint(*config.content_tokens))
        if rng.random() < config.edge_whitespace_rate:
            reasoning, content = _edge_whitespace(rng, reasoning, content)
        return native_text(config.layout, reasoning, content, tool_call)


def _cut(
    ids: list[int], max_tokens: int | None, stop_ids: frozenset[int]
) -> tuple[list[int], Literal["stop", "length"]]:
    stop_at = min((ids.index(i) for i in stop_ids if i in ids), default=len(ids) - 1)
    ids = ids[: stop_at + 1]
    if max_tokens is not None and len(ids) > max_tokens:
        return ids[:max_tokens], "length"
    return ids, "stop"


def _split_one_token(vocab: Vocab, ids: list[int], rng: random.Random) -> bool:
    """Replace one token by two vocabulary tokens with the same bytes (a non-canonical split,
    as an engine can sample). Returns False when no token of `ids` can be split."""
    if not ids:
        return False
    offset = rng.randrange(len(ids))
    for n in range(len(ids)):
        position = (offset + n) % len(ids)
        pair = _two_token_split(vocab, ids[position])
        if pair is not None:
            ids[position : position + 1] = pair
            return True
    return False


def _two_token_split(vocab: Vocab, token_id: int) -> list[int] | None:
    if token_id in vocab.added:
        return None
    data = vocab.token_bytes[token_id]
    for cut in range(len(data) - 1, 0, -1):
        head, tail = vocab.by_bytes.get(data[:cut]), vocab.by_bytes.get(data[cut:])
        if head is not None and tail is not None:
            return [head, tail]
    return None


# --------------------------------------------------------------------------------------------
# Requests


class BadRequest(Exception):
    """The request is invalid: answered with HTTP 400 in OpenRouter's error shape."""


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    text = "" if content is None else str(content)
    for call in message.get("tool_calls") or ():
        text += (
            "\n<tool_call>\n" + orjson.dumps(call.get("function", call)).decode() + "\n</tool_call>"
        )
    return text


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _message_text(message)
    return ""


def last_user_turn(prompt_text: str) -> str:
    """The last user turn of a ChatML prompt (the whole text when it has none)."""
    start = prompt_text.rfind("<|im_start|>user\n")
    if start < 0:
        return prompt_text
    start += len("<|im_start|>user\n")
    end = prompt_text.find("<|im_end|>", start)
    return prompt_text[start : end if end >= 0 else len(prompt_text)]


def render_prompt(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], layout: Layout
) -> str:
    """A ChatML rendering close to Qwen3's template (used only to count prompt tokens)."""
    turns = [(str(m.get("role", "user")), _message_text(m)) for m in messages]
    if tools:
        system = turns.pop(0)[1] + "\n\n" if turns and turns[0][0] == "system" else ""
        listing = "\n".join(orjson.dumps(t).decode() for t in tools)
        turns.insert(0, ("system", f"{system}# Tools\n\n<tools>\n{listing}\n</tools>"))
    text = "".join(f"<|im_start|>{role}\n{body}<|im_end|>\n" for role, body in turns)
    return text + "<|im_start|>assistant\n" + ("<think>\n" if layout == "qwen3-thinking" else "")


def _optional_int(body: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"{name} must be a non-negative integer")
        return value
    return None


@dataclass(frozen=True)
class ChatRequest:
    messages: list[Json]
    tools: list[Any]
    stream: bool
    include_usage: bool
    max_tokens: int | None
    seed: Any
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    show_reasoning: bool

    @classmethod
    def parse(cls, body: Json) -> ChatRequest:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        if not all(isinstance(m, dict) for m in messages):
            raise BadRequest("each message must be an object")
        reasoning = body.get("reasoning")
        excluded = isinstance(reasoning, dict) and bool(reasoning.get("exclude"))
        return cls(
            messages=messages,
            tools=list(body.get("tools") or ()),
            stream=bool(body.get("stream")),
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            max_tokens=_optional_int(body, "max_completion_tokens", "max_tokens"),
            seed=body.get("seed"),
            logprobs=bool(body.get("logprobs")),
            top_logprobs=_optional_int(body, "top_logprobs") or 0,
            return_token_ids=bool(body.get("return_token_ids")),
            show_reasoning=not excluded and body.get("include_reasoning") is not False,
        )

    def wants_tool_call(self, label: str, tools_supported: bool = True) -> bool:
        return tools_supported and bool(self.tools) and _asks_for_tool_call(label)


def _declines(config: ServerConfig, label: str) -> bool:
    return bool(config.declines_tool_for) and config.declines_tool_for in label


def _asks_for_tool_call(label: str) -> bool:
    return "weather" in label.lower() or _TOOL_DIRECTIVE in label


@dataclass(frozen=True)
class GenerateParams:
    """The `sampling_params` of SGLang's /generate that the fake model honours."""

    max_new_tokens: int | None
    stop_ids: frozenset[int]
    """`stop_token_ids` plus the model's own stop tokens."""
    seed: Any
    skip_special_tokens: bool

    @classmethod
    def parse(cls, params: Any, model_stop_ids: frozenset[int]) -> GenerateParams:
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        stop_ids = params.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or not all(isinstance(i, int) for i in stop_ids):
            raise BadRequest("stop_token_ids must be a list of token IDs")
        return cls(
            max_new_tokens=_optional_int(params, "max_new_tokens"),
            stop_ids=model_stop_ids.union(stop_ids),
            seed=params.get("seed", params.get("sampling_seed")),
            skip_special_tokens=params.get("skip_special_tokens", True) is not False,
        )


# --------------------------------------------------------------------------------------------
# Faults and counters


class FaultPicker:
    """Chooses the fault for a request: a directive in the prompt first, else `fault_rates`."""

    def __init__(self, rates: Mapping[str, float], seed: int) -> None:
        self._rates = [(kind, p) for kind, p in rates.items() if p > 0]
        self._rng = random.Random(seed)
        self._directive_counts: Counter[tuple[str, str]] = Counter()

    def pick(self, label: str) -> str | None:
        match = _DIRECTIVE.search(label)
        if match:
            kind, times = match.group(1), match.group(2)
            if kind not in FAULT_KINDS:
                raise BadRequest(f"unknown fault kind {kind!r}; known: {sorted(FAULT_KINDS)}")
            if times is None:
                return kind
            counted = (label, kind)
            if self._directive_counts[counted] < int(times):
                self._directive_counts[counted] += 1
                return kind
        return self._random()

    def _random(self) -> str | None:
        if not self._rates:
            return None
        draw = self._rng.random()
        for kind, p in self._rates:
            if draw < p:
                return kind
            draw -= p
        return None


class ServerStats(Mapping[str, Any]):
    """Counters, readable from any thread as a mapping (each read takes a snapshot):
    `requests` (by endpoint), `responses` (by HTTP status, "reset" or "cancelled"), `faults`
    (by kind, plus "noncanonical"), `in_flight` and `max_in_flight` (chat and generate calls),
    `per_prompt` (by the last user message text), and `bodies` (the last received request
    bodies; headers are never stored)."""

    def __init__(self, max_bodies: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._max_bodies = max_bodies
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._requests: Counter[str] = Counter()
            self._responses: Counter[str] = Counter()
            self._faults: Counter[str] = Counter()
            self._per_prompt: Counter[str] = Counter()
            self._bodies: deque[Any] = deque(maxlen=self._max_bodies)
            self._in_flight = 0
            self._max_in_flight = 0

    def begin(self, endpoint: str, counts_in_flight: bool) -> None:
        with self._lock:
            self._requests[endpoint] += 1
            if counts_in_flight:
                self._in_flight += 1
                self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def end(self, outcome: str, counts_in_flight: bool) -> None:
        with self._lock:
            self._responses[outcome] += 1
            if counts_in_flight:
                self._in_flight -= 1

    def count(self, counter: Literal["faults", "per_prompt"], key: str) -> None:
        with self._lock:
            (self._faults if counter == "faults" else self._per_prompt)[key] += 1

    def received(self, body: Any) -> None:
        with self._lock:
            self._bodies.append(body)

    def snapshot(self, bodies: bool = True) -> Json:
        with self._lock:
            snap: Json = {
                "requests": dict(self._requests),
                "responses": dict(self._responses),
                "faults": dict(self._faults),
                "in_flight": self._in_flight,
                "max_in_flight": self._max_in_flight,
                "per_prompt": dict(self._per_prompt),
            }
            if bodies:
                snap["bodies"] = list(self._bodies)
            return snap

    @property
    def bodies(self) -> list[Any]:
        with self._lock:
            return list(self._bodies)

    def __getitem__(self, key: str) -> Any:
        return self.snapshot(bodies=key == "bodies")[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.snapshot(bodies=True))

    def __len__(self) -> int:
        return len(self.snapshot(bodies=True))


# --------------------------------------------------------------------------------------------
# Wire shapes


@dataclass(frozen=True)
class ReplyContext:
    gen_id: str
    created: int
    provider: str
    started: float
    prompt_ids: list[int]


def usage_json(
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int,
    prices: Prices | None,
    reported_cost: float | str | None = None,
) -> Json:
    usage: Json = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    if prices is not None:
        priced = prices.cost(prompt_tokens, completion_tokens)
        usage["cost"] = priced if reported_cost is None else reported_cost
    return usage


def error_json(kind: str, ctx: ReplyContext, label: str, config: ServerConfig,
               auth: str = "") -> Json:
    """`auth`: the request's Authorization header, echoed when `config.echo_auth`."""
    spec = ERRORS[kind]
    metadata = dict(spec.metadata)
    if spec.code in (403, 408, 502):
        metadata["provider_name"] = ctx.provider
    if spec.code == 403:
        metadata |= {"flagged_input": label[:100], "model_slug": config.model}
    body: Json = {"error": {"code": spec.code, "message": _echoed(spec.message, auth, config),
                            "metadata": metadata}}
    if kind in _BILLED:
        body["usage"] = usage_json(len(ctx.prompt_ids), 0, 0, config.price, config.reported_cost)
    return body


def _echoed(message: str, auth: str, config: ServerConfig) -> str:
    return f"{message} (request headers: Authorization: {auth})" if config.echo_auth else message


def _reasoning_value(name: str, text: str | None) -> Any:
    """A reasoning field's value: the text, or for `reasoning_details` a one-entry list."""
    if name != "reasoning_details" or text is None:
        return text
    return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]


def _reasoning_fields(config: ServerConfig, shown: bool) -> tuple[str, ...]:
    if not shown or config.reasoning_field == "none":
        return ()
    if config.reasoning_field == "both":
        return ("reasoning", "reasoning_content")
    return (config.reasoning_field,)


def _delta(
    piece: StreamPiece, call: ToolCall | None, reasoning_fields: tuple[str, ...]
) -> Json | None:
    if piece.kind == "role":
        return {"role": "assistant", "content": ""}
    if piece.kind == "reasoning":
        return {name: _reasoning_value(name, piece.text) for name in reasoning_fields} or None
    if piece.kind == "content":
        return {"content": piece.text}
    assert call is not None
    if piece.kind == "tool_head":
        head = {"index": 0, "id": call.id, "type": "function"}
        return {"tool_calls": [head | {"function": {"name": call.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": 0, "function": {"arguments": piece.text}}]}


def _sse(obj: Json) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_SSE_DONE = b"data: [DONE]\n\n"
_SSE_COMMENT = b": OPENROUTER PROCESSING\n\n"


@dataclass(frozen=True)
class _ChatReply:
    """Builds the chat endpoint's JSON answer and SSE chunks for one request."""

    config: ServerConfig
    req: ChatRequest
    ctx: ReplyContext
    comp: Completion
    fault: str | None = None

    @property
    def token_ids(self) -> bool:
        return self.req.return_token_ids and self.config.mode != "openrouter"

    def head(self, obj: str) -> Json:
        ctx = self.ctx
        return {
            "id": ctx.gen_id,
            "object": obj,
            "created": ctx.created,
            "model": self.config.model,
            "provider": ctx.provider,
        }

    def usage(self) -> Json:
        comp = self.comp
        return usage_json(
            len(self.ctx.prompt_ids),
            len(comp.ids),
            comp.reasoning_tokens,
            self.config.price,
            self.config.reported_cost,
        )

    @property
    def sends_logprobs(self) -> bool:
        return self.req.logprobs and self.config.logprobs_scope != "none"

    def logprobs(self, start: int, end: int) -> Json:
        if self.config.logprobs_scope == "content":
            start = max(start, self.comp.reasoning_tokens)
        if self.req.top_logprobs > 0:
            entries = (self.comp.logprob_entry(n) for n in range(start, end))
            return {"content": [e | {"top_logprobs": [_top(e)]} for e in entries]}
        return {"content": self.comp.logprob_entries(start, end)}

    def message(self) -> Json:
        comp = self.comp
        content: str | None = comp.content
        if comp.tool_call is not None and not content:
            content = "" if self.config.mode == "openrouter" else None
        message: Json = {"role": "assistant", "content": content}
        for name in _reasoning_fields(self.config, self.req.show_reasoning):
            message[name] = _reasoning_value(name, comp.reasoning)
        if comp.tool_call is not None and not self.config.tool_parser_drops:
            message["tool_calls"] = [comp.tool_call.as_json()]
        if self.fault in BAD_TOOL_CALLS:
            message["tool_calls"] = BAD_TOOL_CALLS[self.fault]
        if self.fault in _HUGE:
            message["content"] = _HUGE_MARK.decode()  # `_huge_pieces` puts the megabytes there
        return message

    def json(self) -> Json:
        finish = self.comp.finish_reason
        choice: Json = {
            "index": 0,
            "message": self.message(),
            "finish_reason": finish,
            "native_finish_reason": finish,
        }
        if self.sends_logprobs:
            choice["logprobs"] = self.logprobs(0, len(self.comp.ids))
        body = self.head("chat.completion") | {"choices": [choice], "usage": self.usage()}
        if self.token_ids:
            choice["token_ids"] = self.comp.ids
            body["prompt_token_ids"] = self.ctx.prompt_ids
        return body

    def choice(self, delta: Json, start: int, end: int, finish: str | None = None) -> Json:
        """A chunk's choice: the delta and the token IDs [start, end) it carries."""
        choice: Json = {"index": 0, "delta": delta, "finish_reason": finish}
        if finish is not None:
            choice["native_finish_reason"] = finish
        if self.token_ids:
            choice["token_ids"] = self.comp.ids[start:end]
        if self.sends_logprobs and end > start:
            choice["logprobs"] = self.logprobs(start, end)
        return choice

    def chunk(self, choices: list[Json], **extra: Any) -> bytes:
        return _sse(self.head("chat.completion.chunk") | {"choices": choices} | extra)

    def delta_events(self) -> tuple[list[bytes], int]:
        """The role chunk, then reasoning, content and tool-call deltas (no final chunk), and
        how many token IDs they carry."""
        fields = _reasoning_fields(self.config, self.req.show_reasoning)
        shape = ("deltas", fields, self.token_ids, self.req.logprobs, self.req.top_logprobs > 0)
        choices, carried = self.comp.memo(shape, lambda: self._delta_choices(fields))
        # Only the head (id, created, provider) differs between requests for one answer.
        prefix = self._prefix()
        events = [prefix + choice + b"]}\n\n" for choice in choices]
        if self.token_ids and events:
            prefix = self._prefix(prompt_token_ids=self.ctx.prompt_ids)
            events[0] = prefix + choices[0] + b"]}\n\n"
        return events, carried

    def _prefix(self, **extra: Any) -> bytes:
        """`data: {"id": ..., "choices":[` for a chunk of this request."""
        head = orjson.dumps(self.head("chat.completion.chunk") | extra)
        return b"data: " + head[:-1] + b',"choices":['

    def _delta_choices(self, fields: tuple[str, ...]) -> tuple[list[bytes], int]:
        choices: list[bytes] = []
        carried = 0
        for piece in self.comp.stream_plan(self.config.stream_tokens_per_chunk):
            if piece.kind.startswith("tool") and self.config.tool_parser_drops:
                continue
            delta = _delta(piece, self.comp.tool_call, fields)
            if delta is not None:
                choices.append(orjson.dumps(self.choice(delta, carried, piece.end)))
                carried = piece.end
        return choices, carried

    def closing_events(self, carried: int) -> list[bytes]:
        """The final chunk (finish_reason, the IDs not carried yet), the usage chunk when
        due, and [DONE]."""
        comp = self.comp
        events = [self.chunk([self.choice({}, carried, len(comp.ids), comp.finish_reason)])]
        if self.req.include_usage or self.config.mode == "openrouter":
            events.append(self.chunk([], usage=self.usage()))
        return [*events, _SSE_DONE]

    def fault_events(self, carried: int) -> list[bytes]:
        """The events a fault adds after the deltas: a malformed tool call, or `huge_body`'s
        64 KB content deltas (one event, repeated)."""
        if self.fault in BAD_TOOL_CALLS:
            delta = {"tool_calls": BAD_TOOL_CALLS[self.fault]}
            return [self.chunk([self.choice(delta, carried, carried)])]
        if self.fault == "huge_body":
            filler = self.chunk([self.choice({"content": "x" * (64 << 10)}, carried, carried)])
            return [filler] * (self.config.huge_body_mb * 16)
        return []

    def error_event(self, auth: str = "") -> bytes:
        """`auth`: the request's Authorization header, echoed when `config.echo_auth`."""
        error = {"code": 502, "message": _echoed("Provider returned error", auth, self.config)}
        error["metadata"] = {"provider_name": self.ctx.provider}
        return self.chunk([self.choice({"content": ""}, 0, 0, "error")], error=error)


def _top(entry: Json) -> Json:
    return {"token": entry["token"], "logprob": entry["logprob"], "bytes": entry["bytes"]}


def _json_response(
    body: Json, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _models_json(config: ServerConfig) -> Json:
    prices = config.price or Prices(0, 0)

    def per_token(usd_per_million: float) -> str:
        return format(Decimal(str(usd_per_million)) / Decimal(1_000_000), "f")

    pricing = {"prompt": per_token(prices.prompt), "completion": per_token(prices.completion)}
    model = {
        "id": config.model,
        "name": config.model,
        "object": "model",
        "created": 0,
        "owned_by": "draftgen-test",
        "pricing": pricing,
        "context_length": config.context_length,
    }
    return {"object": "list", "data": [model]}


def _endpoints_json(config: ServerConfig) -> Json:
    """OpenRouter's `GET /api/v1/models/MODEL/endpoints`: one entry per provider."""
    endpoints = [
        {
            "name": f"{provider} | {config.model}",
            "provider_name": provider,
            "quantization": config.quantizations.get(provider, "unknown"),
            "context_length": config.context_length,
            "pricing": _models_json(config)["data"][0]["pricing"],
        }
        for provider in config.providers
    ]
    return {"data": {"id": config.model, "name": config.model, "endpoints": endpoints}}


# --------------------------------------------------------------------------------------------
# The engine: aiohttp handlers

_ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/api/v1/chat/completions": "chat",
    "/generate": "generate",
    "/v1/models": "models",
    "/api/v1/models": "models",
    "/health": "health",
    "/stats": "stats",
    "/api/v1/generation": "generation",
}
_MODEL_CALLS = frozenset({"chat", "generate"})
GENERATIONS_KEPT = 100_000
_CUT_STREAM = frozenset({"sse_error", "no_done", "reset_stream"})
_HUGE = frozenset({"huge_body", "gzip_bomb"})
"""Faults that end a stream after about half of its deltas."""
_OPEN_PATHS = frozenset({"/health", "/stats"})


class FakeEngine:
    """The request handlers. `create_app` wires them into an aiohttp application."""

    def __init__(self, config: ServerConfig, stats: ServerStats | None = None) -> None:
        self.config = config
        self.stats = stats if stats is not None else ServerStats()
        self.vocab = load_vocab(config.tokenizer_file())
        self.model = FakeModel(config, self.vocab)
        self.faults = FaultPicker(config.fault_rates, config.seed)
        self.generations: dict[str, Json] = {}
        """The latest chat answers' `GET /api/v1/generation` records, by generation ID
        (OpenRouter mode; at most GENERATIONS_KEPT)."""

    # ---- middleware

    @web.middleware
    async def observe(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        endpoint = _ENDPOINTS.get(request.path, "other")
        in_flight = endpoint in _MODEL_CALLS
        self.stats.begin(endpoint, in_flight)
        outcome = "cancelled"
        try:
            response: web.StreamResponse = await handler(request)
            outcome = str(response.status)
        except web.HTTPException as e:  # 404, 405 from the router
            outcome = str(e.status)
            raise
        except _Dropped:
            outcome = "reset"
            raise asyncio.CancelledError from None
        finally:
            self.stats.end(outcome, in_flight)
        if not response.prepared:
            response.headers.setdefault("X-Generation-Id", _generation_id())
        return response

    @web.middleware
    async def authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        key = self.config.api_key
        if key is None or request.path in _OPEN_PATHS:
            return await handler(request)
        given = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, f"Bearer {key}".encode()):
            return await handler(request)
        message = _echoed("No auth credentials found", given.decode(), self.config)
        return _json_response({"error": {"code": 401, "message": message}}, status=401)

    # ---- simple endpoints

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def models(self, request: web.Request) -> web.Response:
        return _json_response(_models_json(self.config))

    async def endpoints(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.config.model:
            return _json_response({"error": {"code": 404, "message": "Model not found"}}, 404)
        return _json_response(_endpoints_json(self.config))

    def _keep_generation(self, reply: _ChatReply) -> None:
        self.generations[reply.ctx.gen_id] = _generation_json(reply)
        if len(self.generations) > GENERATIONS_KEPT:  # a benchmark's millions: oldest first
            del self.generations[next(iter(self.generations))]

    async def generation(self, request: web.Request) -> web.Response:
        record = self.generations.get(request.query.get("id", ""))
        if record is None:
            return _json_response({"error": {"code": 404, "message": "Generation not found"}},
                                  404)
        return _json_response({"data": record})

    async def stats_endpoint(self, request: web.Request) -> web.Response:
        with_bodies = request.query.get("bodies", "1") != "0"
        return _json_response(self.stats.snapshot(bodies=with_bodies))

    # ---- model calls

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            req = ChatRequest.parse(body)
            label = last_user_text(req.messages)
            fault = await self._before_answer(request, label)
        except BadRequest as e:
            return _bad_request(str(e))
        prompt = render_prompt(req.messages, req.tools, self.config.layout)
        ctx = self._context(label, await self.model.encode(prompt))
        early = self._fault_response(fault, req.stream, ctx, label, request)
        if early is not None:
            return early
        key = AnswerKey(
            _digest(req.messages, req.seed, self.config.seed),
            req.wants_tool_call(label, self.config.tools_supported)
            and not _declines(self.config, label),
        )
        comp = await self._completion(fault, key, req.max_tokens, self.vocab.stop_ids)
        reply = _ChatReply(self.config, req, ctx, comp, fault)
        if self.config.mode == "openrouter":
            self._keep_generation(reply)
        if req.stream:
            return await self._stream(request, reply, fault)
        return await self._send_json(request, reply.json(), fault, ctx)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            prompt_ids = await self._generate_prompt(body)
            params = GenerateParams.parse(body.get("sampling_params"), self.vocab.stop_ids)
            prompt_text = self.vocab.text(prompt_ids)
            label = last_user_turn(prompt_text)
            fault = await self._before_answer(request, label)
        except BadRequest as e:
            return _bad_request(str(e))
        ctx = self._context(label, prompt_ids)
        early = self._fault_response(fault, False, ctx, label, request)
        if early is not None:
            return early
        tool = (self.config.tools_supported and "<tools>" in prompt_text
                and _asks_for_tool_call(label) and not _declines(self.config, label))
        key = AnswerKey(_digest(prompt_ids, params.seed, self.config.seed), tool)
        limit = params.max_new_tokens
        if limit is None:
            limit = self.config.generate_default_max_new_tokens
        comp = await self._completion(fault, key, limit, params.stop_ids)
        payload = self._generate_json(ctx, comp, limit, params.skip_special_tokens)
        return await self._send_json(request, payload, fault, ctx)

    async def _generate_prompt(self, body: Json) -> list[int]:
        if body.get("stream"):
            raise BadRequest("streaming /generate is not supported by this test server")
        ids, text = body.get("input_ids"), body.get("text")
        if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
            if any(i not in self.vocab.token_bytes for i in ids):
                raise BadRequest("input_ids holds IDs outside the vocabulary")
            return ids
        if isinstance(text, str) and text:
            return await self.model.encode(text)
        raise BadRequest("give input_ids (a flat list of token IDs) or text (a string)")

    def _generate_json(
        self, ctx: ReplyContext, comp: Completion, limit: int | None, skip_special: bool
    ) -> Json:
        output_ids = comp.ids
        if self.config.generate_omits_stop_id and comp.matched_stop is not None:
            output_ids = output_ids[:-1]
        if comp.matched_stop is not None:
            finish: Json = {"type": "stop", "matched": comp.matched_stop}
        else:
            finish = {"type": "length", "length": limit}
        meta = {
            "id": ctx.gen_id.removeprefix("gen-"),
            "finish_reason": finish,
            "prompt_tokens": len(ctx.prompt_ids),
            "completion_tokens": len(comp.ids),
            "cached_tokens": 0,
            "e2e_latency": time.perf_counter() - ctx.started,
        }
        text = self.vocab.text(comp.ids, skip_special=skip_special)
        return {"text": text, "output_ids": output_ids, "meta_info": meta}

    # ---- shared steps

    async def _body(self, request: web.Request) -> Json:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise BadRequest("the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        self.stats.received(body)
        return body

    async def _before_answer(self, request: web.Request, label: str) -> str | None:
        """Count the prompt, pick the fault, wait; `reset` and `slow` happen here."""
        self.stats.count("per_prompt", label[:_LABEL_CHARS])
        fault = self.faults.pick(label)
        if fault is not None:
            self.stats.count("faults", fault)
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        if fault == "slow":
            await asyncio.sleep(3600)
        if fault == "reset":
            _abort(request)
            raise _Dropped
        return fault

    def _context(self, label: str, prompt_ids: list[int]) -> ReplyContext:
        providers = self.config.providers
        provider = providers[zlib.crc32(label.encode()) % len(providers)]
        created = int(time.time())
        return ReplyContext(_generation_id(), created, provider, time.perf_counter(), prompt_ids)

    def _fault_response(
        self, fault: str | None, stream: bool, ctx: ReplyContext, label: str,
        request: web.Request,
    ) -> web.Response | None:
        if fault == "sse_error" and not stream:
            fault = "error_body"
        if fault not in ERRORS:
            return None
        spec = ERRORS[fault]
        headers = {"X-Generation-Id": ctx.gen_id}
        if spec.retry_after:
            headers["Retry-After"] = spec.retry_after
        auth = request.headers.get("Authorization", "")
        body = error_json(fault, ctx, label, self.config, auth)
        return _json_response(body, spec.status, headers)

    async def _completion(
        self, fault: str | None, key: AnswerKey, limit: int | None, stops: frozenset[int]
    ) -> Completion:
        if fault == "empty":
            return empty_completion(self.vocab, self.config)
        comp = await self.model.completion(key, limit, stops)
        if comp.noncanonical:
            self.stats.count("faults", "noncanonical")
        return comp

    async def _send_json(
        self, request: web.Request, body: Json, fault: str | None, ctx: ReplyContext
    ) -> web.StreamResponse:
        data = orjson.dumps(body)
        headers = {"X-Generation-Id": ctx.gen_id}
        if fault == "malformed":
            data = data[: len(data) // 2]
        if fault == "gzip_bomb":
            gzip = zlib.compressobj(1, wbits=31)  # gzip framing
            pieces = _huge_pieces(data, self.config.huge_body_mb)
            data = b"".join([*map(gzip.compress, pieces), gzip.flush()])
            headers["Content-Encoding"] = "gzip"
        if fault == "huge_body":
            return await _write_in_pieces(request, data, self.config.huge_body_mb, headers)
        if fault != "reset_stream":
            return web.Response(body=data, content_type="application/json", headers=headers)
        response = web.StreamResponse(headers=headers)
        response.content_type = "application/json"
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        _abort(request)
        return response

    async def _stream(
        self, request: web.Request, reply: _ChatReply, fault: str | None
    ) -> web.StreamResponse:
        if fault in ("malformed", "gzip_bomb"):
            return await self._send_json(request, reply.json(), fault, reply.ctx)
        response = web.StreamResponse(
            headers={"Cache-Control": "no-cache", "X-Generation-Id": reply.ctx.gen_id}
        )
        response.content_type = "text/event-stream"
        if fault == "no_done":
            response.force_close()
        await response.prepare(request)
        events, carried = reply.delta_events()
        events += reply.fault_events(carried)
        if fault in _CUT_STREAM:
            events = events[: max(1, len(events) // 2)]
        if fault == "sse_error":
            events += [reply.error_event(request.headers.get("Authorization", "")), _SSE_DONE]
        elif fault not in _CUT_STREAM:
            events += reply.closing_events(carried)
        if self.config.mode == "openrouter":
            events = _with_comments(events)
        await self._write_events(response, events)
        if fault == "reset_stream":
            _abort(request)
            return response
        await response.write_eof()
        return response

    async def _write_events(self, response: web.StreamResponse, events: list[bytes]) -> None:
        per_write = 8 if self.config.stream_interval_s > 0 else 32
        for n in range(0, len(events), per_write):
            if n and self.config.stream_interval_s > 0:
                await asyncio.sleep(self.config.stream_interval_s)
            await response.write(b"".join(events[n : n + per_write]))


_HUGE_MARK = b"@@huge content@@"
_MB_OF_X = b"x" * (1 << 20)


def _huge_pieces(data: bytes, mb: int) -> Iterator[bytes]:
    """`data` (JSON with `_HUGE_MARK` as a string's value) with `mb` MB of "x" in place of the
    mark, a megabyte at a time: a gigabyte answer costs the server no gigabyte. (`/generate`
    answers have no mark: they are sent as they are.)"""
    if _HUGE_MARK not in data:
        yield data
        return
    head, tail = data.split(_HUGE_MARK)
    yield head
    for _ in range(mb):
        yield _MB_OF_X
    yield tail


async def _write_in_pieces(request: web.Request, data: bytes, mb: int,
                           headers: Mapping[str, str]) -> web.StreamResponse:
    """`_huge_pieces` as a JSON body of a declared length, a write each (the client may stop
    reading part way)."""
    response = web.StreamResponse(headers=headers)
    response.content_type = "application/json"
    response.content_length = sum(map(len, _huge_pieces(data, mb)))
    await response.prepare(request)
    for piece in _huge_pieces(data, mb):
        await response.write(piece)
    await response.write_eof()
    return response


class _Dropped(Exception):
    """Raised after the connection was aborted on purpose (the `reset` fault)."""


def _generation_json(reply: _ChatReply) -> Json:
    """What OpenRouter's `GET /api/v1/generation` reports of an answer (the fields draftgen
    reads, and a few more)."""
    usage = reply.usage()
    return {
        "id": reply.ctx.gen_id,
        "model": reply.config.model,
        "provider_name": reply.ctx.provider,
        "total_cost": usage.get("cost", 0.0),
        "tokens_prompt": usage["prompt_tokens"],
        "tokens_completion": usage["completion_tokens"],
        "native_tokens_prompt": usage["prompt_tokens"],
        "native_tokens_completion": usage["completion_tokens"],
        "native_tokens_reasoning": usage["completion_tokens_details"]["reasoning_tokens"],
    }


def _generation_id() -> str:
    return f"gen-{int(time.time())}-{uuid.uuid4().hex[:20]}"


def _with_comments(events: list[bytes], every: int = 16) -> list[bytes]:
    out = [_SSE_COMMENT]
    for n, event in enumerate(events, 1):
        out.append(event)
        if n % every == 0:
            out.append(_SSE_COMMENT)
    return out


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


def _bad_request(message: str) -> web.Response:
    return _json_response({"error": {"code": 400, "message": message, "metadata": {}}}, 400)


def create_app(config: ServerConfig, stats: ServerStats | None = None) -> web.Application:
    """The aiohttp application (for aiohttp's own test utilities, or to mount elsewhere)."""
    engine = FakeEngine(config, stats)
    app = web.Application(
        middlewares=[engine.observe, engine.authenticate], client_max_size=256 * 1024 * 1024
    )
    chat_paths = [p for p, e in _ENDPOINTS.items() if e == "chat"]
    model_paths = [p for p, e in _ENDPOINTS.items() if e == "models"]
    app.add_routes(
        [
            *(web.post(path, engine.chat) for path in chat_paths),
            *(web.get(path, engine.models) for path in model_paths),
            *(web.get(path + "/{model:.+}/endpoints", engine.endpoints) for path in model_paths),
            web.post("/generate", engine.generate),
            web.get("/health", engine.health),
            web.get("/stats", engine.stats_endpoint),
            web.get("/api/v1/generation", engine.generation),
        ]
    )
    return app


# --------------------------------------------------------------------------------------------
# Running it


@contextlib.asynccontextmanager
async def serve(config: ServerConfig, stats: ServerStats | None = None) -> AsyncIterator[str]:
    """Run the server on the current event loop; yields its URL once the port listens."""
    runner = web.AppRunner(
        create_app(config, stats), access_log=None, handler_cancellation=True, shutdown_timeout=0.5
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port, backlog=config.backlog)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    finally:
        await runner.cleanup()


class TestServer:
    """The server on its own event loop in a background thread.

    >>> with TestServer(mode="openrouter", prices=(0.5, 2.5)) as server:
    ...     url = server.url  # "http://127.0.0.1:PORT"
    """

    __test__ = False  # not a pytest test class

    def __init__(self, config: ServerConfig | None = None, **overrides: Any) -> None:
        self.config = dataclasses.replace(config or ServerConfig(), **overrides)
        self.stats = ServerStats()
        self.url = ""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def start(self, timeout: float = 60.0) -> TestServer:
        if self._thread is not None:
            raise RuntimeError("the server is already started")
        self._thread = threading.Thread(target=self._run, name="draftgen-test-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the test server did not start within {timeout} s")
        if self._error is not None:
            self._thread.join()
            raise RuntimeError("the test server failed to start") from self._error
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # reported to start()
            self._error = e
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self.config, self.stats) as url:
            self.url = url
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just finished
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> TestServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# Command line


def _pair(text: str, kind: Callable[[str], Any]) -> tuple[Any, Any]:
    first, second = text.split(",")
    return kind(first), kind(second)


def _fault_rate(text: str) -> tuple[str, float]:
    kind, _, p = text.partition("=")
    if kind not in FAULT_KINDS or not p:
        raise argparse.ArgumentTypeError(f"want KIND=P with KIND one of {sorted(FAULT_KINDS)}")
    return kind, float(p)


def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m draftgen.testing.server",
        description="A local fake inference engine (OpenAI, OpenRouter, SGLang wire protocols).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokenizer", help="tokenizer.json or its folder (default: Qwen3)")
    p.add_argument("--layout", choices=get_args(Layout), default="qwen3")
    p.add_argument("--model", default="test/qwen3")
    p.add_argument("--mode", choices=get_args(Mode), default="openai")
    p.add_argument(
        "--api-key-env", metavar="VAR", help="require Bearer auth with this env var's key"
    )
    p.add_argument("--providers", default="TestProvider", help="comma-separated names")
    p.add_argument(
        "--prices", type=lambda s: _pair(s, float), help="USD/M tokens: PROMPT,COMPLETION"
    )
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    p.add_argument("--stream-interval", type=float, default=0.0,
                   help="seconds between a stream's writes (8 events each; 0: all at once)")
    p.add_argument("--reasoning-tokens", type=lambda s: _pair(s, int), default=(30, 300))
    p.add_argument("--content-tokens", type=lambda s: _pair(s, int), default=(20, 200))
    p.add_argument("--strip-whitespace", action="store_true")
    p.add_argument("--raw-slices", action="store_true")
    p.add_argument(
        "--reasoning-field",
        choices=get_args(ReasoningField),
        default="reasoning",
    )
    p.add_argument(
        "--tool-call-display", choices=get_args(ToolCallDisplay), default="structured"
    )
    p.add_argument("--no-tools", action="store_true", help="ignore the requests' tools")
    p.add_argument("--logprobs-scope", choices=get_args(LogprobsScope), default="all")
    p.add_argument(
        "--quantization", action="append", default=[], metavar="PROVIDER=Q",
        help="quantization the endpoints listing names for a provider (repeatable)",
    )
    p.add_argument("--noncanonical-rate", type=float, default=0.0)
    p.add_argument("--generate-omits-stop-id", action="store_true")
    p.add_argument("--fault-rate", type=_fault_rate, action="append", default=[], metavar="KIND=P")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--huge-body-mb", type=int, default=64,
                   help="size of the huge_body and gzip_bomb answers")
    p.add_argument("--echo-auth", action="store_true",
                   help="error bodies echo the request's Authorization header")
    return p


def config_from_args(argv: Sequence[str] | None = None) -> ServerConfig:
    args = _arg_parser().parse_args(argv)
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise SystemExit(f"environment variable {args.api_key_env} is not set")
    return ServerConfig(
        host=args.host,
        port=args.port,
        tokenizer_path=args.tokenizer,
        layout=args.layout,
        model=args.model,
        mode=args.mode,
        api_key=api_key,
        providers=[p for p in args.providers.split(",") if p],
        prices=args.prices,
        latency_s=args.latency,
        stream_interval_s=args.stream_interval,
        reasoning_tokens=args.reasoning_tokens,
        content_tokens=args.content_tokens,
        strip_whitespace=args.strip_whitespace,
        raw_slices=args.raw_slices,
        reasoning_field=args.reasoning_field,
        tool_call_display=args.tool_call_display,
        tools_supported=not args.no_tools,
        logprobs_scope=args.logprobs_scope,
        quantizations=dict(q.split("=", 1) for q in args.quantization),
        noncanonical_rate=args.noncanonical_rate,
        generate_omits_stop_id=args.generate_omits_stop_id,
        fault_rates=dict(args.fault_rate),
        seed=args.seed,
        huge_body_mb=args.huge_body_mb,
        echo_auth=args.echo_auth,
    )


async def _serve_until_signal(config: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serve(config) as url:
        print(f"LISTENING {url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(_serve_until_signal(config_from_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
