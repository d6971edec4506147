"""`turns: all` in the run (docs/trajectories.md): every assistant turn of each conversation
answered by the target in order, on the loopback test server with the real Qwen3 tokenizer;
each turn written as it arrives, continued after a kill -9 from the last written turn, tool
turns fed back only when the target made the dataset's call, budget cuts left pending, and the
sampling mix recorded."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.audit import audit_run
from draftgen.config import RunConfig, load_config
from draftgen.datasets.conversations import iter_conversations
from draftgen.formats import get_format
from draftgen.run import Runner, prepare
from draftgen.run.turns import Formats, start_conversation
from draftgen.status import collect_status
from draftgen.store.journal import read_journal
from draftgen.store.shards import ShardSpec, run_folders
from draftgen.testing.assets import family_tokenizer
from draftgen.testing.fake_engine import TOOL_ARGUMENTS, TOOL_NAME, TestServer
from tests.e2e_helpers import (
    WEATHER_TOOL,
    fast_backend,
    read_records,
    run_config,
    write_config,
    write_jsonl,
)
from tests.test_formats_gpt_oss_harmony import DATE
from tests.test_formats_gpt_oss_harmony import enc as enc  # the fixture


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def call(city: str, call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": TOOL_NAME, "arguments": orjson.dumps({"city": city}).decode()}}


def tool_result(text: str, call_id: str = "c1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def chat_rows(n: int, turns: int = 3) -> list[dict[str, Any]]:
    """`n` conversations of `turns` user turns each (the dataset's own answers in between,
    which the target's replace)."""
    rows = []
    for i in range(n):
        messages: list[dict[str, Any]] = []
        for k in range(turns):
            messages += [user(f"Conversation {i}, question {k}: tell me about topic {i}-{k}."),
                         assistant(f"the dataset's answer {i}-{k}")]
        rows.append({"id": f"c{i}", "messages": messages})
    return rows


def engine_config(tmp_path: Path, qwen3_dir: Path, server: TestServer,
                  datasets: list[dict[str, Any]], concurrency: int = 4, **top: Any) -> Path:
    """A run.yaml with one chat backend (`vllm`) on the test server."""
    return write_config(tmp_path, qwen3_dir, backends=[
        fast_backend("engine", "vllm", server.url, concurrency=concurrency)],
        datasets=datasets, **top)


def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def by_conversation(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: (r["conversation"], r["turn"])):
        out.setdefault(r["conversation"], []).append(r)
    return out


def chat_bodies(server: TestServer) -> list[dict[str, Any]]:
    return [b for b in server.stats["bodies"] if isinstance(b, dict) and "messages" in b]


def answered(server: TestServer) -> int:
    return int(server.stats["responses"].get("200", 0))


def test_every_turn_regenerated_with_the_targets_own_answers_as_history(
        tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(6))
    with TestServer(latency_s=0.01, reasoning_tokens=(3, 8), content_tokens=(3, 8)) as server:
        cfg = engine_config(tmp_path, qwen3_dir, server, concurrency=4,
            datasets=[{"name": "chat", "path": str(data), "turns": "all"}])
        outcome = run_config(cfg)
        bodies = chat_bodies(server)
    assert outcome.status == "completed", outcome.message
    records = read_records(run_dir(tmp_path), "chat")
    conversations = by_conversation(records)
    assert len(conversations) == 6 and len(records) == 18 == len(bodies)
    for conversation, turns in conversations.items():
        assert [r["turn"] for r in turns] == [0, 1, 2]
        assert [r["id"] for r in turns] == [f"{conversation}#{k}" for k in range(3)]
        assert [r["end"] for r in turns] == [None, None, "last_turn"]
        assert all(r["sampling"] == {} for r in turns)
        for k, r in enumerate(turns):
            history = [m for m in r["messages"] if m["role"] == "assistant"]
            # the target's own earlier answers, never the dataset's
            assert [m["content"] for m in history] == [t["content"] for t in turns[:k]]
            assert [m.get("reasoning_content") for m in history] == \
                [t["reasoning"] for t in turns[:k]]
            # the server was sent exactly that prompt
            assert any(b["messages"] == r["messages"] for b in bodies)
    counters = outcome.counters.total() if outcome.counters else None
    assert counters is not None and counters.done == 18 and counters.pending == 0


def test_a_truncated_turn_ends_its_conversation(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(3))
    with TestServer(reasoning_tokens=(30, 40), content_tokens=(30, 40)) as server:
        cfg = engine_config(tmp_path, qwen3_dir, server, concurrency=4,
            datasets=[{"name": "chat", "path": str(data), "turns": "all"}],
            sampling={"max_tokens": 10})
        outcome = run_config(cfg)
    assert outcome.status == "completed", outcome.message
    records = read_records(run_dir(tmp_path), "chat")
    assert [(r["turn"], r["finish_reason"], r["end"]) for r in records] == \
        [(0, "length", "finish_length")] * 3
    assert outcome.counters is not None and outcome.counters.total().pending == 0


def tool_rows() -> list[dict[str, Any]]:
    weather = "What is the weather in Paris?"
    return [
        # the target calls get_weather(Paris) as the dataset did: the result is fed back
        {"id": "same", "tools": [WEATHER_TOOL], "messages": [
            user(weather), assistant("", [call("Paris")]), tool_result("sunny"),
            assistant("", [call("Paris", "c2")])]},
        {"id": "differs", "tools": [WEATHER_TOOL], "messages": [
            user(weather), assistant("", [call("London")]), tool_result("rain"),
            assistant("It rains.")]},
        {"id": "declined", "tools": [WEATHER_TOOL], "messages": [
            user("DECLINE: " + weather), assistant("", [call("Paris")]),
            tool_result("sunny"), assistant("It is sunny.")]},
    ]


def test_tool_results_fed_back_only_for_the_same_call(tmp_path: Path, qwen3_dir: Path) -> None:
    assert TOOL_ARGUMENTS == {"city": "Paris"}
    data = write_jsonl(tmp_path / "tools.jsonl", tool_rows())
    with TestServer(declines_tool_for="DECLINE", reasoning_tokens=(3, 8),
                    content_tokens=(3, 8)) as server:
        cfg = engine_config(tmp_path, qwen3_dir, server, concurrency=4,
            datasets=[{"name": "tools", "path": str(data), "turns": "all"}])
        outcome = run_config(cfg)
        bodies = chat_bodies(server)
    assert outcome.status == "completed", outcome.message
    conversations = by_conversation(read_records(run_dir(tmp_path), "tools"))
    ends = {c.split("/")[-1]: [r["end"] for r in turns] for c, turns in conversations.items()}
    assert ends == {"same": [None, "last_turn"], "differs": ["tool_call_differs"],
                    "declined": ["no_tool_call"]}
    first, second = conversations["tools/same"]
    [target_call] = first["tool_calls"]
    fed = [m for m in second["messages"] if m["role"] == "tool"]
    assert fed == [{"role": "tool", "tool_call_id": target_call["id"], "content": "sunny"}]
    assert len(bodies) == 4  # nothing sent after a conversation ended


def test_a_budget_cut_leaves_conversations_pending_and_a_later_run_finishes_them(
        tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(4))
    dataset = {"name": "chat", "path": str(data), "turns": "all"}
    with TestServer(reasoning_tokens=(3, 8), content_tokens=(3, 8)) as server:
        backends = [fast_backend("engine", "vllm", server.url, concurrency=2)]
        cfg = write_config(tmp_path, qwen3_dir, backends=backends,
                           datasets=[{**dataset, "max_output_tokens": 400}],
                           sampling={"max_tokens": 128})
        outcome = run_config(cfg)
        assert outcome.status == "completed", outcome.message
        cut = read_records(run_dir(tmp_path), "chat")
        assert 0 < len(cut) < 12
        assert all(r["end"] in (None, "last_turn") for r in cut)
        pending = [c for c, turns in by_conversation(cut).items() if turns[-1]["end"] is None]
        assert pending
        assert outcome.counters is not None and outcome.counters.total().skipped > 0
        shown = collect_status(run_dir(tmp_path)).as_json()["datasets"]["chat"]["trajectories"]
        assert shown["stopped_by_budget"] == len(pending)  # not shown as pending (running)
        assert shown["pending"] == 4 - shown["done"] - len(pending)
        sent_before = answered(server)
        cfg = write_config(tmp_path, qwen3_dir, backends=backends, datasets=[dataset],
                           sampling={"max_tokens": 128})
        outcome = run_config(cfg)
        sent = answered(server) - sent_before
    assert outcome.status == "completed", outcome.message
    records = read_records(run_dir(tmp_path), "chat")
    assert records[:len(cut)] == cut
    assert len(records) == len(cut) + sent == 12
    assert Counter(r["id"] for r in records).most_common(1)[0][1] == 1
    for turns in by_conversation(records).values():
        assert [r["turn"] for r in turns] == [0, 1, 2] and turns[-1]["end"] == "last_turn"


MIX = [{"weight": 1, "temperature": 0.1, "max_tokens": 64},
       {"weight": 1, "temperature": 0.9, "top_p": 0.5}]


def test_sampling_mix_recorded_on_every_turn_and_sent(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(12, turns=2))
    with TestServer(reasoning_tokens=(3, 8), content_tokens=(3, 8)) as server:
        cfg = engine_config(tmp_path, qwen3_dir, server, concurrency=4,
            datasets=[{"name": "chat", "path": str(data), "turns": "all", "sampling_mix": MIX}],
            sampling={"temperature": 0.6, "top_p": 0.95, "max_tokens": 256, "seed": 7})
        outcome = run_config(cfg)
        bodies = chat_bodies(server)
    assert outcome.status == "completed", outcome.message
    records = read_records(run_dir(tmp_path), "chat")
    assert len(records) == 24
    drawn = {r["conversation"]: r["sampling"] for r in records if r["turn"] == 0}
    assert {orjson.dumps(s) for s in drawn.values()} == {
        orjson.dumps({"temperature": 0.1, "max_tokens": 64}),
        orjson.dumps({"temperature": 0.9, "top_p": 0.5})}
    for r in records:
        assert r["sampling"] == drawn[r["conversation"]]
        [body] = [b for b in bodies if b["messages"] == r["messages"]]
        want = {"temperature": 0.6, "top_p": 0.95, "max_tokens": 256, **r["sampling"]}
        assert {k: body[k] for k in want} == want


def _left_open(run: Path) -> set[str]:
    """The requests the last (killed) session left open with no record written: paid for,
    perhaps, and sent again by the next session."""
    written = {r["id"] for r in read_records(run, "chat")}
    return {r.id for r in read_journal(run / "journal.jsonl").open} - written


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_no_turn_lost_or_paid_twice(
        tmp_path: Path, qwen3_dir: Path) -> None:
    rng = random.Random(27)
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(60))
    mix = [{"weight": 1, "temperature": 0.2}, {"weight": 1, "temperature": 0.8}]
    run = run_dir(tmp_path)
    responses = run / "chat" / "responses.jsonl"
    open_at_kills = 0
    with TestServer(latency_s=0.05, reasoning_tokens=(3, 8), content_tokens=(3, 8)) as server:
        cfg = engine_config(tmp_path, qwen3_dir, server, concurrency=16,
            datasets=[{"name": "chat", "path": str(data), "turns": "all", "sampling_mix": mix}],
            sampling={"temperature": 0.6, "max_tokens": 512, "seed": 3}, fsync_interval_s=0)
        drawn: dict[str, Any] = {}
        for _ in range(3):
            before = responses.read_bytes().count(b"\n") if responses.exists() else 0
            proc = subprocess.Popen(
                [sys.executable, "-m", "draftgen", "run", str(cfg), "--no-live", "--no-probe"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 120
            target = before + rng.randint(5, 40)
            while time.monotonic() < deadline and proc.poll() is None:
                if responses.exists() and responses.read_bytes().count(b"\n") >= target:
                    break
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.1))
            assert proc.poll() is None, "the run ended before its kill"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            open_at_kills += len(_left_open(run))
            for r in read_records(run, "chat"):
                assert drawn.setdefault(r["conversation"], r["sampling"]) == r["sampling"]
        outcome = run_config(cfg)
        served = answered(server)
        sent = Counter(orjson.dumps(b["messages"]) for b in chat_bodies(server))
    assert outcome.status == "completed", outcome.message
    records = read_records(run, "chat")
    ids = Counter(r["id"] for r in records)
    assert ids.most_common(1)[0][1] == 1, "a turn was written twice"
    conversations = by_conversation(records)
    assert len(conversations) == 60
    for conversation, turns in conversations.items():
        assert [r["turn"] for r in turns] == [0, 1, 2] and turns[-1]["end"] == "last_turn"
        assert all(r["sampling"] == drawn.get(conversation, r["sampling"]) for r in turns)
        for k, r in enumerate(turns):
            history = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
            assert history == [t["content"] for t in turns[:k]]
    assert open_at_kills > 0, "no kill landed with requests in flight"
    # every answer the server gave is written, but those in flight at a kill (journaled open)
    assert len(records) <= served <= len(records) + open_at_kills
    assert sum(sent.values()) - len(sent) <= open_at_kills, "a written turn was sent again"
    assert set(sent) == {orjson.dumps(r["messages"]) for r in records}


EFFORT_MIX = [{"weight": 1, "reasoning_effort": "low"}, {"weight": 1, "reasoning_effort": "high"}]


def test_a_drawn_reasoning_effort_renders_the_prompt_and_rides_in_chat_bodies(
        tmp_path: Path, enc: Any) -> None:
    """gpt-oss: each conversation's drawn effort is in its prompt (a format per option set,
    built once) and, for a backend that renders the messages itself, in the request body."""
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(16, turns=2))
    cfg = RunConfig.model_validate({
        "output_dir": str(tmp_path / "run"),
        "model": {"name": "openai/gpt-oss-20b", "format": "gpt-oss", "tokenizer": "unused",
                  "format_options": {"current_date": DATE}},
        "sampling": {"temperature": 1.0, "seed": 5},
        "backends": [{"name": "b", "type": "vllm", "url": "http://127.0.0.1:9"}],
        "datasets": [{"name": "chat", "path": str(data), "turns": "all",
                      "sampling_mix": EFFORT_MIX}]})
    fmt = get_format("gpt-oss", family_tokenizer("gpt-oss"), {"current_date": DATE})
    formats = Formats(cfg, fmt)
    conversations = [start_conversation(plan, cfg, formats, [])
                     for plan in iter_conversations(cfg.datasets[0])]
    efforts = {c.drawn["reasoning_effort"] for c in conversations}
    assert efforts == {"low", "high"}
    assert len({id(c.fmt) for c in conversations}) == 2  # one format per effort, shared
    for c in conversations:
        effort = c.drawn["reasoning_effort"]
        text = c.fmt.prompt_text(c.next_prompt().messages, None)
        assert f"Reasoning: {effort}" in text
        chat = c.request_sampling(takes_prompt_ids=False)
        native = c.request_sampling(takes_prompt_ids=True)
        assert chat is not None and chat.extra == {"reasoning_effort": effort}
        assert native is not None and native.extra == {} and native.temperature == 1.0


def test_sharded_conversations_each_walked_in_one_shard_and_read_as_one_run(
        tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(10))
    with TestServer(latency_s=0.01, reasoning_tokens=(3, 8), content_tokens=(3, 8)) as server:
        cfg = engine_config(tmp_path, qwen3_dir, server, concurrency=4,
            datasets=[{"name": "chat", "path": str(data), "turns": "all"}])
        for i in range(2):
            outcome = asyncio.run(Runner(prepare(load_config(cfg), ShardSpec(i, 2)),
                                         live_display=False).execute())
            assert outcome.status == "completed", outcome.message
    root = run_dir(tmp_path)
    shards = [read_records(folder, "chat") for folder in run_folders(root)]
    assert all(shards) and sum(map(len, shards)) == 30 == answered(server)
    homes = [{r["conversation"] for r in records} for records in shards]
    assert not set.intersection(*homes)  # every conversation's turns in one shard's folder
    for records in shards:
        assert all([r["turn"] for r in turns] == [0, 1, 2]
                   for turns in by_conversation(records).values())
    status = collect_status(root).as_json()["datasets"]["chat"]["trajectories"]
    assert (status["conversations"], status["done"], status["pending"]) == (10, 10, 0)
    audit = audit_run(root, workers=1)
    assert audit.ok and audit.trajectories["chat"].conversations == 10
