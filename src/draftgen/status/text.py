"""The figures of a status as text, for the summary (`brief`) and the tables (`render`)."""

from __future__ import annotations

import time

from draftgen.printable import for_console
from draftgen.status.model import Rates, RunStatus


def when(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    ago = now - t
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    return f"{stamp} ({duration(ago)} ago)" if ago >= 0 else stamp


def duration(s: float) -> str:
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def rate_text(r: Rates | None) -> str:
    if r is None or r.seconds <= 0:
        return "-"
    j = r.as_json()
    return (f"{j['answers_per_s']:.2f} answers/s · {j['tokens_per_s']:,.0f} tokens/s · "
            f"${j['usd_per_min']:.4f}/min over {duration(r.seconds)}")


def headline(st: RunStatus) -> str:
    """The run folder, whether it is live (which shards) and its sessions (rich markup)."""
    if st.shards:
        live_n = sum(s.state == "live" for s in st.shards)
        live = (f"[bold green]{live_n} of {len(st.shards)} shard folders live[/]" if live_n
                else f"not running ({len(st.shards)} shard folders)")
    else:
        live = (f"[bold green]live[/] (pid {st.pid} on {st.host})" if st.live
                else f"not running (last session: {st.last_outcome or 'killed or crashed'})")
    return f"[bold]{for_console(st.root)}[/] · {live} · {st.sessions} session(s)"


def spent_text(st: RunStatus) -> str:
    """$ spent against budget.usd, of how much, and what is left of it."""
    spent, kept = st.spent_usd, st.total.sums.cost
    on_answers = f" (${kept:.4f} on the answers kept)" if abs(spent - kept) >= 5e-5 else ""
    left = st.budget_left_usd
    if st.budget_usd is None or left is None:
        return f"${spent:.4f}{on_answers} · no budget.usd"
    held = st.journal.open_usd
    holding = f" (${held:.4f} held by requests in flight)" if held else ""
    return f"${spent:.4f} of ${st.budget_usd:.4f}{on_answers} · left ${left:.4f}{holding}"
