"""`model.tokenizer` as a Hugging Face Hub repo ID: read from a pre-filled Hub cache (laid out
as huggingface_hub lays it out: blobs, snapshots/<commit>/ links, refs/main), offline; never
the network."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson
import pytest

from draftgen.store.runjson import TOKENIZERS
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import TokenizerError, load_tokenizer
from draftgen.tokenize.hub import is_hub_id
from tests.e2e_helpers import fast_backend, mixed_rows, run_config, write_config, write_jsonl

REPO = "Qwen/Qwen3-8B"
COMMIT = "b968826d9c46dd6066d109eabc6255188de91218"


def fill_hub_cache(cache: Path, repo: str, files: Path, commit: str = COMMIT) -> Path:
    """`files`' files as the Hub cache holds a snapshot of `repo`: each a link to its blob."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in sorted(files.iterdir()):
        data = f.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-cache"
    fill_hub_cache(cache, REPO, qwen3_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_repo_id_loads_from_the_hub_cache(hub_cache: Path, qwen3_dir: Path) -> None:
    tok = load_tokenizer(REPO)
    assert tok.path == hub_cache / f"models--Qwen--Qwen3-8B/snapshots/{COMMIT}/tokenizer.json"
    assert tok.sha256 == load_tokenizer(qwen3_dir).sha256
    assert tok.encode("<|im_end|>") == [151645]
    pinned = load_tokenizer(f"{REPO}@{COMMIT}")  # a revision: that snapshot
    assert pinned.path == tok.path


def test_a_missing_repo_offline_names_the_repo_and_the_cache(hub_cache: Path) -> None:
    with pytest.raises(TokenizerError) as e:
        load_tokenizer("Qwen/Qwen3-99B")
    message = str(e.value)
    assert "\n" not in message
    assert "Qwen/Qwen3-99B" in message and str(hub_cache) in message
    assert "HF_HUB_OFFLINE" in message


def test_an_existing_folder_so_named_is_a_path(tmp_path: Path, qwen3_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "qwen3").symlink_to(qwen3_dir)
    assert not is_hub_id("models/qwen3")
    assert is_hub_id("Qwen/Qwen3-8B") and is_hub_id("Qwen/Qwen3-8B@main")
    assert not is_hub_id("a/b/c") and not is_hub_id("/abs/path") and not is_hub_id("tok.json")
    assert load_tokenizer("models/qwen3").encode("<|im_end|>") == [151645]


def test_a_run_keeps_a_copy_of_the_hub_tokenizer_and_its_hash(
        tmp_path: Path, hub_cache: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(3))
    with TestServer(latency_s=0.01) as server:
        cfg = write_config(tmp_path, Path("unused"), backends=[
            fast_backend("engine", "vllm", server.url)],
            datasets=[{"name": "d", "path": str(data)}])
        text = cfg.read_text().replace("tokenizer: unused", f"tokenizer: {REPO}")
        cfg.write_text(text)
        outcome = run_config(cfg)
    assert outcome.status == "completed", outcome.message
    run = tmp_path / "run"
    info = orjson.loads((run / "run.json").read_bytes())
    sha = hashlib.sha256((qwen3_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert info["config"]["model"]["tokenizer"] == REPO
    assert info["tokenizer"]["sha256"] == sha
    kept = run / TOKENIZERS / sha
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert not (kept / name).is_symlink()  # a copy, not a link into the cache
        assert (kept / name).read_bytes() == (qwen3_dir / name).read_bytes()
