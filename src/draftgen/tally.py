"""The counts every per-dataset (and per-backend, per-provider) total of answers repeats: the
write path's live counters (`progress.DatasetCounters`) and the readers' (`status`, `report`)
are each a `Tally` and what is their own."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Tally:
    answers: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0
    """US dollars."""

    def add(self, other: Tally) -> None:
        self.answers += other.answers
        self.output_tokens += other.output_tokens
        self.reasoning_tokens += other.reasoning_tokens
        self.cost += other.cost

