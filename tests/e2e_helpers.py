"""Shared set-up for the end-to-end tests: datasets on disk, a run.yaml, a run, reading back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from draftgen.config import load_config
from draftgen.run import Outcome, Runner, prepare
from draftgen.store.prompt_refs import LineReader
from draftgen.store.record import Record, record_as_dict

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}


def mixed_rows(n: int, tag: str = "") -> list[dict[str, Any]]:
    """`n` prompts in the common schemas, every fifth with a tool that invites a call."""
    rows: list[dict[str, Any]] = []
    for i in range(n):
        text = f"Question {tag}{i}: explain topic number {i} briefly."
        kind = i % 5
        if kind == 0:
            rows.append({"id": f"r{i}", "messages": [{"role": "user", "content": text}]})
        elif kind == 1:
            rows.append({"problem": text, "solution": "ignored"})
        elif kind == 2:
            rows.append({"conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": text},
                {"from": "gpt", "value": "an answer that is not the target's"},
            ]})
        elif kind == 3:
            rows.append({"instruction": text, "input": f"context {i}"})
        else:
            rows.append({"id": f"t{i}", "tools": [WEATHER_TOOL], "messages": [
                {"role": "user", "content": f"What is the weather in city {tag}{i}?"}]})
    return rows


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]], extra_lines: Sequence[bytes] = ()
                ) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for row in rows:
            f.write(orjson.dumps(row) + b"\n")
        for line in extra_lines:
            f.write(line + b"\n")
    return path


def write_config(tmp_path: Path, tokenizer: Path, backends: list[dict[str, Any]],
                 datasets: list[dict[str, Any]], **top: Any) -> Path:
    cfg = {
        "output_dir": str(tmp_path / "run"),
        "model": {"name": "test/qwen3", "format": "qwen3", "tokenizer": str(tokenizer)},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 2048},
        "backends": backends,
        "datasets": datasets,
        **top,
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_config(path: Path) -> Outcome:
    plan = prepare(load_config(path))
    return asyncio.run(Runner(plan, live_display=False).execute())


def read_records(run_dir: Path, dataset: str) -> list[dict[str, Any]]:
    return records_in(run_dir / dataset / "responses.jsonl")


def records_in(path: Path) -> list[dict[str, Any]]:
    """Each line of a responses file as JSON, a turn written as the turn it extends read back
    whole (`store.prompt_refs`)."""
    if not path.exists():
        return []
    out = []
    start = 0
    with LineReader(path) as reader:
        for line in path.read_bytes().splitlines(keepends=True):
            record = reader.read(line, start)
            out.append(record_as_dict(record) if isinstance(record, Record)
                       else orjson.loads(line))
            start += len(line)
    return out


def read_failures(run_dir: Path, dataset: str) -> list[dict[str, Any]]:
    path = run_dir / dataset / "failures.jsonl"
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def fast_backend(name: str, type_: str, url: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "url": url, "backoff_base_s": 0.01,
            "backoff_max_s": 2.0, **kw}


def wait_for_lines(path: Path, n: int, timeout: float = 60) -> None:
    """Wait until a growing JSONL file (written by a run in another process) has `n` lines."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.02)
    raise TimeoutError(f"{path}: fewer than {n} lines after {timeout}s")
