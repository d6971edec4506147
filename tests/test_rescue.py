"""Answers the run folder would not take (a write failed while requests were in flight) are
kept in a rescue file, shown by `status`, and added by the next run without being sent again.
The kernel errors themselves (EPERM, EFBIG, ENOSPC) are in tests/reliability/test_disk.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from draftgen.export.source import open_run
from draftgen.run import Outcome
from draftgen.status import collect_status
from draftgen.store import RunLayout, Store, StoreError
from draftgen.store.record import Record, decode_record, record_as_dict
from draftgen.store.rescue import RESCUE, outside_folder, read_rescued, write_rescue
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, read_records, run_config, write_config, write_jsonl
from tests.reliability.helpers import prompt_rows

N = 120
CONCURRENCY = 16
WRITES_BEFORE_FAILING = 30
PRICE = {"prompt": 1.0, "completion": 2.0}


@pytest.fixture(autouse=True)
def _own_rescue_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    outside = tmp_path / "outside"
    monkeypatch.setenv("DRAFTGEN_RESCUE_DIR", str(outside))
    return outside


def _config(tmp_path: Path, qwen3_dir: Path, url: str) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(N))
    return write_config(tmp_path, qwen3_dir,
                        backends=[fast_backend("or", "openrouter", url, concurrency=CONCURRENCY,
                                               price=PRICE)],
                        datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 32})


def _failing_writes(monkeypatch: pytest.MonkeyPatch, after: int) -> None:
    """Answer writes fail from the `after`+1-th on, as a disk quota would."""
    real = Store.append_record
    calls = {"n": 0}

    def append_record(self: Store, dataset: str, record: Record) -> None:
        calls["n"] += 1
        if calls["n"] > after:
            raise StoreError(f"{self.layout.responses(dataset)}: write failed: "
                             "Disk quota exceeded")
        real(self, dataset, record)

    monkeypatch.setattr(Store, "append_record", append_record)


def _run_failing(cfg: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[Outcome, list[dict[str, Any]]]:
    """A run whose answer writes fail after WRITES_BEFORE_FAILING: its outcome and answers."""
    with monkeypatch.context() as patch:
        _failing_writes(patch, WRITES_BEFORE_FAILING)
        outcome = run_config(cfg)
    assert outcome.status == "failed"
    assert "Disk quota exceeded" in outcome.message
    kept = read_records(run_dir, "d")
    assert len(kept) == WRITES_BEFORE_FAILING
    return outcome, kept


def test_answers_in_flight_at_a_write_failure_are_rescued_then_added(
        tmp_path: Path, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    with TestServer(mode="openrouter", latency_s=0.05, reasoning_tokens=(3, 8),
                    content_tokens=(3, 8)) as server:
        cfg = _config(tmp_path, qwen3_dir, server.url)
        outcome, kept = _run_failing(cfg, run_dir, monkeypatch)
        sent_first = dict(server.stats["per_prompt"])
        rescued = read_rescued(RunLayout(run_dir))
        parked = [record_as_dict(r) for r in rescued.records["d"]]
        assert len(parked) == len(sent_first) - len(kept) > 0, "answers in flight were lost"
        assert str(rescued.files[0]) in outcome.message
        assert rescued.files[0].parent == run_dir / RESCUE

        run = orjson.loads((run_dir / "run.json").read_bytes())["sessions"][0]["summary"]
        assert run["rescued"] == len(parked)
        assert run["cost_usd_now"] == pytest.approx(
            sum(r["cost_usd"] for r in kept + parked), abs=1e-5)

        status = collect_status(run_dir)
        assert status.rescued == len(parked) and status.total.in_flight == 0
        assert any("the next run adds them" in note for note in status.notes)
        assert status.as_json()["rescue_files"] == [str(rescued.files[0])]
        with caplog.at_level(logging.WARNING):
            open_run(run_dir)
        assert f"{len(parked)} answers wait in rescue files" in caplog.text

        assert run_config(cfg).status == "completed"
        assert all(n == 1 for n in server.stats["per_prompt"].values()), \
            "a rescued answer was paid for again"
        assert len(server.stats["per_prompt"]) == N
    records = read_records(run_dir, "d")
    assert len(records) == len({r["id"] for r in records}) == N
    by_id = {r["id"]: r for r in records}
    assert all(by_id[r["id"]] == r for r in parked), "a rescued answer changed on its way"
    assert not read_rescued(RunLayout(run_dir)).files, "the rescue file was not removed"
    final = collect_status(run_dir)
    assert final.total.pending == 0 and final.rescued == 0


def _record(i: int) -> Record:
    return Record(id=f"p{i}", dataset="d", messages=[], input_ids=[], output_ids=[1, 2, 3],
                  token_source="native", token_check="exact", flags=[], reasoning=None,
                  content=None, tool_calls=None, finish_reason="stop", backend="b")


def test_rescue_goes_outside_when_the_run_folder_refuses(tmp_path: Path,
                                                        _own_rescue_dir: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    (layout.root / RESCUE).write_text("a file where the folder should be")
    path, errors = write_rescue(layout, [_record(1), _record(2)], "s0")
    assert path is not None and path.parent == outside_folder(layout.root)
    assert path.is_relative_to(_own_rescue_dir)
    assert len(errors) == 1 and str(layout.root / RESCUE) in errors[0]
    assert [r.id for r in read_rescued(layout).records["d"]] == ["p1", "p2"]


def test_a_bad_rescue_line_is_named(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    path, _ = write_rescue(layout, [_record(1)], "s0")
    assert path is not None
    path.write_bytes(path.read_bytes() + b'{"id": 7}\n')
    with pytest.raises(StoreError, match=rf"{path.name}:2: not an answer record"):
        read_rescued(layout)
    layout.run_json.write_text('{"sessions": []}')
    status = collect_status(tmp_path)
    assert status.rescued == 0
    assert any(f"a rescue file cannot be read: {path}:2" in n for n in status.notes), \
        status.notes


def test_rescued_answers_already_in_the_run_are_not_added_twice(
        tmp_path: Path, qwen3_dir: Path) -> None:
    run_dir = tmp_path / "run"
    layout = RunLayout(run_dir)
    with TestServer(mode="openrouter", reasoning_tokens=(3, 8), content_tokens=(3, 8)) as server:
        cfg = _config(tmp_path, qwen3_dir, server.url)
        assert run_config(cfg).status == "completed"
        first = read_records(run_dir, "d")
        twin = decode_record(orjson.dumps({**first[5], "content": "a different answer"}))
        write_rescue(layout, [twin], "s9")
        other, _ = write_rescue(layout, [msgspec.structs.replace(_record(1), dataset="other")],
                                "s10")
        assert run_config(cfg).status == "completed"
        assert read_records(run_dir, "d") == first
        assert [p.name for p in read_rescued(layout).files] == [other.name], \
            "a file naming a dataset not in the config must be kept, the others removed"
        assert sum(server.stats["per_prompt"].values()) == N


def test_answers_no_disk_takes_count_as_spent_in_later_sessions(
        tmp_path: Path, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RESCUE).write_text("a file where the folder should be")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("DRAFTGEN_RESCUE_DIR", str(blocker))
    with TestServer(mode="openrouter", latency_s=0.05, reasoning_tokens=(3, 8),
                    content_tokens=(3, 8)) as server:
        outcome, kept = _run_failing(_config(tmp_path, qwen3_dir, server.url), run_dir,
                                     monkeypatch)
    assert "could not be written anywhere" in outcome.message
    summary = orjson.loads((run_dir / "run.json").read_bytes())["sessions"][0]["summary"]
    lost_usd = summary["cost_usd_now"] - sum(r["cost_usd"] for r in kept)
    assert lost_usd > 0
    assert summary["unsettled_usd"] == pytest.approx(lost_usd, abs=1e-5)
    assert collect_status(run_dir).unsettled_usd == pytest.approx(lost_usd, abs=1e-5)
