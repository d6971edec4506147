"""Whether `budget.usd_per_minute` can ever admit a request (`refuse_impossible_rate`), and
whether `budget.usd` can ever admit one of the longest answers a dataset asks for
(`refuse_unaffordable_answer`).

The spend rate is a bucket of one minute's worth of dollars; a request takes its priced worst
case from it. Every request reserves at least its output's worst case, `max_tokens` at the
backend's completion price, whatever its prompt: a rate below that for some paid backend can
never pay for one of its requests, and is refused before anything is sent. The prompt's tokens
are left out of the figure on purpose (they are known only once each prompt is rendered), so a
rate is never refused that some request could fit; a request whose prompt makes its worst case
bigger than a minute's worth is admitted alone when the bucket is full (`Ledger.admit`).

The same figure against `budget.usd`: a `max_tokens` whose output worst case on the cheapest
backend is over the whole budget can never be admitted, so the run would stop on the budget
having sent nothing of it (and, as a paid backend leaves the run then, maybe nothing at all);
it is refused where a short answer would fit in the budget (the budget is not simply tiny).
"""

from __future__ import annotations

from collections.abc import Mapping

from draftgen.budget.pricing import PriceWatch
from draftgen.config import ConfigError, DatasetConfig, RunConfig


class SpendRateError(ConfigError):
    """`budget.usd_per_minute` is below what any request of some paid backend reserves."""


def least_output_tokens(cfg: RunConfig) -> int:
    """The fewest output tokens a request of the run reserves: its `max_tokens` (the run's or
    a `sampling_mix` choice's), cut to its dataset's `max_output_tokens`."""
    return min(_least_of(cfg, ds) for ds in cfg.datasets)


def _least_of(cfg: RunConfig, ds: DatasetConfig) -> int:
    drawn = [c.max_tokens or cfg.sampling.max_tokens for c in ds.sampling_mix or []]
    least = min(drawn or [cfg.sampling.max_tokens])
    return min(least, ds.max_output_tokens or least)


def refuse_impossible_rate(cfg: RunConfig, prices: Mapping[str, PriceWatch | None],
                           usd_per_minute: float | None) -> None:
    """`SpendRateError` naming the figures when `usd_per_minute` (the run's, or a shard's part
    of it) is below the output worst case of one request on a paid backend."""
    if not usd_per_minute:
        return
    tokens = least_output_tokens(cfg)
    for name, price in prices.items():
        least = price.worst(0, tokens) if price is not None else 0.0
        if least <= usd_per_minute:
            continue
        assert price is not None
        configured = cfg.budget.usd_per_minute
        rate = (f"${usd_per_minute:g} (budget.usd_per_minute ${configured:g} split over the "
                "shards)" if configured != usd_per_minute else f"${usd_per_minute:g}")
        raise SpendRateError(
            f"budget.usd_per_minute: a minute's spend of {rate} cannot pay for one request on "
            f"backend {name!r}: its output alone may cost ${least:g} (max_tokens {tokens} at "
            f"{_per_million(price)} per million tokens, before any prompt token); raise "
            f"budget.usd_per_minute to at least ${least:g} or lower max_tokens")


def refuse_unaffordable_answer(cfg: RunConfig, prices: Mapping[str, PriceWatch | None],
                               short: int) -> None:
    """`SpendRateError` naming the key, the dataset and the figures when one answer of some
    `max_tokens` a dataset asks for may cost more than the whole `budget.usd` on every
    backend, while a `short` one (the ledger's least useful answer) would fit: that
    max_tokens is the mistake. A budget too small for even a short answer is only small: the
    run ends on it, having sent nothing."""
    usd = cfg.budget.usd
    if usd is None or not prices:
        return
    for ds in cfg.datasets:
        for key, tokens in cfg.max_tokens_of(ds):
            name, least = _cheapest(prices, tokens)
            if least <= usd or _cheapest(prices, min(tokens, short))[1] > usd:
                continue
            price = prices[name]
            assert price is not None
            raise SpendRateError(
                f"{key}: one answer of {tokens:,} tokens (dataset {ds.name!r}) may cost "
                f"${least:g} on the cheapest backend ({name!r}, {_per_million(price)} per "
                f"million output tokens), more than the whole budget.usd (${usd:g}): no "
                "such request could ever be sent; lower it")


def _cheapest(prices: Mapping[str, PriceWatch | None], tokens: int) -> tuple[str, float]:
    """The backend whose output worst case for `tokens` is the least, and that figure."""
    return min(((name, price.worst(0, tokens) if price is not None else 0.0)
                for name, price in prices.items()), key=lambda pair: pair[1])


def _per_million(price: PriceWatch) -> str:
    listed = price.listed.completion if price.listed is not None else 0.0
    return f"${listed * price.ratio:g}" if listed else f"${price.usd_per_token * 1e6:g}"
