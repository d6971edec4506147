from __future__ import annotations

import logging
from collections.abc import Iterator
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


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The CLI points the draftgen logger at CliRunner's stream; put it back afterwards."""
    logger = logging.getLogger("draftgen")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
