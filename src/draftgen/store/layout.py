"""Where things live in a run folder. Nothing outside `draftgen.store` writes in it. Light (no
numpy): the config imports it for the names a dataset may not take."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RESPONSES = "responses.jsonl"
FAILURES = "failures.jsonl"
TORN = "torn_tail.bin"
INDEX = "index.jsonl"
COLUMNS = "index.v1.bin"
QUARANTINE = "quarantine.jsonl"
JOURNAL = "journal.jsonl"
CACHE = ".cache"
SHARDS_DIR = "shards"
"""Each shard's own run folder is SHARDS_DIR/I-of-N (`store.shards`); no dataset may take the
name (the config refuses it)."""


@dataclass(frozen=True, slots=True)
class RunLayout:
    root: Path

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    def dataset_dir(self, dataset: str) -> Path:
        return self.root / dataset

    def responses(self, dataset: str) -> Path:
        return self.root / dataset / RESPONSES

    def failures(self, dataset: str) -> Path:
        return self.root / dataset / FAILURES

    def index(self, dataset: str) -> Path:
        return self.root / dataset / INDEX

    def columns(self, dataset: str) -> Path:
        """The binary copy of the index (see `store.columns`)."""
        return self.root / dataset / COLUMNS

    def quarantine(self, dataset: str) -> Path:
        """Answers moved out of responses.jsonl by `draftgen audit --quarantine`."""
        return self.root / dataset / QUARANTINE

    @property
    def journal(self) -> Path:
        return self.root / JOURNAL

    def prompt_cache(self, dataset: str) -> Path:
        """Where each prompt of a dataset's source is, so that a resume need not parse it
        (see `datasets.cache`). In a hidden folder: no dataset can be named so."""
        return self.root / CACHE / f"prompts-{dataset}.npz"

    def torn(self, dataset: str) -> Path:
        return self.root / dataset / TORN

    def dataset_names(self) -> list[str]:
        """Datasets present on disk (folders holding a responses or failures file)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir()
            if p.is_dir() and ((p / RESPONSES).exists() or (p / FAILURES).exists())
        )
