"""Backends know wire protocols, never model formats. A backend type is one module here: its
config model, registered with `registry.register` (run.yaml's `type` picks it), beside the
class that serves it, whose `capabilities` say what its endpoint does. Adding a backend type is
adding its module and its name to `BACKEND_MODULES`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftgen.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from draftgen.backends.base import Backend, Capabilities
    from draftgen.backends.llamacpp import LlamaCppChatBackend, LlamaCppNativeBackend
    from draftgen.backends.openai_chat import OpenAIChatBackend
    from draftgen.backends.openrouter import OpenRouterBackend
    from draftgen.backends.registry import BackendConfigBase
    from draftgen.backends.router import BackendNotReady
    from draftgen.backends.sglang import SGLangBackend
    from draftgen.backends.vllm import VLLMChatBackend
    from draftgen.config import ModelConfig, SamplingConfig

BACKEND_MODULES = ("openai_chat", "openrouter", "vllm", "sglang", "llamacpp")
"""The modules of the backend types, in the order their types are listed (docs, errors):
importing one registers its types (`registry.backend_types` imports them all)."""


def capabilities_of(cfg: BackendConfigBase) -> Capabilities:
    """What the backend of this config can do, before one is made."""
    return cfg.backend_class().capabilities


def make_backend(cfg: BackendConfigBase, model: ModelConfig, sampling: SamplingConfig
                 ) -> Backend:
    return cfg.backend_class()(cfg, model, sampling)


# Imported on first use: the registry (which `draftgen.config` imports) is a module of this
# package, and must not bring aiohttp and every backend with it.
__getattr__ = lazy_exports(__name__, {
    "draftgen.backends.base": ("Backend", "Capabilities"),
    "draftgen.backends.llamacpp": ("LlamaCppChatBackend", "LlamaCppNativeBackend"),
    "draftgen.backends.openai_chat": ("OpenAIChatBackend",),
    "draftgen.backends.openrouter": ("OpenRouterBackend",),
    "draftgen.backends.router": ("BackendNotReady",),
    "draftgen.backends.sglang": ("SGLangBackend",),
    "draftgen.backends.vllm": ("VLLMChatBackend",),
})

__all__ = [
    "BACKEND_MODULES",
    "Backend",
    "BackendNotReady",
    "Capabilities",
    "LlamaCppChatBackend",
    "LlamaCppNativeBackend",
    "OpenAIChatBackend",
    "OpenRouterBackend",
    "SGLangBackend",
    "VLLMChatBackend",
    "capabilities_of",
    "make_backend",
]
