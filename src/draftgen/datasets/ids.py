"""Stable prompt IDs and duplicate detection.

A row's ID is its own `id`/`idx`/`uuid`/`conversation_id`/`prompt_id` when it has one, else
"h" + the first 16 hex digits of the SHA-256 of its canonical content (messages and tools as
JSON with sorted keys). IDs depend only on the row (and, for an own-ID clash, on the row's
content), so two loads of the same data give the same IDs. Only 16-byte digests are remembered.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from draftgen.datasets.errors import BadRowError
from draftgen.types import Message, Tool

OWN_ID_FIELDS = ("id", "idx", "uuid", "conversation_id", "prompt_id")
DIGEST_BYTES = 16


@dataclass(frozen=True, slots=True)
class RowIdentity:
    own_id: str | None
    """The row's own ID field, as a string; None when it has none."""
    content_sha256: bytes
    """SHA-256 of the canonical (messages, tools)."""

    @property
    def content_id(self) -> str:
        return "h" + self.content_sha256.hex()[:16]

    @property
    def row_id(self) -> str:
        return self.own_id if self.own_id is not None else self.content_id

    @property
    def content_digest(self) -> bytes:
        return self.content_sha256[:DIGEST_BYTES]


def row_identity(
    row: dict[str, Any], messages: list[Message], tools: list[Tool] | None
) -> RowIdentity:
    return RowIdentity(own_row_id(row), content_sha256(messages, tools))


def own_row_id(row: dict[str, Any]) -> str | None:
    """The first own-ID field that holds a non-empty string or an integer."""
    for field in OWN_ID_FIELDS:
        value = row.get(field)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def content_sha256(messages: list[Message], tools: list[Tool] | None) -> bytes:
    try:
        canonical = orjson.dumps([messages, tools], option=orjson.OPT_SORT_KEYS)
    except TypeError as e:
        raise BadRowError(f"content cannot be written as JSON: {e}") from None
    return hashlib.sha256(canonical).digest()


@dataclass(frozen=True, slots=True)
class AssignedId:
    row_id: str
    collided: bool
    """The row's own ID was already taken by a row with other content; `row_id` has a suffix."""


class IdAssigner:
    """Hands out unique row IDs within one dataset and spots exact duplicates."""

    def __init__(self) -> None:
        self._seen_contents: set[bytes] = set()
        self._taken_ids: set[bytes] = set()

    def assign(self, identity: RowIdentity) -> AssignedId | None:
        """The row's ID, or None when the same content was seen before (an exact duplicate)."""
        if identity.content_digest in self._seen_contents:
            return None
        self._seen_contents.add(identity.content_digest)
        row_id = identity.row_id
        collided = self._is_taken(row_id)
        if collided:
            row_id = self._free_variant(f"{row_id}-{identity.content_id}")
        self._taken_ids.add(_id_digest(row_id))
        return AssignedId(row_id, collided)

    def _is_taken(self, row_id: str) -> bool:
        return _id_digest(row_id) in self._taken_ids

    def _free_variant(self, row_id: str) -> str:
        candidate, counter = row_id, 1
        while self._is_taken(candidate):
            counter += 1
            candidate = f"{row_id}-{counter}"
        return candidate


def _id_digest(row_id: str) -> bytes:
    return hashlib.blake2b(
        row_id.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES
    ).digest()


def content_digest(messages: list[Message], tools: list[Tool] | None) -> bytes:
    """What a prompt's content is, short: compared between a dataset row and the answer a run
    stored for its ID (which keeps the messages and tools it was asked with) to tell a row
    edited under a known ID. No tools and an empty tools list are the same content."""
    return content_sha256(messages, tools or None)[:DIGEST_BYTES]
