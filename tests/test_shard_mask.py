"""The shard of a prompt from the ID hash the prompt table caches (draftgen.store.shards.
shard_mask): the same shard as `ShardSpec.takes` for every ID, read fresh or from the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from draftgen.config import DatasetConfig
from draftgen.datasets import load_prompt_table
from draftgen.store.columns import id_hash
from draftgen.store.shards import ShardSpec, shard_mask, shard_of
from tests.e2e_helpers import mixed_rows, write_jsonl

ODD_IDS = ["", "a", "caf\u00e9 \u2603", "x" * 5000, "ds/0", "ds/00", "\x00", "q0000001"]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 64, 1000])
def test_the_mask_gives_the_shard_of_every_id(count: int) -> None:
    ids = ODD_IDS + [f"ds/{i}" for i in range(3000)]
    hashes = np.array([id_hash(i) for i in ids], dtype=np.uint64)
    assert (hashes >= 2**63).any(), "hashes with the top bit set: no float or int64 on the way"
    for index in range(min(count, 8)):
        spec = ShardSpec(index, count)
        assert shard_mask(hashes, spec).tolist() == [spec.takes(i) for i in ids]
    assert {shard_of(i, count) for i in ids} <= set(range(count))


def test_the_mask_of_a_prompt_table_fresh_and_cached(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "data.jsonl", mixed_rows(200))
    cache = tmp_path / "prompts.npz"
    fresh, _ = load_prompt_table(DatasetConfig(name="ds", path=str(data)), cache)
    fresh.save_cache()
    cached, _ = load_prompt_table(DatasetConfig(name="ds", path=str(data)), cache)
    for table in (fresh, cached):
        parts = [table.where(shard_mask(table.id_hashes, ShardSpec(i, 3))).ids
                 for i in range(3)]
        assert parts == [[p for p in table.ids if shard_of(p, 3) == i] for i in range(3)]
        assert all(parts), "200 prompts: every shard gets some"
    assert cache.exists()
