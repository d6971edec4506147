"""1. Kill anywhere: `draftgen run` is `kill -9`ed at random moments with 1,000+ requests in
flight, again and again on one run folder, then resumed to completion. Also: files cut in the
middle of their last line, as a kill inside a write() leaves them, and a kill during
`draftgen audit --quarantine`."""

from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from draftgen.store.prompt_refs import LineReader
from draftgen.store.record import Record, record_as_dict
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, run_config, write_config
from tests.reliability.helpers import (
    DRAFTGEN,
    ServerProcess,
    check_folder,
    draftgen,
    has_option,
    index_matches_data,
    no_probe,
    prompt_rows,
    start_run,
    wait_until,
    write_jsonl,
)

KILLS = int(os.environ.get("DRAFTGEN_RELIABILITY_KILLS", "30"))
CHAINS = int(os.environ.get("DRAFTGEN_RELIABILITY_CHAINS", "2"))
"""Run folders killed side by side, the KILLS shared between them: each session spends most of
its time starting and waiting for the held answers, so two chains take ~0.7x the time of one on
2 CPUs (195 → 138 s measured), each still at ≥ 1,000 in flight when killed."""
MIN_IN_FLIGHT = 1000
LATENCY_S = 3.0
"""The server holds each request this long: a session reaches 1,000 requests in flight before
its first answer lands."""
WRITE_WINDOW_S = 1.5
"""A kill comes at a uniformly random moment from the 1,000th request in flight to this long
after the first answers are due (LATENCY_S after the session's first request)."""
HEADROOM = 3500
"""Unanswered prompts at the start of each session (the dataset grows to keep them)."""


def _grow(data: Path, rows: list[dict], answered: int) -> None:
    """Append prompts so that at least HEADROOM are unanswered."""
    missing = HEADROOM - (len(rows) - answered)
    if missing > 0:
        rows.extend(prompt_rows(len(rows) + missing)[len(rows):])
        write_jsonl(data, rows)


def _tear(path: Path, rng: random.Random) -> bytes:
    """Cut a file in the middle of its last line, as a kill inside write() leaves it; returns
    the bytes that stay behind of that line."""
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        return b""
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    cut = rng.randrange(start + 1, len(data) - 1)
    with open(path, "rb+") as f:
        f.truncate(cut)
    return data[start:cut]


def _split_torn(corrupt: list[str]) -> tuple[list[str], list[str]]:
    torn = [c for c in corrupt if c.endswith("(torn)")]
    return torn, [c for c in corrupt if not c.endswith("(torn)")]


@dataclass
class Chain:
    """One run folder killed again and again, then resumed to completion."""

    kills: int = 0
    cuts: int = 0
    lost: int = 0
    duplicated: int = 0
    corrupt: int = 0
    crashed: int = 0
    prompts: int = 0
    in_flight: list[int] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    """Answers written by each killed session."""
    ramp_s: list[float] = field(default_factory=list)
    """Seconds from a session's start to 1,000 requests in flight."""
    torn_records: list[bytes] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _kill_chain(root: Path, qwen3_dir: Path, kills: int, seed: int) -> Chain:
    out = Chain()
    rng = random.Random(seed)
    rows = prompt_rows(HEADROOM)
    data = write_jsonl(root / "d.jsonl", rows)
    run_dir = root / "run"
    kept: set[str] = set()
    with ServerProcess("--latency", str(LATENCY_S), "--reasoning-tokens", "3,8",
                       "--content-tokens", "3,8", "--seed", str(seed)) as server:
        # SGLang /generate (engine IDs) and a streaming OpenAI endpoint (killed mid-stream)
        cfg = write_config(root, qwen3_dir, backends=[
            fast_backend("engine", "sglang", server.url, concurrency=700),
            fast_backend("stream", "openai", server.url, concurrency=700, stream=True)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64})
        for k in range(kills):
            _grow(data, rows, len(kept))
            wait_until(lambda: server.stats()["in_flight"] < 20, 30, "server drained")
            t0 = time.monotonic()
            proc = start_run(cfg, *no_probe())
            try:
                wait_until(lambda p=proc: p.poll() is not None
                           or server.stats()["in_flight"] > 0, 120, f"kill {k}: a request")
                first = time.monotonic()
                wait_until(lambda p=proc: p.poll() is not None
                           or server.stats()["in_flight"] >= MIN_IN_FLIGHT, 120,
                           f"kill {k}: {MIN_IN_FLIGHT} requests in flight")
                out.ramp_s.append(time.monotonic() - t0)
                # until the first answers are due, then a while into writing them
                due = max(0.0, first + LATENCY_S - time.monotonic())
                time.sleep(rng.uniform(0, due + WRITE_WINDOW_S))
                # in flight dips while the first answers land together: kill at the first
                # moment from then on with 1,000+ in flight
                deadline = time.monotonic() + 30
                in_flight = server.stats()["in_flight"]
                while (in_flight < MIN_IN_FLIGHT and proc.poll() is None
                       and time.monotonic() < deadline):
                    time.sleep(0.002)
                    in_flight = server.stats()["in_flight"]
                if proc.poll() is not None:  # it must still be running: a crash
                    out.crashed += 1
                    text = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                    pytest.fail(f"kill {k}: run exited by itself ({proc.returncode}): "
                                f"{text[-2000:]}")
                os.kill(proc.pid, signal.SIGKILL)
            finally:
                proc.kill()
                proc.wait()
            out.kills += 1
            out.in_flight.append(in_flight)
            check = check_folder(run_dir, extra_files=())  # the journal: at the end
            torn, corrupt = _split_torn(check.corrupt)
            out.corrupt += len(corrupt)
            out.duplicated += check.duplicated
            now = check.ids("d")
            out.lost += len(kept - now)
            out.written.append(len(now - kept))
            if torn:  # a kill really did land inside a write: fine, resume cuts it
                out.notes.append(f"kill {k}: the kill itself tore {torn}")
            if k % 3 == 2:  # the torn-line window, simulated
                out.cuts += 1
                for name in ("d/responses.jsonl", "d/index.jsonl", "journal.jsonl"):
                    if (run_dir / name).exists() and (run_dir / name).stat().st_size:
                        left = _tear(run_dir / name, rng)
                        if name == "d/responses.jsonl" and left:
                            out.torn_records.append(left)
                now = check_folder(run_dir, extra_files=()).ids("d")  # torn: not an answer
            kept = now
            assert not corrupt and not check.duplicated, (k, corrupt, check.duplicated)
            assert in_flight >= MIN_IN_FLIGHT, (k, in_flight)
        wait_until(lambda: server.stats()["in_flight"] < 20, 30, "server drained")
        final = draftgen("run", str(cfg), "--no-live", *no_probe(), timeout=300)
    out.prompts = len(rows)
    out.crashed += final.returncode != 0 or "Traceback" in final.stderr
    check = check_folder(run_dir)  # every file, the journal included
    ids = check.answered.get("d", [])
    wanted = {f"d/{r['id']}" for r in rows}
    out.lost += len(wanted - set(ids)) + len(kept - set(ids))
    out.duplicated += check.duplicated
    out.corrupt += len(check.corrupt)
    assert final.returncode == 0 and "completed" in final.stderr, final.stderr[-3000:]
    assert not check.corrupt, check.corrupt[:10]
    assert len(ids) == len(set(ids)) == len(wanted) and set(ids) == wanted
    assert kept <= set(ids)
    assert index_matches_data(run_dir, "d")
    kept_aside = (run_dir / "d" / "torn_tail.bin").read_bytes() if out.torn_records else b""
    assert all(t in kept_aside for t in out.torn_records)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_at_random_moments_under_1000_in_flight_then_resume(
    tmp_path: Path, qwen3_dir: Path, reliability
) -> None:
    kills = reliability("1. Kill anywhere", f"`kill -9` at a random moment, ≥{MIN_IN_FLIGHT:,} "
                        "requests in flight, one folder killed again and again, then resumed")
    torn_case = reliability("1. Kill anywhere", "torn last line: responses, index and journal "
                            "cut mid-line after a kill (as a kill inside a write leaves them), "
                            "then resumed")
    seed = int(os.environ.get("DRAFTGEN_RELIABILITY_SEED", "8"))
    per_chain = [KILLS // CHAINS + (i < KILLS % CHAINS) for i in range(CHAINS)]
    with ThreadPoolExecutor(CHAINS) as pool:
        futures = [pool.submit(_kill_chain, tmp_path / f"chain{i}", qwen3_dir, n, seed + i)
                   for i, n in enumerate(per_chain)]
        chains: list[Chain] = []
        errors: list[BaseException] = []
        for f in futures:
            try:
                chains.append(f.result())
            except BaseException as e:  # count what failed, then fail
                errors.append(e)
    in_flight = [n for c in chains for n in c.in_flight]
    written = [n for c in chains for n in c.written]
    ramp = [s for c in chains for s in c.ramp_s]
    for c in chains:
        kills.runs += c.kills
        torn_case.runs += c.cuts
        for case in (kills, torn_case):
            case.lost += c.lost
            case.duplicated += c.duplicated
            case.corrupt += c.corrupt
            case.crashed += c.crashed
        for note in c.notes:
            kills.note(note)
    kills.crashed += len(errors)
    if errors:
        raise errors[0]
    kills.extra.update(
        chains=len(chains), prompts=sum(c.prompts for c in chains), in_flight_at_kill=in_flight,
        answers_written_by_killed_sessions=written,
        seconds_from_start_to_1000_in_flight=[round(s, 1) for s in ramp])
    folders = "one run folder" if len(chains) == 1 else f"{len(chains)} run folders"
    kills.note(
        f"{kills.runs} kills on {folders}; requests in flight at the kill: "
        f"min {min(in_flight):,}, median {int(statistics.median(in_flight)):,}, max "
        f"{max(in_flight):,}; the killed sessions had written {sum(written):,} answers "
        f"({sum(1 for n in written if n == 0)} were killed before their first); "
        f"{sum(c.prompts for c in chains):,} prompts, each answered exactly once after the "
        "final resume; every answer on disk before a kill still there; every line of "
        "responses, index, failures and journal parses; the index matches the data")
    torn_case.note(
        f"{torn_case.runs} cuts of responses.jsonl, index.jsonl and journal.jsonl mid-line; "
        f"{sum(len(c.torn_records) for c in chains)} torn records kept aside in torn_tail.bin "
        "and answered again; no line glued onto a torn one")


QUARANTINE_ATTEMPTS = int(os.environ.get("DRAFTGEN_RELIABILITY_QUARANTINE_KILLS", "4"))


def _answers_with_bad_ones(tmp_path: Path, qwen3_dir: Path, server: TestServer, n: int
                           ) -> tuple[Path, Path]:
    """A finished run whose every third answer fails the audit (stop token cut off)."""
    data = write_jsonl(tmp_path / "q.jsonl", prompt_rows(n, "q"))
    cfg = write_config(tmp_path, qwen3_dir, backends=[
        fast_backend("local", "sglang", server.url, concurrency=64)],
        datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": 64})
    assert run_config(cfg).status == "completed"
    run_dir = tmp_path / "run"
    lines = (run_dir / "d" / "responses.jsonl").read_bytes().splitlines()
    out = []
    for i, line in enumerate(lines):
        record = orjson.loads(line)
        if i % 3 == 0:
            record["output_ids"] = record["output_ids"][:-1]
        out.append(orjson.dumps(record) + b"\n")
    (run_dir / "d" / "responses.jsonl").write_bytes(b"".join(out))
    for name in ("index.jsonl", "index.v1.bin"):
        (run_dir / "d" / name).unlink(missing_ok=True)
    return cfg, run_dir


def _key(record: dict) -> tuple:
    return (record.get("id"), record.get("created_at"), record.get("request_id"))


def _partition(run_dir: Path) -> tuple[list[tuple], list[tuple], list[str]]:
    """Answer keys in responses.jsonl and in quarantine.jsonl, and lines that do not parse
    (a torn last line of quarantine.jsonl is reported as such)."""
    out: list[list[tuple]] = [[], []]
    bad: list[str] = []
    for n, name in enumerate(("responses.jsonl", "quarantine.jsonl")):
        path = run_dir / "d" / name
        if not path.exists():
            continue
        raw = path.read_bytes()
        lines = raw.split(b"\n")
        if lines.pop():
            bad.append(f"{name}: torn last line")
        for i, line in enumerate(lines, 1):
            try:
                out[n].append(_key(orjson.loads(line)))
            except orjson.JSONDecodeError:
                bad.append(f"{name}:{i}: does not parse")
    return out[0], out[1], bad


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_during_audit_quarantine(tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability("1. Kill anywhere", "`kill -9` during `draftgen audit --quarantine` "
                       "(in the move window, or at random), then quarantined again and resumed")
    if not has_option("--quarantine", "audit"):
        case.note("not run: `draftgen audit --quarantine` does not exist")
        pytest.skip("`draftgen audit --quarantine` does not exist: kill during quarantine is "
                    "not tested")
    rng = random.Random(9)
    server = TestServer(reasoning_tokens=(5, 20), content_tokens=(5, 20)).start()
    try:
        _quarantine_kills(tmp_path, qwen3_dir, server, rng, case)
    finally:
        server.stop()


def _quarantine_kills(tmp_path: Path, qwen3_dir: Path, server: TestServer, rng: random.Random,
                      case) -> None:
    cfg, pristine = _answers_with_bad_ones(tmp_path / "src", qwen3_dir, server, 600)
    good, bad = set(), set()
    for i, line in enumerate((pristine / "d" / "responses.jsonl").read_bytes().splitlines()):
        (bad if i % 3 == 0 else good).add(_key(orjson.loads(line)))
    in_window = torn = 0
    for attempt in range(QUARANTINE_ATTEMPTS):
        run_dir = tmp_path / f"a{attempt}" / "run"
        shutil.copytree(pristine, run_dir)
        tmp_file = run_dir / "d" / "responses.jsonl.quarantine.tmp"
        proc = subprocess.Popen([*DRAFTGEN, "audit", str(run_dir), "--quarantine", "-j", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            if attempt % 2 == 0:  # in the move window: the temp file exists
                wait_until(lambda t=tmp_file, p=proc: t.exists() or p.poll() is not None, 120,
                           "quarantine moving", every=0.0005)
                time.sleep(rng.uniform(0, 0.02))
            else:
                time.sleep(rng.uniform(0.2, 2.5))
            finished = proc.poll() is not None
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        in_window += tmp_file.exists()
        kept, moved, broken = _partition(run_dir)
        case.runs += 1
        case.note(f"attempt {attempt}: "
                  + ("finished before the kill" if finished else
                     f"killed with {len(moved)} answers in quarantine.jsonl, "
                     f"{len(kept)} in responses.jsonl"))
        case.lost += len((good | bad) - set(kept) - set(moved))
        case.duplicated += len(kept) - len(set(kept))
        case.corrupt += sum(1 for b in broken if "torn" not in b)
        if tmp_file.exists() and (run_dir / "d" / "quarantine.jsonl").exists():
            # killed before the rename: a kill inside the buffered writes leaves this
            torn += bool(_tear(run_dir / "d" / "quarantine.jsonl", rng))  # kill in a write
        again = draftgen("audit", str(run_dir), "--quarantine", "-j", "1", timeout=120)
        kept, moved, broken = _partition(run_dir)
        case.crashed += "Traceback" in again.stderr
        case.lost += len((good | bad) - set(kept) - set(moved))
        case.duplicated += (len(kept) - len(set(kept))) + (len(moved) - len(set(moved)))
        case.corrupt += len(broken)
        assert "Traceback" not in again.stderr, again.stderr[-3000:]
        assert not broken, broken
        assert set(kept) == good and len(kept) == len(good), attempt
        assert set(moved) == bad and len(moved) == len(bad), attempt
    case.note(f"{in_window} kills landed in the move window (temp file present); "
              f"quarantine.jsonl cut mid-line {torn} times before quarantining again")
    # the last folder, resumed: the quarantined prompts are generated again
    last = tmp_path / f"a{QUARANTINE_ATTEMPTS - 1}" / "run"
    config = cfg.read_text().replace(str(tmp_path / "src" / "run"), str(last))
    (tmp_path / "last.yaml").write_text(config)
    resumed = draftgen("run", str(tmp_path / "last.yaml"), "--no-live", *no_probe(), timeout=120)
    check = check_folder(last)
    case.crashed += resumed.returncode != 0
    case.duplicated += check.duplicated
    case.corrupt += len(check.corrupt)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len(check.answered["d"]) == len(check.ids("d")) == 600
    audit = draftgen("audit", str(last), "-j", "1", timeout=120)
    assert audit.returncode == 0, audit.stdout[-2000:]
    case.note("after the final quarantine: every good answer once in responses.jsonl, every "
              "failing one once in quarantine.jsonl; the resumed run regenerated the 200 "
              "quarantined prompts; the audit then passes")


TURN_KILLS = 4


def test_kill_9_while_turns_are_written_as_the_turns_they_extend(
        tmp_path: Path, qwen3_dir: Path, reliability) -> None:
    case = reliability("1. Kill anywhere", "`turns: all` killed at random moments while each "
                       "turn is written as the turn it extends (fsync every second), the last "
                       "line torn after each kill, then resumed: every turn reads whole, once, "
                       "naming only a line before it")
    from tests.test_run_trajectories import by_conversation, chat_rows, engine_config

    rng = random.Random(34)
    data = write_jsonl(tmp_path / "chat.jsonl", chat_rows(30, turns=6))
    responses = tmp_path / "run" / "chat" / "responses.jsonl"
    torn = 0
    with TestServer(latency_s=0.02, reasoning_tokens=(3, 8), content_tokens=(3, 8)) as server:
        cfg = engine_config(tmp_path, qwen3_dir, server, concurrency=8,
                            datasets=[{"name": "chat", "path": str(data), "turns": "all"}],
                            sampling={"max_tokens": 512})
        for _ in range(TURN_KILLS):
            before = responses.read_bytes().count(b"\n") if responses.exists() else 0
            proc = subprocess.Popen([*DRAFTGEN, "run", str(cfg), "--no-live", "--no-probe"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            target = before + rng.randint(10, 30)
            wait_until(lambda p=proc, t=target: p.poll() is not None or (
                responses.exists() and responses.read_bytes().count(b"\n") >= t), 120,
                "turns written", every=0.005)
            time.sleep(rng.uniform(0, 0.2))
            if proc.poll() is not None:  # it answered every turn before its kill (a fast
                case.crashed += proc.returncode != 0  # machine): nothing left to kill
                case.runs += 1
                break
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            torn += bool(_tear(responses, rng))
            case.runs += 1
        outcome = run_config(cfg)
        case.runs += 1
    case.crashed += outcome.status != "completed"
    lines = responses.read_bytes().splitlines(keepends=True)
    starts = [sum(map(len, lines[:i])) for i in range(len(lines))]
    with LineReader(responses) as reader:
        read = [reader.read(line, at) for line, at in zip(lines, starts, strict=True)]
    records = [record_as_dict(r) for r in read if isinstance(r, Record)]
    case.corrupt = len(read) - len(records)
    named = [orjson.loads(line)["extends"]["at"] for line in lines if b'"extends":' in line]
    case.corrupt += sum(at not in starts for at in named)
    ids = Counter(r["id"] for r in records)
    case.duplicated = sum(n - 1 for n in ids.values())
    conversations = by_conversation(records)
    case.lost = sum(6 - len(turns) for turns in conversations.values()) + 30 - len(conversations)
    for turns in conversations.values():
        for k, r in enumerate(turns):
            history = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
            case.corrupt += history != [t["content"] for t in turns[:k]]
    case.note(f"{TURN_KILLS} kills, {torn} last lines torn; {len(records)} turns of 30 "
              f"conversations, {len(named)} written as the turn they extend")
    assert (case.lost, case.duplicated, case.corrupt, case.crashed) == (0, 0, 0, 0)
    # Turn 0 of each conversation is whole (30 of 180); a turn whose last turn's fsync has
    # not returned yet is too (a machine under load: fewer), so only a floor is a property.
    assert len(named) > len(records) // 3, "turns were written whole"
