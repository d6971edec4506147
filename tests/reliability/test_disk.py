"""4. Disk trouble: the output disk fills up mid-run, or the output becomes read-only mid-run,
or the run folder is not writable at all. draftgen stops dispatching, keeps what it has, exits
with a clear message, and resumes cleanly once the disk is back.

Real kernel errors throughout: a small tmpfs fills up (ENOSPC) where this process may mount
one (root); RLIMIT_FSIZE makes the kernel fail writes past a size (EFBIG) anywhere; `chattr
+i` makes an open output file unwritable even for root (EPERM) where the file system has it.
A case whose tool is missing is skipped with the reason."""

from __future__ import annotations

import contextlib
import resource
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from draftgen.status import collect_status
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, write_config
from tests.reliability.helpers import (
    DRAFTGEN,
    check_folder,
    draftgen,
    line_count,
    no_probe,
    prompt_rows,
    start_run,
    wait_until,
    write_jsonl,
)

SCENARIO = "4. Disk trouble"
N = 1500


@pytest.fixture(autouse=True)
def _rescue_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rescue files that cannot go in the run folder go here, not in the system's /tmp."""
    monkeypatch.setenv("DRAFTGEN_RESCUE_DIR", str(tmp_path / "rescue"))


def _rescued(case, run_dir: Path, sent: int, kept: set[str]) -> int:
    """Answers kept in rescue files at the stop, noted with the requests sent."""
    status = collect_status(run_dir)
    case.note(f"{sent:,} requests sent: {len(kept):,} answers written, {status.rescued:,} "
              f"kept in a rescue file ({', '.join(status.rescue_files) or 'none'})")
    return status.rescued


def _mount(cmd: list[str]) -> bool:
    return subprocess.run(cmd, capture_output=True).returncode == 0


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    if not _mount(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]):
        pytest.skip("cannot mount a tmpfs here (not root?): covered by the RLIMIT_FSIZE case")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _setup(tmp_path: Path, qwen3_dir: Path, server: TestServer, run_dir: Path,
           **top: Any) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(N))
    return write_config(tmp_path, qwen3_dir, backends=[
        fast_backend("local", "sglang", server.url, concurrency=64)],
        datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64},
        output_dir=str(run_dir), **top)


@contextlib.contextmanager
def _run_on_tmpfs(tmp_path: Path, qwen3_dir: Path, size: str, **top: Any
                  ) -> Iterator[tuple[Path, TestServer, Path, Path]]:
    """A tmpfs of `size`, a fast test server, and a run config writing to the tmpfs: (the
    tmpfs, the server, the run folder, the config)."""
    with tmpfs(tmp_path / "disk", size) as disk, \
         TestServer(latency_s=0.02, reasoning_tokens=(5, 20), content_tokens=(5, 20)) as server:
        run_dir = disk / "run"
        yield disk, server, run_dir, _setup(tmp_path, qwen3_dir, server, run_dir, **top)


def _model_calls(server: TestServer) -> int:
    return sum(server.stats["per_prompt"].values())


def _check_stop(case, proc_rc: int, out: str, run_dir: Path, what: str) -> set[str]:
    check = check_folder(run_dir)
    case.runs += 1
    case.corrupt += len(check.corrupt)
    case.duplicated += check.duplicated
    case.crashed += "Traceback" in out or proc_rc not in (1, 2)
    assert "Traceback" not in out, out[-4000:]
    assert proc_rc in (1, 2), (proc_rc, out[-3000:])
    assert what in out, out[-3000:]
    assert not check.corrupt and not check.duplicated, check.corrupt[:5]
    return check.ids("d")


def _resume_and_check(case, cfg: Path, run_dir: Path, kept: set[str],
                      server: TestServer) -> None:
    """Resumed: every prompt answered once, and none paid for twice (an answer in flight at
    the failure is added from its rescue file, not asked for again)."""
    proc = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=180)
    check = check_folder(run_dir)
    ids = check.ids("d")
    paid_twice = sum(n - 1 for n in server.stats["per_prompt"].values())
    case.lost += len(kept - ids) + (N - len(ids)) + paid_twice
    case.duplicated += check.duplicated
    case.corrupt += len(check.corrupt)
    case.crashed += proc.returncode != 0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert kept <= ids and len(ids) == N and not check.duplicated and not check.corrupt
    assert paid_twice == 0, f"{paid_twice} answers paid for, lost, and asked for again"


@pytest.mark.slow
def test_disk_full_mid_run_tmpfs(tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability(SCENARIO, "output disk full mid-run (a 1 MB tmpfs: ENOSPC; the free-space "
                       "guard off), then resumed once space is back")
    with _run_on_tmpfs(tmp_path, qwen3_dir, "1m", min_free_mb=0) as (disk, server, run_dir, cfg):
        t0 = time.monotonic()
        proc = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=180)
        wall = time.monotonic() - t0
        kept = _check_stop(case, proc.returncode, proc.stderr, run_dir, "No space left on device")
        case.note(f"stopped after {wall:.0f}s with {len(kept):,} answers kept, exit "
                  f"{proc.returncode}: `{_last_error(proc.stderr)}`")
        assert 0 < len(kept) < N
        _rescued(case, run_dir, _model_calls(server), kept)
        sent = sum(server.stats["requests"].values())
        again = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=120)
        sent = sum(server.stats["requests"].values()) - sent
        _check_stop(case, again.returncode, again.stderr, run_dir, "No space left on device")
        assert check_folder(run_dir).ids("d") == kept
        case.note(f"a run started while the disk is still full: exit {again.returncode}, "
                  f"{sent} requests sent: `{_last_error(again.stderr)}`")
        assert _mount(["mount", "-o", "remount,size=64m", str(disk)])
        _resume_and_check(case, cfg, run_dir, kept, server)
    case.note(f"resumed once the disk was 64 MB: all {N:,} answered exactly once")


@pytest.mark.slow
def test_disk_nearly_full_stops_sending_and_loses_no_answer(tmp_path: Path, qwen3_dir: Path,
                                                            reliability) -> None:
    case = reliability(SCENARIO, "output disk nearly full mid-run (a 3 MB tmpfs, min_free_mb 2): "
                       "no new request, every answer in flight written, then resumed")
    with _run_on_tmpfs(tmp_path, qwen3_dir, "3m", min_free_mb=2) as (disk, server, run_dir, cfg):
        proc = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=180)
        kept = _check_stop(case, proc.returncode, proc.stderr, run_dir, "output disk nearly full")
        sent = _model_calls(server)
        case.lost += sent - len(kept)
        case.note(f"exit {proc.returncode}, {sent:,} requests sent and {len(kept):,} answers "
                  f"kept: `{_last_error(proc.stderr)}`")
        assert "No space left on device" not in proc.stderr, proc.stderr[-3000:]
        assert 0 < len(kept) < N
        assert sent == len(kept), "answers paid for and not written"
        again = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=120)
        _check_stop(case, again.returncode, again.stderr, run_dir, "output disk nearly full")
        assert _model_calls(server) == sent, "a run on a nearly full disk sent requests"
        assert check_folder(run_dir).ids("d") == kept
        assert _mount(["mount", "-o", "remount,size=64m", str(disk)])
        _resume_and_check(case, cfg, run_dir, kept, server)
    case.note(f"a second run refused before sending; resumed once the disk was 64 MB: all "
              f"{N:,} answered exactly once")


@pytest.mark.slow
def test_disk_full_mid_run_rlimit(tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability(SCENARIO, "output file over the size the system allows mid-run "
                       "(RLIMIT_FSIZE: EFBIG), then resumed without the limit")
    limit = 500_000

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    with TestServer(latency_s=0.02, reasoning_tokens=(5, 20), content_tokens=(5, 20)) as server:
        run_dir = tmp_path / "run"
        cfg = _setup(tmp_path, qwen3_dir, server, run_dir)
        proc = subprocess.run([*DRAFTGEN, "run", str(cfg), "--no-live", *no_probe()],
                              capture_output=True, text=True, timeout=180, preexec_fn=limited)
        kept = _check_stop(case, proc.returncode, proc.stderr, run_dir, "File too large")
        case.note(f"exit {proc.returncode} with {len(kept):,} answers kept: "
                  f"`{_last_error(proc.stderr)}`")
        assert 0 < len(kept) < N
        assert _rescued(case, run_dir, _model_calls(server), kept) > 0
        _resume_and_check(case, cfg, run_dir, kept, server)
    case.note(f"resumed without the limit: all {N:,} answered exactly once")


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`chattr +i`: even root's writes to an open file fail (EPERM) until it is lifted."""
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (not root, or the file system lacks it)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


@pytest.mark.slow
def test_output_file_not_writable_mid_run(tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability(SCENARIO, "output file made unwritable mid-run (`chattr +i`: EPERM), "
                       "a run started while it is, then resumed once writable")
    with TestServer(latency_s=0.05, reasoning_tokens=(5, 20), content_tokens=(5, 20)) as server:
        run_dir = tmp_path / "run"
        responses = run_dir / "d" / "responses.jsonl"
        cfg = _setup(tmp_path, qwen3_dir, server, run_dir)
        proc = start_run(cfg, *no_probe())
        try:
            wait_until(lambda: line_count(responses) >= 200, 60, "200 answers")
            with immutable(responses):
                out, _ = proc.communicate(timeout=120)
                text = out.decode(errors="replace")
                kept = _check_stop(case, proc.returncode, text, run_dir,
                                   "Operation not permitted")
                case.note(f"exit {proc.returncode} with {len(kept):,} answers kept: "
                          f"`{_last_error(text)}`")
                assert 0 < len(kept) < N
                sent = _model_calls(server)
                assert len(kept) + _rescued(case, run_dir, sent, kept) == sent, \
                    "answers in flight at the failure were lost"
                sent = sum(server.stats["requests"].values())
                again = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=120)
                sent = sum(server.stats["requests"].values()) - sent
                _check_stop(case, again.returncode, again.stderr, run_dir,
                            "Operation not permitted")
                assert check_folder(run_dir).ids("d") == kept
                case.note(f"a run started while it is not writable: exit {again.returncode}, "
                          f"{sent} requests sent: `{_last_error(again.stderr)}`")
                assert sent == 0, "requests were paid for while no answer could be written"
        finally:
            proc.kill()
            proc.wait()
        _resume_and_check(case, cfg, run_dir, kept, server)
    case.note(f"resumed once writable: all {N:,} answered exactly once")


def _last_error(text: str) -> str:
    """What the user reads last: the run's closing message."""
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""
