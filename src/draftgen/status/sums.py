"""Tally over a dataset's index columns (one contiguous array per field: fast to mask and sum),
and the failures read from failures.jsonl."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from draftgen.status.model import FINISHED_CUT, DatasetStatus, Rates
from draftgen.store.columns import id_hash, str_code
from draftgen.store.fast_index import IndexColumns
from draftgen.store.journal import as_usd
from draftgen.tally import Tally

Columns = dict[str, np.ndarray]
"""The index rows as one contiguous array per field (fast to mask and sum)."""
_FIELDS = ("idh", "t", "cost", "out", "reasoning", "backend", "provider", "quant", "finish",
           "check")


def columns_of(rows: np.ndarray) -> Columns:
    return {name: np.ascontiguousarray(rows[name]) for name in _FIELDS}


def sums(c: Columns, mask: np.ndarray | None = None) -> Tally:
    out, reasoning, cost = c["out"], c["reasoning"], c["cost"]
    if mask is not None:
        out, reasoning, cost = out[mask], reasoning[mask], cost[mask]
    return Tally(answers=len(out), output_tokens=int(out.sum(dtype=np.int64)),
                 reasoning_tokens=int(reasoning[reasoning > 0].sum(dtype=np.int64)),
                 cost=float(cost.sum()))


def distinct(col: np.ndarray) -> list[int]:
    """The distinct values of a column holding a few (one pass per value; no sort)."""
    values = []
    rest = col
    while len(rest):
        v = rest[0]
        values.append(int(v))
        rest = rest[rest != v]
    return values


def contains(sorted_unique: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Which `values` are in a sorted array (binary search; no re-sort of the big array)."""
    if not len(sorted_unique):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_unique, values), len(sorted_unique) - 1)
    return sorted_unique[at] == values


def group_sums(c: Columns, key: np.ndarray, label: Any) -> dict[str, Tally]:
    """Tally per distinct key (one pass per key to label the rows, then bincounts)."""
    keys = distinct(key)
    group = np.zeros(len(key), dtype=np.intp)
    for j, k in enumerate(keys[1:], 1):
        group[key == k] = j
    n = len(keys)
    done = np.bincount(group, minlength=n)
    out = np.bincount(group, weights=c["out"], minlength=n)
    reasoning = np.bincount(group, weights=np.maximum(c["reasoning"], 0), minlength=n)
    cost = np.bincount(group, weights=c["cost"], minlength=n)
    return {label(k): Tally(int(done[j]), int(out[j]), int(reasoning[j]), float(cost[j]))
            for j, k in enumerate(keys)}


def _provider_label(cols: IndexColumns) -> Any:
    def label(k: int) -> str:
        provider = cols.name(k >> 32) or "-"
        quant = cols.name(k & 0xFFFFFFFF)
        return f"{provider}/{quant}" if quant else provider
    return label


def read_answers(d: DatasetStatus, cols: IndexColumns) -> tuple[np.ndarray, Columns]:
    """Fill the answer counts from the index; returns the answers' ID hashes (sorted, unique)
    and their columns."""
    rows = cols.rows
    idh = np.sort(rows["idh"])
    if len(idh) and (idh[1:] == idh[:-1]).any():  # duplicate lines: count each ID once
        idh, first = np.unique(rows["idh"], return_index=True)
        d.duplicates = len(rows) - len(idh)
        rows = rows[np.sort(first)]
    c = columns_of(rows)
    d.sums = sums(c)
    d.truncated = int((c["finish"] == str_code(FINISHED_CUT)).sum())
    d.not_exact = int((c["check"] != str_code("exact")).sum())
    d.old_schema = int((np.isnan(c["t"]) | (c["backend"] == 0) | (c["check"] == 0)).sum())
    d.by_backend = group_sums(c, c["backend"], lambda k: cols.name(k) or "-")
    pq = (c["provider"].astype(np.uint64) << np.uint64(32)) | c["quant"].astype(np.uint64)
    d.by_provider = group_sums(c, pq, _provider_label(cols))
    d.bad_lines = cols.bad_lines
    t = c["t"][~np.isnan(c["t"])]
    if len(t):
        d.first_t, d.last_t = float(t.min()), float(t.max())
    return idh, c


def read_failures(path: Path, size: int, done: np.ndarray, max_attempts: int, d: DatasetStatus
              ) -> dict[str, float]:
    """Failed prompts (by the kind of their last failure) that were never answered; returns
    each failed ID's last failure time."""
    times: dict[str, float] = {}
    if size == 0:
        return times
    with open(path, "rb") as f:
        raw = f.read(size)
    cut = len(raw) - (raw.rfind(b"\n") + 1)
    if cut:
        d.torn_tail_bytes["failures.jsonl"] = cut
    last: dict[str, str] = {}
    attempts: Counter[str] = Counter()
    for line in raw[: len(raw) - cut].splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            d.bad_lines += 1
            continue
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            d.bad_lines += 1
            continue
        attempts[row["id"]] += 1
        last[row["id"]] = str(row.get("kind") or "unknown")
        d.cost_not_kept_usd += as_usd(row.get("cost_usd"))
        if isinstance(row.get("created_at"), int | float):
            times[row["id"]] = float(row["created_at"])
    d.failed_attempts = sum(attempts.values())
    ids = list(last)
    answered = contains(done, np.fromiter((id_hash(i) for i in ids), dtype=np.uint64,
                                          count=len(ids)))
    for rid, was_answered in zip(ids, answered.tolist(), strict=True):
        if not was_answered:
            d.failed_by_kind[last[rid]] += 1
            d.out_of_attempts += attempts[rid] >= max_attempts
    return times


def rates(c: Columns, start: float, stop: float) -> Rates:
    s = sums(c, (c["t"] >= start) & (c["t"] <= stop))
    return Rates(seconds=max(0.0, stop - start), answers=s.answers,
                 output_tokens=s.output_tokens, cost_usd=s.cost)




def concat(cols: Iterable[Columns]) -> Columns:
    """The columns the rates need, of several sets of answers as one."""
    parts = list(cols)
    return {k: np.concatenate([c[k] for c in parts]) for k in ("t", "out", "reasoning", "cost")}


