"""run.json's type (store.runjson.RunInfo): a file written by the first versions still opens,
for every reader; one that is not a run.json is named, with the field, never read half way."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from draftgen.audit.run import format_spec
from draftgen.errors import DraftgenError
from draftgen.status.collect import collect_status
from draftgen.store.reader import Run
from draftgen.store.runjson import run_model
from draftgen.store.runjson_writer import read_run_json, recover_run_json

SHA = "ab" * 32

# run.json as the writer of the first releases left it (store/runinfo.py and runner.py at the
# package skeleton, with the dataset totals added next): no session settings, no format options,
# no probe, no bills; a backend's headers redacted; and a key of a later version.
FIRST_VERSION = {
    "created_at": 1764400000.5,
    "config": {
        "output_dir": "/data/run",
        "model": {"name": "qwen/qwen3-8b", "format": "qwen3", "tokenizer": "/models/qwen3"},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": None, "max_tokens": 4096,
                     "seed": None, "extra": {}},
        "backends": [{"name": "or", "type": "openrouter", "url": "https://openrouter.ai/api/v1",
                      "api_key_env": "OPENROUTER_API_KEY", "concurrency": 64, "priority": 0,
                      "provider": {"only": ["deepinfra"]}, "reasoning": None, "stream": False,
                      "timeout_s": 600.0, "connect_timeout_s": 30.0, "max_retries": 6,
                      "backoff_base_s": 1.0, "backoff_max_s": 60.0,
                      "headers": {"X-Title": "***"}, "extra_body": {}}],
        "datasets": [{"name": "chat", "path": "data/chat.jsonl", "limit": None,
                      "split": "train", "subset": None, "turns": "first"}],
        "max_attempts": 3,
        "fsync_interval_s": 1.0,
    },
    "tokenizer": {"path": "/models/qwen3/tokenizer.json", "sha256": SHA},
    "versions": {"python": "3.11.7", "draftgen": "0.1.0", "orjson": "3.10.0"},
    "sessions": [
        {"started_at": 1764400001.0, "stopped_at": 1764400901, "pid": 4242, "host": "gpu-1",
         "argv": ["run", "config.yaml"], "outcome": "completed",
         "summary": {"done_now": 10, "failed_now": 1, "done_total": 10, "total": 12,
                     "output_tokens_now": 5120, "cost_usd_now": 0}},
        {"started_at": 1764401000.0, "stopped_at": None, "pid": 4343, "host": "gpu-1",
         "argv": ["run", "config.yaml"], "outcome": None},
    ],
    "datasets": {"chat": {"total": 12, "rows": 12, "bad_rows": 0, "duplicates": 0,
                          "skipped_budget": 0, "out_of_attempts": 0}},
    "a_key_of_a_later_version": {"anything": [1, 2]},
}


def test_a_run_json_written_by_the_first_version_still_opens(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_bytes(orjson.dumps(FIRST_VERSION))
    info = Run.open(tmp_path).folders[0].info
    first, killed = info.sessions
    assert first.summary is not None and first.summary.done_now == 10
    assert first.settings is None and first.unknown_bills_usd == 0.0 and first.may_have_answered
    assert killed.summary is None and killed.outcome is None
    # its sessions ran with the config it holds
    assert info.settings_of(0) == info.settings_of() and info.settings_of()["model.format"] == (
        "qwen3")
    assert info.stored_config.routing == {"or": {"only": ["deepinfra"]}}
    assert info.stored_config.trajectory_datasets == set()
    assert info.datasets["chat"].total == 12 and info.probe is None

    model = run_model(info, tmp_path)
    assert (model.format, model.options, model.tokenizer, model.sha256) == (
        "qwen3", {}, "/models/qwen3/tokenizer.json", SHA)
    spec = format_spec(info, root=tmp_path)
    assert spec.routing == {"or": {"only": ["deepinfra"]}}

    status = collect_status(tmp_path, now=1764401100.0)
    assert status.sessions == 2 and status.started_at == 1764400000.5
    assert status.datasets["chat"].total == 12


@pytest.mark.parametrize("bad, field", [
    ({"sessions": [{"started_at": "yesterday"}]}, "$.sessions[0].started_at"),
    ({"config": {"model": {"format": 3}}}, "$.config.model.format"),
    ({"sessions": {"0": {}}}, "$.sessions"),
    ({"tokenizer": "/models/qwen3/tokenizer.json"}, "$.tokenizer"),
])
def test_a_run_json_with_a_field_of_the_wrong_type_is_named(tmp_path: Path, bad: dict,
                                                             field: str) -> None:
    """Not read half way by one reader and differently by another: every reader refuses it,
    naming the file and the field; `draftgen run` sets it aside and rebuilds it."""
    path = tmp_path / "run.json"
    path.write_bytes(orjson.dumps(bad))
    with pytest.raises(DraftgenError) as e:
        Run.open(tmp_path)
    message = str(e.value)
    assert str(path) in message and field in message and "draftgen run" in message
    recover_run_json(path)
    assert [p.read_bytes() for p in tmp_path.glob("run.json.damaged-*")] == [orjson.dumps(bad)]
    assert read_run_json(path) == {"rebuilt_from": next(tmp_path.glob("run.json.damaged-*")).name,
                                   "sessions": []}
