"""The server's configuration: prices, the endpoint behaviours to mimic, the fake model's
lengths, faults and limits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple, get_args

from draftgen.testing.assets import qwen3_tokenizer_dir
from draftgen.testing.fake_engine.faults import FAULT_KINDS
from draftgen.testing.fake_engine.kinds import (
    Layout,
    LogprobsScope,
    Mode,
    ReasoningField,
    ToolCallDisplay,
)


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
    listed_prices: Prices | tuple[float, float] | None = None
    """What `GET /models` lists as the price (None: `prices`): a provider whose listing is
    not its bill."""
    bill_factor: float = 1.0
    """Every answer is billed (and its `usage.cost` reported) at `prices` times this: a
    provider that charges more than its listing says."""
    reported_cost: float | str | None = None
    """With `prices`: sent as every answer's `usage.cost` (and the generation record's
    `total_cost`) instead of the priced cost: 0 (as OpenRouter reports bring-your-own-key
    requests), a negative or absurd number, or a non-number such as "NaN"."""
    cost_as_text: bool = False
    """`usage.cost` (the priced one, or `reported_cost`) sent as a JSON string: "0.0031"."""
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
    """False: the request's `tools` are ignored (a provider that drops them): no tool calls."""
    declines_tool_for: str = ""
    """Set: the model answers a tool request whose last user message holds this text without
    calling the tool (its own choice: the endpoint passes tools through)."""
    tool_parser_drops: bool = False
    """The endpoint's tool parser loses the calls: finish_reason "tool_calls", no
    `tool_calls`, the tool block gone from the content."""
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
    """The size of the `huge_body`, `huge_chunked` and `gzip_bomb` answers."""
    echo_auth: bool = False
    """Error bodies (401 and every error fault) echo the request's Authorization header in
    their message, as careless servers do."""

    def __post_init__(self) -> None:
        if isinstance(self.prices, Mapping):
            self.prices = Prices(self.prices["prompt"], self.prices["completion"])
        elif self.prices is not None:
            self.prices = Prices(*self.prices)
        if self.listed_prices is not None:
            self.listed_prices = Prices(*self.listed_prices)
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
        """What the server bills per million tokens."""
        if not isinstance(self.prices, Prices):
            return None
        return Prices(self.prices.prompt * self.bill_factor,
                      self.prices.completion * self.bill_factor)

    @property
    def listing(self) -> Prices:
        """What `GET /models` lists per million tokens."""
        listed = self.listed_prices or self.prices
        return listed if isinstance(listed, Prices) else Prices(0, 0)

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
