"""Which answers an export writes, how many times, in what order and in which split.

Everything is decided per record from a seeded 64-bit hash of its ID, so the choice needs no
state across records (memory stays flat) and is the same on every pass and every machine:

* order key: `hash(seed, "order", id, copy)`; the shuffle sorts rows by it;
* split: `hash(seed, "split", id)` below `val_fraction` puts the answer (all its copies) in
  validation, so upsampled copies never straddle train and validation;
* weight W: `floor(W)` copies, plus one more when `hash(seed, "weight", id)` falls below the
  fractional part (W = 0.3 keeps a seeded 30 %, W = 2 doubles a dataset);
* cap N: the N copies of a dataset with the smallest order keys, a seeded uniform sample
  (found in a first pass that keeps at most N keys per capped dataset).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftgen.export.checks import (
    CUT_OFF,
    BrokenRow,
    audit_problems,
    damaged_problem,
    structure_problem,
)
from draftgen.export.options import ALLOWED_CHECKS, ExportOptions, Overlong
from draftgen.store.record import Damaged, Record

_TWO64 = float(1 << 64)


def hash64(seed: int, purpose: str, rid: str, copy: int = 0) -> int:
    msg = f"{seed}\x00{purpose}\x00{rid}\x00{copy}".encode()
    return int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "big")


def uniform(seed: int, purpose: str, rid: str) -> float:
    """A seeded number in [0, 1) for this ID."""
    return hash64(seed, purpose, rid) / _TWO64


@dataclass
class DatasetTally:
    records: int = 0
    excluded: Counter[str] = field(default_factory=Counter)
    written: Counter[str] = field(default_factory=Counter)
    """Rows written per split (upsampled copies included)."""
    extra_copies: int = 0
    """Rows added by a weight above 1."""
    truncated_to_max_len: int = 0
    torn_tail_bytes: int = 0
    bad_lines: int = 0


@dataclass(frozen=True, slots=True)
class Pick:
    """One row to write: a record's copy, its order key and its split."""

    key: int
    copy: int
    split: str


class Selector:
    def __init__(self, opts: ExportOptions, stop_id: int | None) -> None:
        self.opts = opts
        self.stop_id = stop_id
        self.allowed = ALLOWED_CHECKS[opts.min_check]
        self.thresholds: dict[str, int | None] = {}
        """Per capped dataset: the largest order key kept (None: the cap keeps everything)."""

    # ---- exclusion -----------------------------------------------------------------------

    def exclusion(self, dataset: str, record: Record | Damaged) -> str | None:
        """Why this record is not exported (None: it is; never for a damaged line). Raises
        BrokenRow for a record that cannot become a row, unless --skip-broken."""
        if isinstance(record, Damaged):
            return self._broken(dataset, record.id, damaged_problem(record))
        broken = structure_problem(record)
        if broken:
            return self._broken(dataset, record.id, broken)
        if self.opts.exclude_truncated and record.finish_reason in CUT_OFF:
            return "truncated"
        check = record.token_check
        if check not in self.allowed:
            return f"token_check:{check}"
        if self.opts.checks:
            problems = audit_problems(record, self.stop_id)
            if problems:
                return f"check:{problems[0]}"
        return self.length_exclusion(record)

    def _broken(self, dataset: str, rid: Any, problem: str) -> str:
        if self.opts.skip_broken:
            return "broken_row"
        raise BrokenRow(f"record {rid!r} (dataset {dataset}): {problem}")

    def length_exclusion(self, record: Record) -> str | None:
        max_len = self.opts.max_len
        if max_len is None:
            return None
        prompt_len = len(record.input_ids)
        if self.opts.overlong is Overlong.drop:
            return "over_max_len" if prompt_len + len(record.output_ids) > max_len else None
        # Truncating keeps the prompt whole: a prompt that fills max_len leaves no answer.
        return "prompt_fills_max_len" if prompt_len >= max_len else None

    # ---- copies, order, split ------------------------------------------------------------

    def copies(self, dataset: str, rid: str) -> int:
        weight = self.opts.weights.get(dataset, 1.0)
        whole = math.floor(weight)
        frac = weight - whole
        extra = 1 if frac > 0 and uniform(self.opts.seed, "weight", rid) < frac else 0
        return whole + extra

    def split(self, rid: str) -> str:
        if self.opts.val_fraction > 0 and uniform(self.opts.seed, "split", rid) < \
                self.opts.val_fraction:
            return "validation"
        return "train"

    def order_keys(self, dataset: str, rid: str) -> list[int]:
        return [hash64(self.opts.seed, "order", rid, c) for c in range(self.copies(dataset, rid))]

    def picks(self, dataset: str, rid: str) -> list[Pick]:
        """The rows an eligible record becomes, after its dataset's weight and cap."""
        keys = self.order_keys(dataset, rid)
        if not keys:
            return []
        capped = dataset in self.thresholds
        limit = self.thresholds.get(dataset)
        split = self.split(rid)
        return [Pick(k, c, split) for c, k in enumerate(keys)
                if not capped or (limit is not None and k <= limit)]


class CapFinder:
    """First pass for caps: the N smallest order keys of a dataset, in bounded memory."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._kept = np.empty(0, dtype=np.uint64)
        self._pending: list[int] = []

    def add(self, keys: list[int]) -> None:
        self._pending.extend(keys)
        if len(self._pending) >= max(4096, self.cap):
            self._compact()

    def _compact(self) -> None:
        merged = np.concatenate([self._kept, np.array(self._pending, dtype=np.uint64)])
        self._pending.clear()
        if len(merged) > self.cap:
            merged = np.partition(merged, self.cap - 1)[: self.cap] if self.cap else merged[:0]
        self._kept = merged

    def threshold(self) -> int | None:
        """The largest key kept; None when the cap keeps nothing."""
        self._compact()
        if len(self._kept) == 0:
            return None
        return int(self._kept.max())
