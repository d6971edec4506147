"""What a probe is asked to do; a light module, so the command-line tool can use it without
importing the backends."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_TOKENS = 512


@dataclass(frozen=True)
class ProbeOptions:
    max_tokens: int = DEFAULT_MAX_TOKENS
    """Per probe request: small, as they cost money on paid backends."""
    force: bool = False
    """Probe again even where run.json holds a result with the same key."""
