"""`--format speculators` read by speculators' own training-path code (speculators==0.9.0).

Real runs against the loopback test server (an SGLang-style backend with engine IDs, an
OpenRouter-style one whose IDs are rebuilt from text, tool calls, a multi-turn `turns: last`
set) are exported and loaded the ways a user trains from them:

* the folder, with `speculators.train.data.ArrowDataset` (what `speculators train
  --data-path OUT` builds), through `__getitem__` with cached hidden states and the trainer's
  `CollateFn` + `shift_batch`;
* `token_freq.pt`, with the train CLI's `parse_vocab_mappings` (the draft vocabulary);
* `--jsonl`, with `prepare_data`'s loader and pass-through (`load_raw_dataset`,
  `build_speculator_training_dataset`), whose saved output ArrowDataset reads too;
* a `--val-fraction` split, one ArrowDataset per split folder.

IDs and loss masks must equal the records on every row.
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from draftgen.export import ExportFormat, ExportOptions, MinCheck, export_run
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, mixed_rows, read_records, run_config, write_config
from tests.e2e_helpers import write_jsonl as write_rows

if not os.environ.get("DRAFTGEN_REQUIRE_TRAINERS"):
    pytest.importorskip("speculators.train.data")
    pytest.importorskip("transformers")

import torch
from safetensors.torch import save_file
from speculators.data_generation.preprocessing import (
    build_speculator_training_dataset,
    load_raw_dataset,
)
from speculators.models.eagle3.data import shift_batch
from speculators.train.cli import parse_vocab_mappings
from speculators.train.data import ArrowDataset, CollateFn, build_client_item
from speculators.train.vocab_mapping import save_token_frequency_distribution
from transformers import PreTrainedTokenizerFast, Qwen3Config

MAX_LEN = 8192
HIDDEN = 8
LAYERS = 3
"""Target layers the draft reads (EAGLE-3's three) plus the last one, in hs_N.safetensors."""


def _multi_turn_rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"m{i}", "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": f"First question {i}?"},
        {"role": "assistant", "content": f"An earlier answer {i}."},
        {"role": "user", "content": f"A follow-up {i}: and then?"},
        {"role": "assistant", "content": "a reply the target will replace"},
    ]} for i in range(n)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("spec-run")
    mixed = write_rows(root / "data" / "mixed.jsonl", mixed_rows(40))
    multi = write_rows(root / "data" / "multi.jsonl", _multi_turn_rows(12))
    with TestServer(latency_s=0.0) as local, \
         TestServer(mode="openrouter", strip_whitespace=True, edge_whitespace_rate=0.0,
                    noncanonical_rate=0.25) as paid:
        cfg = write_config(root, qwen3_dir, backends=[
            fast_backend("local", "sglang", local.url, concurrency=4, priority=0),
            fast_backend("paid", "openrouter", paid.url, logprobs=False, concurrency=4,
                         priority=0),
        ], datasets=[{"name": "mixed", "path": str(mixed)},
                     {"name": "multi", "path": str(multi), "turns": "last"}])
        assert run_config(cfg).status == "completed"
    run = root / "run"
    recs = [*read_records(run, "mixed"), *read_records(run, "multi")]
    sources = {r["token_source"] for r in recs}
    assert sources == {"native", "reconstructed"}, sources  # engine IDs and rebuilt IDs
    assert any(r.get("tool_calls") for r in recs)
    return run


def _records(run: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for d in ("mixed", "multi") for r in read_records(run, d)}


def _export(run: Path, out: Path, **kw: Any) -> Path:
    # every record, rebuilt ones whose length did not match too: all must load exactly
    export_run(run, ExportOptions(format=ExportFormat.speculators, out=out,
                                  min_check=MinCheck.any, **kw))
    return out


def _expected(rec: dict[str, Any]) -> tuple[list[int], list[int]]:
    return (rec["input_ids"] + rec["output_ids"],
            [0] * len(rec["input_ids"]) + [1] * len(rec["output_ids"]))


def _cache_hidden_states(folder: Path, ds: ArrowDataset, seed: int = 0) -> None:
    """hs_N.safetensors as vLLM's hidden-states connector leaves them for row N: the token IDs
    the trainer sent (`build_client_item`) and [seq, layers + 1, hidden] states."""
    gen = torch.Generator().manual_seed(seed)
    (folder / "hidden_states").mkdir(exist_ok=True)
    for i in range(len(ds)):
        ids = torch.tensor(build_client_item(ds.data[i])["input_ids"], dtype=torch.long)
        states = torch.randn(len(ids), LAYERS + 1, HIDDEN, generator=gen, dtype=torch.bfloat16)
        save_file({"token_ids": ids, "hidden_states": states},
                  str(folder / "hidden_states" / f"hs_{ds.start_file_idx + i}.safetensors"))


def _assert_rows_exact(ds: ArrowDataset, recs: dict[str, dict[str, Any]]) -> set[str]:
    """Every row through ArrowDataset.__getitem__ equals its record; returns the IDs seen."""
    seen = set()
    for i in range(len(ds)):
        meta = ds.data[i]["metadata"]
        ids, mask = _expected(recs[meta["id"]])
        sample = ds[i]
        assert isinstance(sample, dict), f"row {i} ({meta['id']}) unavailable: {sample}"
        assert sample["input_ids"].dtype == torch.long
        assert sample["input_ids"].tolist() == ids, meta["id"]
        assert sample["loss_mask"].tolist() == mask, meta["id"]
        assert ds.approx_lengths[i] == len(ids)
        seen.add(meta["id"])
    return seen


def test_arrow_dataset_reads_the_folder_exactly(run_dir: Path, tmp_path: Path) -> None:
    out = _export(run_dir, tmp_path / "spec")
    recs = _records(run_dir)
    ds = ArrowDataset(max_len=MAX_LEN, datapath=str(out), on_missing="raise")
    _cache_hidden_states(out, ds)
    assert _assert_rows_exact(ds, recs) == set(recs)
    rebuilt = [r for r in recs.values() if r["token_source"] == "reconstructed"]
    noncanonical = [r for r in rebuilt if r["token_check"] == "length_mismatch"]
    assert rebuilt and noncanonical  # rebuilt IDs, and sampled splits text cannot carry
    # the trainer's own batching: packed, shifted for EAGLE-3, masks still on the answers
    collate = CollateFn(MAX_LEN, HIDDEN, num_target_layers=LAYERS, preprocess=shift_batch)
    batch = collate([ds[0], ds[1]])
    rows = [_expected(recs[ds.data[i]["metadata"]["id"]]) for i in (0, 1)]
    n = sum(len(ids) - 1 for ids, _ in rows)
    assert batch["input_ids"][0, :n].tolist() == [t for ids, _ in rows for t in ids[1:]]
    assert batch["loss_mask"][0, :n].tolist() == [m for _, mask in rows for m in mask[1:]]
    assert batch["document_ids"][0, :n].tolist() == [
        d for d, (ids, _) in enumerate(rows) for _ in ids[1:]]


def test_token_freq_is_speculators_count_and_feeds_the_vocab_mapping(run_dir: Path,
                                                                      tmp_path: Path) -> None:
    out = _export(run_dir, tmp_path / "spec")
    ds = ArrowDataset(max_len=MAX_LEN, datapath=str(out), on_missing="raise")
    theirs = tmp_path / "theirs.pt"
    save_token_frequency_distribution(ds.data, theirs)
    ours = torch.load(out / "token_freq.pt", weights_only=True)
    assert ours == torch.load(theirs, weights_only=True)
    assert sum(ours.values()) == sum(len(r["output_ids"]) for r in _records(run_dir).values())

    verifier = tmp_path / "verifier"
    Qwen3Config(vocab_size=151936).save_pretrained(verifier)
    args = argparse.Namespace(d2t_path=None, t2d_path=None, data_path=str(out),
                              draft_vocab_size=512, token_freq_path=None,
                              verifier_name_or_path=str(verifier), trust_remote_code=False)
    d2t, t2d, size = parse_vocab_mappings(args)  # not the "full verifier vocab" fallback
    assert size == 512 and d2t is not None and int(t2d.sum()) == 512
    kept = set((torch.arange(512) + d2t).tolist())
    most_used = sorted(ours, key=lambda t: (-ours[t], t))[:min(512, len(ours))]
    assert set(most_used) <= kept


def test_val_fraction_gives_one_trainable_folder_per_split(run_dir: Path, tmp_path: Path
                                                           ) -> None:
    out = _export(run_dir, tmp_path / "spec", val_fraction=0.3, seed=3)
    recs = _records(run_dir)
    seen: dict[str, set[str]] = {}
    for split in ("train", "validation"):
        ds = ArrowDataset(max_len=MAX_LEN, datapath=str(out / split), on_missing="raise")
        _cache_hidden_states(out / split, ds)
        seen[split] = _assert_rows_exact(ds, recs)
        assert (out / split / "token_freq.pt").is_file()
    assert seen["train"] and seen["validation"]
    assert not seen["train"] & seen["validation"]
    assert seen["train"] | seen["validation"] == set(recs)


def test_jsonl_through_prepare_data_pass_through(run_dir: Path, tmp_path: Path,
                                                 qwen3_dir: Path) -> None:
    out = _export(run_dir, tmp_path / "spec", jsonl=True)
    recs = _records(run_dir)
    raw, _ = load_raw_dataset(str(out / "jsonl" / "train.jsonl"))
    processor = PreTrainedTokenizerFast(tokenizer_file=str(qwen3_dir / "tokenizer.json"))
    prepared = build_speculator_training_dataset(raw, processor, max_length=MAX_LEN, num_proc=1)
    assert len(prepared) == len(raw) == len(recs)
    for row, meta in zip(prepared, raw["metadata"], strict=True):
        ids, mask = _expected(recs[meta["id"]])
        assert row["input_ids"].tolist() == ids
        assert row["loss_mask"].tolist() == mask
    # what prepare_data then saves is a folder the trainer reads
    folder = tmp_path / "prepared"
    prepared.save_to_disk(str(folder))
    ds = ArrowDataset(max_len=MAX_LEN, datapath=str(folder), on_missing="raise")
    _cache_hidden_states(folder, ds)
    order = [meta["id"] for meta in raw["metadata"]]
    for i in range(len(ds)):
        ids, mask = _expected(recs[order[i]])
        assert ds[i]["input_ids"].tolist() == ids and ds[i]["loss_mask"].tolist() == mask


# ---- turns: all trajectories (tests/trajectory_runs.py writes the run) -----------------------


@pytest.fixture(scope="module")
def trajectory_run(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Path:
    from draftgen.tokenize import load_tokenizer
    from tests.trajectory_runs import write_trajectory_run

    tok = load_tokenizer(str(qwen3_dir / "tokenizer.json"))
    return write_trajectory_run(tmp_path_factory.mktemp("traj") / "run", tok)


def _branch_rows(run: Path, out: Path) -> dict[str, tuple[list[int], list[int]]]:
    """Each branch's IDs and mask as the trajectory JSONL holds them, checked against the turn
    records: the last turn's prompt + answer, the mask's spans its turns' answers."""
    from tests.test_export_trajectories import assert_exact, expected_row, turn_records
    from tests.trajectory_runs import read_lines

    export_run(run, ExportOptions(format=ExportFormat.trajectories, out=out))
    turns = turn_records(run)
    rows = {}
    for line in read_lines(out / "trajectories.jsonl"):
        meta = line["metadata"]
        assert_exact(line["input_ids"], line["loss_mask"],
                     expected_row(turns, meta["conversation"], meta["turns"]))
        rows[line["id"]] = (line["input_ids"], line["loss_mask"])
    assert any(sum(1 for pair in itertools.pairwise(m) if pair == (0, 1)) > 1
               for _, m in rows.values())  # a row with several answers in its mask
    return rows


def test_trajectory_jsonl_through_prepare_data_pass_through(trajectory_run: Path, tmp_path: Path,
                                                            qwen3_dir: Path) -> None:
    rows = _branch_rows(trajectory_run, tmp_path / "traj")
    raw, _ = load_raw_dataset(str(tmp_path / "traj" / "trajectories.jsonl"))
    processor = PreTrainedTokenizerFast(tokenizer_file=str(qwen3_dir / "tokenizer.json"))
    prepared = build_speculator_training_dataset(raw, processor, max_length=MAX_LEN, num_proc=1)
    assert len(prepared) == len(raw) == len(rows)
    for row, rid in zip(prepared, raw["id"], strict=True):
        assert (row["input_ids"].tolist(), row["loss_mask"].tolist()) == rows[rid]


def test_trajectory_branches_load_in_the_arrow_dataset(trajectory_run: Path, tmp_path: Path
                                                       ) -> None:
    rows = _branch_rows(trajectory_run, tmp_path / "traj")
    out = tmp_path / "spec"
    export_run(trajectory_run, ExportOptions(format=ExportFormat.speculators, out=out))
    ds = ArrowDataset(max_len=MAX_LEN, datapath=str(out), on_missing="raise")
    _cache_hidden_states(out, ds)
    assert len(ds) == len(rows)
    for i in range(len(ds)):
        sample = ds[i]
        rid = ds.data[i]["metadata"]["id"]
        assert (sample["input_ids"].tolist(), sample["loss_mask"].tolist()) == rows[rid]
