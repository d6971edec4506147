"""`draftgen report`: a self-contained page with every section, embedded PNGs, right numbers."""

from __future__ import annotations

import base64
import html
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.export.source import open_run
from draftgen.report import write_report
from draftgen.report.collect import Reservoir, Timeline, collect, plot_bin_s
from draftgen.report.page import SECTIONS
from draftgen.report.plots import spend_over_time
from draftgen.store.journal import read_journal
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import Tokenizer
from tests.e2e_helpers import (
    fast_backend,
    read_records,
    run_config,
    wait_for_lines,
    write_config,
    write_jsonl,
)
from tests.reliability.helpers import no_probe, prompt_rows, wait_until
from tests.test_export import write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_tok: Tokenizer) -> Path:
    root = write_run(tmp_path_factory.mktemp("run"), qwen3_tok, {"chat": 40, "code": 20})
    with (root / "code" / "responses.jsonl").open("ab") as f:
        f.write(b'{"id":"torn","dataset":"code","input_ids":[1,')
    return root


@dataclass
class Reported:
    run: Path
    before: dict[Path, bytes]
    """The run folder's files before the report."""
    out: Path
    page: str


@pytest.fixture(scope="module")
def reported(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Reported:
    """`draftgen report RUN` on a copy of the run, with the default --out."""
    run = tmp_path_factory.mktemp("copy") / "run"
    shutil.copytree(run_dir, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    out = run / "report"
    return Reported(run, before, out, (out / "index.html").read_text(encoding="utf-8"))


def _data_uris(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_every_section_is_present_with_an_embedded_png(reported: Reported) -> None:
    out, page = reported.out, reported.page
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for sid in ["summary", *(s for s, _, _ in SECTIONS)]:
        assert f'<section id="{sid}">' in page
    images = _data_uris(page)
    assert len(images) == len(SECTIONS)
    for data in images:
        assert data.startswith(PNG_MAGIC) and len(data) > 2000
    for _, _, fig in SECTIONS:
        on_disk = (out / f"{fig}.png").read_bytes()
        assert on_disk.startswith(PNG_MAGIC)
        assert on_disk in images
    # Self-contained: nothing to fetch.
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<script" not in page


def test_summary_tables_hold_the_run_numbers(run_dir: Path, reported: Reported) -> None:
    page = reported.page
    records = [orjson.loads(x) for d in ("chat", "code")
               for x in (run_dir / d / "responses.jsonl").read_bytes().splitlines()
               if x.endswith(b"}")]
    assert len(records) == 60
    cost = sum(r["usage"]["cost"] for r in records)
    assert f"${cost:,.4f}" in page
    assert '<table id="totals">' in page
    assert "<td>chat</td><td>40</td><td>4</td>" in page  # answers, failed
    assert "<td>code</td><td>20</td><td>2</td>" in page
    assert "B torn" in page  # the torn last line of code is reported
    assert '<table id="spend-table">' in page and "<td>openrouter</td>" in page
    assert '<table id="latency-table">' in page and "p99 (s)" in page
    assert '<table id="failures-table">' in page and "rate_limited" in page
    assert "answers / s" in page
    assert '<table id="sessions">' in page and "completed" in page
    assert "end-of-reasoning token" in page  # lengths split with the run's format


def test_default_out_is_run_report_and_nothing_else_changes(reported: Reported) -> None:
    assert reported.out == reported.run / "report"
    after = {p: p.read_bytes() for p in reported.run.rglob("*") if p.is_file()
             if "report" not in p.relative_to(reported.run).parts}
    assert after == reported.before


def test_a_run_without_answers_still_renders(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_bytes(orjson.dumps({"config": {}, "sessions": []}))
    result = write_report(tmp_path, tmp_path / "r")
    page = result.index.read_text()
    assert len(_data_uris(page)) == len(SECTIONS)
    assert "No failed requests" in page


def test_report_of_a_folder_that_is_no_run_fails(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a" in result.output and "run folder" in result.output


def test_reservoir_is_bounded_and_percentiles_are_nearest_rank() -> None:
    r = Reservoir(cap=100)
    for i in range(10_000):
        r.add(float(i))
    assert len(r.values) == 100 and r.seen == 10_000
    assert 2_000 < sum(r.values) / 100 < 8_000  # a sample of the whole stream
    small = Reservoir()
    for v in (5.0, 1.0, 3.0, 2.0, 4.0):
        small.add(v)
    assert (small.percentile(50), small.percentile(90), small.percentile(100)) == (3.0, 5.0, 5.0)
    assert Reservoir().percentile(50) is None


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
def test_page_renders_in_headless_chromium(reported: Reported, tmp_path: Path) -> None:
    image = pytest.importorskip("matplotlib.image")
    out = reported.out
    shot = tmp_path / "shot.png"
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,3000",
         f"--screenshot={shot}", (out / "index.html").as_uri()],
        check=True, capture_output=True, timeout=60,
    )
    pixels = image.imread(str(shot))[..., :3]
    background = pixels[0, 0]
    differs = (abs(pixels - background).sum(axis=-1) > 0.05).mean()
    assert pixels.std() > 0.02
    assert differs > 0.05  # text, tables and figures cover a good part of the page


def test_turns_all_datasets_get_turns_per_conversation_and_end_reasons(
        tmp_path: Path, qwen3_tok: Tokenizer) -> None:
    from draftgen.store.record import Record
    from tests.trajectory_runs import write_trajectory_run

    def edit(by: dict[str, list[Record]]) -> None:
        by["agent/loop"][2].end = "tool_call_differs"  # another reason, to be counted apart

    run = write_trajectory_run(tmp_path / "run", qwen3_tok, edit=edit,
                               single=[{"role": "user", "content": "Hi"}])
    page = write_report(run, tmp_path / "r").index.read_text()
    assert '<table id="trajectories">' in page
    # 4 conversations, 3 ended, 9 turns, 2.25 per conversation, at most 3
    assert ("<td>agent</td><td>4</td><td>3</td><td>9</td><td>2.25</td><td>3</td>"
            "<td>finish_length 1, last_turn 1, tool_call_differs 1</td>") in page
    assert "<td>plain</td><td>1</td>" in page.split('<table id="trajectories">')[0]
    assert "<td>plain</td>" not in page.split('<table id="trajectories">')[1].split(
        "</table>")[0]


def test_no_trajectory_table_without_turns_all(reported: Reported) -> None:
    assert '<table id="trajectories">' not in reported.page


def test_a_37_second_run_is_plotted_second_by_second(tmp_path: Path, qwen3_tok: Tokenizer
                                                     ) -> None:
    """The timeline's bins follow the run's length: answers written over 37 seconds are more
    than the one or two points that per-minute bins gave."""
    run = write_run(tmp_path, qwen3_tok, {"chat": 38})
    t0 = 1_750_000_000.0
    responses = run / "chat" / "responses.jsonl"
    lines = [orjson.loads(line) for line in responses.read_bytes().splitlines()]
    for i, record in enumerate(lines):
        record["created_at"] = t0 + i
    responses.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    for derived in run.glob("chat/index*"):
        derived.unlink()
    stats = collect(open_run(run))
    assert stats.span_s == 37
    figure = spend_over_time(stats)
    count_axes = figure.axes[1]
    points = {len(line.get_xdata()) for line in count_axes.get_lines()}
    assert len(count_axes.get_lines()) == 2, "one line per backend"
    assert min(points) > 2, f"points per backend line: {points}"
    total = sum(line.get_ydata()[-1] for line in count_axes.get_lines())
    assert total == 38, "the cumulative lines end at every answer"


def test_a_long_run_keeps_a_bounded_timeline_and_plots_about_120_points() -> None:
    timeline = Timeline(cap=1000)
    week = 7 * 24 * 3600
    for t in range(0, week, 7):
        timeline.add(1_750_000_000.0 + t, 0.5)
    assert len(timeline.bins) <= 1000
    bin_s = plot_bin_s(week, [timeline])
    series = timeline.series(bin_s)
    assert 60 <= len(series) <= 120
    assert sum(answers for _, answers, _ in series) == len(range(0, week, 7))


def _sessions_rows(page: str) -> list[list[str]]:
    table = page.split('<table id="sessions">')[1].split("</table>")[0]
    body = table.split("<tbody>")[1]
    return [re.findall(r"<td>(.*?)</td>", row) for row in body.split("</tr>") if "<td>" in row]


def _budget_note(page: str) -> str:
    found = re.search(r'<p class="note" id="budget-note">(.*?)</p>', page)
    return html.unescape(found.group(1)) if found else ""


@pytest.mark.slow
def test_a_killed_session_shows_what_it_wrote_and_the_budget_says_why_it_differs(
        tmp_path: Path, qwen3_dir: Path) -> None:
    """kill -9 with paid requests in flight: the report counts the session's answers and
    spend from the records it left and calls it killed; the budget's figure, which holds the
    requests in flight at their worst case, is explained; after a resume too."""
    run_dir = tmp_path / "run"
    responses, journal = run_dir / "d" / "responses.jsonl", run_dir / "journal.jsonl"
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(60))
    with TestServer(latency_s=0.3, reasoning_tokens=(5, 10), content_tokens=(5, 10)) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[fast_backend(
            "paid", "openai", server.url, concurrency=8,
            price={"prompt": 0.0, "completion": 1000.0})],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64},
            budget={"usd": 100.0}, fsync_interval_s=0)
        proc = subprocess.Popen([sys.executable, "-m", "draftgen", "run", str(cfg), "--no-live",
                                 *no_probe()], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            wait_for_lines(responses, 10)
            wait_until(lambda: server.stats["in_flight"] >= 4, 30, "requests in flight")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        records = read_records(run_dir, "d")
        answered = {r["id"] for r in records}
        spent = sum(r["cost_usd"] for r in records)
        in_flight = sum(r.usd for r in read_journal(journal).open if r.id not in answered)
        assert in_flight > 0

        page = write_report(run_dir, tmp_path / "r1").index.read_text()
        [killed] = _sessions_rows(page)
        assert killed[3:] == ["killed: ended without closing", str(len(records)), "0",
                              str(round(spent, 6))], killed
        assert killed[2].endswith("(its last write)")
        note = _budget_note(page)
        assert note.startswith(f"budget.usd counts ${spent + in_flight:,.4f} spent, not the "
                               f"answers' ${spent:,.4f}"), note
        assert f"${in_flight:,.4f} at most, by the requests in flight when the last session "\
               "was killed" in note, note

        outcome = run_config(cfg)
        assert outcome.status == "completed", outcome.message
    page = write_report(run_dir, tmp_path / "r2").index.read_text()
    first, second = _sessions_rows(page)
    assert first[3:5] == ["killed: ended without closing", str(len(records))], first
    assert second[3:5] == ["completed", str(60 - len(records))], second
    unsettled = orjson.loads((run_dir / "run.json").read_bytes())["sessions"][0][
        "unsettled_usd"]
    assert unsettled == pytest.approx(in_flight)
    assert f"${unsettled:,.4f} by earlier sessions' paid requests with no answer on disk" \
        in _budget_note(page)
