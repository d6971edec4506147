"""vLLM's OpenAI-compatible chat endpoint: the `vllm` type. The chat protocol of
`OpenAIChatBackend`, plus the sampled IDs vLLM returns when asked (`return_token_ids`)."""

from __future__ import annotations

from typing import Literal

from draftgen.backends.base import Backend, Capabilities
from draftgen.backends.openai_chat import ChatBackendConfig, OpenAIChatBackend
from draftgen.config.backends import register


@register
class VLLMConfig(ChatBackendConfig):
    type: Literal["vllm"]

    def backend_class(self) -> type[Backend]:
        return VLLMChatBackend


class VLLMChatBackend(OpenAIChatBackend):
    """`type: vllm`: vLLM's chat endpoint, which returns the sampled IDs when asked
    (`return_token_ids`)."""

    capabilities = Capabilities(native_ids=True, needs_prompt_ids=False)
