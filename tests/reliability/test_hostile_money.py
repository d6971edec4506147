"""8. Money, what cannot be true is refused at the wire: a cost sent as a numeric string, a cost
that is no cost while the bill is 15x the listing, and a cost no request could have. The
loopback server keeps what it really charged (`stats["billed_usd"]`); each case compares it
with `budget.usd` and with what draftgen counted."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from draftgen.budget import IMPLAUSIBLE_RATIO
from draftgen.cli import app
from draftgen.status import collect_status
from draftgen.store.runjson_writer import read_run_json
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import read_records, run_config
from tests.reliability.test_bill_truth import (
    PRICE,
    SCENARIO,
    SHORT,
    _billed,
    _config,
    _worst_at_listing,
)

pytestmark = pytest.mark.slow


def _server(**kw: Any) -> TestServer:
    return TestServer(mode="openrouter", prices=(PRICE["prompt"], PRICE["completion"]),
                      **SHORT, **kw)


def test_a_cost_sent_as_a_numeric_string_is_read_as_the_number(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    """`usage.cost: "0.0031"`, 15x the listing, billed as that: read as NaN, each answer was
    counted at its worst case at the listing and the run billed 4.5x its budget. Read as a
    number, the price watch learns the 15x and the bill keeps the run's bound."""
    budget, factor = 0.02, 15
    case = reliability(SCENARIO, f"usage.cost sent as a numeric string (\"0.0031\"), the bill "
                       f"{factor}x the listing; budget.usd ${budget}, concurrency 8")
    with _server(bill_factor=factor, cost_as_text=True) as server:
        outcome = run_config(_config(tmp_path, qwen3_dir, server, 100, budget))
        bill = _billed(server)
    case.runs = 1
    records = read_records(tmp_path / "run", "d")
    counted = collect_status(tmp_path / "run").total.sums.cost
    bound = budget + (factor - 1) * _worst_at_listing(tmp_path)
    case.note(f"{len(records)} answers; billed ${bill:.4f} of ${budget} (bound ${bound:.4f}); "
              f"counted ${counted:.4f}; {outcome.status}")
    assert {r["cost_source"] for r in records} == {"reported"}
    assert counted == pytest.approx(bill)
    assert bill <= bound + 1e-12
    assert outcome.status == "budget"


@pytest.mark.parametrize("reported", ["about 3 cents", ["0.003"], True, "nan", "1e999"],
                         ids=["word", "list", "true", "nan_text", "overflow_text"])
def test_a_cost_that_is_no_cost_holds_the_backend_as_unknown(
        tmp_path: Path, qwen3_dir: Path, reliability, reported: Any) -> None:
    """The provider bills 15x its listing and reports something that is no cost: draftgen does
    not know what it charges, so its requests stay held with the margin and each answer counts
    its worst case times the margin, never the bare listing."""
    budget, factor = 0.02, 15
    case = reliability(SCENARIO, f"usage.cost {reported!r} while the bill is {factor}x the "
                       f"listing; budget.usd ${budget}, concurrency 8")
    with _server(bill_factor=factor, reported_cost=reported) as server:
        outcome = run_config(_config(tmp_path, qwen3_dir, server, 100, budget))
        bill = _billed(server)
    case.runs = 1
    records = read_records(tmp_path / "run", "d")
    st = collect_status(tmp_path / "run")
    bound = budget + (factor - 1) * _worst_at_listing(tmp_path)
    case.note(f"{len(records)} answers; billed ${bill:.4f} of ${budget} (bound ${bound:.4f}); "
              f"counted ${st.total.sums.cost:.4f}; {outcome.status}")
    assert records
    assert {r["cost_source"] for r in records} == {"worst_case_report_refused"}
    assert st.cost_reports_refused == len(records)
    assert st.total.sums.cost >= bill - 1e-12  # never counted below the bill
    assert bill <= bound + 1e-12
    assert outcome.status == "budget"


def test_a_cost_no_request_could_have_stops_the_backend_not_the_run(
        tmp_path: Path, qwen3_dir: Path, reliability, caplog) -> None:
    """`usage.cost: 1e308` was believed: $1e308 spent, and every later session answered 1 of
    20 whatever its budget. Now it counts at a documented cap, the backend is taken out of the
    session with a clear line, status flags it, and a later session goes on."""
    budget = 1.0
    case = reliability(SCENARIO, "usage.cost 1e308 (no request could cost that); then a "
                       "session against a clean endpoint, same budget")
    with _server(reported_cost=1e308) as server, caplog.at_level(logging.ERROR, "draftgen"):
        first = run_config(_config(tmp_path, qwen3_dir, server, 20, budget, concurrency=2))
        first_bill = _billed(server)
    st = collect_status(tmp_path / "run")
    capped = st.total.sums.cost
    assert st.cost_reports_implausible >= 1
    assert "taken out of the run" in caplog.text and f"over {IMPLAUSIBLE_RATIO:g}x" in caplog.text
    assert capped < budget / 2  # counted at the cap, not at 1e308
    with _server() as clean:
        second = run_config(_config(tmp_path, qwen3_dir, clean, 20, budget, concurrency=2))
        second_bill = _billed(clean)
    case.runs = 2
    records = read_records(tmp_path / "run", "d")
    st = collect_status(tmp_path / "run")
    session = read_run_json(tmp_path / "run" / "run.json")["sessions"][0]
    case.note(f"first session: {first.status}, {st.cost_reports_implausible} implausible "
              f"report(s) counted ${capped:.4f} (billed ${first_bill:.4f}); second session: "
              f"{second.status}, {len(records)}/20 answered, billed ${second_bill:.4f}")
    assert session["summary"]["cost_reports_implausible"] == st.cost_reports_implausible
    assert {r["cost_source"] for r in records} >= {"worst_case_report_implausible"}
    assert len(records) == 20
    assert second.status == "completed"
    assert st.total.sums.cost <= budget


def test_what_draftgen_probe_spent_is_counted_by_every_later_session(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    """Three `draftgen probe CFG` commands billed $0.0030 and the run that followed spent its
    whole budget besides (1.65x): run.json kept the results, not the spend. Now the spend is
    in run.json, `status` shows it, and the run's budget holds the probes' bill too."""
    case = reliability(SCENARIO, "three `draftgen probe CFG` commands, then `draftgen run` on a "
                       "budget a little above what they spent")
    cli = CliRunner()
    with _server() as server:
        cfg = _config(tmp_path, qwen3_dir, server, 100, 1.0)
        said = [cli.invoke(app, ["probe", str(cfg)]) for _ in range(3)]
        probes_bill = _billed(server)
        budget = 1.3 * probes_bill
        cfg = _config(tmp_path, qwen3_dir, server, 100, budget)
        outcome = run_config(cfg)
        bill = _billed(server)
    case.runs = 4
    st = collect_status(tmp_path / "run")
    case.note(f"the probes billed ${probes_bill:.5f}; status probe_usd ${st.probe_usd:.5f}; "
              f"the run then billed ${bill - probes_bill:.5f}, ${bill:.5f} in all of "
              f"${budget:.5f}; {outcome.status}")
    assert [r.exit_code for r in said] == [0, 0, 0], [r.output for r in said]
    assert st.probe_usd == pytest.approx(probes_bill)
    assert bill <= budget + 1e-12
    assert outcome.status == "budget"
