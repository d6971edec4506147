"""What a run will cost and how long it will take, before a dollar is spent (`draftgen run
--dry-run`), and while it runs (the progress line's projected spend and ETA).

Per dataset: the prompts still to send (those with no answer on disk), their prompt tokens (as
rendered), the output tokens to expect (the mean of the answers on disk, by their index: the
dataset's own, else the run's; else the probe's answers stored in run.json; else only the
`max_tokens` bound is known), and what one answer costs (`PerAnswer`): what the dataset's
answers on disk were billed, where they cost anything; else its prompt tokens and the expected
output tokens at the price of the backend that runs first, by priority; else what the run's
other answers on disk were billed; with nothing measured, only its bounds (its prompt tokens
and one output token at the cheapest backend's price, every request at `max_tokens` on the
dearest). A price is the configured one, else the endpoint's listing (OpenRouter's free
`GET /models`, which the dry run reads), raised to what the stored probe's answers were
billed (`draftgen probe`).

The dollars expected for a dataset are its prompts times the mean, with a range of
SPREAD standard deviations of their sum (the answers' own spread, and the mean's uncertainty
from the answers it was measured on); with nothing measured, the bounds. Then the wall time at
the configured concurrency (from the answers' latency), and which limit stops the run first
(`Stop`): `budget.usd` (the whole run's: what is left of it after what the run has spent on
answers, billed failures, probes and unsettled requests, less one request's worst case, which
the run must still fit to send one more: `budget.ledger`), a dataset's `max_output_tokens`, or
all prompts answered; after about how many prompts, with a range.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from draftgen.budget.pricing import PriceWatch
from draftgen.config import RunConfig
from draftgen.config.backends import Price
from draftgen.probe.model import BackendProbe
from draftgen.probe.options import ProbeOptions
from draftgen.progress import duration_text
from draftgen.store import RunLayout
from draftgen.store.fast_index import load_index_columns
from draftgen.store.runjson import RunJsonDamaged, read_run_info
from draftgen.store.runjson_writer import read_probe
from draftgen.store.scan import spend_in

if TYPE_CHECKING:
    from rich.console import Console

    from draftgen.config.backends import BackendConfig
    from draftgen.run.plan import DatasetPlan, Plan

SPREAD = 3.0
"""The dollar ranges are this many standard deviations either side of the expected figure."""
LISTING_TIMEOUT_S = 10.0
"""How long the dry run waits for an endpoint's price listing."""


@dataclass(frozen=True)
class AnswerShape:
    """Answers measured: how many, their mean output tokens and latency, and from where."""

    answers: int
    output_tokens: float
    latency_s: float | None
    source: str
    output_tokens_sd: float = 0.0


@dataclass(frozen=True)
class OnDisk:
    """A dataset's answers in the run folder: their IDs' hashes, their shape, each one's cost,
    and all it spent (its answers, billed failures and quarantined answers)."""

    id_hashes: np.ndarray
    shape: AnswerShape | None
    costs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spent_usd: float = 0.0


def answers_on_disk(layout: RunLayout, dataset: str) -> OnDisk:
    """The dataset's answers on disk, from its index (reads, never writes)."""
    not_kept = spend_in(layout.failures(dataset)) + spend_in(layout.quarantine(dataset))
    if not layout.responses(dataset).exists():
        return OnDisk(np.zeros(0, dtype=np.uint64), None, spent_usd=not_kept)
    rows = load_index_columns(layout, dataset).rows
    if len(rows) == 0:
        return OnDisk(rows["idh"], None, spent_usd=not_kept)
    latencies = rows["lat"][~np.isnan(rows["lat"])]
    out = rows["out"].astype(float)
    shape = AnswerShape(len(rows), float(out.mean()),
                        float(latencies.mean()) if len(latencies) else None, "answers on disk",
                        float(out.std()))
    costs = rows["cost"].astype(float)
    return OnDisk(rows["idh"], shape, costs, float(costs.sum()) + not_kept)


def probe_answers(run_json: Path) -> AnswerShape | None:
    """The shape of the probe's answers stored in run.json (short: the probe's max_tokens)."""
    tokens = [a.get("output_tokens") for r in read_probe(run_json).backends.values()
              for a in r.get("answers") or [] if isinstance(a, dict)]
    counted = [t for t in tokens if isinstance(t, int)]
    if not counted:
        return None
    return AnswerShape(len(counted), sum(counted) / len(counted), None, "the probe's answers",
                       float(np.std(counted)))


def spent_outside_answers(run_json: Path) -> float:
    """What run.json says the run spent beyond its datasets' files: its probes (sessions' and
    `draftgen probe` commands') and the requests its sessions left unsettled."""
    try:
        info = read_run_info(run_json)
    except RunJsonDamaged:  # the run rebuilds it; the answers' own costs still count
        return 0.0
    return info.spent_outside_answers()


@dataclass(frozen=True)
class DatasetWork:
    """A dataset's prompts still to send: their rendered lengths, and its answers so far."""

    name: str
    prompt_tokens: Sequence[int]
    done: int
    shape: AnswerShape | None
    max_output_tokens: int | None
    costs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """What each of its answers on disk cost."""
    spent_usd: float = 0.0
    """All it spent so far (`OnDisk.spent_usd`)."""


@dataclass(frozen=True)
class CostBounds:
    """What one answer of a dataset may cost, measured or not."""

    low: float | None
    """The least an answer costs on average: its prompt and one output token at the cheapest
    price (None: no price known)."""
    high: float | None
    """The most an answer costs on average: its prompt and `max_tokens` at the dearest price
    (no price known: the dearest answer on disk; None: none)."""
    worst_request: tuple[float, float] | None
    """What the run must fit of budget.usd to send one more request, for the shortest and the
    longest prompt (its worst case at the price of the backend that runs first; no price
    known: the cheapest and dearest answer on disk)."""


@dataclass(frozen=True)
class PerAnswer:
    """What one answer of a dataset costs: measured (`mean`, `sd` over `samples` answers), or
    only bounded (`mean` None: nothing measured yet)."""

    mean: float | None
    sd: float
    samples: int
    bounds: CostBounds
    source: str

    @classmethod
    def of_costs(cls, costs: np.ndarray, bounds: CostBounds, source: str) -> PerAnswer:
        return cls(float(costs.mean()), float(costs.std()), len(costs), bounds, source)


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
    """The likely range (SPREAD standard deviations; nothing measured: the bounds). None: no
    price known and no cost on disk."""
    usd_max: float | None
    """Every request at `max_tokens` on the dearest backend."""
    answers_until_token_budget: int | None
    shape: AnswerShape | None
    per_answer: PerAnswer


@dataclass(frozen=True)
class Stop:
    """Which limit stops the run first, and after about how many more prompts."""

    limit: str
    """"budget.usd", "max_output_tokens", "all prompts answered", or "budget.usd or all
    prompts answered" (nothing measured decides it), or "not known" (no price, no cost)."""
    text: str
    after: int | None = None
    """Prompts answered before it stops, expected (None: only the range is known)."""
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class Projection:
    datasets: list[DatasetProjection]
    wall_s: float | None
    """At the configured concurrency, from the answers' latency (None: not measured)."""
    stop: Stop
    spent_usd: float
    """What the run has spent so far (counted against budget.usd)."""

    @property
    def stops_first(self) -> str:
        return self.stop.text


@dataclass(frozen=True)
class _Prices:
    """The prices the projection uses: the cheapest and dearest of the backends, and that of
    the backend that runs first (by priority)."""

    cheapest: Price | None
    dearest: Price | None
    first: Price | None

    @classmethod
    def of(cls, cfg: RunConfig, prices: Mapping[str, Price | None]) -> _Prices:
        known = [p for p in prices.values() if p is not None]
        first = next((prices[b.name] for b in sorted(cfg.backends, key=lambda b: b.priority)
                      if prices.get(b.name) is not None), None)
        return cls(min(known, key=lambda p: p.cost(1, 1), default=None),
                   max(known, key=lambda p: p.cost(1, 1), default=None), first)


def project(cfg: RunConfig, work: Sequence[DatasetWork], prices: Mapping[str, Price | None],
            run_shape: AnswerShape | None, spent_usd: float | None = None,
            probe_usd: tuple[float, float] = (0.0, 0.0)) -> Projection:
    """The run's projection (`run_shape`: the answers measured over the whole run, for a
    dataset that has none of its own; `spent_usd`: what the run spent so far, by default what
    its datasets' files say; `probe_usd`: the least and the most the run's probe may spend
    before its first request, `probe_spend`)."""
    max_tokens = cfg.sampling.max_tokens
    p = _Prices.of(cfg, prices)
    run_costs = np.concatenate([w.costs for w in work]) if work else np.zeros(0)
    rows = []
    for w in work:
        shape = w.shape or run_shape
        n, prompt_tokens = len(w.prompt_tokens), sum(w.prompt_tokens)
        per = _per_answer(w, shape, p, max_tokens, run_costs)
        low, expected, high = _usd_range(per, n)
        rows.append(DatasetProjection(
            name=w.name, prompts=n, prompt_tokens=prompt_tokens,
            output_tokens=shape.output_tokens * n if shape else None,
            output_tokens_max=n * max_tokens,
            usd_low=low, usd_expected=expected, usd_high=high,
            usd_max=per.bounds.high * n if per.bounds.high is not None else None,
            answers_until_token_budget=_until_tokens(w, shape),
            shape=shape, per_answer=per))
    spent = sum(w.spent_usd for w in work) if spent_usd is None else spent_usd
    return Projection(rows, _wall_s(cfg, rows), _stops_first(cfg, rows, spent, probe_usd),
                      spent)


def _per_answer(w: DatasetWork, shape: AnswerShape | None, p: _Prices, max_tokens: int,
                run_costs: np.ndarray) -> PerAnswer:
    """What one of the dataset's answers costs (see the module's docstring for the order)."""
    lengths = w.prompt_tokens
    mean_prompt = sum(lengths) / len(lengths) if lengths else 0.0
    worst = (None if p.first is None or not lengths
             else (p.first.cost(min(lengths), max_tokens), p.first.cost(max(lengths), max_tokens)))
    low = None if p.cheapest is None else p.cheapest.cost(mean_prompt, 1)
    high = None if p.dearest is None else p.dearest.cost(mean_prompt, max_tokens)
    if high is None and run_costs.sum() > 0:
        high = float(run_costs.max())
        worst = worst or (float(run_costs.min()), high)
    bounds = CostBounds(low, high, worst)
    if w.costs.sum() > 0:
        return PerAnswer.of_costs(w.costs, bounds, "costs on disk")
    if p.first is not None and shape is not None:
        return PerAnswer(p.first.cost(mean_prompt, shape.output_tokens),
                         p.first.completion * shape.output_tokens_sd / 1e6, shape.answers,
                         bounds, shape.source)
    if run_costs.sum() > 0:
        return PerAnswer.of_costs(run_costs, bounds, "the run's costs on disk")
    return PerAnswer(None, 0.0, 0, bounds, "nothing yet")


def _usd_range(per: PerAnswer, n: int) -> tuple[float | None, float | None, float | None]:
    """The dollars of `n` answers: the likely range (SPREAD standard deviations of their sum,
    within the bounds; nothing measured: the bounds) and the expected figure in it, as (low,
    expected, high)."""
    b = per.bounds
    if per.mean is None:
        return (None if b.low is None else b.low * n, None,
                None if b.high is None else b.high * n)
    expected = per.mean * n
    spread = SPREAD * per.sd * math.sqrt(n + n * n / max(per.samples, 1))
    low, high = max(0.0, expected - spread), expected + spread
    if b.low is not None:
        low = max(low, min(expected, b.low * n))
    if b.high is not None:
        high = min(high, max(expected, b.high * n))
    return low, expected, high


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


def _stops_first(cfg: RunConfig, rows: Sequence[DatasetProjection], spent: float,
                 probe: tuple[float, float]) -> Stop:
    budget = (_budget_stop(cfg.budget.usd, rows, spent, probe) if cfg.budget.usd is not None
              else None)
    if budget is not None and budget.limit != "all prompts answered":
        return budget
    cut = [r for r in rows if r.answers_until_token_budget is not None
           and r.answers_until_token_budget < r.prompts]
    if cut:
        return Stop("max_output_tokens", "; ".join(
            f"{r.name}: max_output_tokens after ~{r.answers_until_token_budget:,} answers"
            for r in cut), after=sum(_answers_sent(r) for r in rows))
    return budget or Stop("all prompts answered", "all prompts answered",
                          after=sum(r.prompts for r in rows))


def _budget_stop(usd: float, rows: Sequence[DatasetProjection], spent: float,
                 probe: tuple[float, float]) -> Stop | None:
    """Where budget.usd stops the run: after the answers whose costs fill what is left of it
    (less what the probe spends, between `probe`'s least and most) but one request's worst
    case (the run sends a request only when that fits). None: nothing is left to send."""
    sending = [(r, _answers_sent(r)) for r in rows if _answers_sent(r)]
    total = sum(n for _, n in sending)
    if not total:
        return None
    head = (f"budget.usd (${usd:g}" + (f", ${spent:,.4f} spent" if spent else "")
            + (f", the probe ${probe[0]:,.4f} – ${probe[1]:,.4f}" if probe[1] else "") + ")")
    pers = [(r.per_answer, n) for r, n in sending]
    worsts = [p.bounds.worst_request for p, _ in pers]
    if any(w is None for w in worsts):
        unknown = ", ".join(r.name for (r, _), w in zip(sending, worsts, strict=True)
                            if w is None)
        return Stop("not known", f"not known: {head} against no price and no cost on disk "
                    f"for {unknown}")
    shortest = min(w[0] for w in worsts if w is not None)
    longest = max(w[1] for w in worsts if w is not None)
    if usd - spent - probe[0] < shortest:
        return Stop("budget.usd", f"{head}: no more prompts, one request's worst case "
                    f"(${shortest:,.4f}) does not fit in what is left", after=0, low=0, high=0)
    # The probe's spend widens the worst case's range: the least left is after its most.
    lost = (shortest + probe[0], longest + probe[1])
    if all(p.mean is not None for p, _ in pers):
        return _measured_stop(head, pers, usd - spent, lost, total)
    return _bounded_stop(head, pers, usd - spent, lost, total)


def _answers_in(room: float, per_answer: float, total: int) -> int:
    """Answers sent, of `total`, before their costs pass `room` (the last one sent while
    they had not)."""
    if room < 0:
        return 0
    return min(total, math.floor(room / per_answer) + 1) if per_answer > 0 else total


def _measured_stop(head: str, pers: Sequence[tuple[PerAnswer, int]], left: float,
                   worst: tuple[float, float], total: int) -> Stop:
    """Answers measured: at their mean cost, within SPREAD standard deviations of the mean of
    the answers still to come (their own spread, and the mean's uncertainty)."""
    mean = sum(p.mean * n for p, n in pers if p.mean is not None) / total
    var = sum(n * (p.sd ** 2 + ((p.mean or 0.0) - mean) ** 2) for p, n in pers) / total
    samples = min(p.samples for p, _ in pers)
    after = _answers_in(left - (worst[0] + worst[1]) / 2, mean, total)
    spread = SPREAD * math.sqrt(var * (1 / max(after, 1) + 1 / max(samples, 1)))
    low = _answers_in(left - worst[1], mean + spread, total)
    high = _answers_in(left - worst[0], max(mean - spread, mean / 10), total)
    if after >= total:
        maybe = f" ({head} may stop it after ~{low:,} more prompts)" if low < total else ""
        return Stop("all prompts answered", "all prompts answered" + maybe, after=total)
    return Stop("budget.usd", f"{head} after ~{after:,} more prompts ({low:,} – {high:,})",
                after=after, low=low, high=high)


def _bounded_stop(head: str, pers: Sequence[tuple[PerAnswer, int]], left: float,
                  worst: tuple[float, float], total: int) -> Stop:
    """Nothing measured: between every answer at its most and every answer at its least."""
    most = sum((p.bounds.high or 0.0) * n for p, n in pers) / total
    least = sum((p.bounds.low if p.bounds.low is not None else 0.0) * n for p, n in pers) / total
    low = _answers_in(left - worst[1], most, total)
    high = _answers_in(left - worst[0], least, total)
    if low >= total:
        return Stop("all prompts answered", "all prompts answered", after=total)
    if high < total:
        return Stop("budget.usd", f"{head} after {low:,} – {high:,} more prompts (no answer "
                    "measured yet)", low=low, high=high)
    return Stop("budget.usd or all prompts answered",
                f"{head} after {low:,} – {total:,} more prompts, or all prompts answered (no "
                "answer measured yet)", low=low, high=total)


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
    return DatasetWork(ds.name, lengths, int(done.sum()), on_disk.shape, cfg.max_output_tokens,
                       on_disk.costs, on_disk.spent_usd)


def configured_prices(cfg: RunConfig) -> dict[str, Price | None]:
    """Each backend's price as the config gives it (0 for one that does not bill; None: the
    endpoint lists it, `listed_prices`)."""
    return {b.name: b.price or (None if b.is_paid else Price(prompt=0, completion=0))
            for b in cfg.backends}


def listed_prices(cfg: RunConfig) -> dict[str, Price | None]:
    """The price each paid backend the config gives none lists for the model (OpenRouter's
    `GET /models`, which is free; no chat request is sent). None: its listing could not be
    read within LISTING_TIMEOUT_S, or the endpoint has none."""
    wanted = [b for b in cfg.backends
              if b.price is None and b.is_paid and b.fleet is None and _has_listing(b)]
    if not wanted:
        return {}

    async def read_all() -> list[Price | None]:
        return await asyncio.gather(*(_listed_price(cfg, b) for b in wanted))

    return dict(zip((b.name for b in wanted), asyncio.run(read_all()), strict=True))


def _has_listing(b: BackendConfig) -> bool:
    """Whether its endpoint lists prices (its backend class reads a listing)."""
    from draftgen.backends.base import Backend

    return b.backend_class().listed_price is not Backend.listed_price


async def _listed_price(cfg: RunConfig, b: BackendConfig) -> Price | None:
    from draftgen.backends import make_backend

    backend = make_backend(b, cfg.model, cfg.sampling)
    try:
        await backend.start()
        return await asyncio.wait_for(backend.listed_price(), LISTING_TIMEOUT_S)
    except TimeoutError:
        return None
    finally:
        await backend.close()


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


def projected_prices(cfg: RunConfig, probed: Mapping[str, ProbedPrice],
                     listed: Mapping[str, Price | None] | None = None
                     ) -> dict[str, Price | None]:
    """Each backend's price for the projection: the configured one (`configured_prices`),
    else its listing (`listed_prices`), never below what its probe saw charged; the probe's
    where neither gives one."""
    prices = configured_prices(cfg)
    for name, price in (listed or {}).items():
        if prices.get(name, price) is None:
            prices[name] = price
    for name, seen in probed.items():
        if name not in prices:
            continue
        own = prices[name]
        prices[name] = seen.charged if own is None else Price(
            prompt=max(own.prompt, seen.charged.prompt),
            completion=max(own.completion, seen.charged.completion))
    return prices


@dataclass(frozen=True)
class ProbeSpend:
    """What the run's probe may spend before its first request: its requests at one output
    token each (`least`) and at its max_tokens (`most`), to `backends`."""

    least: float = 0.0
    most: float = 0.0
    backends: tuple[str, ...] = ()
    requests: int = 0


def probe_spend(plan: Plan, prices: Mapping[str, Price | None], probe: ProbeOptions | None
                ) -> ProbeSpend:
    """The probe's spend on the paid backends it would probe: those without a stored result
    that still serves. Nothing without a probe (`--no-probe`)."""
    if probe is None:
        return ProbeSpend()
    from draftgen.probe.exchange import probe_requests
    from draftgen.probe.gate import names_to_probe

    names = names_to_probe(plan.fmt, plan.cfg, [b.name for b in plan.cfg.backends], probe,
                           RunLayout(plan.run_dir).run_json)
    paid = [(n, price) for n in names
            if (price := prices.get(n)) is not None and price.cost(1, 1) > 0]
    lengths = [len(r.input_ids) for r in probe_requests(plan.fmt)[0]]
    return ProbeSpend(
        least=sum(price.cost(n, 1) for _, price in paid for n in lengths),
        most=sum(price.cost(n, probe.max_tokens) for _, price in paid for n in lengths),
        backends=tuple(name for name, _ in paid), requests=len(lengths))


def print_projection(out: Console, plan: Plan, work: Sequence[DatasetWork],
                     probe: ProbeOptions | None = None) -> None:
    """The projection's table and lines; `probe`: the run's probe (None: `--no-probe`),
    whose spend comes out of the budget before the first request."""
    from rich.table import Table

    run_json = RunLayout(plan.run_dir).run_json
    measured = [w.shape for w in work if w.shape is not None]
    run_shape = _pooled(measured) if measured else probe_answers(run_json)
    probed = probed_prices(run_json)
    listed = listed_prices(plan.cfg)
    prices = projected_prices(plan.cfg, probed, listed)
    spent = sum(w.spent_usd for w in work) + spent_outside_answers(run_json)
    probing = probe_spend(plan, prices, probe)
    p = project(plan.cfg, work, prices, run_shape, spent, (probing.least, probing.most))
    table = Table(title="projection", header_style="bold")
    for col in ("dataset", "to send", "prompt tokens", "output tokens", "$ expected (range)",
                "measured from"):
        table.add_column(col, justify="left" if col in ("dataset", "measured from") else "right")
    for r in p.datasets:
        per = r.per_answer
        table.add_row(r.name, f"{r.prompts:,}", f"{r.prompt_tokens:,}",
                      f"~{r.output_tokens:,.0f}" if r.output_tokens is not None
                      else f"≤ {r.output_tokens_max:,}", _usd_text(r),
                      f"{per.source} ({per.samples:,})" if per.samples else per.source)
    out.print(table)
    most = [r.usd_max for r in p.datasets]
    if all(m is not None for m in most) and any(r.usd_expected is not None for r in p.datasets):
        out.print(f"at most ${sum(m or 0.0 for m in most):,.4f}: every request at max_tokens "
                  f"({plan.cfg.sampling.max_tokens:,}) on the dearest backend", highlight=False)
    _print_prices(out, plan.cfg, prices, probed, listed)
    usd = plan.cfg.budget.usd
    if usd is not None or spent:
        out.print(f"spent so far: ${spent:,.4f}"
                  + (f" of budget.usd ${usd:g}" if usd is not None else ""), highlight=False)
    if probing.backends:
        out.print(f"the probe: ${probing.least:,.4f} – ${probing.most:,.4f} before the first "
                  f"request ({probing.requests} requests to each of "
                  f"{', '.join(probing.backends)}; --no-probe: none)", highlight=False)
    concurrency = sum(b.concurrency for b in plan.cfg.backends)
    out.print(f"wall time at concurrency {concurrency:,}: "
              + (f"~{duration_text(p.wall_s)}" if p.wall_s is not None
                 else "not known until answers are on disk (their latency)"), highlight=False)
    out.print(f"stops first: {p.stops_first}", highlight=False)


def _pooled(shapes: Sequence[AnswerShape]) -> AnswerShape:
    """The shape of the run's answers, from each dataset's."""
    n = sum(s.answers for s in shapes)
    mean = sum(s.output_tokens * s.answers for s in shapes) / n
    var = sum(s.answers * (s.output_tokens_sd ** 2 + (s.output_tokens - mean) ** 2)
              for s in shapes) / n
    return AnswerShape(n, mean, None, "the run's answers", math.sqrt(var))


def _print_prices(out: Console, cfg: RunConfig, prices: Mapping[str, Price | None],
                  probed: Mapping[str, ProbedPrice], listed: Mapping[str, Price | None]
                  ) -> None:
    """Where each price the config does not give comes from, or that none is known."""
    configured = configured_prices(cfg)
    for name in sorted(prices):
        price, seen = prices[name], probed.get(name)
        if price is None or price == configured[name]:
            continue
        if seen is not None and (seen.ratio > 1 or listed.get(name) is None):
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(seen.probed_at))
            why = (f"{seen.ratio:.3g}x the price: what its answers were billed" if seen.ratio > 1
                   else "the endpoint's listing")
            where = f"its probe of {when} ({why})"
        else:
            where = "the endpoint's listing"
        out.print(f"price of {name}: ${price.prompt:,.4g} / ${price.completion:,.4g} per "
                  f"million prompt / output tokens, from {where}", highlight=False)
    unpriced = sorted(name for name, price in prices.items() if price is None)
    if unpriced:
        out.print(f"no price known for {', '.join(unpriced)}: the endpoint lists none that "
                  "could be read (set backends[].price; `draftgen probe` shows the listing)",
                  highlight=False)


def _usd_text(r: DatasetProjection) -> str:
    if r.usd_low is None or r.usd_high is None:
        return "?"
    span = f"{_usd(r.usd_low)} – {_usd(r.usd_high)}"
    return span if r.usd_expected is None else f"{_usd(r.usd_expected)} ({span})"


def _usd(usd: float) -> str:
    return f"${usd:,.4f}"
