"""A dataset's `sampling_mix`: the config block, and the seeded per-conversation draw (stable
given the run's seed and the conversation's ID, whatever the order or the shard; frequencies
following the weights)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftgen.config import ConfigError, DatasetConfig, SamplingChoice, load_config
from draftgen.datasets.cache import cache_key
from draftgen.datasets.sampling_mix import choose, sampling_for, unit_draw

EFFORTS = [SamplingChoice(weight=4, reasoning_effort="low"),
           SamplingChoice(weight=4, reasoning_effort="medium"),
           SamplingChoice(weight=2, reasoning_effort="high")]
IDS = [f"chat/conv-{i}" for i in range(20_000)]


def test_a_draw_depends_on_the_seed_and_the_id_only() -> None:
    first = {i: sampling_for(EFFORTS, 7, i) for i in IDS[:2000]}
    shuffled = IDS[:2000]
    random.Random(1).shuffle(shuffled)
    assert {i: sampling_for(EFFORTS, 7, i) for i in shuffled} == first  # order
    shards = [IDS[:2000][s::3] for s in range(3)]  # any split of the IDs between shards
    assert {i: sampling_for(EFFORTS, 7, i) for shard in shards for i in shard} == first
    # a fresh list of equal choices (a resumed run reading its config again)
    again = [SamplingChoice.model_validate(c.model_dump()) for c in EFFORTS]
    assert {i: sampling_for(again, 7, i) for i in IDS[:2000]} == first
    other_seed = {i: sampling_for(EFFORTS, 8, i) for i in IDS[:2000]}
    assert sum(other_seed[i] != first[i] for i in first) > 800  # ~62% differ
    assert unit_draw(None, "x") == unit_draw(None, "x") != unit_draw(0, "x")


@pytest.mark.parametrize("seed", [None, 0, 12345])
def test_frequencies_follow_the_weights(seed: int | None) -> None:
    counts = {"low": 0, "medium": 0, "high": 0}
    for i in IDS:
        counts[choose(EFFORTS, seed, i).reasoning_effort or ""] += 1
    n = len(IDS)
    for effort, share in (("low", 0.4), ("medium", 0.4), ("high", 0.2)):
        # 5 standard deviations of a binomial share over 20,000 draws: about 0.017
        assert abs(counts[effort] / n - share) < 5 * (share * (1 - share) / n) ** 0.5


def test_a_draw_is_uniform_in_the_unit_interval() -> None:
    draws = [unit_draw(3, i) for i in IDS]
    assert all(0 <= d < 1 for d in draws)
    tenths = [0] * 10
    for d in draws:
        tenths[int(d * 10)] += 1
    assert all(abs(t - len(IDS) / 10) < 200 for t in tenths)


def test_settings_are_the_keys_a_choice_sets() -> None:
    choice = SamplingChoice(weight=1, temperature=1.0, extra={"min_p": 0.1})
    assert choice.settings() == {"temperature": 1.0, "extra": {"min_p": 0.1}}
    assert sampling_for(None, 1, "x") == {}
    assert sampling_for([choice], 1, "x") == choice.settings()
    with pytest.raises(ValueError):
        choose([], 1, "x")


def write(tmp_path: Path, dataset: dict[str, Any]) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "output_dir": str(tmp_path / "run"),
        "model": {"name": "m", "format": "qwen3", "tokenizer": "t"},
        "backends": [{"name": "b", "type": "vllm", "url": "http://127.0.0.1:9"}],
        "datasets": [{"name": "d", "path": "p.jsonl", **dataset}],
    }))
    return path


def test_the_config_takes_a_mix_and_turns_all(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, {"turns": "all", "sampling_mix": [
        {"weight": 4, "reasoning_effort": "low"}, {"weight": 2.5, "temperature": 0.2}]}))
    [ds] = cfg.datasets
    assert ds.turns == "all"
    assert ds.sampling_mix is not None
    assert [c.settings() for c in ds.sampling_mix] == [{"reasoning_effort": "low"},
                                                       {"temperature": 0.2}]
    assert DatasetConfig(name="d", path="p").sampling_mix is None


@pytest.mark.parametrize(("mix", "complaint"), [
    ([{"weight": 0, "temperature": 1.0}], "sampling_mix.0.weight: Input should be greater"),
    ([{"weight": -1}], "sampling_mix.0.weight: Input should be greater"),
    ([{"temperature": 1.0}], "sampling_mix.0.weight: Field required"),
    ([{"weight": 1, "temprature": 1.0}], "sampling_mix.0.temprature: unknown key"),
    ([{"weight": 1, "reasoning_effort": "max"}], "sampling_mix.0.reasoning_effort"),
    ([{"weight": 1, "extra": {"max_tokens": 5}}], "set by draftgen itself"),
    ([], "sampling_mix: List should have at least 1 item"),
])
def test_the_config_refuses_a_bad_mix(tmp_path: Path, mix: list[dict[str, Any]],
                                      complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        load_config(write(tmp_path, {"sampling_mix": mix}))


def test_the_config_refuses_an_unknown_turns_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"datasets\.0\.turns: Input should be 'first', "
                                          r"'last' or 'all'"):
        load_config(write(tmp_path, {"turns": "every"}))


def test_the_mix_is_not_a_prompt_option(tmp_path: Path) -> None:
    """Changing the mix keeps the prompt cache, and a config without one has the key it had
    before the option existed."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    plain = DatasetConfig(name="d", path=str(data))
    mixed = plain.model_copy(update={"sampling_mix": EFFORTS})
    assert cache_key(plain, [data]) == cache_key(mixed, [data])
