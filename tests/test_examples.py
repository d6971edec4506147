"""The shipped example configs stay valid as the config schema moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftgen.config import load_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_story_config_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(EXAMPLES / "kimi-k2.5-openrouter.yaml")
    assert [d.name for d in cfg.datasets] == [f"B{i}" + n for i, n in enumerate(
        ["_ultrachat", "_wildchat_multiturn", "_magicoder", "_mixture_of_thoughts",
         "_openthoughts", "_xlam_tool_calls", "_hermes_tool_use", "_numina_math"], start=1)]
    assert all(d.max_output_tokens == 10_000_000 for d in cfg.datasets)
    assert sum(d.limit or 0 for d in cfg.datasets) == 100_000
    local, paid = cfg.backends
    assert (local.type, local.priority) == ("sglang", 0)
    assert (paid.type, paid.concurrency, paid.priority) == ("openrouter", 2000, 1)
    assert paid.provider == {"ignore": ["fireworks", "baseten"], "quantizations": ["int4"],
                             "allow_fallbacks": False}
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    assert paid.api_key_env == "OPENROUTER_API_KEY" and "sk-" not in str(cfg.redacted())


def test_the_quickstart_config_validates() -> None:
    cfg = load_config(EXAMPLES / "quickstart.yaml")
    assert cfg.backends[0].type == "llamacpp" and cfg.backends[0].model.endswith(".gguf")
    assert {d.name: d.turns for d in cfg.datasets} == {
        "quickstart": "first", "quickstart_multiturn": "last", "quickstart_trajectories": "all"}


def test_the_fleet_config_validates() -> None:
    cfg = load_config(EXAMPLES / "fleet-sglang-router.yaml")
    fleet, overflow = cfg.backends
    assert fleet.fleet is not None and fleet.fleet.wait_for_workers == 8
    assert fleet.fleet.slots_per_worker == 128
    assert (overflow.type, overflow.priority) == ("openrouter", 1)
    assert cfg.budget.usd == 200.0
