"""The checks of one answer that need no tokenizer call: token-level checks against the
format's special-token IDs (`TokenSpec`), what the record claims, and the config's routing.

Each check returns problem codes (see `PROBLEMS`); an answer passes when it has none. These are
also the checks `draftgen export` applies to each row (through `export.checks`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from draftgen.provider_routing import routing_problems as routing_problems
from draftgen.provider_routing import served_problems
from draftgen.store.record import Record

CUT_OFF = frozenset({"length"})
"""finish_reason values of an answer cut off by max_tokens: it has no end-of-turn token."""
FINISHED = frozenset({"stop", "tool_calls", "eos"})
"""finish_reason values that say the model ended its turn, so emitted a stop token. Other
values (none, `content_filter`) require neither."""

PROBLEMS: dict[str, str] = {
    "not_a_record": "a complete line that is not a JSON object with a string id",
    "missing_fields": "record from an older schema: fields the audit needs are missing",
    "output_empty": "no output token IDs",
    "stop_token_missing": "finished answer that does not end with a stop token",
    "stop_token_on_cut_off_answer": "cut-off answer (finish_reason length) ending with a stop "
                                    "token",
    "stop_token_inside_answer": "stop token before the end of the answer",
    "end_think_missing": "answer with reasoning but no end-of-reasoning token",
    "end_think_repeated": "end-of-reasoning token more than once",
    "tool_tokens_unbalanced": "tool-call tokens not opened and closed in pairs",
    "tool_tokens_without_tools": "tool-call tokens in an answer to a prompt that declared no "
                                 "tools",
    "input_ids_not_native": "input_ids differ from the format's rendering of messages + tools",
    "reasoning_mismatch": "decoded output's reasoning differs from the stored reasoning",
    "content_mismatch": "decoded output's content differs from the stored content",
    "tool_calls_mismatch": "decoded output's tool calls differ from the stored tool calls",
    "exact_not_native": "token_check exact on IDs that are not native",
    "special_token_in_reasoning": "special-token text inside the reasoning",
    "special_token_in_content": "special-token text inside the content",
    "provider_excluded": "answered by a provider the config's routing excluded",
    "quantization_excluded": "answered at a quantization the config's routing excluded",
    "duplicate_id": "an ID already answered earlier (this or another dataset's file)",
}
"""Every problem code, with what it means (the trajectory ones added below)."""

TRAJECTORY_PROBLEMS: dict[str, str] = {
    "turn_missing": "a conversation's turn written after a gap (turns not 0..k in a row)",
    "turn_repeated": "a conversation's turn written twice",
    "end_not_last": "an end on a turn before the conversation's last, or a second end",
    "turn_id_mismatch": "a turn of a `turns: all` dataset whose id is not "
                        "{conversation}#{turn} (or that lacks conversation or turn)",
    "mask_not_sampled": "the trajectory's loss mask does not cover exactly the sampled tokens",
}
"""The findings about `turns: all` datasets as trajectories (`audit.conversation_checks`)."""
PROBLEMS.update(TRAJECTORY_PROBLEMS)

REQUIRED = ("id", "input_ids", "output_ids", "finish_reason", "token_source", "token_check",
            "messages")
"""Fields the audit reads; a record lacking any is from an older schema."""
_FLAG_PROBLEMS = ("special_token_in_reasoning", "special_token_in_content")


@dataclass(frozen=True)
class TokenSpec:
    """The special-token IDs of a model format that the token checks look for."""

    stop_ids: frozenset[int]
    end_think_id: int | None = None
    end_think_once: bool = True
    """False where the end-of-reasoning token also ends other messages (gpt-oss `<|end|>`)."""
    tool_ids: frozenset[int] = frozenset()
    tool_pairs: tuple[tuple[int, int], ...] = ()
    """(opening, closing) tool tokens that must come in pairs."""
    continuation: tuple[int, int] | None = None
    """(stop ID, next ID) that continue an answer past a stop token
    (`Format.answer_continuation`)."""

    @classmethod
    def of_stop(cls, stop_ids: int | Iterable[int]) -> TokenSpec:
        ids = (stop_ids,) if isinstance(stop_ids, int) else tuple(stop_ids)
        return cls(stop_ids=frozenset(ids))


_END_THINK_SEPARATORS = frozenset({"<|end|>"})
"""End-of-reasoning tokens that also end every other message of the answer (harmony)."""


def tool_token_pairs(tokens: Sequence[str]) -> list[tuple[str, str]]:
    """The tool tokens that open and close a span, paired by name: `<x>`/`</x>` and
    `…begin…`/`…end…`."""
    names = set(tokens)
    pairs = []
    for tok in tokens:
        closer = None
        if "begin" in tok:
            closer = tok.replace("begin", "end")
        elif tok.startswith("<") and not tok.startswith("</"):
            closer = "</" + tok[1:]
        if closer and closer != tok and closer in names:
            pairs.append((tok, closer))
    return pairs


def spec_for(fmt: Any) -> TokenSpec:
    """The TokenSpec of a `formats.Format` (its tokenizer maps the token strings to IDs)."""
    tok = fmt.tokenizer

    def ids(names: Iterable[str]) -> frozenset[int]:
        return frozenset(i for i in (tok.token_to_id(n) for n in names) if i is not None)

    end_think = fmt.end_think_token
    pairs = []
    for a, b in tool_token_pairs(fmt.tool_tokens):
        ia, ib = tok.token_to_id(a), tok.token_to_id(b)
        if ia is not None and ib is not None:
            pairs.append((ia, ib))
    return TokenSpec(
        stop_ids=ids(fmt.stop_tokens),
        continuation=_id_pair(tok, getattr(fmt, "answer_continuation", None)),
        end_think_id=tok.token_to_id(end_think) if end_think else None,
        end_think_once=end_think not in _END_THINK_SEPARATORS,
        tool_ids=ids(fmt.tool_tokens),
        tool_pairs=tuple(pairs),
    )


def _id_pair(tok: Any, pair: tuple[str, str] | None) -> tuple[int, int] | None:
    if pair is None:
        return None
    a, b = tok.token_to_id(pair[0]), tok.token_to_id(pair[1])
    return None if a is None or b is None else (a, b)


# ---- the records checked ---------------------------------------------------------------------


class LooseRecord:
    """A damaged line's JSON object (`store.record.Damaged`) read like a `Record`: each field as
    it is, None where missing, so that the audit checks what there is of it and names what is
    missing (`missing_fields`) rather than failing the line as a whole."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __getattr__(self, name: str) -> Any:
        return self.fields.get(name)


Checked = Record | LooseRecord
"""What the checks read: a record, or what there is of a damaged one."""


def missing_fields(record: Checked) -> list[str]:
    """The fields the audit reads that the record lacks (a `Record` has them all)."""
    if isinstance(record, LooseRecord):
        return [k for k in REQUIRED if k not in record.fields]
    return []


def has_text(record: Checked) -> bool:
    """The record stores reasoning or content (a `Record` stores both, maybe as null)."""
    return not isinstance(record, LooseRecord) or bool({"reasoning", "content"}
                                                       & record.fields.keys())


# ---- the checks ------------------------------------------------------------------------------


def stop_token_problems(ids: list[int], finish: Any, stop_ids: Collection[int],
                        continuation: tuple[int, int] | None = None) -> list[str]:
    """Ends with a stop token exactly when finished; no stop token before the end, but where
    `continuation` (stop ID, next ID) goes on with the answer."""
    if not ids or not stop_ids:
        return []
    problems = []
    ends_with_stop = ids[-1] in stop_ids
    if finish in FINISHED and not ends_with_stop:
        problems.append("stop_token_missing")
    if finish in CUT_OFF and ends_with_stop:
        problems.append("stop_token_on_cut_off_answer")
    continued = 0 if continuation is None else sum(
        1 for pair in pairwise(ids) if pair == continuation)
    if sum(ids.count(s) for s in stop_ids) - continued > ends_with_stop:
        problems.append("stop_token_inside_answer")
    return problems


def end_think_problems(ids: list[int], spec: TokenSpec, *, finished: bool,
                       has_reasoning: bool, tool_section_ends_reasoning: bool) -> list[str]:
    """The end-of-reasoning token: at most once (where it is not also a message separator),
    and present when a finished answer has reasoning, unless a tool section ended the
    reasoning (Kimi)."""
    if spec.end_think_id is None:
        return []
    n = ids.count(spec.end_think_id)
    if n > 1 and spec.end_think_once:
        return ["end_think_repeated"]
    if n == 0 and has_reasoning and finished and not tool_section_ends_reasoning:
        return ["end_think_missing"]
    return []


def tool_token_problems(ids: list[int], spec: TokenSpec, *, cut_off: bool,
                        declared_tools: bool) -> list[str]:
    """Tool tokens only where the prompt declared tools, each pair opened and closed in turn
    (a cut-off answer may end inside one)."""
    if spec.tool_ids.isdisjoint(ids):
        return []
    present = [i for i in ids if i in spec.tool_ids]
    problems = [] if declared_tools else ["tool_tokens_without_tools"]
    for opening, closing in spec.tool_pairs:
        depth = 0
        for i in present:
            depth += (i == opening) - (i == closing)
            if depth not in (0, 1):
                break
        if depth not in (0, 1) or (depth == 1 and not cut_off):
            problems.append("tool_tokens_unbalanced")
            break
    return problems


def claim_problems(record: Checked) -> list[str]:
    """What the record says about its IDs and its text fields."""
    problems = []
    if record.token_check == "exact" and record.token_source != "native":
        problems.append("exact_not_native")
    flags = record.flags or []
    problems.extend(p for p in _FLAG_PROBLEMS if p in flags)
    return problems


def record_routing_problems(record: Checked, routing: Mapping[str, Any] | None) -> list[str]:
    """`served_problems` of a record."""
    return served_problems(record.provider, record.quantization, record.flags, routing)


@dataclass
class Routing:
    """Each backend's provider routing, from run.json's config
    (`store.runjson.StoredConfig.routing`)."""

    by_backend: dict[str, dict[str, Any]] = field(default_factory=dict)

    def of(self, backend: Any) -> dict[str, Any] | None:
        return self.by_backend.get(str(backend))


def token_problems(record: Checked, spec: TokenSpec) -> list[str]:
    """The checks on output_ids alone (no decoding): non-empty, stop token, tool tokens."""
    ids = record.output_ids or []
    if not ids:
        return ["output_empty"]
    finish = record.finish_reason
    return [*stop_token_problems(ids, finish, spec.stop_ids, spec.continuation),
            *tool_token_problems(ids, spec, cut_off=finish in CUT_OFF,
                                 declared_tools=bool(record.tools))]
