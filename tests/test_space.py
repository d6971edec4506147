"""The free-space guard (`run.free_space`): a run sends nothing while the output disk holds less
than `min_free_mb`. (Filling a real disk mid-run: tests/reliability/test_disk.py, as root.)"""

from __future__ import annotations

from pathlib import Path

from draftgen.run.free_space import SpaceGuard
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, read_records, run_config, write_config
from tests.reliability.helpers import prompt_rows, write_jsonl

MORE_THAN_ANY_DISK_MB = 2.0**40


def test_the_guard_names_the_folder_the_free_space_and_the_setting(tmp_path: Path) -> None:
    short = SpaceGuard(tmp_path, MORE_THAN_ANY_DISK_MB).shortage()
    assert short is not None
    assert str(tmp_path) in short and "MB free" in short and "min_free_mb" in short
    assert SpaceGuard(tmp_path, 0).shortage() is None
    assert SpaceGuard(tmp_path, 1).shortage() is None  # 1 MB: any test machine has that


def test_the_guard_reads_the_disk_at_most_every_interval(tmp_path: Path) -> None:
    guard = SpaceGuard(tmp_path, MORE_THAN_ANY_DISK_MB, every_s=3600)
    assert guard.shortage() is not None
    assert guard.shortage() is None  # not read again within the hour
    assert SpaceGuard(tmp_path, MORE_THAN_ANY_DISK_MB, every_s=0).shortage() is not None


def test_a_folder_that_cannot_be_read_leaves_the_writes_to_say_so(tmp_path: Path) -> None:
    assert SpaceGuard(tmp_path / "missing", MORE_THAN_ANY_DISK_MB).shortage() is None


def test_a_run_on_a_nearly_full_disk_sends_nothing(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(20))
    with TestServer(reasoning_tokens=(5, 10), content_tokens=(5, 10)) as server:
        cfg = write_config(tmp_path, qwen3_dir,
                           backends=[fast_backend("local", "sglang", server.url, concurrency=4)],
                           datasets=[{"name": "d", "path": str(data)}],
                           min_free_mb=MORE_THAN_ANY_DISK_MB)
        outcome = run_config(cfg)
        sent = sum(server.stats["per_prompt"].values())
    assert outcome.status == "failed"
    assert "output disk nearly full" in outcome.message and "min_free_mb" in outcome.message
    assert sent == 0 and not read_records(tmp_path / "run", "d")
