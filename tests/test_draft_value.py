"""bench/draft_value.py --small: drafts O and R, each trained one step by speculators' trainer on
a real vLLM's hidden states, scored on the same held-out answers, as CI runs it.

Skipped without the vLLM build unless DRAFTGEN_REQUIRE_VLLM=1 (tests/vllm_engine.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vllm_engine import run_small

# two `vllm serve` starts (70-234 s each on a loaded 2-core machine) and training
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "draft_value.py"
TTT_STEPS = 3


def test_small_mode_scores_both_drafts_on_one_heldout_set(tmp_path: Path) -> None:
    work = tmp_path / "value"
    stdout = run_small(SCRIPT, work)
    runs = {d: json.loads((work / "results" / f"{d}-s0.json").read_text()) for d in "OR"}
    for draft, result in runs.items():
        assert result["steps"] == 1, draft
        for scored_on in ("on_policy", "original"):
            metrics = result[scored_on]
            assert [f"cond_acc_{k}_epoch" in metrics for k in range(TTT_STEPS)] == [True] * 3
            assert all(0.0 <= metrics[f"full_acc_{k}_epoch"] <= 1.0 for k in range(TTT_STEPS))
    # both drafts validated on the very same rows: the target's answers to the held-out prompts
    assert runs["O"]["heldout"]["on_policy"] == runs["R"]["heldout"]["on_policy"]
    assert runs["O"]["heldout"]["on_policy"]["rows"] == 2
    # and the trap set is another one: the same prompts with the original answers
    assert runs["O"]["heldout"]["original"] != runs["O"]["heldout"]["on_policy"]
    # the drafts trained on different answers to the same prompts
    assert runs["O"]["train_answer_tokens"] != runs["R"]["train_answer_tokens"]
    table = json.loads((work / "results.json").read_text())
    assert [(r["draft"], r["scored_on"]) for r in table["rows"]] == [
        ("O", "on_policy"), ("O", "original"), ("R", "on_policy"), ("R", "original")]
    assert "| R | on-policy |" in stdout
