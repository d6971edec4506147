"""Auditing answers in batches: the checks that need the run's tokenizer and format (prompt
rendering in one `encode_batch` call per batch, decoding, parsing the decoded answer), on top
of the token checks of `audit.checks`; and one byte range of a responses file at a time, for
the process pool of `audit.run`.
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from draftgen.audit.checks import (
    CUT_OFF,
    FINISHED,
    PROBLEMS,
    Checked,
    LooseRecord,
    Routing,
    TokenSpec,
    claim_problems,
    end_think_problems,
    has_text,
    missing_fields,
    record_routing_problems,
    spec_for,
    token_problems,
)
from draftgen.formats import Format, FormatError, get_format
from draftgen.formats.agreement import no_space, text_problems
from draftgen.formats.base import ParsedAnswer
from draftgen.store.prompt_refs import LineReader
from draftgen.store.record import Damaged
from draftgen.tokenize import Tokenizer, load_tokenizer
from draftgen.types import Prompt

CODES = list(PROBLEMS)
_BAD_INPUT = (FormatError, ValueError, TypeError, KeyError, AttributeError, OverflowError)
"""What rendering, decoding or parsing a malformed record can raise: that record fails its
check, the audit goes on."""
BIT = {code: 1 << i for i, code in enumerate(CODES)}


def problems_of(mask: int) -> list[str]:
    return [code for code in CODES if mask & BIT[code]]


# ---- the run's model format -------------------------------------------------------------------


@dataclass(frozen=True)
class FormatSpec:
    """What a worker needs to rebuild the run's tokenizer and format (picklable)."""

    tokenizer: str
    format: str
    options: dict[str, Any]
    routing: dict[str, dict[str, Any]]

    def load(self) -> Auditor:
        tok = load_tokenizer(self.tokenizer)
        return Auditor(tok, get_format(self.format, tok, self.options), self.format,
                       self.options, Routing(dict(self.routing)))


UNJUDGED = "-"
"""The judge key of a session whose settings cannot be had (its tokenizer file changed since):
its answers are counted, not checked."""


@dataclass(frozen=True)
class SessionSpecs:
    """What a run's answers are judged by: the run's format (`main`, key "") and, for sessions
    that resumed with other settings (`run --accept-changed-settings`), theirs, by key."""

    main: FormatSpec
    others: dict[str, FormatSpec] = field(default_factory=dict)

    def load(self) -> Judges:
        return Judges(self, self.main.load())


class Judges:
    """One Auditor per spec of a `SessionSpecs`, each loaded when first needed."""

    def __init__(self, specs: SessionSpecs, main: Auditor) -> None:
        self.specs = specs
        self.main = main
        self._loaded: dict[str, Auditor] = {"": main}

    def auditor(self, key: str) -> Auditor:
        if key not in self._loaded:
            self._loaded[key] = self.specs.others[key].load()
        return self._loaded[key]

    def add(self, key: str, spec: FormatSpec, auditor: Auditor) -> None:
        """Another session's spec, with its Auditor already loaded (by the main process)."""
        self.specs.others[key] = spec
        self._loaded[key] = auditor


class Auditor:
    """Checks batches of records against one model format."""

    def __init__(self, tokenizer: Tokenizer, fmt: Format, format_name: str,
                 options: Mapping[str, Any], routing: Routing) -> None:
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.spec: TokenSpec = spec_for(fmt)
        self.routing = routing
        self._format_name = format_name
        self._options = dict(options)
        self._dated: dict[str, Format] = {}
        self.date_sensitive = ("current_date" in fmt.option_types
                               and "current_date" not in self._options)
        """The prompt holds the date it was rendered on (gpt-oss): render each prompt with the
        day its answer was written, or the day before."""

    def check(self, records: Sequence[Checked]) -> list[list[str]]:
        """The problems of each record (empty list: it passes every check)."""
        out = [self._static(r) for r in records]
        self._input_ids(records, out)
        for record, problems in zip(records, out, strict=True):
            problems.extend(self._decoded(record))
        return out

    # ---- checks without the tokenizer ----

    def _static(self, record: Checked) -> list[str]:
        problems = ["missing_fields"] if missing_fields(record) else []
        if isinstance(record.output_ids, list):
            problems.extend(token_problems(record, self.spec))
        problems.extend(claim_problems(record))
        problems.extend(record_routing_problems(record, self.routing.of(record.backend)))
        return problems

    # ---- input_ids ----

    def _format_on(self, day: str) -> Format:
        fmt = self._dated.get(day)
        if fmt is None:
            fmt = get_format(self._format_name, self.tokenizer,
                             {**self._options, "current_date": day})
            self._dated[day] = fmt
        return fmt

    def _render(self, fmt: Format, prompts: list[Prompt]) -> list[list[int] | None]:
        """`fmt.render_prompts` (one encode_batch call); None for a prompt the format
        refuses."""
        try:
            return list(fmt.render_prompts(prompts))
        except _BAD_INPUT:
            pass
        out: list[list[int] | None] = []
        for p in prompts:
            try:
                out.append(fmt.render_prompt(p.messages, p.tools))
            except _BAD_INPUT:
                out.append(None)
        return out

    def _input_ids(self, records: Sequence[Checked], out: list[list[str]]) -> None:
        todo = [i for i, r in enumerate(records)
                if isinstance(r.messages, list) and isinstance(r.input_ids, list)]
        prompts = [Prompt(str(records[i].id), str(records[i].dataset), records[i].messages,
                          records[i].tools or None) for i in todo]
        if not self.date_sensitive:
            rendered = self._render(self.fmt, prompts)
            for i, ids in zip(todo, rendered, strict=True):
                if ids != records[i].input_ids:
                    out[i].append("input_ids_not_native")
            return
        for i, prompt in zip(todo, prompts, strict=True):
            if not any(self._render(self._format_on(day), [prompt])[0] == records[i].input_ids
                       for day in _days(records[i].created_at)):
                out[i].append("input_ids_not_native")

    # ---- decoded output ----

    def _decoded(self, record: Checked) -> list[str]:
        ids = record.output_ids
        if not isinstance(ids, list) or not ids:
            return []
        try:
            parsed = self.fmt.parse_answer_text(self.tokenizer.text_of(ids))
            stored = self._stored(record)
        except _BAD_INPUT:
            return ["content_mismatch"]
        finish = record.finish_reason
        problems = end_think_problems(
            ids, self.spec, finished=finish in FINISHED,
            has_reasoning=bool(no_space(parsed.reasoning)
                               or no_space(stored.reasoning)),
            tool_section_ends_reasoning=bool(parsed.tool_calls) and parsed.reasoning is not None)
        if has_text(record):
            problems.extend(text_problems(parsed, stored, record.flags or [], finish in CUT_OFF))
        return problems

    def _stored(self, record: Checked) -> ParsedAnswer:
        """The stored fields; raw think text left in the content is split as the runner did."""
        reasoning, content = record.reasoning, record.content
        flags = record.flags or []
        if reasoning is None and content and "reasoning_in_content" in flags:
            split = self.fmt.parse_answer_text(content)
            reasoning, content = split.reasoning, split.content
        return ParsedAnswer(reasoning, content, record.tool_calls, True)


def _days(created_at: Any) -> list[str]:
    if not isinstance(created_at, int | float):
        return [datetime.now().strftime("%Y-%m-%d")]
    day = datetime.fromtimestamp(created_at)
    return [d.strftime("%Y-%m-%d") for d in (day, day - timedelta(days=1))]


# ---- one byte range of a file -----------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    dataset: str
    path: str
    start: int
    stop: int
    duplicates: frozenset[int] = frozenset()
    """End offsets of the lines in this range whose ID was answered earlier."""
    judges: tuple[str, ...] = ()
    """Per session of the file's run folder (run.json), the key of the spec its answers are
    judged by (`SessionSpecs`); empty: all by the run's."""

    def judge_of(self, record: Checked) -> str:
        """A record's judge: its session's; for one naming no session (written before records
        named theirs), the first session's."""
        session = record.session
        if isinstance(session, int) and 0 <= session < len(self.judges):
            return self.judges[session]
        return self.judges[0] if self.judges else ""


@dataclass
class ChunkResult:
    dataset: str
    records: int = 0
    problems: Counter[str] = field(default_factory=Counter)
    groups: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(kind "backend"/"provider", name, problem or "" for the answers counted)."""
    examples: dict[str, list[str]] = field(default_factory=dict)
    fail_starts: array = field(default_factory=lambda: array("q"))
    fail_ends: array = field(default_factory=lambda: array("q"))
    fail_masks: array = field(default_factory=lambda: array("Q"))
    unjudged: int = 0
    """Answers of sessions whose settings cannot be had (UNJUDGED): counted, not checked."""


def chunk_lines(chunk: Chunk) -> list[tuple[int, int, bytes]]:
    with open(chunk.path, "rb") as f:
        f.seek(chunk.start)
        raw = f.read(chunk.stop - chunk.start)
    out = []
    pos = 0
    while pos < len(raw):
        nl = raw.find(b"\n", pos)
        if nl < 0:
            break
        out.append((chunk.start + pos, chunk.start + nl + 1, raw[pos:nl]))
        pos = nl + 1
    return out


def record_of(reader: LineReader, line: bytes, start: int) -> Checked | None:
    """The record of the line starting at byte `start` of the reader's file; what there is of
    a damaged one with a string id; None for a line that is not a record."""
    record = reader.read(line, start)
    if isinstance(record, Damaged):
        return LooseRecord(record.fields) if isinstance(record.id, str) else None
    return record


def audit_chunk(judges: Judges, chunk: Chunk, examples: int = 5) -> ChunkResult:
    result = ChunkResult(chunk.dataset)
    lines = chunk_lines(chunk)
    with LineReader(Path(chunk.path)) as reader:
        parsed = [(s, e, record_of(reader, line, s)) for s, e, line in lines if line.strip()]
    records = [r for _, _, r in parsed if r is not None]
    checked = iter(_check_by_session(judges, chunk, records, result))
    for start, end, record in parsed:
        problems = next(checked) if record is not None else ["not_a_record"]
        if record is not None:
            result.records += 1
            if end in chunk.duplicates:
                problems.append("duplicate_id")
            _count_groups(result, record, problems)
        rid = record.id if record is not None else f"{chunk.dataset}@{start}"
        if problems:
            _note_failure(result, start, end, str(rid), problems, examples)
    return result


def _check_by_session(judges: Judges, chunk: Chunk, records: list[Checked],
                      result: ChunkResult) -> list[list[str]]:
    """Each record's problems, judged by its session's settings."""
    keys = [chunk.judge_of(r) for r in records]
    out: list[list[str]] = [[] for _ in records]
    for key in dict.fromkeys(keys):
        mine = [i for i, k in enumerate(keys) if k == key]
        if key == UNJUDGED:
            result.unjudged += len(mine)
            continue
        found = judges.auditor(key).check([records[i] for i in mine])
        for i, problems in zip(mine, found, strict=True):
            out[i] = problems
    return out


def _count_groups(result: ChunkResult, record: Checked, problems: list[str]) -> None:
    provider = record.provider or "-"
    if record.quantization:
        provider = f"{provider}/{record.quantization}"
    for kind, name in (("backend", str(record.backend or "-")), ("provider", provider)):
        result.groups[(kind, name, "")] += 1
        for p in set(problems):
            result.groups[(kind, name, p)] += 1


def _note_failure(result: ChunkResult, start: int, end: int, rid: str, problems: list[str],
                  examples: int) -> None:
    mask = 0
    for p in problems:
        mask |= BIT[p]
        result.problems[p] += 1
        shown = result.examples.setdefault(p, [])
        if len(shown) < examples and rid not in shown:
            shown.append(rid)
    result.fail_starts.append(start)
    result.fail_ends.append(end)
    result.fail_masks.append(mask)


# ---- worker processes ---------------------------------------------------------------------

_WORKER: Judges | None = None


def init_worker(spec: SessionSpecs) -> None:
    global _WORKER
    # One process per core already: the tokenizer's own threads would only contend.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = spec.load()


def run_chunk(chunk: Chunk) -> ChunkResult:
    assert _WORKER is not None, "init_worker was not called"
    return audit_chunk(_WORKER, chunk)
