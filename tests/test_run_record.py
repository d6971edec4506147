"""The answer's line in responses.jsonl, now written from a typed `Record`: the same keys, in the
same order, with the same values as the dict the run wrote before (draftgen.runner.make_record
up to issue 26)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from draftgen.run import make_record
from draftgen.store import RunLayout, Store
from draftgen.types import Prompt, RawAnswer, Rebuilt, Usage

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _answer(*, tools: bool, engine_ids: list[int] | None) -> tuple[Any, ...]:
    prompt = Prompt(id="ds/7", dataset="ds", messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo \u2028?"}],
        tools=TOOLS if tools else None)
    raw = RawAnswer(reasoning="think", content="hi", finish_reason="length",
                    usage=Usage(prompt_tokens=12, completion_tokens=5, reasoning_tokens=2,
                                cost=1.25e-05),
                    provider="Alpha", quantization="fp8", model="m", request_id="r-1",
                    prompt_ids=engine_ids)
    rebuilt = Rebuilt(output_ids=[5, 6, 7], token_source="native", token_check="exact",
                      reasoning="think", content="hi",
                      tool_calls=[{"name": "f", "arguments": "{}"}] if tools else None,
                      flags=["think_split"])
    routing = {"ignore": ["alpha"]}
    backend = SimpleNamespace(name="or", cfg=SimpleNamespace(provider_routing=routing))
    return prompt, raw, rebuilt, backend


def _as_before(prompt: Prompt, input_ids: list[int], raw: RawAnswer, rebuilt: Rebuilt,
               cost: float, latency_s: float, retries: int, created_at: float,
               session: int | None, flags: list[str]) -> dict[str, Any]:
    """The line as the run wrote it before the typed record."""
    record: dict[str, Any] = {"id": prompt.id, "dataset": prompt.dataset,
                              "messages": prompt.messages}
    if prompt.tools:
        record["tools"] = prompt.tools
    record.update({
        "input_ids": input_ids, "output_ids": rebuilt.output_ids,
        "token_source": rebuilt.token_source, "token_check": rebuilt.token_check,
        "flags": flags, "reasoning": rebuilt.reasoning, "content": rebuilt.content,
        "tool_calls": rebuilt.tool_calls, "finish_reason": raw.finish_reason, "backend": "or",
        "provider": raw.provider, "quantization": raw.quantization, "model": raw.model,
        "usage": raw.usage.as_dict(), "cost_usd": round(cost, 8), "cost_source": "reported",
        "request_id": raw.request_id, "latency_s": round(latency_s, 3), "retries": retries,
        "created_at": created_at})
    if session is not None:
        record["session"] = session
    return record


@pytest.mark.parametrize(("tools", "engine_ids", "session"),
                         [(False, None, None), (True, [1, 2, 3], 4), (False, [9, 9], 0)])
def test_the_record_line_keeps_its_keys_order_and_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tools: bool,
        engine_ids: list[int] | None, session: int | None) -> None:
    monkeypatch.setattr(time, "time", lambda: 1700000000.123456)
    prompt, raw, rebuilt, backend = _answer(tools=tools, engine_ids=engine_ids)
    record = make_record(prompt, [1, 2, 3], raw, rebuilt, backend, 0.000123456789, 1.23456, 2,
                         cost_source="reported", session=session)
    store = Store(tmp_path, fsync_interval_s=0)
    store.append_record("ds", record)
    store.close()
    line = RunLayout(tmp_path).responses("ds").read_bytes()
    flags = ["think_split", *(["prompt_ids_differ_from_engine"]
                              if engine_ids not in (None, [1, 2, 3]) else []),
             "provider_excluded_by_config"]
    before = _as_before(prompt, engine_ids or [1, 2, 3], raw, rebuilt, 0.000123456789,
                        1.23456, 2, 1700000000.123, session, flags)
    assert line == orjson.dumps(before, option=orjson.OPT_APPEND_NEWLINE)
