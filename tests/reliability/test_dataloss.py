"""7. Data loss by careless commands: an export or report pointed at a run folder, a resume
with changed settings. Nothing a run wrote is deleted, overwritten or judged by the wrong
settings."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftgen.testing.server import TestServer
from tests.e2e_helpers import fast_backend, run_config, write_config
from tests.reliability.helpers import all_bytes, draftgen, prompt_rows, write_jsonl

pytestmark = pytest.mark.slow  # `draftgen` subprocesses

SCENARIO = "7. Data loss"
ANSWERS = 12


@dataclass
class Base:
    server: TestServer
    root: Path
    run_dir: Path
    cfg: dict[str, Any]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Iterator[Base]:
    """A run folder holding ANSWERS answers."""
    root = tmp_path_factory.mktemp("dataloss")
    data = write_jsonl(root / "d.jsonl", prompt_rows(ANSWERS, "g"))
    with TestServer(latency_s=0.0, reasoning_tokens=(3, 10), content_tokens=(3, 10)) as server:
        path = write_config(root, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url, concurrency=8)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 48})
        assert run_config(path).status == "completed"
        yield Base(server, root, root / "run", yaml.safe_load(path.read_text()))


def _copy_run(base: Base, dest: Path) -> Path:
    shutil.copytree(base.run_dir, dest)
    return dest


def _export(run_dir: Path, out: Path, *extra: str) -> Any:
    return draftgen("export", str(run_dir), "--format", "specforge", "--out", str(out), *extra)


def _snapshot(*folders: Path) -> dict[Path, bytes]:
    return dict(all_bytes(*folders))


def _refused_intact(case: Any, proc: Any, before: dict[Path, bytes], *folders: Path) -> None:
    after = _snapshot(*folders)
    case.runs += 1
    case.lost += sum(1 for p in before if p not in after or after[p] != before[p])
    case.crashed += "Traceback" in proc.stderr
    said = " ".join(proc.stderr.split())
    case.note(f"exit {proc.returncode}: `{said[:220]}`")
    assert proc.returncode == 1, proc.stderr
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
    _refused_intact(case, proc, before, run_dir)
