"""`draftgen audit` on `turns: all` datasets: each conversation's turns 0..k in a row, each
once, one end at most and on the last turn, ids `{conversation}#{turn}`, and the layout's mask
on exactly the sampled tokens (runs written as a run writes them: tests/trajectory_runs.py)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from draftgen.audit import conversation_checks
from draftgen.audit.quarantine import quarantine
from draftgen.audit.run import audit_run
from draftgen.formats.trajectory import (
    MaskedSequence,
    TrajectoryLayout,
    TurnTokens,
    mask_covers_sampled,
    trajectory_layout,
    turn_order_problems,
)
from draftgen.run.turns import written_turns
from draftgen.store.record import Record
from draftgen.tokenize import Tokenizer
from tests.trajectory_runs import read_lines, write_trajectory_run


def _audit(root: Path) -> dict:
    return audit_run(root, workers=1).as_json()


def _failed(report: dict) -> dict[str, list[str]]:
    return {code: c["examples"] for code, c in report["checks"].items() if c["failed"]}


def test_a_clean_trajectory_run_passes_with_its_layouts_and_ends(tmp_path: Path,
                                                                 qwen3_tok: Tokenizer) -> None:
    report = _audit(write_trajectory_run(tmp_path / "run", qwen3_tok,
                                         single=[{"role": "user", "content": "Hi"}]))
    assert report["ok"], _failed(report)
    assert report["trajectories"] == {"agent": {
        "conversations": 4, "turns": 9,
        # the tool loop (3 turns) and the pending one-turn chat; the chats branch per query
        "layouts": {"sequence": 2, "branches": 2}, "sequences": 7, "breaks": 3,
        "ends": {"last_turn": 2, "finish_length": 1, "none": 1}}}
    assert "plain" not in report["trajectories"]


def _drop(conversation: str, turn: int):
    def edit(by: dict[str, list[Record]]) -> None:
        del by[conversation][turn]
    return edit


def test_a_gap_fails_the_turn_after_it(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    report = _audit(write_trajectory_run(tmp_path / "run", qwen3_tok,
                                         edit=_drop("agent/chat", 1)))
    assert not report["ok"]
    assert _failed(report) == {"turn_missing": ["agent/chat#2"]}


def test_a_missing_first_turn_fails(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    report = _audit(write_trajectory_run(tmp_path / "run", qwen3_tok,
                                         edit=_drop("agent/loop", 0)))
    assert _failed(report) == {"turn_missing": ["agent/loop#1"]}


def test_a_repeated_turn_fails(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    def edit(by: dict[str, list[Record]]) -> None:
        by["agent/loop"].append(by["agent/loop"][1])

    report = _audit(write_trajectory_run(tmp_path / "run", qwen3_tok, edit=edit))
    assert _failed(report) == {"turn_repeated": ["agent/loop#1"],
                               "duplicate_id": ["agent/loop#1"]}
    assert report["failing"] == 1  # both findings on the same (later) line


def test_an_end_before_the_last_turn_fails(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    def edit(by: dict[str, list[Record]]) -> None:
        by["agent/chat"][0].end = "last_turn"

    report = _audit(write_trajectory_run(tmp_path / "run", qwen3_tok, edit=edit))
    assert _failed(report) == {"end_not_last": ["agent/chat#0"]}


def test_an_id_that_is_not_conversation_and_turn_fails(tmp_path: Path, qwen3_tok: Tokenizer
                                                       ) -> None:
    def edit(by: dict[str, list[Record]]) -> None:
        by["agent/chat"][1].id = "agent/chat-1"
        by["agent/loop"][2].turn = msgspec.UNSET

    report = _audit(write_trajectory_run(tmp_path / "run", qwen3_tok, edit=edit))
    assert _failed(report) == {"turn_id_mismatch": ["agent/chat-1", "agent/loop#2"]}


def test_a_mask_off_by_one_is_found(tmp_path: Path, qwen3_tok: Tokenizer,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok)

    def shifted(turns: list[TurnTokens]) -> TrajectoryLayout:
        layout = trajectory_layout(turns)
        seqs = [MaskedSequence(s.input_ids, [0, *s.loss_mask[:-1]], s.turns)
                for s in layout.sequences]
        return TrajectoryLayout(layout.kind, seqs, layout.breaks)

    monkeypatch.setattr(conversation_checks, "trajectory_layout", shifted)
    report = _audit(root)
    assert set(_failed(report)) == {"mask_not_sampled"}
    assert report["checks"]["mask_not_sampled"]["failed"] == 9  # every turn of every one


def test_mask_covers_sampled_on_plain_ids() -> None:
    turns = [TurnTokens([1, 2], [3, 4]), TurnTokens([1, 2, 3, 4, 5], [6])]
    [seq] = trajectory_layout(turns).sequences
    assert seq.loss_mask == [0, 0, 1, 1, 0, 1]
    assert mask_covers_sampled(turns, seq)
    for wrong in ([0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0]):
        assert not mask_covers_sampled(turns, MaskedSequence(seq.input_ids, wrong, seq.turns))
    other = [TurnTokens([1, 2], [3, 9]), turns[1]]  # the prompt does not hold the answer
    assert not mask_covers_sampled(other, seq)


def test_turn_order_problems() -> None:
    assert turn_order_problems([(0, None), (1, None), (2, "last_turn")]) == [[], [], []]
    assert turn_order_problems([(1, None), (0, None)]) == [[], []]  # order in the file is free
    assert turn_order_problems([(0, None), (2, None)]) == [[], ["turn_missing"]]
    assert turn_order_problems([(0, None), (0, None)]) == [[], ["turn_repeated"]]
    assert turn_order_problems([(0, "budget"), (1, "last_turn")]) == [["end_not_last"], []]
    assert turn_order_problems([(0, None), (1, "x"), (1, "y")]) == [
        [], [], ["turn_repeated", "end_not_last"]]


def test_a_file_is_read_in_blocks_whatever_their_size(tmp_path: Path, qwen3_tok: Tokenizer
                                                      ) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok)
    path = root / "agent" / "responses.jsonl"
    f = conversation_checks.TrajectoryFile("agent", "agent", str(path), path.stat().st_size)
    whole = list(conversation_checks._file_lines(f))
    assert len(whole) == 9 and whole[-1][1] == path.stat().st_size
    for block in (7, 1000, 4096):  # smaller than a line, and several lines a block
        assert list(conversation_checks._file_lines(f, block)) == whole


def _claims_exact_from_text(conversation: str, turn: int):
    def edit(by: dict[str, list[Record]]) -> None:
        by[conversation][turn].token_source = "reconstructed"  # "exact" it cannot be
    return edit


def test_quarantine_takes_the_later_turns_of_a_failing_turns_conversation(
        tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok,
                                edit=_claims_exact_from_text("agent/chat", 1))
    report = audit_run(root, workers=1)
    assert report.failing == 1
    result = quarantine(report)
    assert result.moved == {"agent": 2}
    kept = {r["id"] for r in read_lines(root / "agent" / "responses.jsonl")}
    moved = {r["id"]: r["quarantine"]["problems"]
             for r in read_lines(root / "agent" / "quarantine.jsonl")}
    assert "agent/chat#0" in kept and not {"agent/chat#1", "agent/chat#2"} & kept
    assert moved == {"agent/chat#1": ["exact_not_native"],
                     "agent/chat#2": ["after_quarantined_turn"]}
    assert written_turns([root], "agent")["agent/chat"][-1].turn == 0  # resumed from turn 1
    assert audit_run(root, workers=1).ok  # nothing after a gap is left behind
