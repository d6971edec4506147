"""The names every part of the fake engine shares: the configuration's choices, the JSON and
span types, and the error an invalid request raises."""

from __future__ import annotations

from typing import Any, Literal

Layout = Literal["qwen3", "qwen3-thinking"]
Mode = Literal["openai", "openrouter", "vllm"]
ReasoningField = Literal["reasoning", "reasoning_content", "both", "reasoning_details", "none"]
ToolCallDisplay = Literal["structured", "content"]
LogprobsScope = Literal["all", "content", "none"]
Json = dict[str, Any]
Span = tuple[int, int]


class BadRequest(Exception):
    """The request is invalid: answered with HTTP 400 in OpenRouter's error shape."""
