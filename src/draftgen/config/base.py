"""What every config model shares: strict validation, `ConfigError`, the limits of a count,
and the request keys no config may set. Below `config` (the run-level models) and the backend
types' config models (`backends.registry`), which both build on it."""

from __future__ import annotations

import difflib
import math
import typing
from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, field_validator

from draftgen.errors import DraftgenError


class ConfigError(DraftgenError):
    """A config that cannot be used; the message names the file and the key."""


INT64_MAX = 2**63 - 1
TOKENS_MAX = 2**31 - 1
"""The most tokens a count can say: engines and APIs hold token counts as 32-bit integers."""
MANAGED_BODY_KEYS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "max_new_tokens", "n_predict",
    "n", "stream", "stream_options", "logprobs", "input_ids", "prompt", "text",
    "return_token_ids", "return_tokens", "sampling_params",
})
"""Request keys draftgen sets itself (the clamped answer length, the prompt and its IDs, one
streamed or not answer with logprobs): `sampling.extra` or `extra_body` overriding one would
break the budget (`max_tokens` is what the reservation counts on) or the token-exact record."""


def refuse_managed_keys(extra: dict[str, Any]) -> dict[str, Any]:
    managed = sorted(MANAGED_BODY_KEYS & set(extra))
    if managed:
        raise ValueError(
            f"{', '.join(managed)}: set by draftgen itself on every request (the answer length "
            "from sampling.max_tokens and the budgets, the prompt, stream and logprobs from "
            "the backend's settings); remove them from here")
    return extra


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's annotation holds: itself, or those inside `X | None`, unions,
    `list[X]`, `dict[str, X]` and `Annotated[X, ...]`."""
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def keys_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys allowed at `loc` inside `model`, a validation error's location: each name a
    field of a model below steps into that field's models; a list index, a dict's key or a
    union member's name (pydantic puts the member's class or tag in the location) does not."""
    models = [model]
    for part in loc:
        if isinstance(part, int):
            continue
        inner = [m for owner in models if part in owner.model_fields
                 for m in models_in(owner.model_fields[part].annotation)]
        member = [m for m in models if part in (m.__name__, *_tags(m))]
        models = inner or member or models
    return sorted({key for m in models for key in m.model_fields})


def _tags(model: type[BaseModel]) -> tuple[Any, ...]:
    """The values of the model's `type: Literal[...]` key, which a discriminated union names it
    by."""
    field = model.model_fields.get("type")
    return typing.get_args(field.annotation) if field is not None else ()


def unknown_key(model: type[BaseModel], loc: Sequence[int | str]) -> str:
    """What to say of the key at `loc` (inside `model`) that no model there takes: the allowed
    key closest to it, if one is close."""
    close = difflib.get_close_matches(str(loc[-1]), keys_at(model, loc[:-1]), n=1)
    return f"unknown key; did you mean `{close[0]}`?" if close else "unknown key (typo?)"


def error_text(message: str) -> str:
    """A pydantic error message without the prefix it gives a validator's ValueError."""
    return message.removeprefix("Value error, ")


def non_finite(value: Any) -> float | None:
    """The first NaN or infinity inside a JSON-like value (dicts, lists), None if none."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


class StrictModel(BaseModel):
    """Unknown keys are errors, and values are not coerced across types: `concurrency: true`
    or `max_tokens: 1e20` is refused, not taken as 1 or as a float made an integer. Every
    number is finite: YAML's `.nan` and `.inf` are refused in any field (`allow_inf_nan`) and
    inside free-form objects (`sampling.extra`, `extra_body`, ...), where JSON would send them
    as `null`; no key takes infinity for "no limit" (each says how to turn it off)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _fits_in_64_bits(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
            raise ValueError(f"must be at most {INT64_MAX:,} in size")
        if isinstance(value, dict) and value and not isinstance(value, BaseModel):
            try:  # free-form objects go into request bodies and run.json as JSON
                orjson.dumps(value)
            except orjson.JSONEncodeError as e:
                raise ValueError(f"cannot be sent as JSON: {e}") from None
            bad = non_finite(value)
            if bad is not None:  # orjson writes NaN and infinity as null
                raise ValueError(f"holds {bad}: every number must be finite")
        return value
