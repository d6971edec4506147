"""Answers as a request sees them: the sampled IDs cut to the request's limits, where the
reasoning, content and tool call lie in their text, what the chat endpoint shows of them, their
logprobs, and the plan of their SSE deltas."""

from __future__ import annotations

import array
import bisect
import functools
import itertools
import json
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import orjson

from draftgen.testing.fake_engine.config import ServerConfig
from draftgen.testing.fake_engine.kinds import Json, Layout, Span, ToolCallDisplay
from draftgen.testing.fake_engine.vocab import Vocab

T = TypeVar("T")


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
    """The reasoning and content the chat endpoint shows (see the package docstring)."""
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
