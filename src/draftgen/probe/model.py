"""What the probe found, per answer and per backend: plain data that round-trips through
run.json (so a resumed run can reuse it and status/report can show it)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["exact", "reconstructable", "unsafe"]
Scope = Literal["all", "tools"]
"""What a problem makes unsafe: every prompt, or only prompts with tools."""
RequestKind = Literal["plain", "reasoning", "tool"]

IdsFrom = Literal["native", "logprobs", "text"]
"""Where an answer's IDs came from: the engine's IDs, IDs recovered from complete logprobs,
or the text re-encoded."""


@dataclass
class Problem:
    code: str
    """Stable label: request_failed, length_mismatch, unverifiable, reasoning_missing,
    stop_token_in_answer, special_token_in_text, whitespace_uncertain, tool_calls_missing,
    tool_calls_dropped, tool_calls_malformed, tool_calls_unsupported."""
    message: str
    scope: Scope = "all"


@dataclass
class AnswerReport:
    """One probe request and what its answer showed."""

    kind: str
    error: str | None = None
    finish_reason: str | None = None
    ids: IdsFrom | None = None
    token_check: str | None = None
    completion_tokens: int | None = None
    """`usage.completion_tokens` as the endpoint reported it."""
    output_tokens: int | None = None
    """How many IDs the answer's record would hold."""
    length_delta: int | None = None
    """Reconstructed answers: output_tokens - completion_tokens."""
    reasoning_tokens: int | None = None
    """`usage.completion_tokens_details.reasoning_tokens`, where reported."""
    text_rebuild: str | None = None
    """Where the true IDs are known: whether re-encoding the text fields gives them
    ("matches") or not ("differs"); None when there is nothing to compare."""
    reasoning: str = "n/a"
    """Where reasoning arrived: field names joined by "+", "content", "ids" (inside the
    engine's IDs), "encrypted" (reasoning_details without text), "none", or "n/a" (the
    format does not reason)."""
    whitespace: str = "n/a"
    """Around reasoning and content: "kept" (raw slices), "stripped", "differs" (compared with
    the true text), or without true text "restored" (the format put layout whitespace back)
    and "uncertain"."""
    tool_calls: str | None = None
    """Tool request only: "structured", "raw_text" (tool tokens in content), "ids" (inside the
    engine's IDs), "missing", "malformed", "unsupported" (the format cannot lay them out),
    "cut_off" (max_tokens reached first)."""
    logprobs: str = "none"
    """"complete" (they give every output token's ID), "partial", "no_bytes", "none"."""
    logprob_entries: int | None = None
    flags: list[str] = field(default_factory=list)
    provider: str | None = None
    quantization: str | None = None
    cost_usd: float = 0.0
    """What the answer counts for (`budget.counted_cost`)."""
    reported_usd: float | None = None
    """`usage.cost` as the endpoint reported it (None: none; NaN: not a number)."""
    priced_usd: float | None = None
    """Its usage at the backend's price (None: no price known)."""
    billed_tokens: int = 0
    """Prompt and completion tokens, as billed."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def exact(self) -> bool:
        return self.ok and self.token_check == "exact"


@dataclass
class BackendProbe:
    backend: str
    type: str
    key: str
    """Hash of what the result depends on (model, tokenizer, backend config, probe settings):
    a resumed run reuses a stored result with the same key."""
    verdict: Verdict
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    answers: list[AnswerReport] = field(default_factory=list)
    cost_usd: float = 0.0
    probed_at: float = 0.0
    price: dict[str, float] | None = None
    """USD per million tokens the answers were priced at (`prompt`, `completion`): the
    configured price, else the endpoint's listing; None: none known."""
    cached: bool = False
    """Taken from run.json rather than probed now (not stored)."""

    def blocking(self, needs: set[str]) -> list[Problem]:
        """The problems that make this backend unsafe for prompts needing `needs`."""
        return [p for p in self.problems if p.scope == "all" or p.scope in needs]

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("cached")
        return data

    @classmethod
    def from_dict(cls, data: Any) -> BackendProbe | None:
        """A stored result, or None when it is not one (an older or damaged run.json)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                backend=str(data["backend"]),
                type=str(data["type"]),
                key=str(data["key"]),
                verdict=data["verdict"],
                problems=[Problem(**p) for p in data.get("problems") or []],
                warnings=[str(w) for w in data.get("warnings") or []],
                answers=[AnswerReport(**a) for a in data.get("answers") or []],
                cost_usd=float(data.get("cost_usd") or 0.0),
                probed_at=float(data.get("probed_at") or 0.0),
                price=_stored_price(data.get("price")),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _stored_price(data: Any) -> dict[str, float] | None:
    """A stored result's price; ValueError when it is no price (a run.json edited by hand):
    the dry run prices a backend by it."""
    if data is None:
        return None
    price = {k: float(data[k]) for k in ("prompt", "completion")}
    if not all(math.isfinite(v) and v >= 0 for v in price.values()):
        raise ValueError(f"price {price} is not USD per million tokens")
    return price
