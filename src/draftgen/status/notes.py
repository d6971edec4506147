"""The notes under the status tables: what was left out, lost, or is unknown, and why."""

from __future__ import annotations

from collections import Counter

from draftgen.budget.pricing import IMPLAUSIBLE_RATIO
from draftgen.status.model import RunStatus
from draftgen.store.journal import JournalTail
from draftgen.store.shards import RunPart


def run_notes(st: RunStatus, journal: JournalTail) -> list[str]:
    return [*_template_note(st), *_totals_note(st), *_folder_notes(st, journal),
            *_stop_note(st), *_rescue_note(st), *_unsettled_note(st), *_spend_notes(st)]


def _template_note(st: RunStatus) -> list[str]:
    """The last session's prompts differ from the model's own chat template (a warning)."""
    warning = st.template_check.warning if st.template_check is not None else None
    return [f"prompts: {warning}"] if warning else []


def _totals_note(st: RunStatus) -> list[str]:
    unknown = [n for n, d in st.datasets.items() if d.total is None]
    if not unknown:
        return []
    missing = _missing_shards([shard.part for shard in st.shards])
    if missing:
        why = f"no folder yet for shard {', '.join(missing)}: not started"
    elif st.shards:
        why = "no set of shard folders covering every shard records them"
    else:
        why = "run.json has no \"datasets\" totals: written by draftgen run at each session start"
    return [f"prompt totals unknown for {', '.join(unknown)} ({why}); pending not shown"]


def _folder_notes(st: RunStatus, journal: JournalTail) -> list[str]:
    notes = []
    for name, d in st.datasets.items():
        for file, n in d.torn_tail_bytes.items():
            notes.append(f"{name}/{file}: torn last line ({n} bytes without a newline): "
                         "left out; the next draftgen run cuts it")
        if d.old_schema:
            notes.append(f"{name}: {d.old_schema:,} answers from an older record schema "
                         "(no created_at, backend or token_check): counted, left out of rates")
        if d.duplicates:
            notes.append(f"{name}: {d.duplicates:,} duplicate answer lines (counted once)")
        if d.bad_lines:
            notes.append(f"{name}: {d.bad_lines:,} lines that are not records")
    if journal.torn_tail_bytes:
        notes.append(f"journal.jsonl: torn last line ({journal.torn_tail_bytes} bytes)")
    if not journal.complete:
        notes.append("journal: fewer open requests found than its counts say (lines that are "
                     "not JSON?): in flight may be undercounted")
    return notes


def _stop_note(st: RunStatus) -> list[str]:
    if st.journal.open and not st.live:
        usd = st.journal.open_usd
        billed = (f" (at most ${usd:,.4f} at their worst case, counted as spent when the run "
                  "resumes)" if usd else "")
        return [f"{len(st.journal.open):,} requests were in flight at the stop: sent, never "
                f"answered, possibly billed{billed}; the next run sends them again"]
    return []


def _rescue_note(st: RunStatus) -> list[str]:
    if st.rescue_error:
        return [f"a rescue file cannot be read: {st.rescue_error}"]
    if not st.rescued:
        return []
    return [f"{st.rescued:,} answers a session could not write to the run folder are kept in "
            f"{', '.join(st.rescue_files)}: paid for, not in the counts above; the next run "
            "adds them"]


def _unsettled_note(st: RunStatus) -> list[str]:
    if not st.unsettled_usd:
        return []
    return [f"earlier sessions' paid requests with no answer on disk (aborted, in flight at a "
            f"kill, or answers no disk would take): at most ${st.unsettled_usd:,.4f}, not in "
            "the $ above; counted as spent against budget.usd"]


def _spend_notes(st: RunStatus) -> list[str]:
    notes = []
    if st.total.cost_not_kept_usd:
        notes.append(f"${st.total.cost_not_kept_usd:,.4f} spent on quarantined answers and "
                     "billed failed requests: not in the $ above; counted as spent against "
                     "budget.usd")
    if st.cost_reports_refused:
        notes.append(f"{st.cost_reports_refused:,} answers or billed failures reported a cost "
                     "that is no cost (negative, not a number): counted at their worst case "
                     "(cost_source worst_case_report_refused)")
    if st.cost_reports_implausible:
        notes.append(f"{st.cost_reports_implausible:,} answers or billed failures reported a "
                     f"cost no request could have (over {IMPLAUSIBLE_RATIO:g}x its worst case): "
                     "counted at their worst case with the margin, the backend taken out of "
                     "its session (cost_source worst_case_report_implausible); check the "
                     "provider's bill")
    if st.changed_prompts:
        notes.append(f"{st.changed_prompts:,} answered prompts changed in their dataset since "
                     "they were answered (same ID, other content): counted as done; `draftgen "
                     "run --reask-changed` asks them again")
    if st.probe_usd:
        notes.append(f"${st.probe_usd:,.4f} spent by the probe's requests: not in the $ above; "
                     "counted as spent against budget.usd")
    return notes


def _missing_shards(parts: list[RunPart]) -> list[str]:
    """The shards ("I/N") of each shard count N seen that have no folder."""
    present: dict[int, set[int]] = {}
    for part in parts:
        if part.shard is not None:
            present.setdefault(part.shard.count, set()).add(part.shard.index)
    return [f"{i}/{n}" for n, have in sorted(present.items()) for i in range(n) if i not in have]


def sharded_notes(st: RunStatus, repeats: Counter[str]) -> list[str]:
    notes = [*_template_note(st), *_totals_note(st)]
    for shard in st.shards:
        where = f"shard {shard.part.label} ({shard.part.folder})"
        own = shard.status
        notes.extend(f"{where}: {n}" for n in [*_folder_notes(own, own.journal),
                                               *_stop_note(own), *_rescue_note(own)])
    notes.extend(f"{name}: {n:,} prompts answered in two shard folders (a re-sharded run): "
                 "counted once; export keeps the first" for name, n in repeats.items() if n)
    return [*notes, *_unsettled_note(st), *_spend_notes(st)]
