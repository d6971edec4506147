"""Set-up for the sharded-run tests: prompts split unevenly over shards, a priced config, and
reading every shard's answers back as one run."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from draftgen.config import load_config
from draftgen.config.backends import Price
from draftgen.store.shards import ShardSpec, shard_folders, shard_of
from tests.e2e_helpers import fast_backend, wait_for_lines, write_config, write_jsonl

PRICE = Price(prompt=0.5, completion=2.5)
"""USD per million tokens: what the test server bills and what the config says."""
MAX_TOKENS = 300
SERVER = {"mode": "openrouter", "prices": (PRICE.prompt, PRICE.completion),
          "reasoning_tokens": (20, 120), "content_tokens": (20, 120)}
"""TestServer settings: ~140 answer tokens on average, billed as priced."""

_SHARD_SCRIPT = """
import asyncio, sys
from draftgen.config import load_config
from draftgen.run import Runner, prepare
from draftgen.store.shards import ShardSpec
plan = prepare(load_config(sys.argv[1]), shard=ShardSpec.parse(sys.argv[2]))
outcome = asyncio.run(Runner(plan, live_display=False).execute())
print(outcome.status, outcome.message)
sys.exit(outcome.exit_code)
"""


def uneven_rows(per_shard: list[int], dataset: str = "d") -> list[dict[str, Any]]:
    """Rows with explicit IDs, `per_shard[i]` of them going to shard i of len(per_shard) (by
    their stored ID, `<dataset>/<id>`): a shard with few prompts finishes early."""
    count = len(per_shard)
    left = list(per_shard)
    rows: list[dict[str, Any]] = []
    i = 0
    while any(left):
        prompt_id = f"p{i}"
        shard = shard_of(f"{dataset}/{prompt_id}", count)
        if left[shard]:
            left[shard] -= 1
            rows.append({"id": prompt_id, "messages": [
                {"role": "user", "content": f"Question {i}: explain topic number {i} briefly."}]})
        i += 1
    return rows


def sharded_config(tmp_path: Path, qwen3_dir: Path, url: str, rows: list[dict[str, Any]],
                   budget_usd: float | None, concurrency: int,
                   max_output_tokens: int | None = None) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    dataset: dict[str, Any] = {"name": "d", "path": str(data)}
    if max_output_tokens is not None:
        dataset["max_output_tokens"] = max_output_tokens
    return write_config(
        tmp_path, qwen3_dir,
        backends=[fast_backend("or", "openrouter", url, concurrency=concurrency, logprobs=False,
                               price={"prompt": PRICE.prompt, "completion": PRICE.completion})],
        datasets=[dataset],
        budget={"usd": budget_usd} if budget_usd is not None else {},
        sampling={"temperature": 0.6, "max_tokens": MAX_TOKENS})


def run_shard_processes(config: Path, count: int, timeout: float = 120,
                        first_answers: int = 0) -> list[str]:
    """`count` shards of the run, each in its own process at the same time (as `draftgen run
    CONFIG --shard I/N` on several machines); their last output lines. With `first_answers`,
    shard 0 starts alone and the others once it has stored that many answers (a loaded
    machine may otherwise start it last)."""
    def start(i: int) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", _SHARD_SCRIPT, str(config),
                                 str(ShardSpec(i, count))],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = [start(0)]
    if first_answers:
        run_root = Path(load_config(config).output_dir)
        wait_for_lines(ShardSpec(0, count).folder(run_root) / "d" / "responses.jsonl",
                       first_answers, timeout)
    procs += [start(i) for i in range(1, count)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    return [out.strip().splitlines()[-1] for out in outputs]


def run_records(run_root: Path, dataset: str = "d") -> list[dict[str, Any]]:
    """Every stored answer of the run, over all its shard folders."""
    records = []
    for folder in shard_folders(run_root):
        path = folder / dataset / "responses.jsonl"
        if path.exists():
            records += [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return records


def assert_each_answered_once(records: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    counts = Counter(r["id"] for r in records)
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]
    assert set(counts) == {f"d/{row['id']}" for row in rows}


def worst_case_usd(records: list[dict[str, Any]], slack_tokens: int = 8) -> float:
    """One request's priced worst case: the longest prompt seen (plus slack for the prompts
    never sent, which are of the same shape) and `max_tokens`."""
    longest = max(len(r["input_ids"]) for r in records) + slack_tokens
    return PRICE.cost(longest, MAX_TOKENS)


def spend(records: list[dict[str, Any]]) -> float:
    return sum(r["usage"]["cost"] for r in records)
