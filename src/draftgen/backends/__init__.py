"""Backends know wire protocols, never model formats. One class per backend type (llama.cpp:
per endpoint), whose `capabilities` say what its endpoint does."""

from __future__ import annotations

from draftgen.backends.base import Backend, Capabilities
from draftgen.backends.llamacpp import LlamaCppChatBackend, LlamaCppNativeBackend
from draftgen.backends.openai_chat import OpenAIChatBackend, VLLMChatBackend
from draftgen.backends.openrouter import OpenRouterBackend
from draftgen.backends.router import BackendNotReady
from draftgen.backends.sglang import SGLangBackend
from draftgen.config import (
    BackendConfig,
    LlamaCppConfig,
    ModelConfig,
    OpenAIConfig,
    OpenRouterConfig,
    SamplingConfig,
    SGLangConfig,
    VLLMConfig,
)


def backend_class(cfg: BackendConfig) -> type[Backend]:
    """The class that serves a backend of this config's type (and llama.cpp endpoint)."""
    match cfg:
        case OpenAIConfig():
            return OpenAIChatBackend
        case VLLMConfig():
            return VLLMChatBackend
        case OpenRouterConfig():
            return OpenRouterBackend
        case SGLangConfig():
            return SGLangBackend
        case LlamaCppConfig(endpoint="chat"):
            return LlamaCppChatBackend
        case LlamaCppConfig():
            return LlamaCppNativeBackend
    raise TypeError(f"backend {cfg.name!r}: no backend class for type {cfg.type!r}")


def capabilities_of(cfg: BackendConfig) -> Capabilities:
    """What the backend of this config can do, before one is made."""
    return backend_class(cfg).capabilities


def make_backend(cfg: BackendConfig, model: ModelConfig, sampling: SamplingConfig) -> Backend:
    return backend_class(cfg)(cfg, model, sampling)


__all__ = [
    "Backend",
    "BackendNotReady",
    "Capabilities",
    "LlamaCppChatBackend",
    "LlamaCppNativeBackend",
    "OpenAIChatBackend",
    "OpenRouterBackend",
    "SGLangBackend",
    "VLLMChatBackend",
    "backend_class",
    "capabilities_of",
    "make_backend",
]
