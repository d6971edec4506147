"""Model families. Adding a model is adding a module here and importing it below."""

from draftgen.formats import (
    chat_template,  # noqa: F401  (registers chat-template)
    chatml,  # noqa: F401  (registers chatml, smollm2)
    deepseek,  # noqa: F401  (registers deepseek-r1, deepseek-v3.1)
    gpt_oss,  # noqa: F401  (registers gpt-oss)
    kimi_k2,  # noqa: F401  (registers kimi-k2.5, kimi-k2, kimi-k2-thinking)
    qwen3,  # noqa: F401  (registers qwen3, qwen3-thinking)
)
from draftgen.formats.base import (
    AnswerText,
    Format,
    FormatError,
    ParsedAnswer,
    format_names,
    get_format,
    register,
)

__all__ = [
    "AnswerText",
    "Format",
    "FormatError",
    "ParsedAnswer",
    "format_names",
    "get_format",
    "register",
]
