"""`draftgen status` on a `turns: all` dataset: conversations done (a turn with an `end`),
pending, in flight, turns written, turns per conversation and the end reasons, read from the
index's line ends and the lines' tails (tests/trajectory_runs.py writes the run)."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.status import trajectories as status_trajectories
from draftgen.status.collect import collect_status
from draftgen.store.record import Record
from draftgen.tokenize import Tokenizer
from tests.trajectory_runs import chat_plan, standard_conversations, write_trajectory_run


def _status(root: Path) -> dict:
    return collect_status(root).as_json()


def test_conversations_done_pending_in_flight_and_ends(tmp_path: Path, qwen3_tok: Tokenizer
                                                       ) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok, in_flight=["agent/pending#1"],
                                single=[{"role": "user", "content": "Hi"}])
    data = _status(root)
    assert data["datasets"]["agent"]["trajectories"] == {
        "conversations": 4, "done": 3, "pending": 0, "in_flight": 1, "turns_written": 9,
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


def test_a_line_whose_tail_lacks_the_fields_is_read_whole(tmp_path: Path, qwen3_tok: Tokenizer,
                                                          monkeypatch) -> None:
    long = chat_plan(row_id="c" * 3000)  # its ID alone is longer than the tail read
    root = write_trajectory_run(tmp_path / "run", qwen3_tok,
                                [*standard_conversations(), (long, standard_conversations()[0][1])])
    t = _status(root)["datasets"]["agent"]["trajectories"]
    assert (t["conversations"], t["done"], t["ends"]["last_turn"]) == (5, 4, 3)
    monkeypatch.setattr(status_trajectories, "_line_fields", lambda line: None)
    t = _status(root)["datasets"]["agent"]["trajectories"]
    assert t["conversations"] == 4  # without the whole-line read, the long one is missed


def test_status_command_shows_the_conversations(tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok)
    result = CliRunner().invoke(app, ["status", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "conversations (turns: all)" in result.output
    assert "last_turn 2, finish_length 1" in result.output
    as_json = CliRunner().invoke(app, ["status", str(root), "--json"])
    assert orjson.loads(as_json.output)["datasets"]["agent"]["trajectories"]["done"] == 3


def test_status_table_names_the_units_of_a_turns_all_row(tmp_path: Path, qwen3_tok: Tokenizer
                                                        ) -> None:
    root = write_trajectory_run(tmp_path / "run", qwen3_tok,
                                single=[{"role": "user", "content": "Hi"}])
    result = CliRunner().invoke(app, ["status", str(root)], env={"COLUMNS": "200"})
    agent = next(line for line in result.output.splitlines() if line.startswith("│ agent"))
    [total] = [line for line in result.output.splitlines() if line.startswith("│ total")]
    cells = [c.strip() for c in agent.split("│")[1:-1]]
    # conversations beside turns, each named (the run written here records no total)
    assert (cells[1], cells[2], cells[5]) == ("? conv", "9 turns", "1 conv")
    assert [c.strip() for c in total.split("│")[1:-1]][1] == "-"
