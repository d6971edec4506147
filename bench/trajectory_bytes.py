"""Trajectory bytes: what a `turns: all` conversation's records take on disk, each turn's prompt
written whole (before) and as the earlier turn it extends plus what it adds (after,
`store.prompt_refs`), for conversations of 10, 100 and 500 turns, measured in the same run.

Two conversations of the Qwen3 format, with the real Qwen3 tokenizer, every turn's prompt
rendered by `formats.trajectory.turn_prompt` as the run renders it:

- `tool loop`: one task answered through a tool call per turn (a shell command and its output
  of about 60 tokens), each answer with a short reasoning: Qwen3 keeps the reasoning within the
  tool loop, so each prompt starts with the previous prompt and answer (one sequence);
- `chat`: a user question per turn, each answer with a short reasoning: Qwen3 drops the
  reasoning of earlier questions, so each prompt starts with the previous prompt only (a
  branch per turn; `keep` is the previous prompt's length).

"before" is the bytes of the records as lines written whole (`encode_record`, what every turn
was written as before); "after" is the responses.jsonl `Store.append_record` writes (fsync per
line, so that every turn may name the one before it). Both are checked to read back as the same
records (`LineReader`), and the time to read the file back is printed too.

    python bench/trajectory_bytes.py [--turns 10,100,500] [--json FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_machine

from draftgen.datasets.conversations import conversation_plan
from draftgen.formats import Format, get_format
from draftgen.formats.trajectory import TurnAnswer, turn_prompt
from draftgen.store import RunLayout, Store
from draftgen.store.prompt_refs import LineReader
from draftgen.store.record import Record, encode_record
from draftgen.testing.assets import qwen3_tokenizer_dir
from draftgen.tokenize import load_tokenizer

DATASET = "agent"
SHELL = {"type": "function", "function": {
    "name": "run_shell", "description": "Run a shell command in the repository.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                   "required": ["cmd"]}}}
OUTPUT = ("src/draftgen/store/record.py:{k}: def decode_record(line: bytes | str) -> Record: "
          "the record of one line; RecordError naming the field when a field is missing or "
          "of the wrong type. {k} files changed, {k} insertions(+), 3 deletions(-)")


def _call(k: int) -> dict[str, Any]:
    return {"id": f"call_{k}", "type": "function",
            "function": {"name": "run_shell", "arguments": orjson.dumps(
                {"cmd": f"grep -n decode_record src/draftgen/store/*.py | head -{k + 1}"}
            ).decode()}}


def _says(kind: str, k: int) -> tuple[str, str, list[dict[str, Any]] | None]:
    """Turn k's answer: reasoning, content, tool calls."""
    if kind == "tool loop":
        return (f"Step {k}: the last output names the decoder; look further down the file.",
                "", [_call(k)])
    return (f"The user asks question {k}; answer it in two sentences.",
            f"Answer {k}: the record is decoded by msgspec, each field checked against its "
            "type, and a line that is not a record is reported naming the field.", None)


def conversation_row(kind: str, turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."}]
    for k in range(turns):
        user = ("Find where records are decoded and explain it." if kind == "tool loop"
                else f"Question {k}: how is a record line checked?")
        if kind != "tool loop" or k == 0:
            messages.append({"role": "user", "content": user})
        reasoning, content, calls = _says(kind, k)
        last = k == turns - 1
        message: dict[str, Any] = {"role": "assistant", "content": content,
                                   "reasoning_content": reasoning}
        if calls and not last:
            message["tool_calls"] = calls
        messages.append(message)
        if calls and not last:
            messages.append({"role": "tool", "tool_call_id": calls[0]["id"],
                             "content": OUTPUT.format(k=k)})
    row: dict[str, Any] = {"id": f"{kind.replace(' ', '-')}-{turns}", "messages": messages}
    if kind == "tool loop":
        row["tools"] = [SHELL]
    return row


def conversation_records(fmt: Format, kind: str, turns: int) -> list[Record]:
    plan, _ = conversation_plan(conversation_row(kind, turns), DATASET, "bench")
    assert plan is not None and len(plan.turns) == turns
    answers: list[TurnAnswer] = []
    records = []
    for k in range(turns):
        messages, prompt_ids = turn_prompt(fmt, plan.turns, answers, plan.tools)
        reasoning, content, calls = _says(kind, k)
        calls = calls if k < turns - 1 else None
        text = fmt.answer_text(reasoning, content, calls, finished=True).text
        output_ids = fmt.tokenizer.encode(text)
        answers.append(TurnAnswer(reasoning, content, calls, output_ids))
        records.append(Record(
            id=f"{plan.id}#{k}", dataset=DATASET, messages=messages,
            tools=plan.tools or [], input_ids=prompt_ids, output_ids=output_ids,
            token_source="native", token_check="exact", flags=[], reasoning=reasoning,
            content=content, tool_calls=calls, finish_reason="tool_calls" if calls else "stop",
            backend="engine", model="qwen/qwen3-8b", created_at=1.0 + k, latency_s=1.0,
            conversation=plan.id, turn=k, end="last_turn" if k == turns - 1 else None,
            sampling={}))
    return records


def measure(fmt: Format, kind: str, turns: int, folder: Path) -> dict[str, Any]:
    records = conversation_records(fmt, kind, turns)
    before = sum(len(encode_record(r)) + 1 for r in records)
    store = Store(folder, fsync_interval_s=0)
    for record in records:
        store.append_record(DATASET, record)
    store.close()
    path = RunLayout(folder).responses(DATASET)
    after = path.stat().st_size
    t0 = time.perf_counter()
    read: list[Any] = []
    start = 0
    with LineReader(path) as reader:
        for line in path.read_bytes().splitlines(keepends=True):
            read.append(reader.read(line, start))
            start += len(line)
    read_s = time.perf_counter() - t0
    assert read == records, f"{kind}, {turns} turns: the records do not read back the same"
    return {"kind": kind, "turns": turns, "before_bytes": before, "after_bytes": after,
            "ratio": round(before / after, 1), "read_back_s": round(read_s, 3),
            "prompt_tokens_last_turn": len(records[-1].input_ids)}


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", default="10,100,500")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print_machine()
    fmt = get_format("qwen3", load_tokenizer(qwen3_tokenizer_dir()))
    results = []
    with tempfile.TemporaryDirectory(prefix="draftgen-trajectory-bytes-") as tmp:
        for kind in ("tool loop", "chat"):
            for turns in (int(t) for t in args.turns.split(",")):
                results.append(measure(fmt, kind, turns, Path(tmp) / f"{kind}-{turns}"))
    print("| conversation | turns | last prompt (tokens) | before | after | before / after "
          "| read back |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['kind']} | {r['turns']} | {r['prompt_tokens_last_turn']:,} | "
              f"{_mb(r['before_bytes'])} | {_mb(r['after_bytes'])} | {r['ratio']}x | "
              f"{r['read_back_s']:.2f} s |")
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
