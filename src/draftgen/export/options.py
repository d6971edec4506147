"""What `draftgen export` was asked to do."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from draftgen.errors import DraftgenError


class ExportError(DraftgenError):
    """The export cannot be done as asked; nothing was written to --out."""

    exit_code = 1


class ExportFormat(StrEnum):
    speculators = "speculators"
    specforge = "specforge"
    parquet = "parquet"
    trajectories = "trajectories"


class MinCheck(StrEnum):
    """The weakest token check an exported answer may have."""

    exact = "exact"
    """Native engine IDs only."""
    length_ok = "length_ok"
    """Also answers rebuilt from text whose length matched the engine's token count."""
    any = "any"
    """Also rebuilt answers whose length did not match or could not be checked."""


ALLOWED_CHECKS: dict[MinCheck, frozenset[str]] = {
    MinCheck.exact: frozenset({"exact"}),
    MinCheck.length_ok: frozenset({"exact", "length_ok"}),
    MinCheck.any: frozenset({"exact", "length_ok", "length_mismatch", "unverifiable"}),
}


class Overlong(StrEnum):
    drop = "drop"
    truncate = "truncate"


@dataclass
class ExportOptions:
    format: ExportFormat
    out: Path
    datasets: list[str] | None = None
    """Only these datasets (default: every dataset of the run)."""
    caps: dict[str, int] = field(default_factory=dict)
    """At most this many rows from a dataset (after weights): a seeded sample by hash."""
    weights: dict[str, float] = field(default_factory=dict)
    """Row multiplier per dataset (default 1): 0.5 keeps a seeded half, 2.5 writes every answer
    twice and a seeded half of them a third time."""
    exclude_truncated: bool = True
    min_check: MinCheck = MinCheck.length_ok
    checks: bool = True
    """Exclude answers failing the audit checks (export.checks.audit_problems)."""
    max_len: int | None = None
    overlong: Overlong = Overlong.drop
    seed: int = 0
    turn_dropout: float = 0.0
    """`turns: all` datasets: the probability that a conversation is cut after a seeded random
    number of turns (`export.branches.dropout_turns`)."""
    shuffle: bool = True
    val_fraction: float = 0.0
    jsonl: bool = False
    """speculators: also write JSONL next to the Arrow dataset."""
    text: bool = True
    """speculators: decode a `text` column with the run's tokenizer (when it loads)."""
    tokenizer: Path | None = None
    """Use this tokenizer instead of the one run.json names."""
    overwrite: bool = False
    skip_broken: bool = False
    """Exclude broken rows (counted) instead of failing."""
    batch_rows: int = 512
    bucket_bytes: int = 64 << 20
    """Shuffle: target size of one spill bucket (sorted in memory)."""
    max_buckets: int = 4096

    @property
    def splits(self) -> list[str]:
        return ["train", "validation"] if self.val_fraction > 0 else ["train"]

    def validate(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise ExportError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if not 0 <= self.turn_dropout <= 1:
            raise ExportError(f"--turn-dropout must be in [0, 1], got {self.turn_dropout}")
        if self.max_len is not None and self.max_len < 2:
            raise ExportError(f"--max-len must be at least 2, got {self.max_len}")
        for name, cap in self.caps.items():
            if cap < 0:
                raise ExportError(f"--cap {name}={cap}: must be >= 0")
        for name, weight in self.weights.items():
            if not math.isfinite(weight) or weight < 0:
                raise ExportError(f"--weight {name}={weight}: must be a finite number >= 0")


def parse_pairs(values: list[str] | None, what: str, kind: type[int] | type[float]
                ) -> dict[str, int] | dict[str, float]:
    """["a=3", "b=5"] → {"a": 3, "b": 5}; errors name the option."""
    out: dict = {}
    for value in values or []:
        name, sep, number = value.partition("=")
        if not sep or not name:
            raise ExportError(f"{what} {value!r}: expected NAME=NUMBER")
        try:
            out[name] = kind(number)
        except ValueError:
            raise ExportError(f"{what} {value!r}: {number!r} is not a valid number") from None
    return out
