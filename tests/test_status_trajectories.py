"""`draftgen status` on a `turns: all` dataset: conversations done (a turn with an `end`),
pending, in flight, stopped by a budget, turns written, turns per conversation and the end
reasons, read from the index entries (from the lines' tails for an older index;
tests/trajectory_runs.py writes the run)."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.status import conversation_counts
from draftgen.status.collect import collect_status
from draftgen.store import RunLayout
from draftgen.store.record import Record
from draftgen.tokenize import Tokenizer
from tests.trajectory_runs import (
    DATASET,
    chat_plan,
    standard_conversations,
    write_trajectory_run,
)


def _status(root: Path) -> dict:
    return collect_status(root).as_json()


def test_conversations_done_pending_in_flight_and_ends(tmp_path: Path, qwen3_tok: Tokenizer
                                                       ) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok, in_flight=["agent/pending#1"],
                                single=[{"role": "user", "content": "Hi"}])
    data = _status(root)
    assert data["datasets"]["agent"]["trajectories"] == {
        "conversations": 4, "done": 3, "pending": 0, "in_flight": 1, "stopped_by_budget": 0,
        "turns_written": 9,
        "turns_per_conversation": {"mean": 2.25, "max": 3},
        "ends": {"last_turn": 2, "finish_length": 1}}
    assert "trajectories" not in data["datasets"]["plain"]
    assert data["datasets"]["agent"]["done"] == 9  # the existing keys count turns (records)


def test_a_conversation_without_an_end_is_pending(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    def edit(by: dict[str, list[Record]]) -> None:
        by["agent/chat"][-1].end = None  # the budget stopped it after its last turn

    data = _status(write_trajectory_run(tmp_path / "run", qwen3_tok, edit=edit))
    t = data["datasets"]["agent"]["trajectories"]
    assert (t["done"], t["pending"], t["ends"]) == (2, 2, {"last_turn": 1, "finish_length": 1})


def test_a_repeated_turn_is_counted_once(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    def edit(by: dict[str, list[Record]]) -> None:
        by["agent/loop"].append(by["agent/loop"][0])

    t = _status(write_trajectory_run(tmp_path / "run", qwen3_tok, edit=edit))[
        "datasets"]["agent"]["trajectories"]
    assert (t["turns_written"], t["turns_per_conversation"]["max"]) == (9, 3)


def _as_an_older_index(root: Path) -> None:
    """The dataset's index as written before its entries held the trajectory fields."""
    layout = RunLayout(root)
    index = layout.index(DATASET)
    old = [{k: v for k, v in orjson.loads(line).items()
            if k not in ("conversation", "turn", "end_reason")}
           for line in index.read_bytes().splitlines()]
    index.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in old))
    layout.columns(DATASET).unlink()


def test_the_fields_are_read_from_the_index_entries(tmp_path: Path, qwen3_tok: Tokenizer,
                                                    monkeypatch) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok, in_flight=["agent/pending#1"])
    entries = [orjson.loads(x) for x in RunLayout(root).index(DATASET).read_bytes().splitlines()]
    assert {(e["conversation"], e["turn"], e["end_reason"]) for e in entries} >= {
        ("agent/chat", 2, "last_turn"), ("agent/pending", 0, None)}
    monkeypatch.setattr(conversation_counts, "read_turns", _no_record_read)
    t = _status(root)["datasets"]["agent"]["trajectories"]
    assert (t["conversations"], t["done"], t["in_flight"], t["turns_written"]) == (4, 3, 1, 9)


def _no_record_read(*_: object) -> list:
    raise AssertionError("read the records' lines")


def test_a_line_whose_tail_lacks_the_fields_is_read_whole(tmp_path: Path, qwen3_tok: Tokenizer,
                                                          monkeypatch) -> None:
    long = chat_plan(row_id="c" * 3000)  # its ID alone is longer than the tail read
    root = write_trajectory_run(tmp_path / "run", qwen3_tok,
                                [*standard_conversations(), (long, standard_conversations()[0][1])])
    _as_an_older_index(root)
    t = _status(root)["datasets"]["agent"]["trajectories"]
    assert (t["conversations"], t["done"], t["ends"]["last_turn"]) == (5, 4, 3)
    monkeypatch.setattr(conversation_counts, "_line_fields", lambda line: None)
    t = _status(root)["datasets"]["agent"]["trajectories"]
    assert t["conversations"] == 4  # without the whole-line read, the long one is missed


def _stopped_by_budget(root: Path, outcome: str) -> None:
    """The last session ended `outcome`, the budget having left turns of the dataset."""
    run_json = root / "run.json"
    data = orjson.loads(run_json.read_bytes())
    data["sessions"][-1]["outcome"] = outcome
    data["datasets"] = {DATASET: {"total": 5, "skipped_budget": 4}}
    run_json.write_bytes(orjson.dumps(data))


def test_a_conversation_a_budget_stopped_is_shown_as_such(tmp_path: Path, qwen3_tok: Tokenizer
                                                          ) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok)
    _stopped_by_budget(root, "budget")
    t = _status(root)["datasets"]["agent"]["trajectories"]
    # `pending` (one turn written, no end) was stopped; a fifth conversation never started
    assert (t["done"], t["stopped_by_budget"], t["pending"], t["in_flight"]) == (3, 1, 1, 0)
    result = CliRunner().invoke(app, ["status", str(root), "--wide"], env={"COLUMNS": "200"})
    assert "stopped by budget" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith("│ agent")
               and "last_turn" in line)
    assert [c.strip() for c in row.split("│")[1:-1]][1:5] == ["3", "1", "0", "1"]


def test_a_conversation_stopped_by_hand_or_whose_turn_failed_is_not_marked_budget(
        tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok)
    _stopped_by_budget(root, "stopped")
    assert _status(root)["datasets"]["agent"]["trajectories"]["stopped_by_budget"] == 0
    _stopped_by_budget(root, "budget")
    failures = RunLayout(root).failures(DATASET)
    failures.write_bytes(orjson.dumps({"id": "agent/pending#1", "kind": "http_500",
                                       "created_at": 2.0}) + b"\n")
    t = _status(root)["datasets"]["agent"]["trajectories"]
    assert (t["stopped_by_budget"], t["pending"]) == (0, 2)


def test_status_command_shows_the_conversations(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok)
    result = CliRunner().invoke(app, ["status", str(root), "--wide"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "conversations (turns: all)" in result.output
    assert "last_turn 2, finish_length 1" in result.output
    as_json = CliRunner().invoke(app, ["status", str(root), "--json"])
    assert orjson.loads(as_json.output)["datasets"]["agent"]["trajectories"]["done"] == 3


def test_status_table_names_the_units_of_a_turns_all_row(tmp_path: Path, qwen3_tok: Tokenizer
                                                        ) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok,
                                single=[{"role": "user", "content": "Hi"}])
    result = CliRunner().invoke(app, ["status", str(root), "--wide"], env={"COLUMNS": "200"})
    agent = next(line for line in result.output.splitlines() if line.startswith("│ agent"))
    [total] = [line for line in result.output.splitlines() if line.startswith("│ total")]
    cells = [c.strip() for c in agent.split("│")[1:-1]]
    # conversations beside turns, each named (the run written here records no total)
    assert (cells[1], cells[2], cells[5]) == ("? conv", "9 turns", "1 conv")
    assert [c.strip() for c in total.split("│")[1:-1]][1] == "-"
