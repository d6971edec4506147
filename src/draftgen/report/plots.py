"""The report's figures, as PNG bytes. Uses matplotlib's object API with the Agg canvas (no
pyplot state, no display needed)."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from draftgen.printable import printable
from draftgen.report.collect import RunStats, plot_bin_s

DPI = 100
Plot = Callable[[RunStats], Figure]


def png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def _figure(width: float = 10, height: float = 4.5) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _empty(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes,
            fontsize=13, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def cumulative(series: list[tuple[float, float, float]],
               ) -> tuple[list[datetime], list[float], list[float]]:
    """Bin starts as UTC times, and the answers and cost up to and including each bin."""
    times, counts, costs = [], [], []
    answers = cost = 0.0
    for start, bin_answers, bin_cost in series:
        answers += bin_answers
        cost += bin_cost
        times.append(datetime.fromtimestamp(start, tz=UTC))
        counts.append(answers)
        costs.append(cost)
    return times, counts, costs


def spend_over_time(stats: RunStats) -> Figure:
    fig = _figure(10, 6)
    cost_ax, count_ax = fig.subplots(2, 1, sharex=True)
    timelines = {name: b.timeline for name, b in sorted(stats.backends.items()) if b.timeline}
    bin_s = plot_bin_s(stats.span_s, list(timelines.values()))
    for name, timeline in timelines.items():
        times, counts, costs = cumulative(timeline.series(bin_s))
        cost_ax.step(times, costs, where="post", label=name)
        count_ax.step(times, counts, where="post", label=name)
    if not timelines:
        _empty(cost_ax, "answers with timestamps")
        _empty(count_ax, "answers with timestamps")
        return fig
    cost_ax.set_ylabel("cumulative spend (USD)")
    count_ax.set_ylabel("cumulative answers")
    count_ax.set_xlabel("time (UTC)")
    cost_ax.legend(loc="upper left")
    cost_ax.set_title("Spend and answers over time, per backend")
    for ax in (cost_ax, count_ax):
        ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return fig


def answer_lengths(stats: RunStats) -> Figure:
    names = [n for n, d in stats.datasets.items() if d.answers]
    cols = min(3, max(1, len(names)))
    rows = max(1, -(-len(names) // cols))
    fig = _figure(4.2 * cols, 3.2 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(names):]:
        ax.set_visible(False)
    if not names:
        axes[0].set_visible(True)
        _empty(axes[0], "answers")
        return fig
    for ax, name in zip(axes, names, strict=False):
        d = stats.datasets[name]
        series = [("reasoning", d.reasoning_len.values), ("content", d.content_len.values)]
        top = max((max(v) for _, v in series if len(v)), default=1.0)
        bins = [top * i / 40 for i in range(41)] if top > 0 else 10
        for label, values in series:
            if len(values):
                ax.hist(values, bins=bins, alpha=0.55, label=f"{label} (n={len(values):,})")
        ax.set_title(name)
        ax.set_xlabel("tokens")
        ax.legend(fontsize=8)
    fig.suptitle("Answer lengths: reasoning vs content tokens")
    return fig


COLORS = {
    "exact": "#2ca02c", "length_ok": "#1f77b4", "length_mismatch": "#d62728",
    "unverifiable": "#ff7f0e", "native": "#2ca02c", "reconstructed": "#1f77b4",
    "stop": "#2ca02c", "tool_calls": "#1f77b4", "length": "#d62728",
}


def _stacked_bars(ax: Axes, rows: dict[str, Counter[str]], title: str) -> None:
    labels = list(rows)
    keys = sorted({k for c in rows.values() for k in c}, key=lambda k: (-sum(
        c[k] for c in rows.values()), k))
    if not labels or not keys:
        _empty(ax, title.lower())
        return
    left = [0.0] * len(labels)
    for key in keys:
        totals = [sum(rows[n].values()) or 1 for n in labels]
        widths = [100 * rows[n][key] / t for n, t in zip(labels, totals, strict=True)]
        ax.barh(labels, widths, left=left, label=key, color=COLORS.get(key))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of answers")
    ax.set_title(title)
    ax.legend(loc="lower left", bbox_to_anchor=(1.0, 0.0), fontsize=8)
    ax.invert_yaxis()


def finish_reasons(stats: RunStats) -> Figure:
    fig = _figure(10, 1.5 + 0.5 * max(1, len(stats.datasets)))
    rows = {n: d.finish for n, d in stats.datasets.items() if d.answers}
    _stacked_bars(fig.subplots(), rows, "Finish reasons per dataset")
    return fig


def token_checks(stats: RunStats) -> Figure:
    fig = _figure(10, 2 + 0.6 * max(1, len(stats.datasets)))
    checks_ax, source_ax = fig.subplots(1, 2)
    live = {n: d for n, d in stats.datasets.items() if d.answers}
    _stacked_bars(checks_ax, {n: d.checks for n, d in live.items()}, "Token check")
    _stacked_bars(source_ax, {n: d.sources for n, d in live.items()}, "Token source")
    return fig


def providers(stats: RunStats) -> Figure:
    top = stats.providers.most_common(15)
    fig = _figure(10, 1.5 + 0.35 * max(1, len(top)))
    ax = fig.subplots()
    if not top:
        _empty(ax, "answers")
        return fig
    total = sum(stats.providers.values())
    ax.barh([printable(k) for k, _ in top], [100 * v / total for _, v in top], color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel("% of answers")
    ax.set_title("Provider · quantization shares")
    return fig


def latency(stats: RunStats) -> Figure:
    fig = _figure(10, 4)
    ax = fig.subplots()
    series = [(n, b.latency.values) for n, b in sorted(stats.backends.items())
              if len(b.latency.values)]
    if not series:
        _empty(ax, "latencies")
        return fig
    for name, values in series:
        ordered = sorted(values)
        n = len(ordered)
        ax.plot(ordered, [100 * (i + 1) / n for i in range(n)], label=f"{name} (n={n:,})")
    for q in (50, 90, 99):
        ax.axhline(q, color="#999", lw=0.7, ls=":")
    ax.set_xscale("log")
    seconds = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(seconds)
    ax.xaxis.set_minor_formatter(seconds)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel("latency per answer (s, log scale)")
    ax.set_ylabel("% of answers at most")
    ax.set_title("Latency, cumulative, per backend")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def failures(stats: RunStats) -> Figure:
    fig = _figure(10, 1.5 + 0.5 * max(1, len(stats.datasets)))
    ax = fig.subplots()
    rows = {n: d.failure_kinds for n, d in stats.datasets.items() if d.failures}
    if not rows:
        _empty(ax, "failures")
        return fig
    kinds = sorted({k for c in rows.values() for k in c})
    left = [0] * len(rows)
    for kind in kinds:
        widths = [rows[n][kind] for n in rows]
        ax.barh(list(rows), widths, left=left, label=kind)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("failed requests")
    ax.set_title("Failures by kind, per dataset")
    ax.legend(loc="lower left", bbox_to_anchor=(1.0, 0.0), fontsize=8)
    return fig


PLOTS: dict[str, Plot] = {
    "spend_over_time": spend_over_time,
    "answer_lengths": answer_lengths,
    "finish_reasons": finish_reasons,
    "token_checks": token_checks,
    "providers": providers,
    "latency": latency,
    "failures": failures,
}
