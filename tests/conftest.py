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


LONGEST_FILES = (
    "tests/test_draft_value.py",
    "tests/test_vllm_real.py",
    "tests/reliability/test_kill.py",
    "tests/test_vllm_chain.py",
    "tests/test_run_trajectories.py",
    "tests/test_quickstart.py",
)
"""Files whose tests take minutes on 2 cores (scripts/test.sh prints the slowest), longest
first. With `--dist loadfile` a worker takes a file at a time: these go out first, so no
worker idles at the end while the other runs a 5-minute file (pytest-xdist's own order,
by number of tests, sent them last; scripts/test.sh turns it off)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
