"""Backends know wire protocols, never model formats. A backend type is one module here: its
config model, registered with `draftgen.config.backends.register` (run.yaml's `type` picks it),
beside the class that serves it, whose `capabilities` say what its endpoint does. Adding a
backend type is adding its module and its name to `BACKEND_MODULES` (draftgen.config.backends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftgen.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from draftgen.backends.base import Backend, Capabilities
    from draftgen.backends.llamacpp import LlamaCppChatBackend, LlamaCppNativeBackend
    from draftgen.backends.openai_chat import OpenAIChatBackend
    from draftgen.backends.openrouter import OpenRouterBackend
    from draftgen.backends.router import BackendNotReady
    from draftgen.backends.sglang import SGLangBackend
    from draftgen.backends.vllm import VLLMChatBackend
    from draftgen.config import ModelConfig, SamplingConfig
    from draftgen.config.backends import BackendConfigBase


def capabilities_of(cfg: BackendConfigBase) -> Capabilities:
    """What the backend of this config can do, before one is made."""
    return cfg.backend_class().capabilities


def make_backend(cfg: BackendConfigBase, model: ModelConfig, sampling: SamplingConfig
                 ) -> Backend:
    return cfg.backend_class()(cfg, model, sampling)


# Imported on first use: importing the package (the registry imports its modules by name)
# must not bring aiohttp and every backend with it.
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
