"""7. Money, the bill is the truth: a provider whose price list is not its bill (a listing of
0, a bill 9x or 15x its listing), reported costs that are no cost, and the probe's own
requests. The loopback server keeps what it really charged (`stats["billed_usd"]`); each case
compares that bill with `budget.usd` and with what draftgen counted."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from draftgen.config import ConfigError, load_config
from draftgen.probe import ProbeOptions
from draftgen.probe.exchange import probe_requests
from draftgen.run import Runner, prepare
from draftgen.status import collect_status
from draftgen.store.runjson_writer import read_run_json
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, read_records, run_config, write_config
from tests.reliability.helpers import prompt_rows, write_jsonl

SCENARIO = "8. Money"
PRICE = {"prompt": 10.0, "completion": 10.0}
"""USD per million tokens, as listed: $0.00001 a token."""
SHORT = {"reasoning_tokens": (5, 20), "content_tokens": (5, 20)}
MAX_TOKENS = 64


def _config(tmp_path: Path, qwen3_dir: Path, server: TestServer, n: int, usd: float,
            concurrency: int = 8, **backend: Any) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(n))
    return write_config(
        tmp_path, qwen3_dir,
        backends=[fast_backend("or", "openrouter", server.url + "/api/v1",
                               concurrency=concurrency, **backend)],
        datasets=[{"name": "d", "path": str(data)}],
        sampling={"max_tokens": MAX_TOKENS}, budget={"usd": usd})


def _billed(server: TestServer) -> float:
    return float(server.stats.snapshot(bodies=False)["billed_usd"])


def _run_with_probe(cfg: Path) -> Any:
    plan = prepare(load_config(cfg))
    return asyncio.run(Runner(plan, live_display=False, probe=ProbeOptions()).execute())


def _worst_at_listing(tmp_path: Path) -> float:
    """One request's worst case at the listed price: max_tokens and the longest prompt."""
    prompt_tokens = max(r["usage"]["prompt_tokens"] for r in read_records(tmp_path / "run", "d"))
    return (prompt_tokens + MAX_TOKENS) * PRICE["completion"] / 1e6


# ---- a listing that is not the bill -------------------------------------------------------------


@pytest.mark.parametrize("factor", [1, 9, 15])
def test_a_bill_above_the_listing_stays_within_the_budget(tmp_path: Path, qwen3_dir: Path,
                                                          reliability, factor: int) -> None:
    """The listing says PRICE, the server bills `factor` times that and reports it. The bill
    may pass the budget only by what the first request cost beyond its reservation (one
    request in flight until the backend's first answer tells what it charges)."""
    budget = 0.02
    case = reliability(SCENARIO, f"the provider bills {factor}x its listed price (and reports "
                       f"it); budget.usd ${budget}, concurrency 8, 100 prompts")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    bill_factor=factor, **SHORT) as server:
        outcome = run_config(_config(tmp_path, qwen3_dir, server, 100, budget))
        bill = _billed(server)
    case.runs = 1
    records = read_records(tmp_path / "run", "d")
    bound = (factor - 1) * _worst_at_listing(tmp_path)
    counted = collect_status(tmp_path / "run").total.sums.cost
    case.note(f"{len(records)} answers; server billed ${bill:.4f} of ${budget} (bound "
              f"${budget + bound:.4f}); draftgen counted ${counted:.4f}; {outcome.status}")
    assert bill <= budget + bound + 1e-12
    assert counted == pytest.approx(bill)  # never less than the provider billed
    assert all(r["cost_source"] == "reported" for r in records)
    if factor > 1:
        assert outcome.status == "budget"


def test_the_probe_learns_what_a_provider_charges(tmp_path: Path, qwen3_dir: Path,
                                                  reliability) -> None:
    """With the probe, the first request of the run is reserved at 15x already: the bill
    stays within the budget, the probe's requests included. (The budget holds the probe's
    five requests with the run's margin: $0.52 at this listing.)"""
    budget = 0.6
    case = reliability(SCENARIO, "the provider bills 15x its listed price; the probe runs "
                       f"first; budget.usd ${budget}")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    bill_factor=15, **SHORT) as server:
        outcome = _run_with_probe(_config(tmp_path, qwen3_dir, server, 100, budget))
        bill = _billed(server)
    case.runs = 1
    st = collect_status(tmp_path / "run")
    counted = st.total.sums.cost + st.probe_usd
    case.note(f"server billed ${bill:.4f} of ${budget}; counted ${counted:.4f} (probe "
              f"${st.probe_usd:.4f}); {outcome.status}")
    assert outcome.status == "budget"
    assert bill <= budget
    assert st.probe_usd > 0
    assert counted == pytest.approx(bill)
    session = read_run_json(tmp_path / "run" / "run.json")["sessions"][-1]
    assert session["probe_usd"] == pytest.approx(st.probe_usd)


@pytest.mark.parametrize("listing", [(0.0, 0.0), (1e-15, 1e-15)], ids=["zero", "1e-15"])
def test_a_paid_backend_listed_at_nothing_is_refused(tmp_path: Path, qwen3_dir: Path,
                                                     reliability, listing: tuple) -> None:
    case = reliability(SCENARIO, f"OpenRouter lists the model at {listing[0]:g} per token "
                       "while it bills its true price; budget.usd $0.005")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    listed_prices=listing, **SHORT) as server:
        cfg = _config(tmp_path, qwen3_dir, server, 100, 0.005)
        with pytest.raises(ConfigError, match="paid: false"):
            run_config(cfg)
        bill = _billed(server)
    case.runs = 1
    case.note(f"refused at start; server billed ${bill:.4f}")
    assert bill == 0


def test_a_configured_price_of_zero_on_a_paid_backend_is_refused(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability(SCENARIO, "price: {prompt: 0, completion: 0} on a paid backend; "
                       "budget.usd $0.005")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    **SHORT) as server:
        cfg = _config(tmp_path, qwen3_dir, server, 20, 0.005,
                      price={"prompt": 0, "completion": 0})
        with pytest.raises(ConfigError, match="below what any paid API charges"):
            run_config(cfg)
        bill = _billed(server)
    case.runs = 1
    assert bill == 0


def test_a_free_backend_that_reports_costs_counts_them(tmp_path: Path, qwen3_dir: Path,
                                                       reliability, caplog) -> None:
    case = reliability(SCENARIO, "a backend configured `paid: false` whose answers report "
                       "a cost; budget.usd $0.005")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    listed_prices=(0, 0), **SHORT) as server:
        cfg = _config(tmp_path, qwen3_dir, server, 100, 0.005, concurrency=2, paid=False)
        outcome = run_config(cfg)
        bill = _billed(server)
    case.runs = 1
    counted = collect_status(tmp_path / "run").total.sums.cost
    case.note(f"server billed ${bill:.4f}; counted ${counted:.4f}; {outcome.status}")
    assert counted == pytest.approx(bill)
    assert outcome.status == "budget"
    assert "paid: false" in caplog.text and "report a cost" in caplog.text


# ---- the probe pays from the budget -------------------------------------------------------------


def test_a_budget_too_small_for_any_probe_is_refused_with_the_figure_to_raise_it_to(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    """budget.usd 1e-9 with the probe on used to run unprobed after one warning. Nothing is sent
    and the run fails naming the budget the smallest probe needs; at that budget it probes."""
    case = reliability(SCENARIO, "budget.usd 1e-9 with the probe on, then the budget the "
                       "refusal names")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    **SHORT) as server:
        refused = _run_with_probe(_config(tmp_path, qwen3_dir, server, 10, 1e-9))
        bill_refused = _billed(server)
        figure = re.search(r"raise budget\.usd to at least \$([0-9.]+)", refused.message)
        assert figure, refused.message
        budget = float(figure[1])
        again = _run_with_probe(_config(tmp_path, qwen3_dir, server, 10, budget))
        bill = _billed(server)
    case.runs = 2
    session = read_run_json(tmp_path / "run" / "run.json")["sessions"][-1]
    case.note(f"refused ({refused.status}), billed ${bill_refused}; at the ${budget} it names: "
              f"probed, billed ${bill:.6f}, {again.status}")
    assert bill_refused == 0
    assert refused.status == "failed" and "--no-probe" in refused.message
    assert session.get("probe_usd", 0) > 0
    assert bill <= budget


@pytest.mark.parametrize("share", [2.0, 0.5], ids=["full_max_tokens", "max_tokens_cut"])
def test_a_small_trial_budget_is_probed_first_request_alone(
        tmp_path: Path, qwen3_dir: Path, reliability, share: float) -> None:
    """A cautious first budget used to switch the probe off: its requests were held at once,
    the four beside the first at 20x ($0.109 at budget.usd $0.05). The first now goes alone
    and the others once its bill is known, so `share` times the probe's worst case at the
    listing is enough; below it, the probe's max_tokens is cut to what the budget allows."""
    case = reliability(SCENARIO, f"budget.usd {share}x the probe's worst case at the listing "
                       "(its old hold at 20x did not fit), concurrency 1")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    latency_s=0.3, **SHORT) as server:
        worst = _probe_worst_at_listing(_config(tmp_path, qwen3_dir, server, 4, 1.0))
        budget = share * sum(worst)
        outcome = _run_with_probe(_config(tmp_path, qwen3_dir, server, 4, budget,
                                          concurrency=1))
        snap = server.stats.snapshot()
    case.runs = 1
    session = read_run_json(tmp_path / "run" / "run.json")["sessions"][-1]
    sent_max = {b["max_tokens"] for b in snap["bodies"][:len(worst)]}
    case.note(f"probe held ${session.get('probe_reserved_usd', 0):.6f} at most of "
              f"${budget:.6f}; max in flight {snap['max_in_flight']}; probe max_tokens "
              f"{sorted(sent_max)}; billed ${snap['billed_usd']:.6f}; {outcome.status}")
    assert "probe_reserved_usd" in session  # probed
    assert session["probe_reserved_usd"] <= budget
    assert snap["max_in_flight"] == len(worst) - 1  # the first alone, then the rest at once
    assert snap["billed_usd"] <= budget
    assert outcome.status in ("completed", "budget")
    first, *others = [b["max_tokens"] for b in snap["bodies"][:len(worst)]]
    assert first == MAX_TOKENS  # held at the price alone: no larger than the run's requests
    if share >= 1:
        assert set(others) == {ProbeOptions().max_tokens}
    else:
        assert max(others) < ProbeOptions().max_tokens


def _probe_worst_at_listing(cfg: Path, first_max_tokens: int | None = None) -> list[float]:
    """The probe's requests' worst cases at the listed price (the first one's with
    `first_max_tokens`: the run's, to a backend whose charges are not known yet)."""
    fmt = prepare(load_config(cfg)).fmt
    full = ProbeOptions().max_tokens
    return [(len(r.input_ids) + (first_max_tokens or full if i == 0 else full))
            * PRICE["completion"] / 1e6 for i, r in enumerate(probe_requests(fmt)[0])]


@pytest.mark.parametrize("room", [2.0, 30.0], ids=["probe_refused_after_its_first_bill",
                                                   "probe_runs"])
def test_the_probe_sent_at_once_to_a_15x_provider_keeps_the_run_bound(
        tmp_path: Path, qwen3_dir: Path, reliability, room: float) -> None:
    """The probe sends its requests at once, before anything told what the provider charges:
    held at the listing alone, five answers billed 15x passed a budget of twice their listed
    worst case 7-fold. Held as the run holds requests before a first answer (the first at
    its worst case, the others at 20x), the bill passes the budget by at most (15 - 1) times
    one request's worst case, as a run without the probe. The first request now goes alone,
    with the run's max_tokens: its bill tells the others' price (and whether the budget still
    holds them), and the bill passes the budget by at most (15 - 1) times one of the run's
    requests."""
    factor = 15
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    bill_factor=factor, reasoning_tokens=(4000, 4000)) as server:
        cfg = _config(tmp_path, qwen3_dir, server, 3, 1.0)
        worst = _probe_worst_at_listing(cfg)
        budget = room * sum(worst)
        cfg = _config(tmp_path, qwen3_dir, server, 3, budget)
        case = reliability(SCENARIO, f"the provider bills {factor}x its listing; every answer "
                           f"is max_tokens long; the probe on; budget.usd {room}x the probe's "
                           "worst case at the listing")
        outcome = _run_with_probe(cfg)
        bill = _billed(server)
    case.runs = 1
    session = read_run_json(tmp_path / "run" / "run.json")["sessions"][-1]
    probed = "probe_reserved_usd" in session
    case.note(f"server billed ${bill:.4f} of ${budget:.4f}; probe "
              f"{'ran' if probed else 'left out'}; {outcome.status}")
    # The one request held at the listing alone is the probe's first, sent with the run's
    # max_tokens: the bill passes the budget by no more than an unprobed run's would.
    first_alone = _probe_worst_at_listing(cfg, MAX_TOKENS)[0]
    assert bill <= budget + (factor - 1) * first_alone + 1e-12
    assert probed  # the first request alone fits; the others wait for its bill
    assert session["probe_unguarded_usd"] == pytest.approx(first_alone, rel=1e-6)
    if room < factor:  # what the provider bills leaves no room for the others: refused
        assert outcome.status == "failed" and "raise budget.usd" in outcome.message


def test_a_stored_probe_result_needs_no_room_in_the_budget(tmp_path: Path, qwen3_dir: Path,
                                                           reliability) -> None:
    """The probe found the backend unsafe (its reasoning never arrives) and the run sent
    nothing. Resumed with a budget too small for a new probe, the stored verdict still keeps the
    backend out: reusing it costs nothing (it used to skip the probe, and its verdict, whole)."""
    case = reliability(SCENARIO, "a resumed run whose budget cannot hold a probe, with a stored "
                       "verdict of unsafe")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    reasoning_field="none", **SHORT) as server:
        first = _run_with_probe(_config(tmp_path, qwen3_dir, server, 10, 1.0))
        sent_by_probe = sum(server.stats["per_prompt"].values())
        again = _run_with_probe(_config(tmp_path, qwen3_dir, server, 10, 0.05))
        sent = sum(server.stats["per_prompt"].values())
    case.runs = 2
    case.note(f"first: {first.status}; resumed with $0.05: {again.status}, "
              f"{sent - sent_by_probe} requests sent")
    assert first.status == again.status == "failed"
    assert "no backend safe" in again.message
    assert sent == sent_by_probe > 0
    assert read_records(tmp_path / "run", "d") == []


# ---- reported costs that are no cost ------------------------------------------------------------


@pytest.mark.parametrize("reported", [0, -0.5, "NaN"],
                         ids=["zero_byok", "negative", "not_a_number"])
def test_a_reported_cost_never_counts_less_than_the_price(
        tmp_path: Path, qwen3_dir: Path, reliability, reported: Any) -> None:
    """0 counts the price; a negative or non-number counts the worst case with the margin
    (flagged). (A cost no request could have, 1e308: test_hostile_money.)"""
    budget = 0.02
    case = reliability(SCENARIO, f"the endpoint reports usage.cost {reported!r} for every "
                       f"answer (bill: its price); budget.usd ${budget}")
    with TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                    reported_cost=reported, **SHORT) as server:
        outcome = run_config(_config(tmp_path, qwen3_dir, server, 60, budget, concurrency=2))
        bill = _billed(server)
    case.runs = 1
    records = read_records(tmp_path / "run", "d")
    st = collect_status(tmp_path / "run")
    case.note(f"{len(records)} answers, billed ${bill:.4f} of ${budget}; counted "
              f"${st.total.sums.cost:.4g}; {outcome.status}")
    assert outcome.status == "budget"
    assert bill <= budget
    for r in records:
        priced = (r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]) * 1e-5
        assert r["cost_usd"] >= priced - 1e-12
    sources = {r["cost_source"] for r in records}
    assert sources == ({"priced"} if reported == 0 else {"worst_case_report_refused"})
    assert st.total.sums.cost >= bill - 1e-12
    if sources == {"worst_case_report_refused"}:
        assert st.cost_reports_refused == len(records)
