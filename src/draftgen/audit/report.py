"""What an audit found: counts per check (problem code), per dataset, per backend and per
provider/quantization, with example IDs; as JSON and as tables."""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgen.audit.checks import PROBLEMS
from draftgen.audit.conversation_checks import Finding, TrajectoryAudit, TurnSpan
from draftgen.audit.engine import BIT, ChunkResult

EXAMPLES = 5


@dataclass
class Failing:
    """The failing lines of one responses file: byte ranges and problem bit masks."""

    starts: array = field(default_factory=lambda: array("q"))
    ends: array = field(default_factory=lambda: array("q"))
    masks: array = field(default_factory=lambda: array("Q"))
    _at: dict[int, int] | None = field(default=None, repr=False, compare=False)
    """Entry per line start, built when `mark` is first called."""

    def __len__(self) -> int:
        return len(self.starts)

    def extend(self, r: ChunkResult) -> None:
        self.starts.extend(r.fail_starts)
        self.ends.extend(r.fail_ends)
        self.masks.extend(r.fail_masks)

    def merge(self, other: Failing) -> None:
        self.starts.extend(other.starts)
        self.ends.extend(other.ends)
        self.masks.extend(other.masks)

    def mark(self, start: int, end: int, mask: int) -> None:
        """Add problems to a line: to its entry where it already fails, else a new one."""
        if self._at is None or len(self._at) != len(self.starts):
            self._at = {s: i for i, s in enumerate(self.starts)}
        i = self._at.get(start)
        if i is not None:
            self.masks[i] |= mask
            return
        self._at[start] = len(self.starts)
        self.starts.append(start)
        self.ends.append(end)
        self.masks.append(mask)


@dataclass
class DatasetAudit:
    answers: int = 0
    problems: Counter[str] = field(default_factory=Counter)
    failing: Failing = field(default_factory=Failing)
    snapshot_size: int = 0
    """Bytes of responses.jsonl audited (the file's size when the audit started)."""
    torn_tail_bytes: int = 0
    folder: Path = Path()
    """The run folder holding the file (a shard's folder in a sharded run)."""
    name: str = ""
    """The dataset (the report's key is the file's place: shards/0-of-4/<dataset> in a shard)."""
    turns: list[TurnSpan] = field(default_factory=list)
    """A `turns: all` file's turns: where each one's line lies (`audit.conversation_checks`)."""

    def merge(self, other: DatasetAudit) -> None:
        """Count another file of the same dataset (another folder of a sharded run) in; the
        byte ranges of failing lines then no longer name one file: for counting only."""
        self.answers += other.answers
        self.problems.update(other.problems)
        self.failing.merge(other.failing)
        self.torn_tail_bytes += other.torn_tail_bytes


@dataclass
class AuditReport:
    root: Path
    live: bool
    tokenizer: str
    format: str
    notes: list[str] = field(default_factory=list)
    datasets: dict[str, DatasetAudit] = field(default_factory=dict)
    problems: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    groups: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    seconds: float = 0.0
    workers: int = 1
    trajectories: dict[str, TrajectoryAudit] = field(default_factory=dict)
    """Per `turns: all` dataset: its conversations as trajectories (`audit.conversation_checks`)."""
    unchecked: int = 0
    """Answers counted but not checked: their session's tokenizer or format cannot be had."""

    @property
    def answers(self) -> int:
        return sum(d.answers for d in self.datasets.values())

    @property
    def failing(self) -> int:
        """Lines with at least one problem."""
        return sum(len(d.failing) for d in self.datasets.values())

    @property
    def ok(self) -> bool:
        """Every answer checked, and none failing."""
        return self.failing == 0 and self.unchecked == 0

    @property
    def sharded(self) -> bool:
        return any(d.folder != self.root for d in self.datasets.values())

    def by_dataset(self) -> dict[str, DatasetAudit]:
        """The files of each dataset (one per folder of a sharded run) as one."""
        if not self.sharded:
            return self.datasets
        merged: dict[str, DatasetAudit] = {}
        for d in self.datasets.values():
            merged.setdefault(d.name, DatasetAudit(folder=self.root, name=d.name)).merge(d)
        return merged

    def by_folder(self) -> dict[Path, list[DatasetAudit]]:
        folders: dict[Path, list[DatasetAudit]] = {}
        for d in self.datasets.values():
            folders.setdefault(d.folder, []).append(d)
        return folders

    def add(self, r: ChunkResult) -> None:
        d = self.datasets[r.dataset]
        d.answers += r.records
        d.problems.update(r.problems)
        d.failing.extend(r)
        self.problems.update(r.problems)
        self.groups.update(r.groups)
        for code, ids in r.examples.items():
            shown = self.examples.setdefault(code, [])
            shown.extend(i for i in ids if i not in shown)
            del shown[EXAMPLES:]

    def add_finding(self, finding: Finding) -> None:
        """A trajectory finding on one line of a file."""
        d = self.datasets[finding.key]
        mask = 0
        for p in finding.problems:
            mask |= BIT[p]
            d.problems[p] += 1
            self.problems[p] += 1
            shown = self.examples.setdefault(p, [])
            if len(shown) < EXAMPLES and finding.rid not in shown:
                shown.append(finding.rid)
        d.failing.mark(finding.start, finding.end, mask)

    def _group_json(self, kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (k, name, problem), n in sorted(self.groups.items()):
            if k != kind:
                continue
            entry = out.setdefault(name, {"answers": 0, "problems": {}})
            if problem:
                entry["problems"][problem] = n
            else:
                entry["answers"] = n
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.root),
            "ok": self.ok,
            "live": self.live,
            "tokenizer": self.tokenizer,
            "format": self.format,
            "answers": self.answers,
            "failing": self.failing,
            "unchecked": self.unchecked,
            "checks": {code: {"failed": self.problems.get(code, 0),
                              "examples": self.examples.get(code, []),
                              "meaning": meaning}
                       for code, meaning in PROBLEMS.items()},
            "datasets": {name: _dataset_json(d) for name, d in self.by_dataset().items()},
            **({"files": {key: {"folder": str(d.folder), "dataset": d.name, **_dataset_json(d)}
                          for key, d in self.datasets.items()}} if self.sharded else {}),
            **({"trajectories": {name: t.as_json() for name, t in self.trajectories.items()}}
               if self.trajectories else {}),
            "by_backend": self._group_json("backend"),
            "by_provider": self._group_json("provider"),
            "seconds": round(self.seconds, 3),
            "answers_per_s": round(self.answers / self.seconds, 1) if self.seconds else None,
            "workers": self.workers,
            "notes": self.notes,
        }


def _dataset_json(d: DatasetAudit) -> dict[str, Any]:
    return {"answers": d.answers, "failing": len(d.failing),
            "problems": dict(d.problems.most_common()), "torn_tail_bytes": d.torn_tail_bytes}


def render_report(report: AuditReport, console: Any, *, all_checks: bool = False) -> None:
    """The summary line, then the checks some answer fails and where those answers came from
    (by backend, by provider); `all_checks` lists every check and group, failed or not."""
    from rich.table import Table

    from draftgen.printable import for_console

    verdict = _verdict(report)
    console.print(f"[bold]{report.root}[/] · {report.answers:,} answers audited against "
                  f"format {report.format} ({report.tokenizer}) in {report.seconds:.1f}s · "
                  f"{verdict}", highlight=False)
    shown = [code for code in PROBLEMS if all_checks or report.problems.get(code, 0)]
    if shown:
        console.print(_checks_table(report, shown))
    for kind, title in (("backend", "by backend"), ("provider", "by provider/quantization")):
        groups = report._group_json(kind)
        if not groups or not shown:
            continue
        t = Table(title=title, title_justify="left", header_style="bold")
        for col in ("", "answers", "failing checks"):
            t.add_column(col, justify="right" if col == "answers" else "left")
        for name, g in groups.items():
            fails = ", ".join(f"{p} {n:,}" for p, n in sorted(g["problems"].items())) or "-"
            t.add_row(for_console(name), f"{g['answers']:,}", fails)
        console.print(t)
    if report.trajectories:
        console.print(_trajectories_table(report))
    if report.sharded:
        console.print(_folders_table(report))
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def _checks_table(report: AuditReport, codes: list[str]) -> Any:
    """The answers of each dataset, and how many fail each of `codes`, with examples."""
    from rich.table import Table

    datasets = report.by_dataset()
    names = list(datasets)
    table = Table(header_style="bold")
    table.add_column("check")
    for name in names:
        table.add_column(name, justify="right")
    if len(names) > 1:
        table.add_column("total", justify="right")
    table.add_column("examples")
    table.add_row("answers", *[f"{datasets[n].answers:,}" for n in names],
                  *([f"{report.answers:,}"] if len(names) > 1 else []), "", style="dim")
    for code in codes:
        total = report.problems.get(code, 0)
        per = [f"{datasets[n].problems.get(code, 0):,}" for n in names]
        table.add_row(code, *per, *([f"{total:,}"] if len(names) > 1 else []),
                      ", ".join(report.examples.get(code, [])), style="red" if total else None)
    return table


def _verdict(report: AuditReport) -> str:
    """"all answers pass" only where every answer was checked."""
    unchecked = (f"[bold yellow]{report.unchecked:,} answer(s) not checked[/]"
                 if report.unchecked else "")
    if report.failing:
        return " · ".join(filter(None, [f"[bold red]{report.failing:,} failing line(s)[/]",
                                        unchecked]))
    if unchecked:
        checked = report.answers - report.unchecked
        return f"{unchecked} · the {checked:,} checked pass"
    return "[bold green]all answers pass[/]"


def _folders_table(report: AuditReport) -> Any:
    from rich.table import Table

    t = Table(title="by folder", title_justify="left", header_style="bold")
    for col in ("folder", "answers", "failing"):
        t.add_column(col, justify="left" if col == "folder" else "right")
    for folder, files in report.by_folder().items():
        place = folder.relative_to(report.root) if folder.is_relative_to(report.root) else folder
        t.add_row(str(place), f"{sum(d.answers for d in files):,}",
                  f"{sum(len(d.failing) for d in files):,}")
    return t


def _trajectories_table(report: AuditReport) -> Any:
    from rich.table import Table

    t = Table(title="trajectories (turns: all)", title_justify="left", header_style="bold")
    for col in ("dataset", "conversations", "turns", "one sequence", "branched", "sequences",
                "ended"):
        t.add_column(col, justify="left" if col in ("dataset", "ended") else "right")
    for name, a in report.trajectories.items():
        ends = ", ".join(f"{k or 'none'} {n:,}" for k, n in a.ends.most_common())
        t.add_row(name, f"{a.conversations:,}", f"{a.turns:,}",
                  f"{a.layouts.get('sequence', 0):,}", f"{a.layouts.get('branches', 0):,}",
                  f"{a.sequences:,}", ends or "-")
    return t
