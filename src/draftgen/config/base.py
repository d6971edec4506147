"""What every config model shares: strict validation, `ConfigError`, the limits of a count,
and the request keys no config may set. Below `config` (the run-level models) and the backend
types' config models (`backends.registry`), which both build on it."""

from __future__ import annotations

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


class StrictModel(BaseModel):
    """Unknown keys are errors, and values are not coerced across types: `concurrency: true`
    or `max_tokens: 1e20` is refused, not taken as 1 or as a float made an integer."""

    model_config = ConfigDict(extra="forbid", strict=True)

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
        return value
