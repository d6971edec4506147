"""Errors and bad-row reports shared by the dataset modules."""

from __future__ import annotations

from dataclasses import dataclass

from draftgen.errors import DraftgenError


class DatasetError(DraftgenError):
    """A dataset that cannot be read at all: missing or unreadable file, unknown format,
    unreachable hub. The message names the path."""


class BadRowError(DraftgenError):
    """One row that cannot become a prompt; `reason` says what is wrong with it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class BadRow:
    """A row that was skipped: where it is ("path:line" or "path[row N]") and why."""

    source: str
    reason: str


def type_name(value: object) -> str:
    """The JSON-ish name of a value's type, for error messages."""
    if value is None:
        return "null"
    return type(value).__name__


def clip(text: str, limit: int = 200) -> str:
    """`text` cut to `limit` characters, so one huge value cannot flood a report."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
