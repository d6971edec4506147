"""What a figure from the wire counts for: a cost (`wire_cost`), a token count (`parse_usage`), a
listed price (`price_from_listing`), and the budget's rules over them (`counted_cost`,
`PriceWatch`). A string where a number goes is read as the number it spells, or refused; a
size no answer can have is refused; nothing refused is ever counted below the listing."""

from __future__ import annotations

import math
from typing import Any

import pytest

from draftgen.backends.base import parse_usage, wire_cost
from draftgen.backends.openrouter import price_from_listing
from draftgen.budget import (
    IMPLAUSIBLE_RATIO,
    LEARNING_MARGIN,
    REPORT_IMPLAUSIBLE,
    REPORT_REFUSED,
    REPORTED,
    Ledger,
    PriceWatch,
    counted_cost,
)
from draftgen.config.backends import Price


@pytest.mark.parametrize(("sent", "read"), [
    (0.0031, 0.0031), (3, 3.0), ("0.0031", 0.0031), (" 1e-3 ", 0.001), (".5", 0.5),
    ("-0.5", -0.5), (None, None),
])
def test_a_cost_is_a_number_or_a_numeric_string(sent: Any, read: float | None) -> None:
    assert wire_cost(sent) == read


@pytest.mark.parametrize("sent", ["nan", "inf", "-Infinity", "0x1p3", "about 3 cents", "",
                                  True, ["0.1"], {"usd": 1}, 10**400, "1e999"])
def test_anything_else_is_no_cost(sent: Any) -> None:
    value = wire_cost(sent)
    assert value is not None and not (math.isfinite(value) and value >= 0)


def test_token_counts_are_counts() -> None:
    usage = parse_usage({"prompt_tokens": "120", "completion_tokens": -4,
                         "completion_tokens_details": {"reasoning_tokens": 2**70},
                         "prompt_tokens_details": {"cached_tokens": True}})
    assert usage.prompt_tokens == 120
    assert usage.completion_tokens is None
    assert usage.reasoning_tokens is None
    assert usage.cached_tokens is None


@pytest.mark.parametrize("pricing", [{"prompt": "nan", "completion": "0.00001"},
                                     {"prompt": "-1", "completion": "0.00001"},
                                     {"prompt": "1e400", "completion": "0.00001"},
                                     {"prompt": "free", "completion": "0"},
                                     {"prompt": "0.00001"}, "0.00001"])
def test_a_listing_that_is_no_price_is_no_listing(pricing: Any) -> None:
    assert price_from_listing([{"id": "m", "pricing": pricing}], "m") is None


def test_a_listing_in_strings_is_read() -> None:
    price = price_from_listing([{"id": "m", "pricing": {"prompt": "0.000001",
                                                        "completion": "0.000002"}}], "m")
    assert price == Price(prompt=1.0, completion=2.0)


def test_refused_and_implausible_reports_count_the_margin_never_the_listing() -> None:
    worst, priced = 0.001, 0.0004
    assert counted_cost(math.nan, priced, worst) == (worst * LEARNING_MARGIN, REPORT_REFUSED)
    most = IMPLAUSIBLE_RATIO * worst
    assert counted_cost(1e308, priced, worst, most) == (worst * LEARNING_MARGIN,
                                                        REPORT_IMPLAUSIBLE)
    assert counted_cost(most, priced, worst, most) == (most, REPORTED)


def test_the_plausible_bound_has_a_floor_for_a_backend_listed_at_nothing() -> None:
    free = PriceWatch(Price(prompt=0, completion=0))
    assert free.most_plausible(100, 900) == pytest.approx(IMPLAUSIBLE_RATIO * 1000 * 1e-6)
    listed = PriceWatch(Price(prompt=10, completion=10))
    assert listed.most_plausible(100, 900) == pytest.approx(IMPLAUSIBLE_RATIO * 1000 * 1e-5)


def test_an_unreadable_report_puts_the_backend_back_under_the_margin() -> None:
    watch = PriceWatch(Price(prompt=10, completion=10))
    watch.observe(0.001, 0.001, 100)
    assert not watch.charges_unknown(reports_cost=True)
    watch.observe(math.nan, 0.001, 100)
    assert watch.charges_unknown(reports_cost=True)
    watch.observe(1e308, 0.001, 100, most=1.0)  # implausible: unknown, and the ratio unmoved
    assert watch.charges_unknown(reports_cost=True) and watch.ratio == 1.0
    watch.observe(0.002, 0.001, 100, most=1.0)
    assert not watch.charges_unknown(reports_cost=True) and watch.ratio == 2.0


def test_holding_a_backend_as_unknown_raises_its_reservations_in_flight() -> None:
    ledger = Ledger(usd=1.0)
    ledger.add_dataset("d", None, 0)
    watch = PriceWatch(Price(prompt=10, completion=10))
    first = ledger.admit("d", 100, 0, watch, "b").reservation
    assert first is not None and first.usd == pytest.approx(0.001)
    ledger.hold_unknown("b")
    assert first.usd == pytest.approx(0.001 * LEARNING_MARGIN)
    assert first.worst_usd == pytest.approx(0.001)
    assert ledger.reserved_usd == pytest.approx(0.001 * LEARNING_MARGIN)
    ledger.settle(first, 10, 0.0001)
    assert ledger.reserved_usd == 0.0
