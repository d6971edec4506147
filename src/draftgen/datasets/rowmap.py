"""A dataset's `rows:` mapping applied to its rows: each row in the dataset's own schema becomes
one in the schema `datasets.schema` reads (`messages`, `system`, `tools`, the row's own ID),
and rows that a `drop` rule matches are left out before they count as rows.

The mapping is data (config.RowMapping, written by a preset or by hand), so a dataset needs no
code of its own: name the conversation field, template a prompt and an answer from `{field}`s,
rename roles, leave roles out, drop rows by a field's value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from draftgen.config import DatasetConfig, DropRule, RowMapping
from draftgen.datasets.admission import LoadStats
from draftgen.datasets.errors import BadRow, BadRowError, clip, type_name
from draftgen.datasets.ids import OWN_ID_FIELDS
from draftgen.datasets.readers import Row, RowStream

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
"""`{field}`, or `{{`/`}}` for a literal brace."""


def mapped_stream(rows: RowStream, cfg: DatasetConfig, stats: LoadStats | None) -> RowStream:
    """`rows` through the dataset's mapping: dropped rows left out (counted in
    `stats.dropped`), others reshaped, a row the mapping cannot read turned into a `BadRow`.
    The stream itself when the dataset has no mapping."""
    if cfg.rows is None:
        return rows
    return _mapped(rows, cfg.rows, stats)


def _mapped(rows: RowStream, mapping: RowMapping, stats: LoadStats | None) -> RowStream:
    try:
        for item in rows:
            if isinstance(item, BadRow):
                yield item
                continue
            mapped = map_row(item, mapping)
            if mapped is None:
                if stats is not None:
                    stats.dropped += 1
                continue
            yield mapped
    finally:
        rows.close()


def map_row(row: Row, mapping: RowMapping) -> Row | BadRow | None:
    """The row reshaped by `mapping` (its place kept), a `BadRow` saying what the mapping
    could not read, or None when a drop rule leaves it out."""
    data = row.data
    if not isinstance(data, dict):
        return row  # schema reports it
    if any(_drops(data, rule) for rule in mapping.drop):
        return None
    if mapping.messages is None and mapping.prompt is None:
        return row
    try:
        shaped = reshape(data, mapping)
    except BadRowError as e:
        return BadRow(row.source, e.reason)
    return Row(row.source, shaped, row.at)


def _drops(data: dict[str, Any], rule: DropRule) -> bool:
    value = data.get(rule.field)
    if rule.one_of is not None:
        return value in rule.one_of
    assert rule.not_one_of is not None
    return value not in rule.not_one_of


def reshape(data: dict[str, Any], mapping: RowMapping) -> dict[str, Any]:
    """The row in the schema `datasets.schema` reads; `BadRowError` naming the field the
    mapping could not read."""
    out: dict[str, Any] = {k: data[k] for k in OWN_ID_FIELDS if data.get(k) is not None}
    messages: list[dict[str, Any]] = []
    if mapping.messages is not None:
        messages += _messages(data, mapping)
    if mapping.prompt is not None:
        messages.append({"role": "user", "content": fill(mapping.prompt, data)})
    if mapping.answer is not None:
        messages.append({"role": "assistant", "content": fill(mapping.answer, data)})
    out["messages"] = messages
    for key, field in (("system", mapping.system), ("tools", mapping.tools)):
        if field is not None and data.get(field) is not None:
            out[key] = data[field]
    return out


def _messages(data: dict[str, Any], mapping: RowMapping) -> Iterator[dict[str, Any]]:
    field = mapping.messages
    assert field is not None
    raw = data.get(field)
    if not isinstance(raw, list):
        raise BadRowError(f"field {field!r} must be a list of messages, got {type_name(raw)}")
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise BadRowError(f"field '{field}[{index}]' must be an object, "
                              f"got {type_name(message)}")
        renamed = _renamed(message, mapping.roles)
        if renamed.get("role") not in mapping.skip_roles:
            yield renamed


def _renamed(message: dict[str, Any], roles: dict[str, str]) -> dict[str, Any]:
    """The message with `role`/`content` keys (a from/value one converted), its role renamed."""
    out = {k: v for k, v in message.items() if k not in ("from", "value")}
    role = message.get("role", message.get("from"))
    if isinstance(role, str):
        role = roles.get(role, role)
    out["role"] = role
    if out.get("content") is None and "value" in message:
        out["content"] = message["value"]
    return out


def fill(template: str, data: dict[str, Any]) -> str:
    """`template` with each `{field}` replaced by the row's value; `BadRowError` for a field
    that is missing or null."""
    def value(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        field = match.group(1)
        found = data.get(field)
        if found is None:
            raise BadRowError(f"field {clip(field, 60)!r} (in the template "
                              f"{clip(template, 60)!r}) is missing")
        return found if isinstance(found, str) else str(found)
    return _PLACEHOLDER.sub(value, template)

