"""The settings that define a run's data (store.runjson_writer, store.runjson): what counts, how a
change is named, and run.json files written before sessions recorded them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from draftgen.store.runjson import changed_settings
from draftgen.store.runjson_writer import data_settings, session_settings, start_session

TOKENIZER = {"path": "/models/a/tokenizer.json", "sha256": "ab" * 32}


def _config(**model: Any) -> dict[str, Any]:
    return {
        "model": {"name": "m", "format": "chatml", "tokenizer": "/models/a",
                  "format_options": {"default_system": "Be brief."}, **model},
        "sampling": {"temperature": 0.6, "max_tokens": 64, "extra": {"min_p": 0.0}},
        "backends": [{"name": "b", "url": "http://127.0.0.1:1", "concurrency": 8}],
        "budget": {"usd": 1.0},
    }


def test_a_format_option_change_is_named_and_the_rest_is_not() -> None:
    before = data_settings(_config(), TOKENIZER)
    cfg = _config(format_options={"default_system": "Be long."})
    cfg["backends"][0].update(url="http://127.0.0.1:2", concurrency=64)
    cfg["budget"]["usd"] = 9.0
    moved = {**TOKENIZER, "path": "/elsewhere/tokenizer.json"}
    assert changed_settings(before, data_settings(cfg, moved)) == [
        'model.format_options.default_system: "Be brief." → "Be long."']


def test_a_sampling_extra_key_added_is_named() -> None:
    cfg = _config()
    cfg["sampling"]["extra"]["top_a"] = 0.1
    assert changed_settings(data_settings(_config(), TOKENIZER), data_settings(cfg, TOKENIZER)
                            ) == ["sampling.extra.top_a: (unset) → 0.1"]


def test_a_run_json_from_before_settings_were_recorded(tmp_path: Path) -> None:
    """Its sessions ran with the config it holds: that is what a resume is compared with, and
    what they are given when a new session replaces the config."""
    path = tmp_path / "run.json"
    path.write_bytes(orjson.dumps({"config": _config(), "tokenizer": TOKENIZER,
                                   "sessions": [{"outcome": "completed"}]}))
    legacy = orjson.loads(path.read_bytes())
    assert session_settings(legacy) == data_settings(_config(), TOKENIZER)
    changed = _config(name="m2")
    start_session(path, changed, TOKENIZER, ['model.name: "m" → "m2"'])
    data = orjson.loads(path.read_bytes())
    first, second = data["sessions"]
    assert first["settings"]["model.name"] == "m" and second["settings"]["model.name"] == "m2"
    assert second["accepted_changes"] == ['model.name: "m" → "m2"']
    assert session_settings(data, 0)["model.name"] == "m"
    assert session_settings(data)["model.name"] == "m2"
