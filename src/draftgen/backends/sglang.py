"""SGLang native `/generate`: the exact path. The prompt goes out as token IDs rendered by
draftgen's own model format; `output_ids` come back as the engine sampled them."""

from __future__ import annotations

from typing import Any, Literal

from draftgen.backends.base import Backend, Capabilities, RequestContext
from draftgen.config import SamplingConfig
from draftgen.config.backends import BackendConfigBase, register
from draftgen.types import BackendError, Prompt, RawAnswer, Usage
from draftgen.urls import join_url


@register
class SGLangConfig(BackendConfigBase):
    """SGLang's native `/generate`: prompt IDs in, sampled IDs out."""

    type: Literal["sglang"]

    def backend_class(self) -> type[Backend]:
        return SGLangBackend


class SGLangBackend(Backend):
    capabilities = Capabilities(native_ids=True, needs_prompt_ids=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.cfg.url is not None, "validated: only a llamacpp backend may lack a url"
        self.url = join_url(self.cfg.url, "/generate")

    def build_body(self, input_ids: list[int], max_tokens: int,
                   sampling: SamplingConfig | None = None) -> dict[str, Any]:
        s = sampling or self.sampling
        params: dict[str, Any] = {"max_new_tokens": max_tokens}
        for key in ("temperature", "top_p", "top_k"):
            value = getattr(s, key)
            if value is not None:
                params[key] = value
        if s.seed is not None:
            params["sampling_seed"] = s.seed
        params.update(s.extra)
        return {"input_ids": input_ids, "sampling_params": params, "stream": False,
                **self.cfg.extra_body}

    async def _send(self, prompt: Prompt, input_ids: list[int], max_tokens: int,
                    ctx: RequestContext) -> RawAnswer:
        data, _ = await self.post_json(self.url, self.build_body(input_ids, max_tokens,
                                                                 ctx.sampling), ctx)
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        return answer_from_generate(data)


def _finish(meta: dict[str, Any]) -> tuple[str, int | None]:
    finish = meta.get("finish_reason")
    if isinstance(finish, str):
        return finish, None
    if not isinstance(finish, dict):
        raise BackendError("bad_response", "meta_info.finish_reason missing", retryable=True)
    kind = finish.get("type")
    if kind == "abort":
        raise BackendError("aborted", str(finish.get("message") or "request aborted"),
                           retryable=True)
    matched = finish.get("matched")
    return str(kind), matched if isinstance(matched, int) else None


def answer_from_generate(data: Any) -> RawAnswer:
    if not isinstance(data, dict) or not isinstance(data.get("output_ids"), list):
        raise BackendError("bad_response", "/generate answer has no output_ids", retryable=True)
    meta = data.get("meta_info") if isinstance(data.get("meta_info"), dict) else {}
    finish_reason, matched = _finish(meta)
    output_ids = data["output_ids"]
    if not output_ids:
        raise BackendError("empty_answer", "/generate returned no tokens", retryable=True)
    return RawAnswer(
        finish_reason=finish_reason,
        usage=Usage(
            prompt_tokens=meta.get("prompt_tokens"),
            completion_tokens=meta.get("completion_tokens"),
            cached_tokens=meta.get("cached_tokens"),
        ),
        request_id=meta.get("id"),
        output_ids=output_ids,
        stop_token_id=matched,
        text=data.get("text"),
    )
