"""The report page: one self-contained HTML file (figures embedded as data URIs, inline CSS,
no script, nothing fetched), summary tables first."""

from __future__ import annotations

import base64
import html
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from draftgen.export.source import SourceSession
from draftgen.printable import printable
from draftgen.report.collect import DatasetStats, Reservoir, RunStats, SessionWork
from draftgen.store.runjson import Summary

SECTIONS: list[tuple[str, str, str]] = [
    ("spend", "Spend and answers over time", "spend_over_time"),
    ("lengths", "Answer lengths", "answer_lengths"),
    ("finish", "Finish reasons", "finish_reasons"),
    ("checks", "Token checks", "token_checks"),
    ("providers", "Providers and quantization", "providers"),
    ("latency", "Latency", "latency"),
    ("failures", "Failures", "failures"),
]
"""(section id, title, figure name)."""

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;
background:#fafafa}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #ddd;
padding-bottom:4px}
.sub{color:#555;margin:0 0 16px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{background:#fff;border:1px solid #e3e3e3;border-radius:8px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:20px}
table{border-collapse:collapse;background:#fff;margin:8px 0 16px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #e3e3e3;padding:4px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f2f2f2}
img{max-width:100%;background:#fff;border:1px solid #e3e3e3;border-radius:6px}
nav a{margin-right:12px}.note{color:#666;font-size:13px}
.warning{background:#fff4d6;border-left:4px solid #d9a400;padding:8px 12px;font-size:14px}
"""


def _e(value: Any) -> str:
    return html.escape(printable(value))


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], css_id: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    ident = f' id="{css_id}"' if css_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _usd(value: float) -> str:
    return f"${value:,.4f}" if value < 100 else f"${value:,.2f}"


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _or_dash(value: float | None) -> float | str:
    return "-" if value is None else value


def _duration(seconds: float) -> str:
    h, rem = divmod(int(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


def _rate(count: int, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    rate = count / seconds
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def _cards(stats: RunStats) -> str:
    span = stats.span_s
    tokens = sum(d.output_tokens for d in stats.datasets.values())
    failed = sum(d.failures for d in stats.datasets.values())
    cards = [
        ("answers", f"{stats.answers:,}"),
        ("failed requests", f"{failed:,}"),
        ("spend", _usd(stats.cost)),
        ("output tokens", f"{tokens:,}"),
        ("answers / s", _rate(stats.answers, span)),
        ("output tokens / s", _rate(tokens, span)),
        ("first → last answer", _duration(span)),
    ]
    return '<div class="cards">' + "".join(
        f'<div class="card"><span>{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in cards
    ) + "</div>"


def _template_warning(stats: RunStats) -> str:
    """The latest session's prompts differ from the model's own chat template (a warning,
    with the format that matches where one does)."""
    found = stats.sessions[-1].session.template_check if stats.sessions else None
    warning = found.warning if found is not None else None
    if not warning:
        return ""
    return f'<p class="warning" id="template-check">Prompts: {_e(warning)}</p>'


def _datasets_table(stats: RunStats) -> str:
    rows = []
    for name, d in stats.datasets.items():
        rows.append((
            name, f"{d.answers:,}", f"{d.failures:,}", f"{d.output_tokens:,}",
            f"{d.reasoning_tokens:,}", _usd(d.cost), _pct(d.finish["length"], d.answers),
            _pct(d.checks["exact"], d.answers),
            _file_issues(d),
        ))
    return _table(("dataset", "answers", "failed", "output tokens", "reasoning tokens", "spend",
                   "truncated", "exact IDs", "file issues"), rows, "totals")


def _trajectories_table(stats: RunStats) -> str:
    """`turns: all` datasets: conversations, turns per conversation, where they ended."""
    rows = []
    for name, d in stats.datasets.items():
        t = d.trajectories
        if t is None:
            continue
        mean = f"{t.turns / t.conversations:.2f}" if t.conversations else "-"
        ends = ", ".join(f"{k} {n:,}" for k, n in t.ends.most_common()) or "-"
        rows.append((name, f"{t.conversations:,}", f"{t.done:,}", f"{t.turns:,}", mean,
                     f"{t.max_turns:,}", ends))
    if not rows:
        return ""
    return _table(("dataset (turns: all)", "conversations", "ended", "turns", "turns / conv.",
                   "max turns", "end reasons"), rows, "trajectories")


def _file_issues(d: DatasetStats) -> str:
    issues = [f"{d.torn_tail_bytes} B torn, {d.bad_lines} bad"] if (
        d.torn_tail_bytes or d.bad_lines) else []
    if d.duplicates:
        issues.append(f"{d.duplicates:,} answered in two shard folders (left out)")
    return "; ".join(issues)


def _backends_table(stats: RunStats) -> str:
    rows = []
    for name, b in sorted(stats.backends.items()):
        per_answer = _usd(b.cost / b.answers) if b.answers else "-"
        per_mtok = _usd(b.cost / b.output_tokens * 1e6) if b.output_tokens else "-"
        rows.append((name, f"{b.answers:,}", f"{b.failures:,}", f"{b.output_tokens:,}",
                     _usd(b.cost), per_answer, per_mtok))
    return _table(("backend", "answers", "failed", "output tokens", "spend", "per answer",
                   "per 1M output tokens"), rows, "spend-table")


def _sessions_table(stats: RunStats) -> str:
    """One row per session: what it counted at its end, or, for one that never ended (killed,
    or still running), what its own answers and failures on disk show."""
    rows = []
    for i, s in enumerate(stats.sessions):
        label = f"{i + 1} (shard {s.shard})" if s.shard else i + 1
        rows.append((label, _when(s.session.started_at), *_session_end(s, stats)))
    if not rows:
        return '<p class="note">run.json records no sessions.</p>'
    return _table(("session", "started", "stopped", "outcome", "answered", "failed",
                   "spend (USD)"), rows, "sessions")


def _session_end(s: SourceSession, stats: RunStats) -> tuple[Any, ...]:
    """Stopped, outcome, answered, failed, spend."""
    session = s.session
    if session.outcome is not None:
        summary = session.summary or Summary()
        return (_when(session.stopped_at), session.outcome, _or_dash(summary.done_now),
                _or_dash(summary.failed_now), _or_dash(summary.cost_usd_now))
    work = stats.work.get((s.folder, s.index), SessionWork())
    if s.killed:
        stopped = f"{_when(work.last_at)} (its last write)" if work.last_at else "-"
        outcome = "killed: ended without closing"
    else:
        stopped, outcome = "-", "running"
    return stopped, outcome, work.answered, work.failed, round(work.cost, 6)


def _budget_note(stats: RunStats) -> str:
    """Why budget.usd counts more than the answers' spend, in one line (none where it does
    not)."""
    gap = stats.budget
    parts = [(gap.probe_usd, "by the probe's requests"),
             (gap.not_kept_usd, "on quarantined answers and billed failed requests"),
             (gap.unsettled_usd, "by earlier sessions' paid requests with no answer on disk "
                                 "(aborted, or in flight at a kill; their bill, else their "
                                 "worst case)"),
             (gap.in_flight_usd, "at most, by the requests in flight when the last session was "
                                 "killed (counted when the run resumes)")]
    said = [f"{_usd(usd)} {why}" for usd, why in parts if usd > 0]
    if not said:
        return ""
    return (f'<p class="note" id="budget-note">budget.usd counts {_usd(stats.cost + gap.usd)} '
            f"spent, not the answers' {_usd(stats.cost)}: also {_e('; '.join(said))}.</p>")


def _latency_rows(label: str, items: Iterable[tuple[str, Reservoir]]) -> list[tuple[str, ...]]:
    rows = []
    for name, r in items:
        if not r.values:
            continue
        p = [f"{r.percentile(q) or 0.0:.2f}" for q in (50, 90, 99)]
        rows.append((f"{label} {name}", f"{r.seen:,}", *p, f"{max(r.values):.2f}"))
    return rows


def _latency_table(stats: RunStats) -> str:
    rows = _latency_rows("backend", sorted((n, b.latency) for n, b in stats.backends.items()))
    rows += _latency_rows("dataset", ((n, d.latency) for n, d in stats.datasets.items()))
    return _table(("", "answers", "p50 (s)", "p90 (s)", "p99 (s)", "max (s)"), rows,
                  "latency-table")


def _failures_table(stats: RunStats) -> str:
    rows = [(name, kind, f"{n:,}") for name, d in stats.datasets.items()
            for kind, n in d.failure_kinds.most_common()]
    if not rows:
        return '<p class="note">No failed requests.</p>'
    return _table(("dataset", "kind", "failed requests"), rows, "failures-table")


def _image(name: str, data: bytes, title: str) -> str:
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    return f'<img src="{uri}" alt="{_e(title)}" data-figure="{_e(name)}">'


def _extra(section: str, stats: RunStats) -> str:
    if section == "lengths":
        return f'<p class="note">Reasoning vs content: {_e(stats.length_source)}.</p>'
    if section == "latency":
        return _latency_table(stats)
    if section == "failures":
        return _failures_table(stats)
    if section == "spend":
        return _backends_table(stats)
    return ""


def render(stats: RunStats, figures: dict[str, bytes]) -> str:
    model = stats.info.stored_config.model.name or "?"
    live = " · a run was live on this folder when the report was made" if stats.live else ""
    nav = "".join(f'<a href="#{sid}">{_e(title)}</a>' for sid, title, _ in SECTIONS)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>draftgen report: {_e(stats.root)}</title><style>{CSS}</style></head><body><main>",
        f"<h1>draftgen run report</h1><p class=\"sub\">{_e(stats.root)} · model {_e(model)} · "
        f"made {_e(_when(time.time()))}{_e(live)}</p>",
        f"<nav>{nav}</nav>",
        '<section id="summary"><h2>Summary</h2>',
        _cards(stats),
        _template_warning(stats),
        _datasets_table(stats),
        _trajectories_table(stats),
        _sessions_table(stats),
        _budget_note(stats),
        "</section>",
    ]
    for sid, title, fig in SECTIONS:
        parts.append(f'<section id="{sid}"><h2>{_e(title)}</h2>')
        parts.append(_extra(sid, stats))
        if fig in figures:
            parts.append(_image(fig, figures[fig], title))
        parts.append("</section>")
    parts.append("</main></body></html>")
    return "\n".join(parts)
