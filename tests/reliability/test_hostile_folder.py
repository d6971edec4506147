"""Hostile surroundings: a run folder whose files or folders are symbolic links to files outside
it, a full disk under `draftgen export` and `draftgen audit --quarantine`, and a dataset hub
that accepts connections and never answers. Each ends with one clear line and an exit status
nobody has to guess, never a traceback, a hang, or a write outside output_dir."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.reliability.helpers import (
    DRAFTGEN,
    Base,
    all_bytes,
    completed_run,
    draftgen,
    no_probe,
    prompt_rows,
    write_jsonl,
)

pytestmark = pytest.mark.slow  # `draftgen` subprocesses each

BAD_INPUT = "3. Bad input"
DISK = "4. Disk trouble"
GOOD = 20


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Iterator[Base]:
    """A run folder holding GOOD answers, its test server still up."""
    with completed_run(tmp_path_factory.mktemp("hostile"), qwen3_dir, prompt_rows(GOOD, "g"),
                       latency_s=0.01, tokens=(5, 20), max_tokens=64) as base:
        yield base


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""


def _resume_config(base: Base, tmp_path: Path, run_dir: Path, **top: Any) -> Path:
    """The run's config on `run_dir`, its dataset grown by 3 prompts (a resume has work)."""
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(GOOD, "g") + prompt_rows(3, "n"))
    config = {**base.cfg, "output_dir": str(run_dir),
              "datasets": [{"name": "d", "path": str(data)}], **top}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# ---- item 8: files and folders linked out of the run folder -----------------------------------


def _link_file(name: str) -> Callable[[Path, Path], Path]:
    """Move RUN/NAME out to OUTSIDE/NAME and leave a symbolic link to it in its place."""
    def damage(run_dir: Path, outside: Path) -> Path:
        inside = run_dir / name
        target = outside / Path(name).name
        shutil.move(inside, target)
        inside.symlink_to(target)
        return inside
    return damage


def _plant_link(name: str) -> Callable[[Path, Path], Path]:
    """A symbolic link RUN/NAME to a file OUTSIDE/NAME (a temp file's name draftgen writes)."""
    def damage(run_dir: Path, outside: Path) -> Path:
        target = outside / name
        target.write_bytes(b"not draftgen's\n")
        (run_dir / name).symlink_to(target)
        return run_dir / name
    return damage


LINKED = [
    ("responses", "a dataset's responses.jsonl", _link_file("d/responses.jsonl")),
    ("journal", "the run's journal.jsonl", _link_file("journal.jsonl")),
    ("dataset-folder", "a dataset's folder", _link_file("d")),
    ("run-json", "run.json", _link_file("run.json")),
    ("index", "a dataset's index.jsonl", _link_file("d/index.jsonl")),
    ("lock", "the run's lock file", _link_file("lock")),
    ("run-json-partial", "run.json's temp file (planted)", _plant_link("run.json.partial")),
]


@pytest.mark.parametrize("damage", [d for _, _, d in LINKED], ids=[i for i, _, _ in LINKED])
def test_a_link_out_of_the_run_folder_is_refused_not_written_through(
        base: Base, tmp_path: Path, reliability, damage: Callable[[Path, Path], Path]) -> None:
    what = next(w for _, w, d in LINKED if d is damage)
    case = reliability(BAD_INPUT, f"{what} replaced by a symbolic link to a file outside the "
                       "run folder, then resumed: refused in one line naming it, nothing "
                       "written outside")
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(base.run_dir, run_dir)
    outside.mkdir()
    link = damage(run_dir, outside)
    before = dict(all_bytes(outside))
    cfg = _resume_config(base, tmp_path, run_dir)
    sent = sum(base.server.stats["requests"].values())
    proc = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=120)
    sent = sum(base.server.stats["requests"].values()) - sent
    after = dict(all_bytes(outside))
    changed = sorted(str(p) for p in set(before) | set(after) if before.get(p) != after.get(p))
    case.runs += 1
    case.corrupt += len(changed)
    case.crashed += "Traceback" in proc.stderr or proc.returncode not in (1, 2)
    case.note(f"exit {proc.returncode}, {sent} requests sent, {len(changed)} files outside "
              f"changed: `{_last_line(proc.stderr)}`")
    assert not changed, f"written through the link: {changed}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode in (1, 2), proc.stderr[-3000:]
    said = _last_line(proc.stderr)
    assert str(link) in said and "symbolic link" in said, proc.stderr[-3000:]
    assert sent == 0, "requests sent although no answer could be written"


# ---- item 10: a full disk under export and audit --quarantine -------------------------------


def _file_size_limit(limit: int) -> Callable[[], None]:
    """A child's files may not grow past `limit` bytes (RLIMIT_FSIZE: EFBIG, as a full disk or a
    quota does, with no root needed to mount a small disk)."""
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limited


def _limited(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DRAFTGEN, *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=_file_size_limit(limit), env=dict(os.environ))


@pytest.mark.parametrize("fmt", ["specforge", "parquet", "speculators"])
def test_a_full_disk_in_export_is_one_line_and_leaves_nothing(
        base: Base, tmp_path: Path, reliability, fmt: str) -> None:
    case = reliability(DISK, f"`draftgen export -f {fmt}` onto a disk that fills up "
                       "(RLIMIT_FSIZE): one line naming the disk, nothing half written")
    out = tmp_path / "export"
    proc = _limited(2_000, "export", str(base.run_dir), "-f", fmt, "-o", str(out))
    case.runs += 1
    case.crashed += "Traceback" in proc.stderr or proc.returncode != 1
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".export", "export")))
    case.corrupt += len(left)
    case.note(f"exit {proc.returncode}: `{_last_line(proc.stderr)}`")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr[-3000:]  # export's errors exit 1
    said = _last_line(proc.stderr)
    assert "File too large" in said and "free some space" in said, proc.stderr[-3000:]
    assert not left, f"left behind: {left}"
    again = draftgen("export", str(base.run_dir), "-f", fmt, "-o", str(out))
    assert again.returncode == 0, again.stderr[-3000:]


def _break_answers(run_dir: Path, which: set[int]) -> None:
    """Cut the last output token of the answers on lines `which`: those fail the audit."""
    path = run_dir / "d" / "responses.jsonl"
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for i in which:
        records[i]["output_ids"] = records[i]["output_ids"][:-1]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    for name in ("index.jsonl", "index.v1.bin"):
        (run_dir / "d" / name).unlink(missing_ok=True)


def _answer_keys(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [orjson.loads(line)["id"] for line in path.read_bytes().splitlines()]


def test_a_full_disk_in_audit_quarantine_says_how_to_finish(
        base: Base, tmp_path: Path, reliability) -> None:
    case = reliability(DISK, "`draftgen audit --quarantine` of 2 bad answers onto a disk that "
                       "fills up (RLIMIT_FSIZE), then run again: one line saying to run it "
                       "again, every answer in exactly one file at the end")
    run_dir = tmp_path / "run"
    shutil.copytree(base.run_dir, run_dir)
    _break_answers(run_dir, {3, 11})
    responses, quarantined = run_dir / "d" / "responses.jsonl", run_dir / "d" / "quarantine.jsonl"
    everyone = sorted(_answer_keys(responses))
    proc = _limited(responses.stat().st_size // 2, "audit", str(run_dir), "--quarantine")
    case.runs += 1
    case.crashed += "Traceback" in proc.stderr or proc.returncode == 0
    said = _last_line(proc.stderr)
    case.note(f"exit {proc.returncode}: `{said}`")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode not in (0, 1), proc.stderr[-3000:]
    assert "File too large" in said and "--quarantine" in said and "again" in said, said
    assert sorted(_answer_keys(responses)) == everyone, "an answer left responses.jsonl"
    again = draftgen("audit", str(run_dir), "--quarantine")
    kept, moved = _answer_keys(responses), _answer_keys(quarantined)
    case.corrupt += len(set(kept) & set(moved)) + (sorted(kept + moved) != everyone)
    case.note(f"run again: exit {again.returncode}, {len(moved)} moved, {len(kept)} kept, "
              f"{len(set(kept) & set(moved))} in both")
    assert again.returncode == 1, again.stderr[-3000:]  # the audit found 2 failing (and moved them)
    assert "2 failing lines moved" in again.stdout, again.stdout[-3000:]
    assert len(moved) == 2 and not set(kept) & set(moved)
    assert sorted(kept + moved) == everyone


# ---- item 11: a hub that accepts and never answers ----------------------------------------


@contextlib.contextmanager
def _silent_server() -> Iterator[str]:
    """A loopback server that accepts every connection and never sends a byte."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not done.is_set():
            with contextlib.suppress(OSError):
                held.append(sock.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


HUB_TIMEOUT_S = 5


def test_a_hub_that_never_answers_ends_in_a_bounded_clear_error(
        base: Base, tmp_path: Path, reliability) -> None:
    case = reliability(BAD_INPUT, "a preset read from a hub that accepts connections and never "
                       f"answers (hub_timeout_s: {HUB_TIMEOUT_S}): a clear error in well under "
                       "a minute")
    entry = {"preset": "ultrachat", "limit": 5, "hub_timeout_s": HUB_TIMEOUT_S}
    config = {**base.cfg, "output_dir": str(tmp_path / "run"), "datasets": [entry]}
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    with _silent_server() as hub:
        env |= {"HF_ENDPOINT": hub, "HF_HOME": str(tmp_path / "hf")}
        started = time.monotonic()
        proc = subprocess.run([*DRAFTGEN, "run", str(cfg), "--no-live", *no_probe()],
                              capture_output=True, text=True, timeout=150, env=env)
        took = time.monotonic() - started
    case.runs += 1
    case.crashed += "Traceback" in proc.stderr or proc.returncode == 0
    said = _last_line(proc.stderr)
    case.note(f"exit {proc.returncode} after {took:.0f} s: `{said}`")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "hub_timeout_s" in said and hub in said, said
    assert took < HUB_TIMEOUT_S + 30
