"""llama.cpp's `llama-server`: the `llamacpp` backend type, two endpoints.

- `endpoint: native` (default): `POST /completion` with the prompt as the token IDs rendered by
  draftgen's format and `return_tokens: true`; the engine's sampled IDs come back in `tokens`.
  The exact path, like SGLang's `/generate`.
- `endpoint: chat`: the OpenAI chat endpoint (`OpenAIChatBackend`), asking for
  `logprobs: true, top_logprobs: 1` (the least that gets entries): llama-server puts each
  sampled token's `id` and `bytes` in its logprob entry, so the IDs can be recovered without
  re-encoding the text.

A backend with `model:` instead of `url:` runs on a server draftgen starts
(`backends/managed_llamacpp.py`); by the time a backend is made its config carries that URL.

Response fields of `/completion` (llama-server b11434, tools/server/server-task.cpp):
`content`, `tokens`, `id_slot`, `stop`, `model`, `tokens_predicted`, `tokens_evaluated`,
`generation_settings`, `prompt`, `has_new_line`, `truncated`, `stop_type`
("none" | "eos" | "word" | "limit"), `stopping_word`, `tokens_cached`, `timings`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from draftgen.assets import resolve_builtin
from draftgen.backends.base import Backend, Capabilities, RequestContext
from draftgen.backends.openai_chat import ChatBackendConfig, OpenAIChatBackend
from draftgen.config import ModelConfig, SamplingConfig
from draftgen.config.backends import register
from draftgen.types import BackendError, Prompt, RawAnswer, Usage
from draftgen.urls import join_url


@register
class LlamaCppConfig(ChatBackendConfig):
    """llama.cpp's `llama-server`: one that runs (`url`) or one draftgen starts (`model`)."""

    type: Literal["llamacpp"]
    endpoint: Literal["native", "chat"] = "native"
    """"native" (`/completion`, prompt as IDs, engine IDs back) or "chat" (OpenAI
    `/v1/chat/completions`, IDs recoverable from logprobs)."""
    model: str | None = None
    """A GGUF file; draftgen starts and stops its own llama-server for it (backends with the
    same model and server_args share one server)."""
    server_args: list[str] = Field(default_factory=list)
    """With `model` only: extra llama-server flags (e.g. ["--threads", "4"])."""

    def backend_class(self) -> type[Backend]:
        return LlamaCppChatBackend if self.endpoint == "chat" else LlamaCppNativeBackend

    @field_validator("model")
    @classmethod
    def _resolve_model(cls, path: str | None) -> str | None:
        return resolve_builtin(path) if path is not None else None

    def _check_url(self) -> None:
        if (self.url is None) == (self.model is None):
            raise ValueError("llamacpp: give exactly one of url (a running llama-server) "
                             "or model (a GGUF file: draftgen starts the server)")
        if self.server_args and self.model is None:
            raise ValueError("server_args: only with model (a server draftgen starts)")

    @property
    def starts_own_server(self) -> bool:
        return self.model is not None and self.url is None


# llama-server `stop_type` → OpenAI finish_reason (the same mapping its own chat endpoint uses).
_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}


def _base_url(cfg: LlamaCppConfig) -> str:
    if cfg.url is None:
        raise BackendError(
            "not_started",
            f"backend {cfg.name!r}: no url; a llamacpp backend with `model:` needs its managed "
            "server started first (managed_llamacpp.ManagedServers)",
            retryable=False, permanent_for_backend=True,
        )
    return cfg.url


class LlamaCppNativeBackend(Backend):
    """`POST /completion` with token IDs in, token IDs out."""

    capabilities = Capabilities(native_ids=True, needs_prompt_ids=True)
    cfg: LlamaCppConfig

    def __init__(self, cfg: LlamaCppConfig, model: ModelConfig, sampling: SamplingConfig
                 ) -> None:
        super().__init__(cfg, model, sampling)
        self.url = join_url(_base_url(cfg), "/completion")

    def build_body(self, input_ids: list[int], max_tokens: int,
                   sampling: SamplingConfig | None = None) -> dict[str, Any]:
        s = sampling or self.sampling
        body: dict[str, Any] = {
            "prompt": input_ids,
            "n_predict": max_tokens,
            "return_tokens": True,
            "cache_prompt": True,
            "stream": False,
        }
        for key in ("temperature", "top_p", "top_k", "seed"):
            value = getattr(s, key)
            if value is not None:
                body[key] = value
        body.update(s.extra)
        body.update(self.cfg.extra_body)
        return body

    async def _send(self, prompt: Prompt, input_ids: list[int], max_tokens: int,
                    ctx: RequestContext) -> RawAnswer:
        data, _ = await self.post_json(self.url, self.build_body(input_ids, max_tokens,
                                                                 ctx.sampling), ctx)
        return answer_from_completion(data)


def answer_from_completion(data: Any) -> RawAnswer:
    if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
        raise BackendError("bad_response", "/completion answer has no tokens list "
                           "(is return_tokens supported by this llama-server?)", retryable=True)
    stop_type = data.get("stop_type")
    finish = _FINISH.get(stop_type) if isinstance(stop_type, str) else None
    if finish is None:
        raise BackendError("bad_response", f"/completion answer with stop_type {stop_type!r}",
                           retryable=True)
    tokens = data["tokens"]
    if not tokens:
        raise BackendError("empty_answer", "/completion returned no tokens", retryable=True)
    timings = data.get("timings") if isinstance(data.get("timings"), dict) else {}
    cached = timings.get("cache_n")
    return RawAnswer(
        finish_reason=finish,
        usage=Usage(
            prompt_tokens=_int(data.get("tokens_evaluated")),
            completion_tokens=_int(data.get("tokens_predicted")),
            cached_tokens=_int(cached),
        ),
        model=data.get("model") if isinstance(data.get("model"), str) else None,
        output_ids=tokens,
        text=data.get("content") if isinstance(data.get("content"), str) else None,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class LlamaCppChatBackend(OpenAIChatBackend):
    """The OpenAI chat endpoint of llama-server, with per-token logprobs (IDs and bytes)."""

    cfg: LlamaCppConfig

    def __init__(self, cfg: LlamaCppConfig, model: ModelConfig, sampling: SamplingConfig
                 ) -> None:
        _base_url(cfg)
        super().__init__(cfg, model, sampling)

    def build_body(self, prompt: Prompt, max_tokens: int,
                   sampling: SamplingConfig | None = None) -> dict[str, Any]:
        body = super().build_body(prompt, max_tokens, sampling)
        # The base class asks for logprobs when `logprobs: true` (the default); `logprobs:
        # false` gives the text-only path (IDs reconstructed from text). llama-server needs
        # `top_logprobs` >= 1: it takes it as `n_probs`, 20 when absent, and reports no entries
        # at all with 0 (server-common.cpp, server-context.cpp). 1 is the least it sends.
        if body.get("logprobs"):
            body.setdefault("top_logprobs", 1)
        return body

