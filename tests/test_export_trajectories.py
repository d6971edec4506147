"""`draftgen export` of `turns: all` datasets: one row per sequence (branch) of each
trajectory's layout, its mask on exactly the sampled tokens of its turns, in every format;
`--format trajectories` (speculators' trajectory JSONL); `--turn-dropout`. Runs are written as
a run writes them (tests/trajectory_runs.py); the trainers' loaders read them in
tests/test_trainer_speculators.py and tests/test_specforge_conformance.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.export import ExportError, ExportFormat, ExportOptions, export_run
from draftgen.export import branches as export_branches
from draftgen.formats.trajectory import MaskedSequence, TrajectoryLayout, trajectory_layout
from draftgen.store.record import Record
from draftgen.tokenize import Tokenizer
from tests.test_trajectory import masked_spans
from tests.trajectory_runs import read_lines, write_trajectory_run

KEYS = ["id", "conversations", "tools", "input_ids", "loss_mask", "metadata"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, qwen3_tok: Tokenizer) -> Path:
    return write_trajectory_run(tmp_path_factory.mktemp("traj") / "run", qwen3_tok,
                                single=[{"role": "user", "content": "Hi"}])


def turn_records(run: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in read_lines(run / "agent" / "responses.jsonl")}


def expected_row(turns: dict[str, dict[str, Any]], conversation: str, branch: list[int]
                 ) -> tuple[list[int], list[list[int]]]:
    """The branch's IDs (its last turn's prompt and answer) and its answers, token for token."""
    last = turns[f"{conversation}#{branch[-1]}"]
    return (last["input_ids"] + last["output_ids"],
            [turns[f"{conversation}#{k}"]["output_ids"] for k in branch])


def assert_exact(row_ids: list[int], row_mask: list[int], want: tuple[list[int], list[list[int]]]
                 ) -> None:
    ids, outputs = want
    assert row_ids == ids
    assert masked_spans(MaskedSequence(row_ids, row_mask, [])) == outputs
    assert sum(row_mask) == sum(len(o) for o in outputs)


def _export(run: Path, out: Path, fmt: ExportFormat = ExportFormat.trajectories, **kw: Any):
    return export_run(run, ExportOptions(format=fmt, out=out, **kw))


def test_trajectory_jsonl_has_one_exact_line_per_branch(run: Path, tmp_path: Path) -> None:
    summary = _export(run, tmp_path / "out")
    lines = {r["id"]: r for r in read_lines(tmp_path / "out" / "trajectories.jsonl")}
    turns = turn_records(run)
    assert set(lines) == {"agent/chat:branch-0", "agent/chat:branch-1", "agent/chat:branch-2",
                          "agent/loop:branch-0", "agent/pending:branch-0",
                          "agent/cut:branch-0", "plain/one:branch-0"}
    for line in lines.values():
        assert list(line) == KEYS
        meta = line["metadata"]
        assert meta["token_count"] == len(line["input_ids"])
        assert meta["sampled_token_count"] == sum(line["loss_mask"])
        if meta["dataset"] == "agent":
            assert_exact(line["input_ids"], line["loss_mask"],
                         expected_row(turns, meta["conversation"], meta["turns"]))
    loop = lines["agent/loop:branch-0"]
    want = {"turns": [0, 1, 2], "layout": "sequence", "end": "last_turn",
            "stop_condition": "last_turn", "num_turns": 3, "branch_index": 0,
            "source": "draftgen"}
    assert {k: loop["metadata"][k] for k in want} == want
    assert [m["role"] for m in loop["conversations"]] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert loop["tools"][0]["function"]["name"] == "get_weather"
    assert lines["agent/chat:branch-2"]["metadata"]["layout"] == "branches"
    # the truncated turn of "cut" is excluded (the default), so its trajectory stops before it
    assert summary.tallies["agent"].excluded["truncated"] == 1
    assert lines["agent/cut:branch-0"]["metadata"]["end"] is None


def test_keeping_truncated_answers_keeps_the_cut_turn(run: Path, tmp_path: Path) -> None:
    _export(run, tmp_path / "out", exclude_truncated=False, checks=False)
    lines = {r["id"]: r for r in read_lines(tmp_path / "out" / "trajectories.jsonl")}
    assert lines["agent/cut:branch-1"]["metadata"]["end"] == "finish_length"


@pytest.mark.parametrize("fmt", [ExportFormat.specforge, ExportFormat.parquet])
def test_trainer_rows_are_the_branches(run: Path, tmp_path: Path, fmt: ExportFormat) -> None:
    _export(run, tmp_path / "out", fmt, shuffle=False)
    turns = turn_records(run)
    if fmt is ExportFormat.specforge:
        rows = read_lines(tmp_path / "out" / "pretokenized.jsonl")
        ids = [r["id"] for r in read_lines(tmp_path / "out" / "conversations.jsonl")]
    else:
        import pyarrow.parquet as pq
        table = pq.read_table(tmp_path / "out" / "data.parquet").to_pylist()
        rows, ids = table, [r["id"] for r in table]
    branches = {"agent/loop:branch-0": [0, 1, 2], "agent/chat:branch-1": [1]}
    for rid, row in zip(ids, rows, strict=True):
        if rid in branches:
            assert_exact(row["input_ids"], row["loss_mask"],
                         expected_row(turns, rid.split(":")[0], branches[rid]))
    assert set(branches) <= set(ids)


def test_turn_dropout_cuts_seeded_prefixes(run: Path, tmp_path: Path) -> None:
    whole = _export(run, tmp_path / "whole", shuffle=False, turn_dropout=0.0)
    lines = read_lines(tmp_path / "whole" / "trajectories.jsonl")
    assert not any(r["metadata"]["cut_by_turn_dropout"] for r in lines)
    assert "turn_dropout" not in whole.tallies["agent"].excluded
    cut = _export(run, tmp_path / "cut", shuffle=False, turn_dropout=1.0, seed=3)
    cut_lines = read_lines(tmp_path / "cut" / "trajectories.jsonl")
    loop = [r for r in cut_lines if r["metadata"]["conversation"] == "agent/loop"]
    assert len(loop) == 1 and loop[0]["metadata"]["cut_by_turn_dropout"]
    kept = loop[0]["metadata"]["turns"]
    assert kept in ([0], [0, 1])  # every conversation of 2+ turns loses at least one
    chat = sorted(r["metadata"]["turns"][0] for r in cut_lines
                  if r["metadata"]["conversation"] == "agent/chat")
    assert chat in ([0], [0, 1])
    dropped = (3 - len(kept)) + (3 - len(chat))
    assert cut.tallies["agent"].excluded["turn_dropout"] == dropped
    turns = turn_records(run)
    for r in cut_lines:
        if r["metadata"]["dataset"] == "agent":
            assert_exact(r["input_ids"], r["loss_mask"],
                         expected_row(turns, r["metadata"]["conversation"],
                                      r["metadata"]["turns"]))
    again = _export(run, tmp_path / "again", shuffle=False, turn_dropout=1.0, seed=3)
    assert read_lines(tmp_path / "again" / "trajectories.jsonl") == cut_lines
    assert again.tallies["agent"].excluded == cut.tallies["agent"].excluded
    seeds = {tuple(tuple(r["metadata"]["turns"]) for r in read_lines(
        (_export(run, tmp_path / f"s{s}", shuffle=False, turn_dropout=1.0, seed=s)
         .out) / "trajectories.jsonl") if r["metadata"]["conversation"] == "agent/loop")
        for s in range(8)}
    assert len(seeds) == 2  # the seed decides where the loop is cut: after 1 or 2 turns


def test_turn_dropout_option_is_checked(run: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="--turn-dropout"):
        _export(run, tmp_path / "out", turn_dropout=1.5)
    result = CliRunner().invoke(app, ["export", str(run), "-f", "trajectories", "-o",
                                      str(tmp_path / "cli"), "--turn-dropout", "1", "--seed",
                                      "3", "--no-shuffle"])
    assert result.exit_code == 0, result.output
    assert read_lines(tmp_path / "cli" / "trajectories.jsonl") == read_lines(
        _export(run, tmp_path / "api", shuffle=False, turn_dropout=1.0, seed=3).out
        / "trajectories.jsonl")


def _edited(tmp_path: Path, qwen3_tok: Tokenizer, edit: Any) -> Path:
    return write_trajectory_run(tmp_path / "run", qwen3_tok, edit=edit)


def test_a_gap_is_a_broken_row(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    def edit(by: dict[str, list[Record]]) -> None:
        del by["agent/chat"][1]

    run = _edited(tmp_path, qwen3_tok, edit)
    with pytest.raises(ExportError, match=r"agent/chat.*turn_missing"):
        _export(run, tmp_path / "out")
    summary = _export(run, tmp_path / "out", skip_broken=True)
    assert summary.tallies["agent"].excluded["broken_row"] == 2
    ids = [r["id"] for r in read_lines(tmp_path / "out" / "trajectories.jsonl")]
    assert not any(i.startswith("agent/chat:") for i in ids) and "agent/loop:branch-0" in ids


@pytest.mark.parametrize("problem", ["turn_repeated", "end_not_last"])
def test_a_repeated_turn_or_an_early_end_is_a_broken_row(tmp_path: Path, qwen3_tok: Tokenizer,
                                                         problem: str) -> None:
    def edit(by: dict[str, list[Record]]) -> None:
        if problem == "turn_repeated":
            by["agent/loop"].append(by["agent/loop"][1])
        else:
            by["agent/loop"][0].end = "no_tool_call"

    with pytest.raises(ExportError, match=rf"agent/loop.*{problem}"):
        _export(_edited(tmp_path, qwen3_tok, edit), tmp_path / "out")


def test_a_mask_off_by_one_is_refused(run: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def shifted(turns: Any) -> TrajectoryLayout:
        layout = trajectory_layout(turns)
        return TrajectoryLayout(layout.kind, [
            MaskedSequence(s.input_ids, [0, *s.loss_mask[:-1]], s.turns)
            for s in layout.sequences], layout.breaks)

    monkeypatch.setattr(export_branches, "trajectory_layout", shifted)
    with pytest.raises(ExportError, match="does not cover exactly the sampled tokens"):
        _export(run, tmp_path / "out")


def test_an_excluded_turn_cuts_the_rest(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    def edit(by: dict[str, list[Record]]) -> None:
        by["agent/loop"][1].token_check = "length_mismatch"

    summary = _export(_edited(tmp_path, qwen3_tok, edit), tmp_path / "out")
    excluded = summary.tallies["agent"].excluded
    assert excluded["token_check:length_mismatch"] == 1 and excluded["after_excluded_turn"] == 1
    loop = [r for r in read_lines(tmp_path / "out" / "trajectories.jsonl")
            if r["metadata"]["conversation"] == "agent/loop"]
    assert [r["metadata"]["turns"] for r in loop] == [[0]]
