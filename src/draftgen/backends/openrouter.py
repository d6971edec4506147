"""OpenRouter: the `openrouter` type. The chat protocol of `OpenAIChatBackend`, plus what this
hosted API offers: each answer's cost in its usage, the bill of one generation asked afterwards
by its ID (`GET /generation`), and a listing of each model's price (`GET /models`) and of the
providers serving it with their quantizations (`GET /models/MODEL/endpoints`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import orjson

from draftgen.backends.base import Backend, Capabilities
from draftgen.backends.openai_chat import ChatBackendConfig, OpenAIChatBackend
from draftgen.config.backends import Price, register


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
        """The API's base URL (`.../api/v1`)."""
        return self.url.rsplit("/chat/completions", 1)[0]

    async def billed_usd(self, generation_id: str) -> float | None:
        """What OpenRouter billed for a generation (`GET /generation?id=`: `total_cost`);
        None where it does not say (no such record yet, a failure)."""
        data = await self._get_data(f"{self.api_root}/generation", {"id": generation_id})
        cost = data.get("total_cost") if isinstance(data, dict) else None
        return float(cost) if isinstance(cost, int | float) and cost >= 0 else None

    async def listed_price(self) -> Price | None:
        """The /models listing: `pricing.prompt` / `pricing.completion` in USD per token, for
        the configured model; None without a listing (the caller decides whether that is
        fatal)."""
        return price_from_listing(await self._get_data(f"{self.api_root}/models"),
                                  self.model.name)

    async def listed_quantizations(self) -> dict[str, str]:
        """Each provider's quantization of the model (`GET /models/MODEL/endpoints`)."""
        data = await self._get_data(f"{self.api_root}/models/{self.model.name}/endpoints")
        endpoints = data.get("endpoints") if isinstance(data, dict) else None
        out: dict[str, str] = {}
        for entry in endpoints if isinstance(endpoints, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("provider_name"), str):
                out[entry["provider_name"]] = str(entry.get("quantization") or "unknown")
        return out

    async def _get_data(self, url: str, params: dict[str, str] | None = None) -> Any:
        """The `data` of a GET's JSON answer; None on any failure (what these lookups say is
        informative, or its absence is handled by the caller)."""
        try:
            async with self.session.get(url, params=params) as resp:
                if resp.status != 200:
                    return None
                answer = orjson.loads(await self.read_body(resp))
        except Exception:  # unknown stays unknown
            return None
        return answer.get("data") if isinstance(answer, dict) else None


def price_from_listing(models: Any, model: str) -> Price | None:
    """The price of `model` in the /models listing's `data`."""
    for entry in models if isinstance(models, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            pricing = entry.get("pricing") or {}
            try:
                return Price(prompt=float(pricing["prompt"]) * 1e6,
                             completion=float(pricing["completion"]) * 1e6)
            except (KeyError, TypeError, ValueError):
                return None
    return None
