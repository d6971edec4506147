"""examples/train_draft_vllm.py --small: the whole chain on a real vLLM (CPU), as CI runs it.

`draftgen run` (vllm backend, 3 prompts) → `draftgen export --format speculators` →
`speculators generate-offline-data` against vLLM serving hidden states → speculators' trainer
on CPU for one step → a draft checkpoint. Skipped without the vLLM build unless
DRAFTGEN_REQUIRE_VLLM=1 (tests/vllm_engine.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import load_from_disk
from safetensors.torch import load_file

from tests.vllm_engine import run_small

# two `vllm serve` starts (70-234 s each on a loaded 2-core machine) and training
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_draft_vllm.py"
LAYERS = 4
"""The draft's three layers and the last one, as vLLM writes them."""


def test_small_chain_ends_in_a_draft_checkpoint(tmp_path: Path) -> None:
    work = tmp_path / "chain"
    run_small(SCRIPT, work)
    summary = json.loads((work / "chain.json").read_text())
    assert summary["rows"] == 3
    assert summary["checkpoints"] and (work / summary["checkpoints"][0]).is_file()
    # one epoch: its checkpoint is the one handed back
    assert summary["checkpoint"] == "checkpoints/0/model.safetensors"
    assert (work / summary["checkpoint"]).is_file()
    assert [m["global_step"] for m in summary["train"]] == [0]
    rows = load_from_disk(str(work / "export"))
    for i in range(len(rows)):
        saved = load_file(str(work / "export" / "hidden_states" / f"hs_{i}.safetensors"))
        # vLLM's states are for the export's own token IDs, one per token
        assert saved["token_ids"].tolist() == rows[i]["input_ids"].tolist(), i
        assert tuple(saved["hidden_states"].shape) == (len(rows[i]["input_ids"]), LAYERS, 576)
