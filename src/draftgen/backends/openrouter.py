"""OpenRouter: the `openrouter` type. The chat protocol of `OpenAIChatBackend`, plus what this
hosted API offers: each answer's cost in its usage, the bill of one generation asked afterwards
by its ID (`GET /generation`), and a listing of each model's price (`GET /models`) and of the
providers serving it with their quantizations (`GET /models/MODEL/endpoints`)."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import orjson

from draftgen.backends.base import Backend, Capabilities, wire_cost
from draftgen.backends.openai_chat import ChatBackendConfig, OpenAIChatBackend
from draftgen.backends.reach import BackendUnreachable, connection_reason, unreachable_text
from draftgen.config.backends import Price, register
from draftgen.urls import join_url, without_path_suffix


@register
class OpenRouterConfig(ChatBackendConfig):
    type: Literal["openrouter"]
    provider: dict[str, Any] | None = None
    """OpenRouter provider routing object, passed through unchanged."""

    bills_by_default: ClassVar[bool] = True

    def backend_class(self) -> type[Backend]:
        return OpenRouterBackend

    @property
    def provider_routing(self) -> dict[str, Any] | None:
        return self.provider

    @property
    def request_reasoning(self) -> dict[str, Any] | None:
        return self.reasoning or {"enabled": True}


class OpenRouterBackend(OpenAIChatBackend):
    capabilities = Capabilities(native_ids=False, needs_prompt_ids=False, reports_cost=True,
                                looks_up_bills=True, hosted=True)

    @property
    def api_root(self) -> str:
        """The API's base URL (`.../api/v1`, its query string kept)."""
        return without_path_suffix(self.url, "/chat/completions")

    async def billed_usd(self, generation_id: str) -> float | None:
        """What OpenRouter billed for a generation (`GET /generation?id=`: `total_cost`);
        None where it does not say (no such record yet, a failure)."""
        data = await self._get_data(join_url(self.api_root, "/generation", {"id": generation_id}))
        cost = data.get("total_cost") if isinstance(data, dict) else None
        return wire_cost(cost)

    async def listed_price(self) -> Price | None:
        """The /models listing: `pricing.prompt` / `pricing.completion` in USD per token, for
        the configured model; None without a listing (the caller decides whether that is
        fatal). A server that cannot be reached is BackendUnreachable, not a missing price."""
        listing = await self._get_data(join_url(self.api_root, "/models"), unreachable=True)
        return price_from_listing(listing, self.model.name)

    async def listed_quantizations(self) -> dict[str, str]:
        """Each provider's quantization of the model (`GET /models/MODEL/endpoints`)."""
        data = await self._get_data(
            join_url(self.api_root, f"/models/{self.model.name}/endpoints"))
        endpoints = data.get("endpoints") if isinstance(data, dict) else None
        out: dict[str, str] = {}
        for entry in endpoints if isinstance(endpoints, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("provider_name"), str):
                out[entry["provider_name"]] = str(entry.get("quantization") or "unknown")
        return out

    async def _get_data(self, url: str, unreachable: bool = False) -> Any:
        """The `data` of a GET's JSON answer; None on any failure (what these lookups say is
        informative, or its absence is handled by the caller), but with `unreachable`, a
        connection failure is BackendUnreachable."""
        try:
            async with self.session.get(url) as resp:
                if resp.status != 200:
                    return None
                answer = orjson.loads(await self.read_body(resp))
        except Exception as e:  # unknown stays unknown
            reason = connection_reason(e)
            if unreachable and reason is not None:
                raise BackendUnreachable(unreachable_text(
                    self.name, url, reason, f"{type(e).__name__}: {e}")) from None
            return None
        return answer.get("data") if isinstance(answer, dict) else None


def price_from_listing(models: Any, model: str) -> Price | None:
    """The price of `model` in the /models listing's `data`."""
    for entry in models if isinstance(models, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            pricing = entry.get("pricing")
            if not isinstance(pricing, dict):
                return None
            prompt, completion = (wire_cost(pricing.get(part)) for part in ("prompt", "completion"))
            if not (_a_price(prompt) and _a_price(completion)):
                return None  # a price that is no price is no listing
            assert prompt is not None and completion is not None
            return Price(prompt=prompt * 1e6, completion=completion * 1e6)
    return None


def _a_price(per_token: float | None) -> bool:
    return per_token is not None and math.isfinite(per_token * 1e6) and per_token >= 0
