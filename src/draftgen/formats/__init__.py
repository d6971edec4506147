"""Model families. Adding a model is adding a module here and importing it below."""

from draftgen.formats import qwen3  # noqa: F401  (registers qwen3, qwen3-thinking)
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
