"""11. What a run was made from stays true: a resume accepted after the tokenizer file changed
in place, and a dataset row edited under a known ID between sessions.

Each session's answers are audited and exported with that session's tokenizer (the run folder
keeps a copy of it), an export that would decode two sessions' IDs with one tokenizer refuses,
and an audit that could not check some answers never says "all answers pass". A resume counts
the answered prompts whose row changed under the same ID, records the count, and re-asks them
with `--reask-changed` (the old answers go to quarantine.jsonl, never deleted)."""

from __future__ import annotations

import asyncio
import io
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from draftgen.audit import audit_run, render_report
from draftgen.config import load_config
from draftgen.export.options import ExportFormat, ExportOptions
from draftgen.export.pipeline import export_run
from draftgen.export.source import SourceError
from draftgen.run import Runner, prepare
from draftgen.run.state import Outcome
from draftgen.status import collect_status
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import Tokenizer, load_tokenizer
from tests.e2e_helpers import fast_backend, read_records, write_config
from tests.reliability.helpers import prompt_rows, write_jsonl

SCENARIO = "11. What a run was made from"
ANSWERS = 12
SWAPPED = ("Ġsay", "Ġsomething")
"""Two words of every prompt (`prompt_rows`) whose IDs the changed tokenizer swaps."""


@dataclass
class Fixture:
    server: TestServer
    root: Path
    tokenizer: Path
    """The run's tokenizer.json (a copy of Qwen3's), which a test may change in place."""
    original: Tokenizer
    rows: list[dict[str, Any]]

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    def run(self, rows: list[dict[str, Any]] | None = None, **runner: Any) -> Outcome:
        """One session of the run over `rows` (default: the fixture's)."""
        data = write_jsonl(self.root / "d.jsonl", rows if rows is not None else self.rows)
        path = write_config(self.root, self.tokenizer.parent, backends=[
            fast_backend("local", "sglang", self.server.url, concurrency=8)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 32})
        plan = prepare(load_config(path))
        return asyncio.run(Runner(plan, live_display=False, **runner).execute())

    def sessions(self) -> list[dict[str, Any]]:
        return orjson.loads((self.run_dir / "run.json").read_bytes())["sessions"]


@pytest.fixture
def answered(tmp_path: Path, qwen3_dir: Path) -> Iterator[Fixture]:
    """ANSWERS prompts answered in one session, with the tokenizer at ROOT/tok/."""
    tok = tmp_path / "tok"
    shutil.copytree(qwen3_dir, tok)
    with TestServer(latency_s=0.0, reasoning_tokens=(3, 8), content_tokens=(3, 8)) as server:
        fx = Fixture(server, tmp_path, tok / "tokenizer.json", load_tokenizer(qwen3_dir),
                     prompt_rows(ANSWERS))
        assert fx.run().status == "completed"
        yield fx


def swap_words_in_place(tokenizer_json: Path) -> None:
    """Swap the IDs of two words in the file itself (its path and name unchanged)."""
    data = orjson.loads(tokenizer_json.read_bytes())
    vocab = data["model"]["vocab"]
    a, b = SWAPPED
    vocab[a], vocab[b] = vocab[b], vocab[a]
    tokenizer_json.write_bytes(orjson.dumps(data))


def audit_headline(run_dir: Path) -> tuple[Any, str]:
    report = audit_run(run_dir, workers=1)
    out = io.StringIO()
    render_report(report, Console(file=out, width=400, color_system=None))
    return report, " ".join(out.getvalue().split())


def export_texts(run_dir: Path, out: Path) -> tuple[Any, dict[str, str]]:
    summary = export_run(run_dir, ExportOptions(ExportFormat.specforge, out, shuffle=False))
    text = out / "text.jsonl"
    rows = [orjson.loads(x) for x in text.read_bytes().splitlines()] if text.exists() else []
    return summary, {r["id"]: r["text"] for r in rows}


def wrong_texts(fx: Fixture, texts: dict[str, str]) -> int:
    """text.jsonl rows whose text is not the row's IDs (prompt and answer) decoded by the
    tokenizer that made them."""
    truth = {r["id"]: fx.original.decode(r["input_ids"] + r["output_ids"])
             for r in read_records(fx.run_dir, "d")}
    return sum(1 for rid, text in texts.items() if truth[rid] != text)


def test_tokenizer_changed_in_place_and_accepted_each_session_keeps_its_own(
        answered: Fixture, tmp_path: Path, reliability) -> None:
    case = reliability(SCENARIO, "tokenizer file changed in place (two words' IDs swapped), "
                       "resume with --accept-changed-settings: audit checks the first session's "
                       "answers with its own tokenizer (kept in the run folder), export decodes "
                       "them with it")
    fx = answered
    swap_words_in_place(fx.tokenizer)
    outcome = fx.run(accept_changed_settings=True)
    case.runs += 2
    assert outcome.status == "completed"
    assert [s["settings"]["tokenizer.sha256"] == fx.original.sha256
            for s in fx.sessions()] == [True, False]
    assert "changed_prompts" not in fx.sessions()[1], "no row changed"
    report, said = audit_headline(fx.run_dir)
    case.note(f"audit: `{said[said.find(' · ') + 3:][:160]}`")
    assert "not checked" not in said and "all answers pass" in said, said
    assert report.ok and report.as_json()["unchecked"] == 0
    summary, texts = export_texts(fx.run_dir, tmp_path / "export")
    wrong = wrong_texts(fx, texts)
    case.corrupt += wrong
    case.note(f"export: {len(texts)} text rows, {wrong} decoded with the wrong tokenizer")
    assert texts and len(texts) == summary.written() and wrong == 0


def test_an_audit_that_cannot_check_some_answers_never_says_all_pass(
        answered: Fixture, reliability) -> None:
    case = reliability(SCENARIO, "tokenizer changed in place and no copy of the old one kept "
                       "(a run folder from before copies were kept): the audit headline names "
                       "the answers not checked instead of \"all answers pass\", exit status 1")
    fx = answered
    swap_words_in_place(fx.tokenizer)
    assert fx.run(accept_changed_settings=True).status == "completed"
    shutil.rmtree(fx.run_dir / ".tokenizers", ignore_errors=True)
    report, said = audit_headline(fx.run_dir)
    case.runs += 2
    case.note(f"headline: `{said[said.find(' · ') + 3:][:120]}`")
    assert f"{ANSWERS} answer(s) not checked" in said
    assert "all answers pass" not in said, said
    assert not report.ok and report.as_json()["unchecked"] == ANSWERS


def test_an_export_never_decodes_a_session_with_another_sessions_tokenizer(
        answered: Fixture, tmp_path: Path, reliability) -> None:
    case = reliability(SCENARIO, "tokenizer changed in place, no copy kept, then new prompts "
                       "answered with the new file: export refuses to decode both sessions' IDs "
                       "with one tokenizer; with only the old session's answers and no copy, the "
                       "text is left out rather than decoded wrong")
    fx = answered
    swap_words_in_place(fx.tokenizer)
    shutil.rmtree(fx.run_dir / ".tokenizers", ignore_errors=True)
    assert fx.run(accept_changed_settings=True).status == "completed"
    shutil.rmtree(fx.run_dir / ".tokenizers", ignore_errors=True)
    summary, texts = export_texts(fx.run_dir, tmp_path / "only-old")
    case.runs += 2
    case.corrupt += wrong_texts(fx, texts)
    case.note(f"old session only, no copy: {len(texts)} text rows written")
    assert texts == {} and any("text.jsonl and round_trip.jsonl left out" in n
                               for n in summary.notes), summary.notes
    new = fx.run([*fx.rows, *prompt_rows(3, "n")], accept_changed_settings=True)
    assert new.status == "completed"
    with pytest.raises(SourceError, match="different tokenizers") as refused:
        export_texts(fx.run_dir, tmp_path / "mixed")
    case.note(f"both sessions: export refused: `{str(refused.value)[:160]}`")
    assert not (tmp_path / "mixed").exists()


def edited(rows: list[dict[str, Any]], ids: set[str]) -> list[dict[str, Any]]:
    """The rows, those of `ids` with new text under the same ID."""
    return [{**r, "messages": [{"role": "user", "content": f"Edited: {r['id']} asks anew."}]}
            if r["id"] in ids else r for r in rows]


def test_a_row_edited_under_its_id_is_noticed_and_asked_again_on_request(
        answered: Fixture, reliability, caplog: pytest.LogCaptureFixture) -> None:
    case = reliability(SCENARIO, "two answered rows edited between sessions (same id, new "
                       "text): the resume says how many and records it in run.json; "
                       "--reask-changed asks them again, the old answers kept in "
                       "quarantine.jsonl")
    fx = answered
    changed = {"p3", "p5"}
    rows = edited(fx.rows, changed)
    assert fx.run(rows).status == "completed"
    said = " ".join(r.getMessage() for r in caplog.records)
    case.runs += 2
    case.note(f"resume: `{said[said.find('d: 2'):][:140]}`")
    assert "d: 2 answered prompts changed" in said and "--reask-changed" in said, said
    assert fx.sessions()[1]["changed_prompts"] == {"d": 2}
    assert collect_status(fx.run_dir).changed_prompts == 2
    before = read_records(fx.run_dir, "d")
    assert len(before) == ANSWERS, "nothing asked again without --reask-changed"

    assert fx.run(rows, reask_changed=True).status == "completed"
    case.runs += 1
    after = {r["id"]: r for r in read_records(fx.run_dir, "d")}
    quarantined = [orjson.loads(x) for x in
                   (fx.run_dir / "d" / "quarantine.jsonl").read_bytes().splitlines()]
    case.lost += ANSWERS - len(after) + len(changed) - len(quarantined)
    case.note(f"--reask-changed: {len(quarantined)} old answers in quarantine.jsonl, "
              f"{len(after)}/{ANSWERS} answered")
    assert len(after) == ANSWERS and all(r["session"] == 2 for i, r in after.items()
                                         if i.removeprefix("d/") in changed)
    assert {f"d/{i}" for i in changed} == {q["id"] for q in quarantined}
    assert all(q["quarantine"]["problems"] == ["prompt_changed"] for q in quarantined)
    for rid in changed:
        assert after[f"d/{rid}"]["messages"][0]["content"].startswith("Edited:")
    assert fx.sessions()[2]["changed_prompts"] == {"d": 2}

    assert fx.run(rows).status == "completed"
    assert "changed_prompts" not in fx.sessions()[3], "every answer is of its row now"
