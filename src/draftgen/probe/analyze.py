"""What one probe answer shows about its endpoint.

Each answer goes through the run's own `rebuild_batch`, so the probe sees exactly what a run
would record. Where the true IDs are known (engine IDs, or IDs recovered from complete
logprobs), the text fields are compared with the true text and the IDs that text
reconstruction alone would have given are compared with the true ones.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from draftgen.budget.pricing import counted_cost
from draftgen.config.backends import Price
from draftgen.formats import Format
from draftgen.formats.base import (
    IDS_FROM_LOGPROBS,
    UNCERTAIN_SUFFIX,
    WHITESPACE_RESTORED,
    ParsedAnswer,
    answer_finished,
)
from draftgen.probe.exchange import Exchange
from draftgen.probe.model import AnswerReport, IdsFrom
from draftgen.types import BackendError, Prompt, RawAnswer, Rebuilt, Usage

STOP_IN_IDS = "stop_token_inside_ids"
"""Probe flag: an engine-reported ID list holds a stop token before its end."""
STOP_IN_TEXT = "stop_token_in_text"
"""Probe flag: reasoning or content holds a stop token's text."""
PROMPT_IDS_DIFFER = "prompt_ids_differ_from_engine"
_UNSUPPORTED_TOOL_FLAGS = frozenset({"tool_calls_dropped", "tool_calls_unsupported"})


def analyze(fmt: Format, ex: Exchange, price: Price | None,
            quantizations: Mapping[str, str]) -> AnswerReport:
    req = ex.request
    if ex.raw is None:
        error = ex.error or BackendError("unknown", "no answer", retryable=False)
        return AnswerReport(kind=req.kind, error=str(error),
                            **_bill(error.usage or Usage(), price, 0, 0))
    raw = ex.raw
    rebuilt = fmt.rebuild_batch([raw], [req.prompt])[0]
    exact = rebuilt.token_check == "exact"
    truth = fmt.parse_answer_text(fmt.tokenizer.decode(rebuilt.output_ids)) if exact else None
    n = raw.usage.completion_tokens
    return AnswerReport(
        kind=req.kind,
        finish_reason=raw.finish_reason,
        ids=_ids_from(rebuilt),
        token_check=rebuilt.token_check,
        completion_tokens=n,
        output_tokens=len(rebuilt.output_ids),
        length_delta=None if exact or n is None else len(rebuilt.output_ids) - n,
        text_rebuild=_text_rebuild(fmt, raw, req.prompt, rebuilt.output_ids if exact else None),
        reasoning_tokens=raw.usage.reasoning_tokens,
        reasoning=_reasoning_where(fmt, raw, ex, truth),
        whitespace=_whitespace(fmt, raw, truth, rebuilt.flags),
        tool_calls=_tool_calls(fmt, raw, rebuilt, truth) if req.kind == "tool" else None,
        logprobs=_logprobs_state(fmt, raw, req.prompt, rebuilt),
        logprob_entries=len(raw.logprobs) if raw.logprobs is not None else None,
        flags=[*rebuilt.flags, *_defects(fmt, raw, rebuilt, req.input_ids)],
        provider=raw.provider,
        quantization=raw.quantization or quantizations.get(raw.provider or ""),
        **_bill(raw.usage, price, len(req.input_ids), len(rebuilt.output_ids)),
    )


def _ids_from(rebuilt: Rebuilt) -> IdsFrom:
    if rebuilt.token_source == "reconstructed":
        return "text"
    return "logprobs" if IDS_FROM_LOGPROBS in rebuilt.flags else "native"


def _has_text(raw: RawAnswer) -> bool:
    return raw.reasoning is not None or raw.content is not None or bool(raw.tool_calls)


def _text_rebuild(fmt: Format, raw: RawAnswer, prompt: Prompt,
                  true_ids: list[int] | None) -> str | None:
    """Whether text reconstruction alone would have given the true IDs."""
    if true_ids is None or not _has_text(raw):
        return None
    text_only = dataclasses.replace(raw, output_ids=None, logprobs=None)
    ids = fmt.rebuild_batch([text_only], [prompt])[0].output_ids
    return "matches" if ids == true_ids else "differs"


def _reasoning_where(fmt: Format, raw: RawAnswer, ex: Exchange,
                     truth: ParsedAnswer | None) -> str:
    end_think = fmt.end_think_token
    if not end_think:
        return "n/a"
    if ex.wire is not None and ex.wire.reasoning:
        return "+".join(ex.wire.reasoning)
    if ex.wire is None and raw.reasoning:
        return "reasoning"
    if raw.content and end_think in raw.content:
        return "content"
    if ex.wire is not None and ex.wire.encrypted:
        return "encrypted"
    if truth is not None and truth.reasoning and truth.reasoning.strip():
        return "ids"
    return "none"


def _compare(given: str, true: str) -> str:
    if given == true:
        return "kept"
    return "stripped" if given.strip() == true.strip() else "differs"


def _whitespace(fmt: Format, raw: RawAnswer, truth: ParsedAnswer | None,
                flags: Sequence[str]) -> str:
    if raw.reasoning is None and raw.content is None:
        return "n/a"
    if truth is None:
        if any(f.endswith(UNCERTAIN_SUFFIX) for f in flags):
            return "uncertain"
        return "restored" if WHITESPACE_RESTORED in flags else "kept"
    pairs = [(raw.reasoning, truth.reasoning)]
    tools_involved = raw.tool_calls or truth.tool_calls or _has_tool_text(fmt, raw.content)
    if not tools_involved:
        pairs.append((raw.content, truth.content))
    states = {_compare(g, t) for g, t in pairs if g is not None and t is not None}
    return next((s for s in ("differs", "stripped", "kept") if s in states), "n/a")


def _has_tool_text(fmt: Format, text: str | None) -> bool:
    return bool(text) and any(t in (text or "") for t in fmt.tool_tokens)


def _well_formed(call: Mapping[str, Any]) -> bool:
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        return False
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return False
    return isinstance(args, dict)


def _tool_calls(fmt: Format, raw: RawAnswer, rebuilt: Rebuilt,
                truth: ParsedAnswer | None) -> str:
    if _UNSUPPORTED_TOOL_FLAGS & set(rebuilt.flags):
        return "unsupported"
    if raw.tool_calls:
        ok = all(isinstance(c, dict) and _well_formed(c) for c in raw.tool_calls)
        return "structured" if ok else "malformed"
    if _has_tool_text(fmt, raw.content):
        return "raw_text"
    if truth is not None and (truth.tool_calls or _has_tool_text(fmt, truth.content)):
        return "ids"
    return "cut_off" if raw.finish_reason == "length" else "missing"


def _logprobs_state(fmt: Format, raw: RawAnswer, prompt: Prompt, rebuilt: Rebuilt) -> str:
    if not raw.logprobs:
        return "none"
    view = rebuilt
    if raw.output_ids is not None:  # engine IDs won: what would the logprobs alone give?
        view = fmt.rebuild_batch([dataclasses.replace(raw, output_ids=None)], [prompt])[0]
    if IDS_FROM_LOGPROBS in view.flags:
        return "complete"
    if any(e.bytes is None and e.id is None for e in raw.logprobs):
        return "no_bytes"
    return "partial"


def _defects(fmt: Format, raw: RawAnswer, rebuilt: Rebuilt, input_ids: list[int]) -> list[str]:
    """Probe flags: a stop token inside the answer; a prompt the engine saw differently."""
    flags: list[str] = []
    if rebuilt.token_check == "exact":
        stop_ids = {fmt.tokenizer.token_to_id(t) for t in fmt.stop_tokens} - {None}
        ids = rebuilt.output_ids
        inner = ids[:-1] if answer_finished(raw) else ids
        if any(i in stop_ids for i in inner):
            flags.append(STOP_IN_IDS)
    elif any(s in (raw.reasoning or "") or s in (raw.content or "") for s in fmt.stop_tokens):
        flags.append(STOP_IN_TEXT)
    if raw.prompt_ids is not None and raw.prompt_ids != input_ids:
        flags.append(PROMPT_IDS_DIFFER)
    return flags


def _bill(usage: Usage, price: Price | None, prompt_tokens: int, output_tokens: int
          ) -> dict[str, Any]:
    """What the answer cost: as reported, at the price, and counted as the run counts it
    (`budget.counted_cost`; a report that is no cost counts the price here, and the run
    counts the probe's requests at their worst case)."""
    prompt_tokens = usage.prompt_tokens or prompt_tokens
    output_tokens = usage.completion_tokens or output_tokens
    priced = price.cost(prompt_tokens, output_tokens) if price is not None else None
    return {"cost_usd": counted_cost(usage.cost, priced, priced or 0.0)[0],
            "reported_usd": usage.cost,
            "priced_usd": priced, "billed_tokens": prompt_tokens + output_tokens}
