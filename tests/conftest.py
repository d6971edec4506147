from __future__ import annotations

from pathlib import Path

import pytest

from draftgen.testing.assets import qwen3_tokenizer_dir
from draftgen.tokenize import Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def qwen3_dir() -> Path:
    return qwen3_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen3_tok(qwen3_dir: Path) -> Tokenizer:
    return load_tokenizer(qwen3_dir)
