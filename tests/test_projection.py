"""The cost and time projection (`draftgen run --dry-run`, the progress line) against real runs
on the loopback test engine: a run answers part of its prompts, the projection of the rest is
made from those answers, then the rest is answered and the projection compared with what it
really cost."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.config import load_config
from draftgen.config.backends import Price
from draftgen.probe import ProbeOptions
from draftgen.progress import DatasetCounters, RunCounters, progress_line
from draftgen.run import Runner, prepare
from draftgen.run.projection import (
    DatasetWork,
    ProbedPrice,
    configured_prices,
    dataset_work,
    probed_prices,
    project,
    projected_prices,
)
from draftgen.run.render import render_each
from draftgen.run.state import Outcome
from draftgen.status import collect_status
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, run_config, write_config
from tests.reliability.helpers import prompt_rows, write_jsonl

PRICE = {"prompt": 10.0, "completion": 30.0}
SHORT = {"reasoning_tokens": (10, 60), "content_tokens": (10, 60), "latency_s": 0.05}


def _config(tmp_path: Path, qwen3_dir: Path, url: str, **dataset: Any) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(120))
    return write_config(tmp_path, qwen3_dir,
                        backends=[fast_backend("paid", "openai", url, concurrency=4,
                                               price=PRICE, paid=True)],
                        datasets=[{"name": "d", "path": str(data), **dataset}],
                        sampling={"max_tokens": 256})


def _work(cfg_path: Path) -> tuple[Any, list[DatasetWork]]:
    plan = prepare(load_config(cfg_path))
    work = [dataset_work(plan, ds, render_each(plan.fmt, list(ds.prompts)))
            for ds in plan.datasets]
    return plan, work


def test_the_projection_of_the_rest_is_close_to_what_it_cost(tmp_path: Path,
                                                             qwen3_dir: Path) -> None:
    with TestServer(**SHORT) as server:
        cfg = _config(tmp_path, qwen3_dir, server.url, max_prompts=40)
        assert run_config(cfg).status == "completed"
        first = collect_status(tmp_path / "run").total.sums
        data = yaml.safe_load(cfg.read_text())
        del data["datasets"][0]["max_prompts"]
        cfg.write_text(yaml.safe_dump(data))
        plan, work = _work(cfg)
        p = project(plan.cfg, work, configured_prices(plan.cfg), None)
        assert run_config(cfg).status == "completed"
    row = p.datasets[0]
    total = collect_status(tmp_path / "run").total.sums
    spent, tokens = total.cost - first.cost, total.output_tokens - first.output_tokens
    print(f"projected {row.output_tokens:,.0f} tokens ${row.usd_expected:.4f}; answered "
          f"{tokens:,} tokens ${spent:.4f}")
    assert row.prompts == 80 and row.shape is not None and row.shape.answers == 40
    assert row.output_tokens == pytest.approx(tokens, rel=0.25)
    assert row.usd_expected == pytest.approx(spent, rel=0.25)
    assert row.usd_low is not None and row.usd_high is not None
    assert row.usd_low <= row.usd_expected <= row.usd_high
    assert spent <= row.usd_high
    assert p.wall_s is not None and p.stops_first == "all prompts answered"


def test_which_budget_stops_first(tmp_path: Path, qwen3_dir: Path) -> None:
    with TestServer(**SHORT) as server:
        cfg = _config(tmp_path, qwen3_dir, server.url, max_prompts=20)
        assert run_config(cfg).status == "completed"
    data = yaml.safe_load(cfg.read_text())
    del data["datasets"][0]["max_prompts"]
    spent = collect_status(tmp_path / "run").total.sums.cost
    data["budget"] = {"usd": spent * 3}  # about 40 more answers' worth
    cfg.write_text(yaml.safe_dump(data))
    plan, work = _work(cfg)
    p = project(plan.cfg, work, configured_prices(plan.cfg), None)
    assert p.stops_first.startswith("budget.usd")
    answers = int(p.stops_first.split("~")[1].split()[0].replace(",", ""))
    assert 25 <= answers <= 60
    data["budget"] = {}
    data["datasets"][0]["max_output_tokens"] = int(work[0].shape.output_tokens * 30)
    cfg.write_text(yaml.safe_dump(data))
    plan, work = _work(cfg)
    p = project(plan.cfg, work, configured_prices(plan.cfg), None)
    assert p.stops_first.startswith("d: max_output_tokens after ~")


def test_nothing_measured_gives_the_bound_only(tmp_path: Path, qwen3_dir: Path) -> None:
    cfg = _config(tmp_path, qwen3_dir, "http://127.0.0.1:9")
    plan, work = _work(cfg)
    p = project(plan.cfg, work, configured_prices(plan.cfg), None)
    row = p.datasets[0]
    assert row.prompts == 120 and row.output_tokens is None and row.usd_expected is None
    assert row.output_tokens_max == 120 * 256 and row.usd_high is not None
    assert p.wall_s is None


def test_the_progress_line_projects_the_spend() -> None:
    counters = RunCounters()
    counters.datasets["d"] = DatasetCounters(total=100, done_before=10, cost_before=1.0)
    assert "projected" not in progress_line(counters)
    d = counters.datasets["d"]
    d.done, d.cost = 30, 3.0
    assert "projected $10.0000" in progress_line(counters)  # 1 + 3 + 60 pending x $0.10


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("factor", [1, 15])
def test_the_probe_prices_a_backend_priced_by_its_listing_as_billed(
        tmp_path: Path, qwen3_dir: Path, factor: int) -> None:
    """An OpenRouter backend's config gives no price (the endpoint lists it): once `draftgen
    probe` has run, the dry run's projection prices it as the probe saw it charged, the
    listing times what its answers were billed beyond it."""
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(30))
    with TestServer(mode="openrouter", prices=(2.0, 8.0), bill_factor=factor, **SHORT) as server:
        cfg = write_config(tmp_path, qwen3_dir,
                           backends=[fast_backend("or", "openrouter", server.url + "/api/v1")],
                           datasets=[{"name": "d", "path": str(data)}],
                           sampling={"max_tokens": 256})
        plan = prepare(load_config(cfg))
        run_json = tmp_path / "run" / "run.json"
        assert projected_prices(plan.cfg, probed_prices(run_json)) == {"or": None}
        cli = CliRunner()
        assert cli.invoke(app, ["probe", str(cfg)]).exit_code == 0
        dry = cli.invoke(app, ["run", "--dry-run", str(cfg)])
    price = projected_prices(plan.cfg, probed_prices(run_json))["or"]
    assert price is not None
    assert price.prompt == pytest.approx(2.0 * factor, rel=0.1)
    assert price.completion == pytest.approx(8.0 * factor, rel=0.1)
    assert dry.exit_code == 0, dry.output
    assert "price of or: $" in dry.output
    assert ("what its answers were billed" in dry.output) == (factor > 1)
    assert "known once the run starts" not in dry.output


def test_a_configured_price_never_projects_below_the_bills_the_probe_saw(
        tmp_path: Path, qwen3_dir: Path) -> None:
    cfg = load_config(_config(tmp_path, qwen3_dir, "http://127.0.0.1:9"))  # PRICE: 10 / 30
    seen = {"paid": ProbedPrice(Price(prompt=40.0, completion=20.0), 4.0, 0.0),
            "gone": ProbedPrice(Price(prompt=99.0, completion=99.0), 1.0, 0.0)}
    assert projected_prices(cfg, seen) == {"paid": Price(prompt=40.0, completion=30.0)}


@pytest.mark.parametrize("price", [{"prompt": -1.0, "completion": 2.0},
                                   {"prompt": "NaN", "completion": 2.0}, {"prompt": 1.0}])
def test_a_stored_probe_price_that_is_no_price_is_not_used(tmp_path: Path, price: dict) -> None:
    """run.json edited by hand: a probe result whose price is no price is read as no result
    (the run probes again), never as a price for the projection or a crash."""
    from draftgen.probe.model import BackendProbe
    from draftgen.store.runjson_writer import record_probe

    run_json = tmp_path / "run.json"
    good = BackendProbe(backend="or", type="openrouter", key="k", verdict="exact",
                        price={"prompt": 1.0, "completion": 2.0}).as_dict()
    record_probe(run_json, {"or": good, "bad": {**good, "backend": "bad", "price": price}})
    assert set(probed_prices(run_json)) == {"or"}


# ---- the dry run against the run that follows: a paid OpenRouter backend and a small budget ---

LISTING = (2.0, 8.0)
"""The test engine's price (per million prompt / output tokens), listed by its `GET /models`."""
LONG = {"reasoning_tokens": (10, 60), "content_tokens": (10, 60), "latency_s": 0.02}


def _openrouter_config(tmp_path: Path, qwen3_dir: Path, url: str, **top: Any) -> Path:
    """120 prompts of about 400 tokens for an OpenRouter backend with no price in its config
    (its listing gives it); a run with the default of no probe."""
    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}: "
             + "tell me about the weather in Paris and more. " * 40}]} for i in range(120)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    return write_config(tmp_path, qwen3_dir,
                        backends=[fast_backend("or", "openrouter", url + "/api/v1",
                                               concurrency=4)],
                        datasets=[{"name": "d", "path": str(data)}],
                        sampling={"max_tokens": 256}, **top)


def _dry_run(cfg: Path, server: TestServer, probe: bool = False) -> str:
    """`draftgen run --dry-run`'s output (`--no-probe` unless `probe`, as the run that follows),
    checked to have sent no chat request (the draftgen logger the CLI points at CliRunner's
    stream is put back for the run that follows)."""
    logger = logging.getLogger("draftgen")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    before = server.stats["requests"].get("chat", 0)
    try:
        result = CliRunner().invoke(app, ["run", "--dry-run", str(cfg),
                                          *([] if probe else ["--no-probe"])])
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
    assert result.exit_code == 0, result.output
    assert server.stats["requests"].get("chat", 0) == before, "the dry run sent a chat request"
    return result.output


def _stated_stop(output: str) -> tuple[str, int, int]:
    """The dry run's `stops first` line: the limit, and the range of prompts after which."""
    line = next(x for x in output.splitlines() if x.startswith("stops first: "))
    found = re.search(r"after ~?[\d,]* ?(?:more prompts )?\(?([\d,]+) – ([\d,]+)", line)
    assert found, line
    low, high = (int(g.replace(",", "")) for g in found.groups())
    return line.removeprefix("stops first: ").split(" ")[0], low, high


def _answered(outcome: Outcome) -> int:
    assert outcome.counters is not None
    return outcome.counters.total().done


def test_the_dry_run_names_the_budget_that_stops_the_run_and_after_how_many(
        tmp_path: Path, qwen3_dir: Path) -> None:
    """Nothing on disk: the price comes from the endpoint's listing, and the output tokens lie
    between one and max_tokens; a budget that even the least of that cannot hold for all
    prompts is named as what stops the run, after a range of prompts the run then keeps."""
    with TestServer(mode="openrouter", prices=LISTING, **LONG) as server:
        cfg = _openrouter_config(tmp_path, qwen3_dir, server.url, budget={"usd": 0.05})
        output = _dry_run(cfg, server)
        outcome = run_config(cfg)
    limit, low, high = _stated_stop(output)
    print(output, f"answered {_answered(outcome)}")
    assert "price of or: $2 / $8 per million" in output
    assert outcome.status == "budget" and limit == "budget.usd"
    assert low <= _answered(outcome) <= high < 120


def test_the_dry_run_counts_what_the_probe_will_spend(tmp_path: Path, qwen3_dir: Path) -> None:
    """With the probe on (as `draftgen run` has it), the probe's requests are paid from the
    budget before the first prompt: the dry run names their spend, and the run that follows,
    probed, stops by the budget inside the range that leaves room for it."""
    with TestServer(mode="openrouter", prices=LISTING, **LONG) as server:
        cfg = _openrouter_config(tmp_path, qwen3_dir, server.url, budget={"usd": 0.05})
        output = _dry_run(cfg, server, probe=True)
        outcome = asyncio.run(Runner(prepare(load_config(cfg)), live_display=False,
                                     probe=ProbeOptions()).execute())
        unprobed = _dry_run(cfg, server)
    print(output, f"answered {_answered(outcome)}")
    line = next(x for x in output.splitlines() if x.startswith("the probe: "))
    least, most = (float(v) for v in re.findall(r"\$([\d.]+)", line)[:2])
    assert 0 < least < most < 0.05 and "to each of or" in line
    limit, low, high = _stated_stop(output)
    assert outcome.status == "budget" and limit == "budget.usd"
    assert low <= _answered(outcome) <= high < 120
    assert "the probe: " not in unprobed


def test_priced_answers_on_disk_project_a_number_and_the_stop(tmp_path: Path,
                                                              qwen3_dir: Path) -> None:
    """30 prompts answered (and billed) first; the dry run for all 120 under a budget that
    stops the run before them projects dollars from those answers' costs (a number, never
    `?`), and the run that follows stops by that budget after a number of prompts in the
    stated range, counting what the first session spent."""
    with TestServer(mode="openrouter", prices=LISTING, **LONG) as server:
        cfg = _openrouter_config(tmp_path, qwen3_dir, server.url)
        data = yaml.safe_load(cfg.read_text())
        data["datasets"][0]["max_prompts"] = 30
        cfg.write_text(yaml.safe_dump(data))
        assert run_config(cfg).status == "completed"
        spent = collect_status(tmp_path / "run").total.sums.cost
        del data["datasets"][0]["max_prompts"]
        data["budget"] = {"usd": round(spent * 2.5, 4)}  # about 45 more answers' worth
        cfg.write_text(yaml.safe_dump(data))
        output = _dry_run(cfg, server)
        outcome = run_config(cfg)
    print(output, f"answered {_answered(outcome)}")
    projection = output.splitlines()[output.splitlines().index("projection"):]
    row = next(x for x in projection if x.startswith("│ d "))
    assert re.search(r"│ +\$\d+\.\d{4} \(\$[\d.]+ – \$[\d.]+\) │ costs on disk \(30\)", row), row
    limit, low, high = _stated_stop(output)
    assert outcome.status == "budget" and limit == "budget.usd"
    assert low <= _answered(outcome) <= high < 90


def test_costs_on_disk_project_dollars_without_a_price(tmp_path: Path, qwen3_dir: Path) -> None:
    """A paid backend whose price is not known (no listing could be read): the costs of the
    answers on disk still give the dollars expected and where the budget stops the run."""
    import numpy as np

    cfg = load_config(_openrouter_config(tmp_path, qwen3_dir, "http://127.0.0.1:9",
                                         budget={"usd": 1.0}))
    costs = np.full(40, 0.01)
    costs[::2] = 0.02
    work = [DatasetWork("d", [400] * 80, 40, None, None, costs, float(costs.sum()))]
    p = project(cfg, work, {"or": None}, None)
    row = p.datasets[0]
    assert row.usd_expected == pytest.approx(80 * 0.015)
    assert row.usd_low is not None and row.usd_high is not None
    assert row.usd_low < row.usd_expected < row.usd_high
    # $0.40 left, $0.02 the dearest answer on disk: about 26 more answers
    assert p.stop.limit == "budget.usd" and p.stop.after == 26
    assert p.stop.low is not None and p.stop.high is not None
    assert p.stop.low <= 26 <= p.stop.high < 80
