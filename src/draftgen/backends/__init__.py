"""Backends know wire protocols, never model formats. One class per protocol."""

from __future__ import annotations

from collections.abc import Callable

from draftgen.backends.base import Backend, Capabilities
from draftgen.backends.llamacpp import make_llamacpp_backend
from draftgen.backends.openai_chat import OpenAIChatBackend
from draftgen.backends.router import BackendNotReady
from draftgen.backends.sglang import SGLangBackend
from draftgen.config import BackendConfig, ModelConfig, SamplingConfig

_BY_TYPE: dict[str, Callable[[BackendConfig, ModelConfig, SamplingConfig], Backend]] = {
    "openai": OpenAIChatBackend,
    "openrouter": OpenAIChatBackend,
    "vllm": OpenAIChatBackend,
    "sglang": SGLangBackend,
    "llamacpp": make_llamacpp_backend,  # `endpoint` picks native /completion or chat
}


def make_backend(cfg: BackendConfig, model: ModelConfig, sampling: SamplingConfig) -> Backend:
    return _BY_TYPE[cfg.type](cfg, model, sampling)


__all__ = ["Backend", "BackendNotReady", "Capabilities", "make_backend"]
