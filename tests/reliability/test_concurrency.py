"""6. Concurrency safety: a second `draftgen run` on a live folder is refused; `status`,
`audit` and `audit --quarantine` on a live run read (or refuse) without blocking or disturbing
the writer, which completes with every line whole."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, write_config
from tests.reliability.helpers import (
    check_folder,
    draftgen,
    has_command,
    has_option,
    index_matches_data,
    line_count,
    no_probe,
    prompt_rows,
    start_run,
    wait_until,
    write_jsonl,
)

SCENARIO = "6. Concurrency safety"
N = 900
LATENCY_S = 0.8
"""At 16 in flight and 0.8 s a request, about 45 s of live run (not CPU-bound, so about
the same on a busy machine): time for the readers to run beside it."""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_readers_and_a_second_writer_during_a_live_run(tmp_path: Path, qwen3_dir: Path,
                                                        reliability) -> None:
    second = reliability(SCENARIO, "a second `draftgen run` on a live folder (same config, "
                         "another config): refused, the pid named")
    readers = reliability(SCENARIO, "`status`, `status --json`, `audit` and `audit "
                          "--quarantine` during a live run: they read (or refuse), never block "
                          "or corrupt the writer")
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(N))
    run_dir = tmp_path / "run"
    responses = run_dir / "d" / "responses.jsonl"
    small = write_jsonl(tmp_path / "e.jsonl", prompt_rows(3, "e"))
    with TestServer(latency_s=LATENCY_S, reasoning_tokens=(5, 30),
                    content_tokens=(5, 30)) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url, concurrency=16)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64})
        other = write_config(tmp_path / "other", qwen3_dir, backends=[
            fast_backend("x", "openai", server.url, concurrency=4)],
            datasets=[{"name": "e", "path": str(small)}], output_dir=str(run_dir))
        proc = start_run(cfg, *no_probe())
        try:
            wait_until(lambda: line_count(responses) >= 10, 60, "10 answers")
            for config in (cfg, other):
                refused = draftgen("run", str(config), "--no-live", timeout=60)
                second.runs += 1
                second.crashed += "Traceback" in refused.stderr
                assert proc.poll() is None, "the live run ended before the check: make it longer"
                assert refused.returncode == 2, refused.stderr
                assert f"pid {proc.pid}" in refused.stderr and "in use" in refused.stderr
            second.note(f"exit 2: `{refused.stderr.strip().splitlines()[-1]}`")
            done_seen: list[int] = []
            slowest = 0.0
            commands = [["status"], ["status", "--json"], ["audit", "--json", "-j", "1"],
                        ["audit", "--quarantine", "-j", "1"]]
            commands = [c for c in commands if has_command(c[0])
                        and (c[1:2] != ["--quarantine"] or has_option("--quarantine", "audit"))]
            assert commands, "no reader command to test"
            rounds = quarantine_refused = 0
            while proc.poll() is None and rounds < 2:
                rounds += 1
                for command in commands:
                    if proc.poll() is not None:
                        break
                    t0 = time.monotonic()
                    out = draftgen(*command, str(run_dir), timeout=60)
                    slowest = max(slowest, time.monotonic() - t0)
                    readers.runs += 1
                    readers.crashed += "Traceback" in out.stderr + out.stdout
                    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
                    if command == ["status", "--json"]:
                        assert out.returncode == 0, out.stderr
                        done_seen.append(_done(orjson.loads(out.stdout)))
                    elif "--quarantine" in command and proc.poll() is None:
                        # refused while live, nothing moved (a run that ended while the
                        # command started up may be quarantined like any finished one)
                        assert out.returncode != 0 and "live" in (out.stderr + out.stdout)
                        assert not (run_dir / "d" / "quarantine.jsonl").exists()
                        quarantine_refused += 1
                    else:
                        assert out.returncode in (0, 1), out.stderr[-2000:]
            out, _ = proc.communicate(timeout=240)
        finally:
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    check = check_folder(run_dir)
    ids = check.ids("d")
    for case in (second, readers):
        case.lost += N - len(ids)
        case.duplicated += check.duplicated
        case.corrupt += len(check.corrupt)
    readers.crashed += proc.returncode != 0
    names = ", ".join(" ".join(c) for c in commands)
    readers.note(f"{readers.runs} reader commands during the run ({names}), the slowest "
                 f"{slowest:.1f}s; status saw "
                 f"{', '.join(map(str, done_seen))} answers done; the run then completed with "
                 f"all {N:,} answers, every line whole, the index matching the data")
    assert proc.returncode == 0, text[-3000:]
    assert len(ids) == N and not check.duplicated and not check.corrupt
    assert index_matches_data(run_dir, "d")
    assert done_seen == sorted(done_seen) and all(0 < d <= N for d in done_seen), done_seen
    assert rounds >= 1 and slowest < 30
    if ["audit", "--quarantine", "-j", "1"] in commands:
        assert quarantine_refused, "no `audit --quarantine` ran while the run was live"


def _done(status: dict) -> int:
    """Answers done, from `status --json` (whatever its exact shape: the largest 'done')."""
    found: list[int] = []

    def walk(value: object, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif key in ("done", "done_total", "answered") and isinstance(value, int):
            found.append(value)

    walk(status)
    assert found, status
    return max(found)
