"""An answer's upstream provider and quantization against its backend's OpenRouter provider
routing: the run flags an answer as it writes it, the audit judges it by the same rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _slug(name: Any) -> str:
    return str(name).lower().replace(" ", "").replace("-", "").replace("_", "")


def routing_problems(served: Mapping[str, Any], routing: Mapping[str, Any] | None
                     ) -> list[str]:
    """`served_problems` of an answer's {"provider", "quantization", "flags"} (the run's
    dict, before the answer is a record)."""
    return served_problems(served.get("provider"), served.get("quantization"),
                           served.get("flags"), routing)


def served_problems(provider: Any, quant: Any, flags: Any, routing: Mapping[str, Any] | None
                    ) -> list[str]:
    """The answer's upstream provider and quantization against the backend's OpenRouter
    provider routing (`ignore`, `only`, `quantizations`) and the run's flag."""
    problems = []
    excluded = "provider_excluded_by_config" in (flags or [])
    if routing and provider:
        slug = _slug(provider)
        only = {_slug(n) for n in routing.get("only") or []}
        excluded |= slug in {_slug(n) for n in routing.get("ignore") or []}
        excluded |= bool(only) and slug not in only
    if excluded:
        problems.append("provider_excluded")
    allowed = routing.get("quantizations") if routing else None
    if quant and allowed and _slug(quant) not in {_slug(q) for q in allowed}:
        problems.append("quantization_excluded")
    return problems
