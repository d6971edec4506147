"""A record turned into a training row, and the row shapes each trainer reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from draftgen.export.branches import Branch
from draftgen.export.checks import BrokenRow, mask_problem
from draftgen.store.record import Record


@dataclass(slots=True)
class TrainRow:
    dataset: str
    record: Record
    input_ids: list[int]
    """Prompt IDs then answer IDs (cut at --max-len when truncating)."""
    loss_mask: list[int]
    prompt_len: int
    answer_len: int
    """Answer tokens kept in the row."""
    cut: bool
    """Cut at --max-len."""
    split: str
    branch: Branch | None = None
    """A trajectory's sequence (`turns: all`): the record is its last turn, `loss_mask` also 1
    on its earlier turns' answers."""

    @property
    def id(self) -> str:
        return self.record.id


def build_row(dataset: str, record: Record, split: str, max_len: int | None,
              branch: Branch | None = None) -> TrainRow:
    """input_ids = prompt + answer, loss_mask 0 on the prompt and 1 on the answer (a
    trajectory's branch: its mask, 1 on every answer it holds), cut to max_len when given.
    Raises BrokenRow when the mask is not sound."""
    prompt, answer = record.input_ids, record.output_ids
    ids = prompt + answer
    mask = [0] * len(prompt) + [1] * len(answer) if branch is None else list(branch.loss_mask)
    cut = max_len is not None and len(ids) > max_len
    if cut:
        ids, mask = ids[:max_len], mask[:max_len]
    row = TrainRow(dataset, record, ids, mask, len(prompt), len(ids) - len(prompt), cut, split,
                   branch)
    check_row(row)
    return row


def check_row(row: TrainRow) -> None:
    problem = mask_problem(row.input_ids, row.loss_mask)
    if problem:
        raise BrokenRow(f"record {row.id!r} (dataset {row.dataset}): {problem}")


# ---- normalized metadata --------------------------------------------------------------------


def usage(record: Record) -> dict[str, Any]:
    use = record.usage
    return {"prompt_tokens": use.prompt_tokens, "completion_tokens": use.completion_tokens,
            "reasoning_tokens": use.reasoning_tokens, "cached_tokens": use.cached_tokens,
            "cost": use.cost}


def sampling(config_sampling: dict[str, Any]) -> dict[str, Any]:
    """run.json's config.sampling with fixed fields; `extra` (free-form) as a JSON string."""
    extra = config_sampling.get("extra")
    return {
        "temperature": _float(config_sampling.get("temperature")),
        "top_p": _float(config_sampling.get("top_p")),
        "top_k": _int(config_sampling.get("top_k")),
        "max_tokens": _int(config_sampling.get("max_tokens")),
        "seed": _int(config_sampling.get("seed")),
        "extra": orjson.dumps(extra).decode() if extra else None,
    }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# ---- trainer row shapes ---------------------------------------------------------------------


def speculators_row(row: TrainRow, sampling_meta: dict[str, Any], text: str | None,
                    with_text: bool) -> dict[str, Any]:
    rec = row.record
    out: dict[str, Any] = {"input_ids": row.input_ids, "loss_mask": row.loss_mask,
                           "seq_len": len(row.input_ids)}
    if with_text:
        out["text"] = text
    out["metadata"] = {
        "id": row.id,
        "dataset": row.dataset,
        "finish_reason": rec.finish_reason,
        "usage": usage(rec),
        "cost_usd": rec.cost_usd,
        "backend": rec.backend,
        "provider": rec.provider,
        "quantization": rec.quantization,
        "model": rec.model,
        "sampling": sampling_meta,
        "token_source": rec.token_source,
        "token_check": rec.token_check,
    }
    return out


def pretokenized_row(row: TrainRow) -> dict[str, Any]:
    return {"input_ids": row.input_ids, "loss_mask": row.loss_mask}


def answer_message(rec: Record) -> dict[str, Any]:
    """The record's answer as an assistant message (OpenAI fields, `reasoning_content`)."""
    answer: dict[str, Any] = {"role": "assistant", "content": rec.content or ""}
    if rec.reasoning is not None:
        answer["reasoning_content"] = rec.reasoning
    if rec.tool_calls:
        answer["tool_calls"] = rec.tool_calls
    return answer


def conversation_row(row: TrainRow) -> dict[str, Any]:
    """SpecForge conversations: the prompt messages, then the answer as an assistant turn."""
    rec = row.record
    # `tools` on every row: SpecForge's offline reader (Dataset.from_generator) drops the
    # column when the first rows lack it.
    return {"id": row.id, "conversations": [*rec.messages, answer_message(rec)],
            "tools": rec.tools or []}


def flat_row(row: TrainRow) -> dict[str, Any]:
    """One parquet row: IDs, mask and flat metadata columns."""
    rec = row.record
    use = usage(rec)
    created = rec.created_at
    return {
        "id": row.id,
        "dataset": row.dataset,
        "split": row.split,
        "input_ids": row.input_ids,
        "loss_mask": row.loss_mask,
        "prompt_len": row.prompt_len,
        "answer_len": row.answer_len,
        "cut_to_max_len": row.cut,
        "finish_reason": rec.finish_reason,
        "token_source": rec.token_source,
        "token_check": rec.token_check,
        "flags": rec.flags,
        "backend": rec.backend,
        "provider": rec.provider,
        "quantization": rec.quantization,
        "model": rec.model,
        **{f"usage_{k}": v for k, v in use.items()},
        "cost_usd": rec.cost_usd,
        "latency_s": rec.latency_s,
        "retries": rec.retries,
        "created_at": None if created is None else round(created * 1000),
    }


def trajectory_row(row: TrainRow, run_sampling: dict[str, Any]) -> dict[str, Any]:
    """One line of speculators' trajectory JSONL (`scripts/agentic_regeneration/
    convert_traces.py`): `{id, conversations, tools, input_ids, loss_mask, metadata}`. A
    single-turn answer is a trajectory of one turn."""
    rec, branch = row.record, row.branch
    conversation = branch.conversation if branch else rec.id
    turns = branch.turns if branch else [rec.turn if isinstance(rec.turn, int) else 0]
    mix = rec.sampling if isinstance(rec.sampling, dict) else {}
    end = rec.end if isinstance(rec.end, str) else None
    return {
        "id": rec.id if branch else f"{rec.id}:branch-0",
        "conversations": [*rec.messages, answer_message(rec)],
        "tools": rec.tools or [],
        "input_ids": row.input_ids,
        "loss_mask": row.loss_mask,
        "metadata": {
            "source": "draftgen",
            "trace_id": conversation,
            "branch_index": branch.index if branch else 0,
            "model": rec.model,
            "on_policy": True,
            "num_turns": len(turns),
            "stop_condition": end,
            "token_count": len(row.input_ids),
            "sampled_token_count": sum(row.loss_mask),
            "dataset": row.dataset,
            "conversation": conversation,
            "turns": turns,
            "layout": branch.layout if branch else "sequence",
            "end": end,
            "cut_by_turn_dropout": bool(branch and branch.cut),
            "sampling": {**sampling({**run_sampling, **mix}),
                         "reasoning_effort": mix.get("reasoning_effort")},
            "token_check": rec.token_check,
        },
    }
