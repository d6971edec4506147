"""A dataset's `sampling_mix`: one weighted sampling setting drawn per conversation.

The draw depends on the run's seed and the conversation's ID only: the same conversation gets
the same setting in every run with that seed, whatever order it is sent in, whichever shard
sends it, and after any resume. It is a point in [0, 1) hashed from (seed, ID), placed on the
cumulative weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from draftgen.config import SamplingChoice

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
    point = unit_draw(seed, conversation_id) * sum(c.weight for c in mix)
    total = 0.0
    for choice in mix:
        total += choice.weight
        if point < total:
            return choice
    return mix[-1]  # rounding: the point fell on the total


def sampling_for(mix: Sequence[SamplingChoice] | None, seed: int | None,
                 conversation_id: str) -> dict[str, Any]:
    """The sampling keys the conversation's draw sets ({} without a mix): recorded on every
    answer of the conversation, and laid over the run's `sampling` for its requests."""
    if not mix:
        return {}
    return choose(mix, seed, conversation_id).settings()
