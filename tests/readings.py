"""Shared by the tests that compare two readings of the same wire bytes (typed and generic)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftgen.types import BackendError


def outcome(read: Callable[[], Any]) -> tuple[Any, ...]:
    """What a reading gave: the answer, or the error with everything it carries."""
    try:
        return ("answer", read())
    except BackendError as e:
        return ("error", e.kind, e.message, e.retryable, e.status, e.usage,
                e.permanent_for_backend)
    except Exception as e:  # input the generic reading cannot handle either: the same failure
        return ("crash", type(e).__name__, str(e))
