"""JSON shapes the endpoints share, as OpenRouter sends them: `usage` (with cost), error
bodies, and the model and provider listings."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from decimal import Decimal

from draftgen.testing.fake_engine.config import Prices, ServerConfig
from draftgen.testing.fake_engine.faults import BILLED, ERRORS
from draftgen.testing.fake_engine.kinds import Json


@dataclass(frozen=True)
class ReplyContext:
    gen_id: str
    created: int
    provider: str
    started: float
    prompt_ids: list[int]


def usage_json(
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int,
    prices: Prices | None,
    reported_cost: float | str | None = None,
    as_text: bool = False,
) -> Json:
    usage: Json = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    if prices is not None:
        priced = prices.cost(prompt_tokens, completion_tokens)
        cost = priced if reported_cost is None else reported_cost
        usage["cost"] = str(cost) if as_text else cost
    return usage


def error_json(kind: str, ctx: ReplyContext, label: str, config: ServerConfig,
               auth: str = "") -> Json:
    """`auth`: the request's Authorization header, echoed when `config.echo_auth`."""
    spec = ERRORS[kind]
    metadata = dict(spec.metadata)
    if spec.code in (403, 408, 502):
        metadata["provider_name"] = ctx.provider
    if spec.code == 403:
        metadata |= {"flagged_input": label[:100], "model_slug": config.model}
    body: Json = {"error": {"code": spec.code, "message": echoed(spec.message, auth, config),
                            "metadata": metadata}}
    if kind in BILLED:
        body["usage"] = usage_json(len(ctx.prompt_ids), 0, 0, config.price, config.reported_cost,
                                   config.cost_as_text)
    return body


def echoed(message: str, auth: str, config: ServerConfig) -> str:
    return f"{message} (request headers: Authorization: {auth})" if config.echo_auth else message


def models_json(config: ServerConfig) -> Json:
    prices = config.listing

    def per_token(usd_per_million: float) -> str:
        return format(Decimal(str(usd_per_million)) / Decimal(1_000_000), "f")

    pricing = {"prompt": per_token(prices.prompt), "completion": per_token(prices.completion)}
    model = {
        "id": config.model,
        "name": config.model,
        "object": "model",
        "created": 0,
        "owned_by": "draftgen-test",
        "pricing": pricing,
        "context_length": config.context_length,
    }
    return {"object": "list", "data": [model]}


def endpoints_json(config: ServerConfig) -> Json:
    """OpenRouter's `GET /api/v1/models/MODEL/endpoints`: one entry per provider."""
    endpoints = [
        {
            "name": f"{provider} | {config.model}",
            "provider_name": provider,
            "quantization": config.quantizations.get(provider, "unknown"),
            "context_length": config.context_length,
            "pricing": models_json(config)["data"][0]["pricing"],
        }
        for provider in config.providers
    ]
    return {"data": {"id": config.model, "name": config.model, "endpoints": endpoints}}


def generation_id() -> str:
    return f"gen-{int(time.time())}-{uuid.uuid4().hex[:20]}"
