"""datasets.conversations (`turns: all`): rows → conversation plans the run walks turn by turn;
`turns: first | last` unchanged; the run refusing what it does not do yet. No network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.config import DatasetConfig
from draftgen.datasets import BadRowError, DatasetError, LoadStats, load_prompt_table, load_prompts
from draftgen.datasets.conversations import (
    CALLS_UNANSWERED,
    RESULTS_UNASKED,
    conversation_plan,
    iter_conversations,
    plan_turns,
)
from tests.test_datasets import system, user, write_jsonl


def assistant(content: str, calls: list[dict[str, Any]] | None = None, **extra: Any
              ) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": content, **extra}
    if calls:
        m["tool_calls"] = calls
    return m


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
AGENT_ROW = {"id": "agent-1", "system": "Be brief.", "tools": [{"name": "f"}], "messages": [
    user("Do it"), assistant("", [CALL], reasoning_content="call f"), tool("c1", "done"),
    assistant("Done."), user("Again?"), assistant("No."),
]}


def test_plan_walks_every_assistant_turn() -> None:
    plan, _ = conversation_plan(AGENT_ROW, "agents", "rows.jsonl:1")
    assert plan.id == "agents/agent-1" and plan.source == "rows.jsonl:1"
    assert plan.tools == [{"type": "function", "function": {"name": "f"}}]
    assert [t.context for t in plan.turns] == [
        [system("Be brief."), user("Do it")], [tool("c1", "done")], [user("Again?")]]
    assert [t.expected for t in plan.turns] == [
        assistant("", [CALL], reasoning_content="call f"), assistant("Done."),
        assistant("No.")]
    assert plan.ends_early is None


def test_a_trailing_question_or_tool_result_is_a_turn_without_expected_answer() -> None:
    turns, end = plan_turns([user("A"), assistant("a"), user("B")])
    assert [(t.context, t.expected) for t in turns] == [
        ([user("A")], assistant("a")), ([user("B")], None)]
    assert end is None
    turns, _ = plan_turns([user("A"), assistant("", [CALL]), tool("c1", "r")])
    assert [(t.context, t.expected) for t in turns] == [
        ([user("A")], assistant("", [CALL])), ([tool("c1", "r")], None)]
    turns, _ = plan_turns([user("A")])  # a prompt-only row: one turn
    assert [(t.context, t.expected) for t in turns] == [([user("A")], None)]


def test_a_plan_stops_where_the_dataset_cannot_go_on_honestly() -> None:
    turns, end = plan_turns([user("A"), assistant("", [CALL]), user("B"), assistant("b")])
    assert len(turns) == 1 and end == CALLS_UNANSWERED
    turns, end = plan_turns([user("A"), assistant("a"), tool("c1", "r"), assistant("b")])
    assert len(turns) == 1 and end == RESULTS_UNASKED
    turns, end = plan_turns([user("A"), assistant("", [CALL])])  # the last turn: fine
    assert len(turns) == 1 and end is None


def test_a_row_without_a_user_turn_is_a_bad_row_naming_the_dataset() -> None:
    for messages in ([assistant("hi"), user("A"), assistant("a")], [system("S")]):
        with pytest.raises(BadRowError, match="dataset 'agents': no user turn"):
            conversation_plan({"messages": messages}, "agents", "t:1")


def test_iter_conversations_reads_ids_duplicates_and_bad_rows(tmp_path: Path) -> None:
    rows = [AGENT_ROW, AGENT_ROW, {"messages": [assistant("x")]},
            {"messages": [user("Q"), assistant("A")]}]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    stats = LoadStats()
    plans = list(iter_conversations(DatasetConfig(name="agents", path=str(path), turns="all"),
                                    stats))
    assert [p.id for p in plans] == ["agents/agent-1", plans[1].id]
    assert plans[1].id.startswith("agents/h")
    assert (stats.rows, stats.prompts, stats.duplicates, stats.bad_rows) == (4, 2, 1, 1)
    assert "dataset 'agents': no user turn" in stats.examples[0].reason
    with pytest.raises(DatasetError, match="for turns: all, not turns: first"):
        iter_conversations(DatasetConfig(name="agents", path=str(path)))


def test_first_and_last_are_unchanged(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [AGENT_ROW])
    [first], _ = load_prompts(DatasetConfig(name="d", path=str(path)))
    assert first.messages == [system("Be brief."), user("Do it")]
    [last], _ = load_prompts(DatasetConfig(name="d", path=str(path), turns="last"))
    assert last.messages == [system("Be brief."), *AGENT_ROW["messages"][:-1]]
    # "last" still takes a prompt whose first user turn follows an assistant turn
    other = write_jsonl(tmp_path / "o.jsonl", [{"messages": [
        assistant("hello"), user("A"), assistant("a")]}])
    [late], stats = load_prompts(DatasetConfig(name="d", path=str(other), turns="last"))
    assert late.messages == [assistant("hello"), user("A")] and stats.bad_rows == 0


def test_sampling_mix_needs_turns_all(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [AGENT_ROW])
    cfg = DatasetConfig(name="d", path=str(path),
                        sampling_mix=[{"weight": 1, "temperature": 1.0}])
    message = "dataset 'd': sampling_mix needs turns: all"
    with pytest.raises(DatasetError, match=message):
        load_prompts(cfg)
    with pytest.raises(DatasetError, match=message):
        load_prompt_table(cfg, tmp_path / "cache")


def test_turns_all_reads_as_first_turn_prompts(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [AGENT_ROW])
    cfg = DatasetConfig(name="d", path=str(path), turns="all")
    [plan] = iter_conversations(cfg)
    [prompt], stats = load_prompts(cfg)
    table, _ = load_prompt_table(cfg, tmp_path / "cache")
    assert prompt.id == plan.id == table.ids[0] and stats.prompts == 1
    assert prompt.messages == list(plan.turns[0].context) == table.load([0])[0].messages
    assert not (tmp_path / "cache").exists()


def test_draftgen_run_dry_run_reads_turns_all(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "c.jsonl", [AGENT_ROW])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "output_dir": str(tmp_path / "run"),
        "model": {"name": "m", "format": "qwen3", "tokenizer": str(qwen3_dir)},
        "backends": [{"name": "b", "type": "vllm", "url": "http://127.0.0.1:9"}],
        "datasets": [{"name": "d", "path": str(data), "turns": "all"}],
    }))
    result = CliRunner().invoke(app, ["run", "--dry-run", str(config)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "run" / "d").exists()
