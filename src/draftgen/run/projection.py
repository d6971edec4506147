"""What a run will cost and how long it will take, before a dollar is spent (`draftgen run
--dry-run`), and while it runs (the progress line's projected spend and ETA).

Per dataset: the prompts still to send (those with no answer on disk), their prompt tokens (as
rendered), the output tokens to expect (the mean of the answers on disk, by their index: the
dataset's own, else the run's; else the probe's answers stored in run.json; else only the
`max_tokens` bound is known), dollars expected and their range (low: the expected tokens at the
cheapest backend's price; expected: at the price of the backend that runs first, by priority;
high: every request at `max_tokens` on the dearest; a price is the configured one, or the
endpoint's listing as `draftgen probe` stored it, raised to what the probe's answers were
billed), the wall time at the configured
concurrency (from the answers' latency), and which budget stops the run first, after about
how many answers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from draftgen.budget.pricing import PriceWatch
from draftgen.config import RunConfig
from draftgen.config.backends import Price
from draftgen.probe.model import BackendProbe
from draftgen.progress import duration_text
from draftgen.store import RunLayout
from draftgen.store.fast_index import load_index_columns
from draftgen.store.runjson_writer import read_probe

if TYPE_CHECKING:
    from rich.console import Console

    from draftgen.run.plan import DatasetPlan, Plan


@dataclass(frozen=True)
class AnswerShape:
    """Answers measured: how many, their mean output tokens and latency, and from where."""

    answers: int
    output_tokens: float
    latency_s: float | None
    source: str


@dataclass(frozen=True)
class OnDisk:
    """A dataset's answers in the run folder: their IDs' hashes and their shape."""

    id_hashes: np.ndarray
    shape: AnswerShape | None


def answers_on_disk(layout: RunLayout, dataset: str) -> OnDisk:
    """The dataset's answers on disk, from its index (reads, never writes)."""
    if not layout.responses(dataset).exists():
        return OnDisk(np.zeros(0, dtype=np.uint64), None)
    rows = load_index_columns(layout, dataset).rows
    if len(rows) == 0:
        return OnDisk(rows["idh"], None)
    latencies = rows["lat"][~np.isnan(rows["lat"])]
    shape = AnswerShape(len(rows), float(rows["out"].mean()),
                        float(latencies.mean()) if len(latencies) else None, "answers on disk")
    return OnDisk(rows["idh"], shape)


def probe_answers(run_json: Path) -> AnswerShape | None:
    """The shape of the probe's answers stored in run.json (short: the probe's max_tokens)."""
    tokens = [a.get("output_tokens") for r in read_probe(run_json).backends.values()
              for a in r.get("answers") or [] if isinstance(a, dict)]
    counted = [t for t in tokens if isinstance(t, int)]
    if not counted:
        return None
    return AnswerShape(len(counted), sum(counted) / len(counted), None, "the probe's answers")


@dataclass(frozen=True)
class DatasetWork:
    """A dataset's prompts still to send: their rendered lengths, and its answers so far."""

    name: str
    prompt_tokens: Sequence[int]
    done: int
    shape: AnswerShape | None
    max_output_tokens: int | None


@dataclass(frozen=True)
class DatasetProjection:
    name: str
    prompts: int
    prompt_tokens: int
    output_tokens: float | None
    """Expected (None: no answer measured yet)."""
    output_tokens_max: int
    usd_low: float | None
    usd_expected: float | None
    usd_high: float | None
    """None: no price known."""
    answers_until_token_budget: int | None
    shape: AnswerShape | None


@dataclass(frozen=True)
class Projection:
    datasets: list[DatasetProjection]
    wall_s: float | None
    """At the configured concurrency, from the answers' latency (None: not measured)."""
    stops_first: str
    """What ends the run first: "all prompts answered", "budget.usd after ~N answers", or a
    dataset's token budget."""


def project(cfg: RunConfig, work: Sequence[DatasetWork], prices: Mapping[str, Price | None],
            run_shape: AnswerShape | None) -> Projection:
    """The run's projection (`run_shape`: the answers measured over the whole run, for a
    dataset that has none of its own)."""
    max_tokens = cfg.sampling.max_tokens
    known = [p for p in prices.values() if p is not None]
    cheapest = min(known, key=lambda p: p.cost(1, 1), default=None)
    dearest = max(known, key=lambda p: p.cost(1, 1), default=None)
    first = next((prices[b.name] for b in sorted(cfg.backends, key=lambda b: b.priority)
                  if prices.get(b.name) is not None), None)
    rows = []
    for w in work:
        shape = w.shape or run_shape
        n, prompt_tokens = len(w.prompt_tokens), sum(w.prompt_tokens)
        out = shape.output_tokens * n if shape else None
        rows.append(DatasetProjection(
            name=w.name, prompts=n, prompt_tokens=prompt_tokens, output_tokens=out,
            output_tokens_max=n * max_tokens,
            usd_low=_cost(cheapest, prompt_tokens, out),
            usd_expected=_cost(first, prompt_tokens, out),
            usd_high=_cost(dearest, prompt_tokens, n * max_tokens),
            answers_until_token_budget=_until_tokens(w, shape),
            shape=shape))
    return Projection(rows, _wall_s(cfg, rows), _stops_first(cfg, rows))


def _cost(price: Price | None, prompt_tokens: int, output_tokens: float | None
          ) -> float | None:
    if price is None or output_tokens is None:
        return None
    return price.cost(prompt_tokens, 0) + price.completion * output_tokens / 1e6


def _until_tokens(w: DatasetWork, shape: AnswerShape | None) -> int | None:
    """Answers the dataset's token budget allows from here (None: no token budget, or no
    answer measured)."""
    if w.max_output_tokens is None or shape is None or shape.output_tokens <= 0:
        return None
    spent = w.done * shape.output_tokens
    return max(0, math.floor((w.max_output_tokens - spent) / shape.output_tokens))


def _wall_s(cfg: RunConfig, rows: Sequence[DatasetProjection]) -> float | None:
    latencies = [r.shape.latency_s for r in rows if r.shape and r.shape.latency_s]
    if not latencies:
        return None
    answers = sum(_answers_sent(r) for r in rows)
    per_s = sum(b.concurrency for b in cfg.backends) / (sum(latencies) / len(latencies))
    return answers / per_s


def _answers_sent(row: DatasetProjection) -> int:
    if row.answers_until_token_budget is None:
        return row.prompts
    return min(row.prompts, row.answers_until_token_budget)


def _stops_first(cfg: RunConfig, rows: Sequence[DatasetProjection]) -> str:
    usd = cfg.budget.usd
    expected = [r.usd_expected for r in rows]
    if usd is not None and all(x is not None for x in expected):
        answers = sum(_answers_sent(r) for r in rows)
        total = sum(x for x in expected if x is not None)
        if answers and total > usd:
            return f"budget.usd (${usd:g}) after ~{math.floor(answers * usd / total):,} answers"
    elif usd is not None:
        high = sum(r.usd_high or 0.0 for r in rows)
        if high > usd:
            return (f"maybe budget.usd (${usd:g}): every request at max_tokens would cost "
                    f"${high:,.4f}; no answer measured yet")
    cut = [r for r in rows if r.answers_until_token_budget is not None
           and r.answers_until_token_budget < r.prompts]
    if cut:
        return "; ".join(f"{r.name}: max_output_tokens after ~{r.answers_until_token_budget:,} "
                         "answers" for r in cut)
    return "all prompts answered"


# ---- `draftgen run --dry-run` -------------------------------------------------------------------


def dataset_work(plan: Plan, ds: DatasetPlan, rendered: Sequence[Sequence[int] | Exception]
                 ) -> DatasetWork:
    """A dataset's prompts still to send, from its rendered prompts (in table order; a prompt
    that cannot be rendered is left out) and its answers on disk."""
    on_disk = answers_on_disk(RunLayout(plan.run_dir), ds.name)
    done = np.isin(ds.prompts.id_hashes, on_disk.id_hashes)
    lengths = [len(ids) for ids, is_done in zip(rendered, done, strict=True)
               if not is_done and not isinstance(ids, Exception)]
    cfg = next(d for d in plan.cfg.datasets if d.name == ds.name)
    if cfg.max_prompts is not None:
        lengths = lengths[:max(0, cfg.max_prompts - int(done.sum()))]
    return DatasetWork(ds.name, lengths, int(done.sum()), on_disk.shape, cfg.max_output_tokens)


def configured_prices(cfg: RunConfig) -> dict[str, Price | None]:
    """Each backend's price as the config gives it (0 for one that does not bill; None: the
    endpoint lists it, known once the run starts)."""
    return {b.name: b.price or (None if b.is_paid else Price(prompt=0, completion=0))
            for b in cfg.backends}


@dataclass(frozen=True)
class ProbedPrice:
    """A backend's price as its stored probe saw it charged."""

    charged: Price
    """The price its answers were priced at, raised to what they were billed."""
    ratio: float
    """The highest billed cost over priced cost among its answers (1: none above)."""
    probed_at: float


def probed_prices(run_json: Path) -> dict[str, ProbedPrice]:
    """Each probed backend's price as charged (`budget.pricing.PriceWatch` over the probe's
    answers): the listed price a text-only API's config leaves out, and its bills."""
    out: dict[str, ProbedPrice] = {}
    for name, data in read_probe(run_json).backends.items():
        result = BackendProbe.from_dict(data)
        if result is None:
            continue
        watch = PriceWatch(Price(**result.price) if result.price is not None else None)
        for answer in result.answers:
            watch.observe(answer.reported_usd, answer.priced_usd, answer.billed_tokens)
        charged = watch.charged()
        if charged is not None:
            out[name] = ProbedPrice(charged, watch.ratio, result.probed_at)
    return out


def projected_prices(cfg: RunConfig, probed: Mapping[str, ProbedPrice]
                     ) -> dict[str, Price | None]:
    """Each backend's price for the projection: the configured one (`configured_prices`),
    never below what its probe saw charged; the probe's where the config gives none."""
    prices = configured_prices(cfg)
    for name, seen in probed.items():
        if name not in prices:
            continue
        own = prices[name]
        prices[name] = seen.charged if own is None else Price(
            prompt=max(own.prompt, seen.charged.prompt),
            completion=max(own.completion, seen.charged.completion))
    return prices


def print_projection(out: Console, plan: Plan, work: Sequence[DatasetWork]) -> None:
    from rich.table import Table

    run_json = RunLayout(plan.run_dir).run_json
    measured = [w.shape for w in work if w.shape is not None]
    run_shape = (AnswerShape(sum(s.answers for s in measured),
                             sum(s.output_tokens * s.answers for s in measured)
                             / sum(s.answers for s in measured), None, "the run's answers")
                 if measured else probe_answers(run_json))
    probed = probed_prices(run_json)
    prices = projected_prices(plan.cfg, probed)
    p = project(plan.cfg, work, prices, run_shape)
    table = Table(title="projection", header_style="bold")
    for col in ("dataset", "to send", "prompt tokens", "output tokens", "$ expected",
                "$ range", "measured from"):
        table.add_column(col, justify="left" if col in ("dataset", "measured from") else "right")
    for r in p.datasets:
        table.add_row(r.name, f"{r.prompts:,}", f"{r.prompt_tokens:,}",
                      f"~{r.output_tokens:,.0f}" if r.output_tokens is not None
                      else f"≤ {r.output_tokens_max:,}",
                      _usd(r.usd_expected), f"{_usd(r.usd_low)} – {_usd(r.usd_high)}",
                      f"{r.shape.source} ({r.shape.answers:,})" if r.shape else "nothing yet")
    out.print(table)
    configured = configured_prices(plan.cfg)
    for name, seen in sorted(probed.items()):
        price = prices.get(name)
        if price is not None and price != configured[name]:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(seen.probed_at))
            why = (f"{seen.ratio:.3g}x the price: what its answers were billed" if seen.ratio > 1
                   else "the endpoint's listing")
            out.print(f"price of {name}: ${price.prompt:,.4g} / ${price.completion:,.4g} per "
                      f"million prompt / output tokens, from its probe of {when} ({why})",
                      highlight=False)
    unpriced = sorted(name for name, price in prices.items() if price is None)
    if unpriced:
        out.print(f"price listed by the endpoint for {', '.join(unpriced)}: known once the run "
                  "starts (`draftgen probe` shows it)", highlight=False)
    concurrency = sum(b.concurrency for b in plan.cfg.backends)
    out.print(f"wall time at concurrency {concurrency:,}: "
              + (f"~{duration_text(p.wall_s)}" if p.wall_s is not None
                 else "not known until answers are on disk (their latency)"), highlight=False)
    out.print(f"stops first: {p.stops_first}", highlight=False)


def _usd(usd: float | None) -> str:
    return "?" if usd is None else f"${usd:,.4f}"
