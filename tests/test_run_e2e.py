"""draftgen run end to end against the loopback test server (real wire protocol, real Qwen3
tokenizer): two backends at once, retries, failures, resume after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from draftgen.formats import get_format
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import Tokenizer
from tests.e2e_helpers import (
    fast_backend,
    mixed_rows,
    read_failures,
    read_records,
    run_config,
    write_config,
    write_jsonl,
)

CANARY_KEY = "sk-or-v1-CANARY-0123456789abcdef"


def _all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


def test_two_backends_at_once_exact_and_reconstructed(
    tmp_path: Path, qwen3_dir: Path, qwen3_tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_OR_KEY", CANARY_KEY)
    rows = mixed_rows(300)
    data = write_jsonl(tmp_path / "data" / "mixed.jsonl", rows, extra_lines=[
        b'{"messages": [{"role": "user", "content": "unterminated',
        b'{"messages": "not a list"}',
        b'{"completely": "unknown"}',
    ])
    with TestServer(mode="openrouter", api_key=CANARY_KEY, prices=(0.5, 2.5), latency_s=0.01,
                    providers=["Alpha", "Beta"], noncanonical_rate=0.3) as paid, \
         TestServer(latency_s=0.02) as local:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", local.url, concurrency=8, priority=0),
            fast_backend("paid", "openrouter", paid.url + "/api/v1", concurrency=32, priority=1,
                         api_key_env="TEST_OR_KEY", provider={"ignore": ["fireworks"]}),
        ], datasets=[{"name": "mixed", "path": str(data)}])
        outcome = run_config(cfg)
        paid_bodies = list(paid.stats["bodies"])
    assert outcome.status == "completed", outcome.message
    run_dir = tmp_path / "run"
    records = read_records(run_dir, "mixed")
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == 300
    fmt = get_format("qwen3", qwen3_tok)
    by_backend = Counter(r["backend"] for r in records)
    assert by_backend["local"] > 0 and by_backend["paid"] > 0, by_backend
    for r in records:
        assert next(iter(r)) == "id"
        assert r["input_ids"] == fmt.render_prompt(r["messages"], r.get("tools"))
        text = qwen3_tok.decode(r["output_ids"])
        assert text.startswith("<think>\n") and text.endswith("<|im_end|>"), text[-40:]
        assert r["finish_reason"] in ("stop", "tool_calls")
        if r["backend"] == "local":
            assert (r["token_source"], r["token_check"]) == ("native", "exact")
        else:  # IDs recovered from the logprobs the endpoint returned
            assert (r["token_source"], r["token_check"]) == ("native", "exact")
            assert "ids_from_logprobs" in r["flags"]
            assert r["provider"] in ("Alpha", "Beta")
            assert r["usage"]["cost"] > 0
            assert r["request_id"]
    # sampled non-canonical splits survive: text re-encoding would have lost them
    noncanonical = [r for r in records if r["backend"] == "paid"
                    and qwen3_tok.encode(qwen3_tok.decode(r["output_ids"])) != r["output_ids"]]
    assert noncanonical
    tool_records = [r for r in records if r.get("tools")]
    assert tool_records and all("<tool_call>" in qwen3_tok.decode(r["output_ids"])
                                for r in tool_records)
    # OpenRouter routing passes through unchanged, reasoning is asked for
    assert all(b["provider"] == {"ignore": ["fireworks"]} for b in paid_bodies)
    assert all(b["reasoning"] == {"enabled": True} for b in paid_bodies)
    assert CANARY_KEY.encode() not in _all_bytes(run_dir)
    run_json = orjson.loads((run_dir / "run.json").read_bytes())
    assert run_json["sessions"][-1]["outcome"] == "completed"
    assert len(run_json["tokenizer"]["sha256"]) == 64


def test_reconstruction_is_labelled_honestly(tmp_path: Path, qwen3_dir: Path,
                                              qwen3_tok: Tokenizer) -> None:
    """Without engine IDs or logprobs, IDs are rebuilt from text: stripped whitespace is
    restored where the layout makes it certain, and a sampled non-canonical split (same text,
    one token more) is caught by the length check."""
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(60))
    with TestServer(mode="openrouter", strip_whitespace=True, edge_whitespace_rate=0.0,
                    noncanonical_rate=0.25) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("or", "openrouter", server.url, logprobs=False, concurrency=8)],
            datasets=[{"name": "d", "path": str(data)}])
        assert run_config(cfg).status == "completed"
        noncanonical = server.stats["faults"].get("noncanonical", 0)
    records = read_records(tmp_path / "run", "d")
    assert len(records) == 60
    checks = Counter(r["token_check"] for r in records)
    assert {r["token_source"] for r in records} == {"reconstructed"}
    assert 0 < noncanonical < 60
    assert checks == {"length_ok": 60 - noncanonical, "length_mismatch": noncanonical}
    assert all("whitespace_restored" in r["flags"] for r in records)
    for r in records:
        assert qwen3_tok.decode(r["output_ids"]).startswith("<think>\n")


def test_retries_failures_and_resume_up_to_max_attempts(
    tmp_path: Path, qwen3_dir: Path
) -> None:
    directives = {
        "429x2": "[[fault:429*2]]", "429ra": "[[fault:429ra*1]]", "502x2": "[[fault:502*2]]",
        "error_body": "[[fault:error_body*1]]", "reset": "[[fault:reset*1]]",
        "malformed": "[[fault:malformed*1]]", "slow": "[[fault:slow*1]]",
        "budget402": "[[fault:402budget*1]]", "empty": "[[fault:empty*1]]",
        "sse_error": "[[fault:sse_error*1]]", "no_done": "[[fault:no_done*1]]",
        "reset_stream": "[[fault:reset_stream*1]]", "bad400": "[[fault:400]]",
    }
    rows = [{"id": k, "messages": [{"role": "user", "content": f"Say something {v}"}]}
            for k, v in directives.items()]
    rows_text = {row["id"]: row["messages"][0]["content"] for row in rows}
    data = write_jsonl(tmp_path / "faults.jsonl", rows)
    for stream in (False, True):
        with TestServer(mode="openrouter") as server:  # fresh per-prompt fault counters
            cfg = write_config(tmp_path / f"s{stream}", qwen3_dir, backends=[
                fast_backend("or", "openrouter", server.url, stream=stream, timeout_s=1.5,
                             concurrency=16),
            ], datasets=[{"name": "faults", "path": str(data)}], max_attempts=2)
            run_dir = tmp_path / f"s{stream}" / "run"
            outcome = run_config(cfg)
            sent = server.stats["per_prompt"]
            assert outcome.status == "completed", outcome.message
            done = {r["id"].split("/")[1] for r in read_records(run_dir, "faults")}
            assert done == set(directives) - {"bad400"}, stream
            failures = read_failures(run_dir, "faults")
            assert [(f["id"], f["kind"], f["status"]) for f in failures] == [
                ("faults/bad400", "bad_request", 400)]
            retried = {r["id"].split("/")[1]: r["retries"] for r in read_records(run_dir, "faults")}
            # a loaded machine may time out a healthy attempt too (timeout_s=1.5 for "slow"), so
            # the faults set the least retries and the server's count of attempts the exact one
            for key in ("429x2", "502x2"):
                assert retried[key] >= 2 and retried[key] == sent[rows_text[key]] - 1, key
            # resume: the permanent failure is tried again until max_attempts, then left alone
            assert run_config(cfg).status == "completed"
            assert len(read_failures(run_dir, "faults")) == 2
            outcome = run_config(cfg)
            assert outcome.counters.total().exhausted == 1
            assert len(read_failures(run_dir, "faults")) == 2
            assert len(read_records(run_dir, "faults")) == len(directives) - 1


def test_a_backend_with_a_bad_key_is_taken_out_and_others_carry_on(
    tmp_path: Path, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WRONG_KEY", "sk-wrong-key-value")
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(40))
    with TestServer(mode="openrouter", api_key="sk-right") as paid, TestServer() as other:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("paid", "openrouter", paid.url, api_key_env="WRONG_KEY", concurrency=4),
            fast_backend("vllm", "vllm", other.url, concurrency=4, priority=1),
        ], datasets=[{"name": "d", "path": str(data)}])
        outcome = run_config(cfg)
    assert outcome.status == "completed"
    records = read_records(tmp_path / "run", "d")
    assert len(records) == 40 and {r["backend"] for r in records} == {"vllm"}
    # vLLM's return_token_ids: engine IDs, exact
    assert all(r["token_source"] == "native" and r["token_check"] == "exact" for r in records)
    assert read_failures(tmp_path / "run", "d") == []
    assert b"sk-wrong-key-value" not in _all_bytes(tmp_path / "run")


def test_dry_run_reads_everything_and_sends_nothing(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(12),
                       extra_lines=[b"{broken json", b'{"prompt": "   "}'])
    with TestServer() as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url)],
            datasets=[{"name": "d", "path": str(data)}])
        proc = subprocess.run([sys.executable, "-m", "draftgen", "run", str(cfg), "--dry-run"],
                              capture_output=True, text=True, timeout=120)
        requests = sum(server.stats["requests"].values())
    assert proc.returncode == 0, proc.stderr
    assert "12" in proc.stdout and "tokenizer self-check passed" in proc.stdout
    assert f"{data}:13" in proc.stdout and f"{data}:14" in proc.stdout
    assert "not valid JSON" in proc.stdout and "empty user content" in proc.stdout
    assert requests == 0
    assert not (tmp_path / "run").exists()


def test_config_typo_and_missing_key_are_clear_errors(tmp_path: Path, qwen3_dir: Path) -> None:
    cfg = write_config(tmp_path, qwen3_dir, backends=[
        {"name": "or", "type": "openrouter", "url": "http://127.0.0.1:9",
         "api_key_env": "DRAFTGEN_SURELY_UNSET", "concurency": 5}],
        datasets=[{"name": "d", "path": "x.jsonl"}])
    proc = subprocess.run([sys.executable, "-m", "draftgen", "run", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "backends.0.concurency: unknown key" in proc.stderr
    cfg.write_text(cfg.read_text().replace("concurency", "concurrency"))
    proc = subprocess.run([sys.executable, "-m", "draftgen", "run", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "DRAFTGEN_SURELY_UNSET" in proc.stderr


@pytest.mark.slow
def test_resume_after_kill_minus_9_mid_write(tmp_path: Path, qwen3_dir: Path) -> None:
    rows = mixed_rows(400)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    with TestServer(latency_s=0.05) as local, TestServer(mode="openrouter", latency_s=0.05) as paid:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", local.url, concurrency=32),
            fast_backend("paid", "openrouter", paid.url, concurrency=32, stream=True),
        ], datasets=[{"name": "d", "path": str(data)}], fsync_interval_s=0)
        responses = tmp_path / "run" / "d" / "responses.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "draftgen", "run", str(cfg), "--no-live"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if responses.exists() and responses.read_bytes().count(b"\n") >= 100:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = {r["id"] for r in read_records(tmp_path / "run", "d")}
        assert 100 <= len(before) < 400
        with open(responses, "ab") as f:  # the kill landed in the middle of a write
            f.write(b'{"id":"d/torn","dataset":"d","input_ids":[1,2,3')
        outcome = run_config(cfg)
    assert outcome.status == "completed", outcome.message
    lines = responses.read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]  # every line parses
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == 400
    assert before <= set(ids)
    assert b"d/torn" in (tmp_path / "run" / "d" / "torn_tail.bin").read_bytes()
    assert outcome.counters.total().done_before == len(before)
