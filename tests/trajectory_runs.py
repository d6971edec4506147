"""Run folders of `turns: all` datasets, written as a run writes them: per conversation, each
turn's prompt from `formats.trajectory.turn_prompt` (the target's earlier answers as history),
the answer's native IDs from the real Qwen3 tokenizer, the record from `run.make_record` with
the trajectory fields, appended by `store.Store` (index and columns as a run writes them).

The conversations (from tests/test_trajectory.py's dataset rows):

* `chat`: three user queries; Qwen3 drops the reasoning of earlier queries from history, so
  each turn is its own branch; ends `last_turn`;
* `loop`: one query answered through two tool calls: every turn extends the previous, one
  sequence; ends `last_turn`;
* `cut`: the chat cut by `max_tokens` at its second turn: ends `finish_length`;
* `pending`: the chat with one turn written and no end (stopped by the budget, or in flight).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from draftgen.datasets.conversations import ConversationPlan, conversation_plan
from draftgen.formats import Format, get_format
from draftgen.formats.trajectory import TurnAnswer, end_after, turn_prompt
from draftgen.run import make_record
from draftgen.store import Store
from draftgen.store.record import Record
from draftgen.store.runjson_writer import end_session, start_session
from draftgen.tokenize import Tokenizer
from draftgen.types import Message, Prompt, RawAnswer, Usage
from tests.e2e_helpers import records_in
from tests.test_trajectory import CHAT, CHAT_SAYS, TOOL_LOOP_MESSAGES, WEATHER, Say, call

DATASET = "agent"


LOOP_SAYS = [Say("", "Look up Paris.", [call("c1", "Paris")]),
             Say("", "Then Tokyo.", [call("c2", "Tokyo")]),
             Say("Paris: 21C. Tokyo: 28C.", "Both known.")]
LOOP = TOOL_LOOP_MESSAGES[:6]
"""One query answered through two tool calls (no second query): one sequence in Qwen3."""


def chat_plan(dataset: str = DATASET, row_id: str = "chat") -> ConversationPlan:
    messages = [m for turn in CHAT.turns for m in [*turn.context, *([turn.expected]
                                                                    if turn.expected else [])]]
    plan, _ = conversation_plan({"id": row_id, "messages": messages}, dataset, "test")
    return plan


def loop_plan(dataset: str = DATASET, row_id: str = "loop") -> ConversationPlan:
    plan, _ = conversation_plan({"id": row_id, "messages": LOOP, "tools": [WEATHER]}, dataset,
                                "test")
    return plan


def standard_conversations(dataset: str = DATASET
                           ) -> list[tuple[ConversationPlan, list[Say]]]:
    cut = [CHAT_SAYS[0], Say("It is", "Two plus", finished=False)]
    return [(chat_plan(dataset), CHAT_SAYS), (loop_plan(dataset), LOOP_SAYS),
            (chat_plan(dataset, "cut"), cut), (chat_plan(dataset, "pending"), CHAT_SAYS[:1])]


def _raw(fmt: Format, tok: Tokenizer, say: Say, k: int) -> RawAnswer:
    text = fmt.answer_text(say.reasoning, say.content, say.tool_calls,
                           finished=say.finished).text
    ids = tok.encode(text)
    finish = ("tool_calls" if say.tool_calls else "stop") if say.finished else "length"
    raw = RawAnswer(reasoning=say.reasoning, content=say.content, tool_calls=say.tool_calls,
                    finish_reason=finish, usage=Usage(prompt_tokens=10, completion_tokens=len(ids),
                                                      cost=0.0001),
                    model="qwen/qwen3-8b", request_id=f"gen-{k}")
    raw.output_ids = ids
    return raw


def conversation_records(fmt: Format, plan: ConversationPlan, says: list[Say],
                         sampling: dict[str, Any] | None = None) -> list[Record]:
    """The records of one conversation's turns, as the run writes them."""
    backend = SimpleNamespace(name="local-sglang", cfg=SimpleNamespace(provider_routing=None))
    answers: list[TurnAnswer] = []
    records = []
    for k, say in enumerate(says):
        messages, prompt_ids = turn_prompt(fmt, plan.turns, answers, plan.tools)
        prompt = Prompt(f"{plan.id}#{k}", plan.dataset, messages, plan.tools)
        raw = _raw(fmt, fmt.tokenizer, say, k)
        [rebuilt] = fmt.rebuild_batch([raw], [prompt])
        record = make_record(prompt, prompt_ids, raw, rebuilt, backend,  # type: ignore[arg-type]
                             0.0001, 1.0, 0, cost_source="reported")
        answer = TurnAnswer.from_rebuilt(rebuilt, finished=say.finished)
        answers.append(answer)
        record.conversation, record.turn, record.sampling = plan.id, k, sampling or {}
        nxt = plan.turns[k + 1] if k + 1 < len(plan.turns) else None
        record.end = end_after(plan.turns[k], answer, nxt)
        records.append(record)
        if record.end is not None:
            break
    return records


Edit = Callable[[dict[str, list[Record]]], None]


def write_trajectory_run(root: Path, tok: Tokenizer,
                         conversations: list[tuple[ConversationPlan, list[Say]]] | None = None,
                         *, edit: Edit | None = None, dataset: str = DATASET,
                         single: list[Message] | None = None,
                         in_flight: list[str] = ()) -> Path:  # type: ignore[assignment]
    """A run folder whose `dataset` has `turns: all`, the turns written interleaved across
    conversations (as concurrent requests land). `edit` may change each conversation's records
    before they are written (a gap, a repeated turn, an early end). `single`: also a
    `turns: first` dataset "plain" with one answer to these messages. `in_flight`: request
    IDs journaled as sent and never ended."""
    fmt = get_format("qwen3", tok)
    conversations = conversations or standard_conversations(dataset)
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "output_dir": str(root),
        "model": {"name": "qwen/qwen3-8b", "format": "qwen3", "tokenizer": str(tok.path)},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": None, "max_tokens": 4096,
                     "seed": None, "extra": {}},
        "backends": [{"name": "local-sglang"}],
        "datasets": [{"name": dataset, "turns": "all"},
                     *([{"name": "plain"}] if single else [])],
    }
    session = start_session(root / "run.json", config, {"path": str(tok.path),
                                                          "sha256": tok.sha256})
    by_conversation = {plan.id: conversation_records(fmt, plan, says)
                       for plan, says in conversations}
    if edit is not None:
        edit(by_conversation)
    store = Store(root, fsync_interval_s=0)
    depth = max((len(r) for r in by_conversation.values()), default=0)
    for i in range(depth):
        for records in by_conversation.values():
            if i < len(records):
                store.append_record(dataset, records[i])
    for rid in in_flight:
        store.journal({"ev": "sent", "id": rid, "dataset": dataset, "t": 1.0, "session": 0})
    if single:
        prompt = Prompt("plain/one", "plain", single, None)
        raw = _raw(fmt, tok, Say("Plain answer."), 0)
        [rebuilt] = fmt.rebuild_batch([raw], [prompt])
        backend = SimpleNamespace(name="local-sglang", cfg=SimpleNamespace(provider_routing=None))
        store.append_record("plain", make_record(
            prompt, fmt.render_prompt(single, None), raw, rebuilt, backend,  # type: ignore[arg-type]
            0.0001, 1.0, 0, cost_source="reported"))
    store.close()
    end_session(root / "run.json", session, "completed",
                {"done_now": sum(len(r) for r in by_conversation.values())})
    return root


def read_lines(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's lines; a responses file's turns read back whole
    (`tests.e2e_helpers.records_in`)."""
    if path.name == "responses.jsonl":
        return records_in(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
