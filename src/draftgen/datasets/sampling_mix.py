"""A dataset's `sampling_mix`: one weighted sampling setting drawn per conversation.

The draw depends on the run's seed and the conversation's ID only: the same conversation gets
the same setting in every run with that seed, whatever order it is sent in, whichever shard
sends it, and after any resume. It is a point in [0, 1) hashed from (seed, ID), placed on the
cumulative weights (scaled by a power of two first, exactly, so that weights near the float
limit do not add up to infinity).

A mix is checked when its dataset is read (`check_mix`): every weight finite, and no
`max_tokens` over the dataset's `max_output_tokens`, which a conversation could never be sent
with (a conversation's turn waits for its whole `max_tokens` of the budget, so it would end
with no turn and only a budget message).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from draftgen.config import DatasetConfig, SamplingChoice
from draftgen.datasets.errors import DatasetError

_SCALE = float(2**64)


def unit_draw(seed: int | None, conversation_id: str) -> float:
    """A number in [0, 1), uniform over IDs, fixed by (seed, ID)."""
    key = f"{seed}\x00{conversation_id}".encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(key, digest_size=8, person=b"sampling-mix").digest()
    return int.from_bytes(digest, "big") / _SCALE


def choose(mix: Sequence[SamplingChoice], seed: int | None, conversation_id: str
           ) -> SamplingChoice:
    """The conversation's choice: choice i with probability weight_i / sum of weights."""
    if not mix:
        raise ValueError("sampling_mix: no choice to draw from")
    weights = _scaled_weights([c.weight for c in mix])
    point = unit_draw(seed, conversation_id) * sum(weights)
    total = 0.0
    for choice, weight in zip(mix, weights, strict=True):
        total += weight
        if point < total:
            return choice
    return mix[-1]  # rounding: the point fell on the total


def _scaled_weights(weights: list[float]) -> list[float]:
    """The weights divided by the power of two just above the largest: each below 1, their
    sum finite, and the draws those of the unscaled weights wherever those did not overflow
    (a power-of-two scale changes no rounding)."""
    if not all(math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"sampling_mix: weights must be finite and above 0, got {weights}")
    exponent = math.frexp(max(weights))[1]
    return [math.ldexp(w, -exponent) for w in weights]


def check_mix(cfg: DatasetConfig) -> None:
    """`DatasetError` naming the key for a mix a run cannot draw from or send: a weight that
    is not finite, or a `max_tokens` over the dataset's `max_output_tokens`."""
    for i, choice in enumerate(cfg.sampling_mix or []):
        key = f"datasets[{cfg.name}].sampling_mix[{i}]"
        if not math.isfinite(choice.weight):
            raise DatasetError(f"{key}.weight: must be a finite number, got {choice.weight}")
        budget = cfg.max_output_tokens
        if choice.max_tokens is not None and budget is not None and choice.max_tokens > budget:
            raise DatasetError(
                f"{key}.max_tokens: {choice.max_tokens:,} is over the dataset's "
                f"max_output_tokens ({budget:,}): a conversation's turn waits for its whole "
                "max_tokens of the budget, so none could be sent; lower it")


def sampling_for(mix: Sequence[SamplingChoice] | None, seed: int | None,
                 conversation_id: str) -> dict[str, Any]:
    """The sampling keys the conversation's draw sets ({} without a mix): recorded on every
    answer of the conversation, and laid over the run's `sampling` for its requests."""
    if not mix:
        return {}
    return choose(mix, seed, conversation_id).settings()
