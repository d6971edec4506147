"""7. Data loss by careless commands: an export or report pointed at a run folder, a resume
with changed settings. Nothing a run wrote is deleted, overwritten or judged by the wrong
settings."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from draftgen.audit.run import audit_run
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend
from tests.reliability.helpers import (
    Base,
    all_bytes,
    completed_run,
    draftgen,
    merge_config,
    no_probe,
    prompt_rows,
    write_jsonl,
)

pytestmark = pytest.mark.slow  # `draftgen` subprocesses

SCENARIO = "7. Data loss"
ANSWERS = 12


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Iterator[Base]:
    """A run folder holding ANSWERS answers."""
    with completed_run(tmp_path_factory.mktemp("dataloss"), qwen3_dir, prompt_rows(ANSWERS, "g"),
                       latency_s=0.0, tokens=(3, 10), max_tokens=48) as base:
        yield base


def _copy_run(base: Base, dest: Path) -> Path:
    shutil.copytree(base.run_dir, dest)
    return dest


def _export(run_dir: Path, out: Path, *extra: str) -> Any:
    return draftgen("export", str(run_dir), "--format", "specforge", "--out", str(out), *extra)


def _snapshot(*folders: Path) -> dict[Path, bytes]:
    return dict(all_bytes(*folders))


def _refused_intact(case: Any, proc: Any, before: dict[Path, bytes], *folders: Path,
                    code: int = 1) -> None:
    """`code`: export's exit status for a refusal (1), report's (2: a user error)."""
    after = _snapshot(*folders)
    case.runs += 1
    case.lost += sum(1 for p in before if p not in after or after[p] != before[p])
    case.crashed += "Traceback" in proc.stderr
    said = " ".join(proc.stderr.split())
    case.note(f"exit {proc.returncode}: `{said[:220]}`")
    assert proc.returncode == code, proc.stderr
    assert after == before, "the run's files changed"
    assert "Traceback" not in proc.stderr


# ---- export and report never delete or write in a run folder ----------------------------------


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "plain"])
def test_export_onto_its_own_run_folder_is_refused(base: Base, tmp_path: Path, reliability,
                                                    overwrite: bool) -> None:
    how = " --overwrite" if overwrite else ""
    case = reliability(SCENARIO, f"export RUN --out RUN{how}: refused, the run folder "
                       "untouched")
    run_dir = _copy_run(base, tmp_path / "run")
    before = _snapshot(tmp_path)
    proc = _export(run_dir, run_dir, *(["--overwrite"] if overwrite else []))
    _refused_intact(case, proc, before, tmp_path)
    assert "is the run folder" in proc.stderr


def test_export_onto_a_parent_of_run_folders_is_refused(base: Base, tmp_path: Path,
                                                        reliability) -> None:
    case = reliability(SCENARIO, "export RUN --out runs --overwrite (runs/ holds run folders): "
                       "refused, every run folder untouched")
    runs = tmp_path / "runs"
    run_dir = _copy_run(base, runs / "a")
    _copy_run(base, runs / "b")
    before = _snapshot(runs)
    proc = _export(run_dir, runs, "--overwrite")
    _refused_intact(case, proc, before, runs)
    assert "not a draftgen export" in proc.stderr


def test_export_into_a_run_folder_is_refused(base: Base, tmp_path: Path, reliability) -> None:
    case = reliability(SCENARIO, "export RUN --out RUN/exports/x (a new folder inside the run): "
                       "refused, nothing written in the run folder")
    run_dir = _copy_run(base, tmp_path / "run")
    before = _snapshot(run_dir)
    proc = _export(run_dir, run_dir / "exports" / "x")
    _refused_intact(case, proc, before, run_dir)
    assert "is inside the run folder" in proc.stderr


@pytest.mark.parametrize("target", ["shards/0-of-2", "shards"])
def test_export_onto_a_shard_folder_is_refused(base: Base, tmp_path: Path, reliability,
                                               target: str) -> None:
    case = reliability(SCENARIO, f"export RUN --out RUN/{target} --overwrite on a sharded run: "
                       "refused, the shard folders untouched")
    root = tmp_path / "sharded"
    _copy_run(base, root / "shards" / "0-of-2")
    (root / "shards" / "1-of-2").mkdir()
    before = _snapshot(root)
    proc = _export(root, root / target, "--overwrite")
    _refused_intact(case, proc, before, root)
    assert "run folder" in proc.stderr


def test_overwrite_replaces_a_draftgen_export(base: Base, tmp_path: Path, reliability) -> None:
    case = reliability(SCENARIO, "export --overwrite onto an earlier draftgen export: replaced")
    out = tmp_path / "export"
    first = _export(base.run_dir, out)
    assert first.returncode == 0, first.stderr
    (out / "train.stale").write_text("from the first export")
    again = _export(base.run_dir, out, "--overwrite")
    case.runs += 1
    case.crashed += "Traceback" in again.stderr
    case.note(f"exit {again.returncode}; the earlier export replaced")
    assert again.returncode == 0, again.stderr
    assert (out / "draftgen_export.json").is_file() and not (out / "train.stale").exists()


def test_overwrite_of_a_folder_draftgen_did_not_export_is_refused(base: Base, tmp_path: Path,
                                                                  reliability) -> None:
    case = reliability(SCENARIO, "export --overwrite onto a folder draftgen did not export: "
                       "refused, the user's files kept")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my own notes")
    before = _snapshot(out)
    proc = _export(base.run_dir, out, "--overwrite")
    _refused_intact(case, proc, before, out)
    assert "not a draftgen export" in proc.stderr


def test_report_onto_a_run_folder_is_refused(base: Base, tmp_path: Path, reliability) -> None:
    case = reliability(SCENARIO, "report RUN --out RUN: refused, nothing written among the "
                       "run's files")
    run_dir = _copy_run(base, tmp_path / "run")
    (run_dir / "index.html").write_text("the user's page")
    before = _snapshot(run_dir)
    proc = draftgen("report", str(run_dir), "--out", str(run_dir))
    _refused_intact(case, proc, before, run_dir, code=2)


# ---- a resume with changed settings -------------------------------------------------------------


def _resume(base: Base, run_dir: Path, cfg: dict[str, Any], *args: str, new: int = 3,
            tag: str = "n") -> Any:
    """`draftgen run` on `run_dir` (a copy of the base run) with the base config changed by
    `cfg` and `new` prompts more to answer (IDs tag0, tag1...)."""
    data = write_jsonl(run_dir.parent / "d.jsonl",
                       prompt_rows(ANSWERS, "g") + prompt_rows(new, tag))
    config = merge_config({**base.cfg, "output_dir": str(run_dir),
                     "datasets": [{"name": "d", "path": str(data)}]}, cfg)
    path = run_dir.parent / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return draftgen("run", str(path), "--no-live", *no_probe(), *args)


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in (run_dir / "d" / "responses.jsonl").read_bytes().splitlines()]


def _sent(server: TestServer) -> int:
    return sum(server.stats["requests"].values())


CHANGES = [
    ("model.name", {"model": {"name": "test/another-model"}}),
    ("model.format", {"model": {"format": "qwen3-thinking"}}),
    ("sampling.temperature", {"sampling": {"temperature": 0.0}}),
    ("sampling.max_tokens", {"sampling": {"max_tokens": 96}}),
    ("sampling.extra.min_p", {"sampling": {"extra": {"min_p": 0.05}}}),
]


@pytest.mark.parametrize("key,cfg", CHANGES, ids=[k for k, _ in CHANGES])
def test_resume_with_a_data_setting_changed_is_refused(base: Base, tmp_path: Path, reliability,
                                                       key: str, cfg: dict[str, Any]) -> None:
    case = reliability(SCENARIO, f"resume with {key} changed: exit 2 naming it (old → new) "
                       "and --accept-changed-settings; nothing sent, run.json kept")
    run_dir = _copy_run(base, tmp_path / "run")
    before = _snapshot(run_dir)
    sent = _sent(base.server)
    proc = _resume(base, run_dir, cfg)
    _refused_settings(case, proc, before, run_dir, key)
    assert _sent(base.server) == sent


def _refused_settings(case: Any, proc: Any, before: dict[Path, bytes], run_dir: Path,
                      key: str) -> None:
    after = _snapshot(run_dir)
    said = " ".join(proc.stderr.split())
    case.runs += 1
    case.lost += sum(1 for p in before if after.get(p) != before[p])
    case.crashed += "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2)
    case.note(f"exit {proc.returncode}: `{said[:260]}`")
    assert proc.returncode == 2, proc.stderr
    assert f"{key}: " in said and "→" in said and "--accept-changed-settings" in said, said
    assert after == before, "the run folder changed"
    assert "Traceback" not in proc.stderr


def test_resume_with_another_tokenizer_file_at_the_same_path_is_refused(
        base: Base, tmp_path: Path, reliability, qwen3_dir: Path) -> None:
    case = reliability(SCENARIO, "resume with another tokenizer file at the same path: exit 2 "
                       "naming tokenizer.sha256; moving the same file elsewhere is allowed")
    tok = tmp_path / "tok"
    shutil.copytree(qwen3_dir, tok)
    run_dir = _copy_run(base, tmp_path / "run")
    moved = _resume(base, run_dir, {"model": {"tokenizer": str(tok)}}, new=1)
    assert moved.returncode == 0, moved.stderr  # the same file at another path: the same data
    with open(tok / "tokenizer.json", "ab") as f:
        f.write(b"\n")  # another file, the same tokens: only its hash tells
    before = _snapshot(run_dir)
    proc = _resume(base, run_dir, {"model": {"tokenizer": str(tok)}}, new=2)
    _refused_settings(case, proc, before, run_dir, "tokenizer.sha256")


def test_resume_with_other_settings_that_do_not_change_the_data(base: Base, tmp_path: Path,
                                                                reliability) -> None:
    case = reliability(SCENARIO, "resume with concurrency, backend URL and budget changed: "
                       "allowed, the new prompts answered")
    run_dir = _copy_run(base, tmp_path / "run")
    with TestServer(latency_s=0.0, reasoning_tokens=(3, 10), content_tokens=(3, 10)) as other:
        backend = fast_backend("local", "sglang", other.url, concurrency=2)
        proc = _resume(base, run_dir, {"backends": [backend], "budget": {"usd": 5.0},
                                       "max_attempts": 5})
        sent = _sent(other)
    case.runs += 1
    case.crashed += "Traceback" in proc.stderr
    case.note(f"exit {proc.returncode}; {sent} new prompts sent to the new URL")
    assert proc.returncode == 0, proc.stderr
    assert sent == 3 and len(_records(run_dir)) == ANSWERS + 3
    sessions = orjson.loads((run_dir / "run.json").read_bytes())["sessions"]
    assert "accepted_changes" not in sessions[-1]


def test_accepted_change_is_recorded_and_each_session_audited_by_its_own(
        base: Base, tmp_path: Path, reliability) -> None:
    case = reliability(SCENARIO, "resume with model.format changed and "
                       "--accept-changed-settings: recorded per session, each answer names its "
                       "session, audit passes both sessions' answers, --quarantine moves none")
    run_dir = _copy_run(base, tmp_path / "run")
    layout = "qwen3-thinking"
    with TestServer(latency_s=0.0, reasoning_tokens=(3, 10), content_tokens=(3, 10),
                    layout=layout) as other:
        backend = fast_backend("local", "sglang", other.url, concurrency=8)
        proc = _resume(base, run_dir, {"backends": [backend], "model": {"format": layout}},
                       "--accept-changed-settings")
    case.runs += 1
    assert proc.returncode == 0, proc.stderr
    sessions = orjson.loads((run_dir / "run.json").read_bytes())["sessions"]
    assert sessions[-1]["accepted_changes"] == ['model.format: "qwen3" → "qwen3-thinking"']
    assert [s["settings"]["model.format"] for s in sessions] == ["qwen3", layout]
    records = _records(run_dir)
    assert [r["session"] for r in records] == [0] * ANSWERS + [1] * 3
    audit = draftgen("audit", str(run_dir), "--quarantine")
    case.crashed += "Traceback" in proc.stderr + audit.stderr
    case.note(f"run exit {proc.returncode}; audit --quarantine exit {audit.returncode}, "
              f"{len(_records(run_dir))}/{ANSWERS + 3} answers kept")
    case.lost += ANSWERS + 3 - len(_records(run_dir))
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert len(_records(run_dir)) == ANSWERS + 3
    assert not (run_dir / "d" / "quarantine.jsonl").exists()
    pooled = audit_run(run_dir, workers=2, per_chunk=4)  # each worker judges every session
    assert pooled.ok and pooled.answers == ANSWERS + 3, pooled.problems
    exported = _export(run_dir, tmp_path / "export")
    assert exported.returncode == 0, exported.stderr
    assert "sessions differ in model, format" in " ".join(exported.stdout.split())


def test_accepted_tokenizer_change_judges_each_session_by_its_kept_tokenizer(
        base: Base, tmp_path: Path, reliability, qwen3_dir: Path) -> None:
    case = reliability(SCENARIO, "another tokenizer file at the same path, accepted: audit "
                       "judges the earlier sessions' answers by the copy of their tokenizer the "
                       "run folder keeps, and --quarantine moves none of them")
    tok = tmp_path / "tok"
    shutil.copytree(qwen3_dir, tok)
    run_dir = _copy_run(base, tmp_path / "run")
    assert _resume(base, run_dir, {"model": {"tokenizer": str(tok)}}, new=1).returncode == 0
    with open(tok / "tokenizer.json", "ab") as f:
        f.write(b"\n")
    proc = _resume(base, run_dir, {"model": {"tokenizer": str(tok)}},
                   "--accept-changed-settings", new=2, tag="m")
    assert proc.returncode == 0, proc.stderr
    audit = draftgen("audit", str(run_dir), "--quarantine")
    said = " ".join(audit.stdout.split())
    case.runs += 1
    case.crashed += "Traceback" in proc.stderr + audit.stderr
    case.lost += ANSWERS + 3 - len(_records(run_dir))
    case.note(f"audit exit {audit.returncode}: `{said[said.find('answers audited'):][:80]}`; "
              "none quarantined")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    # session 1's file at tok/ was changed since: its answers are judged by the kept copy
    assert "all answers pass" in said and "not checked" not in said, said
    assert len(_records(run_dir)) == ANSWERS + 3
