"""draftgen status: counts equal to a direct count of the files, on runs written through the
store, and on real runs (live, gracefully stopped, killed) against the loopback test server;
the index's binary copy and the journal reader; clear errors; nothing written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.status import StatusError, collect_status
from draftgen.store import RunLayout, Store
from draftgen.store.columns import ROW, id_hash, read_rows
from draftgen.store.fast_index import load_index_columns
from draftgen.store.index import read_index
from draftgen.store.journal import read_journal
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import (
    fast_backend,
    mixed_rows,
    read_records,
    wait_for_lines,
    write_config,
    write_jsonl,
)


def _record(i: int, **kw: Any) -> dict[str, Any]:
    rec = {"id": f"ds/{i}", "dataset": "ds", "output_ids": list(range(3 + i % 5)),
           "finish_reason": "length" if i % 7 == 0 else "stop",
           "token_source": "native", "token_check": "exact" if i % 3 else "length_ok",
           "backend": "local" if i % 2 else "paid", "provider": None if i % 2 else "Alpha",
           "quantization": None if i % 2 else "fp8",
           "usage": {"reasoning_tokens": 2}, "cost_usd": 0.0 if i % 2 else 0.5,
           "latency_s": 1.0, "created_at": 1000.0 + i}
    rec.update(kw)
    return rec


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _run_json(root: Path, totals: dict[str, int], **extra: Any) -> None:
    data = {"created_at": 900.0, "config": {"datasets": [{"name": n} for n in totals],
                                             "max_attempts": 2},
            "sessions": [{"started_at": 950.0, "stopped_at": None, "outcome": None}],
            "datasets": {n: {"total": t, "skipped_budget": 1} for n, t in totals.items()},
            **extra}
    (root / "run.json").write_bytes(orjson.dumps(data))


# ---- the index's binary copy -------------------------------------------------------------------


def _same_as_read_index(layout: RunLayout, name: str) -> None:
    entries, bad = read_index(layout.index(name), layout.responses(name), repair=False)
    cols = load_index_columns(layout, name)
    assert cols.rows["end"].tolist() == [e.end for e in entries]
    assert cols.rows["idh"].tolist() == [id_hash(e.id) for e in entries]
    assert [cols.name(c) for c in cols.rows["backend"]] == [e.backend for e in entries]
    assert [cols.name(c) for c in cols.rows["quant"]] == [e.quant for e in entries]
    assert cols.rows["out"].tolist() == [e.out for e in entries]
    assert cols.bad_lines == bad


def test_binary_copy_follows_the_json_index_through_every_repair(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    store = Store(tmp_path, fsync_interval_s=0)
    for i in range(40):
        store.append_record("ds", _record(i))
    store.close()
    assert len(read_rows(layout.columns("ds"))) == 40
    cols = load_index_columns(layout, "ds")
    assert (cols.from_binary, cols.from_json, cols.from_data) == (40, 0, 0)
    _same_as_read_index(layout, "ds")
    # a kill between the data line and its index line: the tail comes from the data
    with open(layout.responses("ds"), "ab") as f:
        f.write(orjson.dumps(_record(40)) + b"\n" + b"not json\n")
    cols = load_index_columns(layout, "ds")
    assert (cols.from_binary, cols.from_data, cols.bad_lines) == (40, 1, 1)
    _same_as_read_index(layout, "ds")
    # binary copy missing: the JSON index is read; the writer's scan rebuilds the copy
    layout.columns("ds").unlink()
    assert load_index_columns(layout, "ds").from_json == 40
    read_index(layout.index("ds"), layout.responses("ds"), repair=True)
    assert len(read_rows(layout.columns("ds"))) == 41
    _same_as_read_index(layout, "ds")
    # the data cut back (a torn tail cut, a quarantine): rows past the data are not trusted
    data = layout.responses("ds").read_bytes()
    cut = data[: data.index(b"\n", len(data) // 2) + 1]
    layout.responses("ds").write_bytes(cut)
    _same_as_read_index(layout, "ds")
    assert len(load_index_columns(layout, "ds").rows) == cut.count(b"\n")
    # a binary copy out of step with the JSON index (garbage): ignored, never trusted
    layout.columns("ds").write_bytes(b"\x07" * ROW.itemsize * 3)
    _same_as_read_index(layout, "ds")
    # the store brings the copy back in step before appending (after the runner's scan)
    read_index(layout.index("ds"), layout.responses("ds"), repair=True)
    layout.columns("ds").write_bytes(b"\x07" * ROW.itemsize * 3)
    store = Store(tmp_path)
    store.append_record("ds", _record(99))
    store.close()
    rows = read_rows(layout.columns("ds"))
    entries, _ = read_index(layout.index("ds"), layout.responses("ds"), repair=False)
    assert rows["end"].tolist() == [e.end for e in entries]


def test_torn_index_line_is_rewritten_not_appended_after(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    store = Store(tmp_path)
    for i in range(5):
        store.append_record("ds", _record(i))
    store.close()
    with open(layout.index("ds"), "ab") as f:
        f.write(b'{"id":"ds/5","end":12')  # killed mid index write
    with open(layout.responses("ds"), "ab") as f:
        f.write(orjson.dumps(_record(5)) + b"\n")
    entries, _ = read_index(layout.index("ds"), layout.responses("ds"), repair=True)
    assert [e.id for e in entries] == [f"ds/{i}" for i in range(6)]
    assert all(orjson.loads(x) for x in layout.index("ds").read_bytes().splitlines())
    _same_as_read_index(layout, "ds")


# ---- the journal -------------------------------------------------------------------------------


def _events(path: Path, events: list[tuple[str, str, int]]) -> None:
    with open(path, "wb") as f:
        for k, (ev, rid, session) in enumerate(events):
            f.write(orjson.dumps({"ev": ev, "id": rid, "dataset": "ds", "t": float(k),
                                  "session": session}) + b"\n")


def test_journal_open_requests_of_the_last_session(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    events = [("sent", "old", 0)]  # open when session 0 was killed: not this session's
    events += [(ev, f"a{i}", 1) for i in range(500) for ev in ("sent", "ok")]
    events += [("sent", "dropped-then-open", 1), ("dropped", "dropped-then-open", 1),
               ("sent", "long", 1), ("sent", "dropped-then-open", 1)]
    events += [(ev, f"b{i}", 1) for i in range(300) for ev in ("sent", "failed")]
    events += [("sent", "last", 1)]
    _events(path, events)
    tail = read_journal(path)
    assert tail.session == 1 and tail.complete
    assert sorted(r.id for r in tail.open) == ["dropped-then-open", "last", "long"]
    assert not tail.from_checkpoint
    with open(path, "ab") as f:
        f.write(b'{"ev":"ok","id":"la')  # torn last line
    tail = read_journal(path)
    assert tail.torn_tail_bytes == len(b'{"ev":"ok","id":"la') and len(tail.open) == 3
    assert read_journal(tmp_path / "missing.jsonl").open == []


def test_journal_checkpoints_give_the_same_open_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    monkeypatch.setattr("draftgen.store.journal.CHECKPOINT_EVERY", 40)
    rng = random.Random(3)
    store = Store(tmp_path)
    expected: set[str] = set()
    for session in (0, 1):
        expected, pending = set(), []
        for i in range(700):
            rid = f"s{session}-{i}"
            store.journal({"ev": "sent", "id": rid, "dataset": "ds", "t": float(i),
                           "session": session})
            pending.append(rid)
            while len(pending) > 12 or (pending and rng.random() < 0.4):
                done = pending.pop(rng.randrange(len(pending)))
                ev = rng.choice(["ok", "ok", "failed", "dropped"])
                store.journal({"ev": ev, "id": done, "dataset": "ds", "t": float(i),
                               "session": session})
        expected = set(pending)
    store.close()
    path = tmp_path / "journal.jsonl"
    lines = path.read_bytes().splitlines()
    assert sum(b'"ev":"open"' in x for x in lines) > 10
    tail = read_journal(path)
    assert tail.from_checkpoint and tail.session == 1
    assert {r.id for r in tail.open} == expected and len(expected) > 0
    plain = tmp_path / "plain.jsonl"  # the same journal as an older writer left it
    plain.write_bytes(b"".join(x + b"\n" for x in lines if b'"ev":"open"' not in x))
    counted = read_journal(plain)
    assert not counted.from_checkpoint and {r.id for r in counted.open} == expected


# ---- status on runs written through the store ------------------------------------------------


def _direct_counts(root: Path, name: str) -> dict[str, Any]:
    raw = (root / name / "responses.jsonl").read_bytes()
    records = [orjson.loads(x) for x in raw[: raw.rfind(b"\n") + 1].splitlines()]
    seen: dict[str, dict[str, Any]] = {}
    for r in records:
        seen.setdefault(r["id"], r)
    fails: dict[str, str] = {}
    fpath = root / name / "failures.jsonl"
    if fpath.exists():
        for x in fpath.read_bytes().splitlines():
            row = orjson.loads(x)
            fails[row["id"]] = row["kind"]
    return {
        "done": len(seen),
        "failed": Counter(k for i, k in fails.items() if i not in seen),
        "output_tokens": sum(len(r["output_ids"]) for r in seen.values()),
        "cost": sum(r.get("cost_usd") or 0 for r in seen.values()),
        "truncated": sum(r.get("finish_reason") == "length" for r in seen.values()),
        "not_exact": sum(r.get("token_check") != "exact" for r in seen.values()),
        "by_backend": Counter(r.get("backend") for r in seen.values()),
    }


def test_status_counts_equal_the_files_and_write_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for i in range(60):
        store.append_record("ds", _record(i))
    store.append_record("ds", _record(3))  # a duplicate line: counted once
    for rid, kind in (("ds/1", "timeout"), ("ds/100", "timeout"), ("ds/100", "bad_request"),
                      ("ds/101", "server_error")):
        store.append_failure("ds", {"id": rid, "kind": kind, "created_at": 2000.0})
    for ev, rid in (("sent", "ds/59"), ("sent", "ds/102"), ("sent", "ds/100"),
                    ("failed", "ds/100")):
        store.journal({"ev": ev, "id": rid, "dataset": "ds", "t": 1500.0, "session": 0})
    store.close()
    _run_json(tmp_path, {"ds": 70})
    with open(tmp_path / "ds" / "responses.jsonl", "ab") as f:
        f.write(b'{"id":"ds/torn","output_ids":[1,')
    before = _snapshot(tmp_path)
    st = collect_status(tmp_path, now=3000.0)
    assert _snapshot(tmp_path) == before
    d, direct = st.datasets["ds"], _direct_counts(tmp_path, "ds")
    assert d.sums.answers == direct["done"] == 60 and d.duplicates == 1
    assert d.failed_by_kind == direct["failed"] == {"bad_request": 1, "server_error": 1}
    assert d.out_of_attempts == 1  # ds/100 failed twice, max_attempts 2
    assert d.sums.output_tokens == direct["output_tokens"]
    assert d.sums.cost == pytest.approx(direct["cost"])
    assert (d.truncated, d.not_exact) == (direct["truncated"], direct["not_exact"])
    assert {k: v.answers for k, v in d.by_backend.items()} == direct["by_backend"]
    assert set(d.by_provider) == {"-", "Alpha/fp8"}
    assert d.in_flight == 1  # ds/102: ds/59 was answered, ds/100 ended
    assert (d.total, d.skipped, d.pending) == (70, 1, 70 - 60 - 2 - 1)
    assert d.torn_tail_bytes == {"responses.jsonl": len(b'{"id":"ds/torn","output_ids":[1,')}
    assert any("torn last line" in n for n in st.notes)
    data = st.as_json()
    for key in ("done", "failed", "skipped", "pending", "in_flight", "output_tokens",
                "cost_usd", "by_backend"):
        assert key in data["datasets"]["ds"] and key in data["total"]
    assert set(data["datasets"]["ds"]["by_backend"]["paid"]) == {"done", "output_tokens",
                                                                 "cost_usd"}
    assert data["total"]["done"] == 60 and data["in_flight_ids"] == ["ds/102"]
    # rates: answers at t=1000..1059; the run is not live, so the window ends at the last
    # activity (the failures at t=2000); the whole-run span is the session's
    assert data["total"]["rates"]["run"]["seconds"] == pytest.approx(2000.0 - 950.0)
    json.dumps(data)


def test_older_schema_and_unknown_totals_are_reported(tmp_path: Path) -> None:
    old = {"id": "ds/old", "dataset": "ds", "output_ids": [1, 2]}  # no times, backend, check
    Store(tmp_path).append_record("ds", old)
    st = collect_status(tmp_path)
    d = st.datasets["ds"]
    assert d.sums.answers == 1 and d.old_schema == 1 and d.total is None and d.pending is None
    assert any("older record schema" in n for n in st.notes)
    assert any("totals unknown" in n for n in st.notes)


def test_not_a_run_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StatusError, match="not a draftgen run folder"):
        collect_status(tmp_path)
    with pytest.raises(StatusError, match="not a folder"):
        collect_status(tmp_path / "missing")
    proc = subprocess.run([sys.executable, "-m", "draftgen", "status", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a draftgen run folder" in proc.stderr


# ---- real runs: live, stopped, killed ---------------------------------------------------------


def _status_json(run_dir: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "draftgen", "status", str(run_dir), "--json"],
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return orjson.loads(proc.stdout)


def _done_ids(run_dir: Path) -> set[str]:
    return {r["id"] for r in read_records(run_dir, "d")}


def _journal_open(run_dir: Path) -> set[str]:
    """In flight, counted directly: sent in the last session, not ended, not answered."""
    events = [orjson.loads(x) for x in (run_dir / "journal.jsonl").read_bytes().splitlines()
              if x.endswith(b"}")]
    last = max(e["session"] for e in events)
    sent = Counter(e["id"] for e in events if e["session"] == last and e["ev"] == "sent")
    ended = Counter(e["id"] for e in events if e["session"] == last and e["ev"] != "sent")
    return {i for i in sent if sent[i] > ended[i]} - _done_ids(run_dir)


@pytest.mark.slow
def test_status_on_a_live_then_killed_then_stopped_run(tmp_path: Path, qwen3_dir: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(400))
    run_dir = tmp_path / "run"
    responses = run_dir / "d" / "responses.jsonl"
    with TestServer(latency_s=0.4) as server:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url, concurrency=16)],
            datasets=[{"name": "d", "path": str(data)}], fsync_interval_s=0)
        run = [sys.executable, "-m", "draftgen", "run", str(cfg), "--no-live"]
        proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_lines(responses, 30)
            # live: between the files before and after the call
            low = len(_done_ids(run_dir))
            live = _status_json(run_dir)
            high = len(_done_ids(run_dir))
            assert live["live"] and live["pid"] == proc.pid
            assert low <= live["total"]["done"] <= high
            assert live["datasets"]["d"]["total"] == 400
            assert 0 < live["total"]["in_flight"] <= 16
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        killed = collect_status(run_dir).as_json()
        assert not killed["live"] and killed["pid"] is None
        assert killed["total"]["done"] == len(_done_ids(run_dir))
        assert killed["total"]["in_flight"] == len(_journal_open(run_dir)) > 0
        assert set(killed["in_flight_ids"]) == _journal_open(run_dir)
        assert killed["total"]["pending"] == 400 - killed["total"]["done"]
        # a second session, stopped gracefully: nothing left in flight
        proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_lines(responses, killed["total"]["done"] + 20)
        subprocess.run([sys.executable, "-m", "draftgen", "stop", str(run_dir)], check=True,
                       capture_output=True, timeout=60)
        assert proc.wait(timeout=60) == 0
    stopped = collect_status(run_dir).as_json()
    assert stopped["total"]["done"] == len(_done_ids(run_dir))
    assert stopped["total"]["in_flight"] == 0 == len(_journal_open(run_dir))
    assert stopped["sessions"] == 2 and stopped["last_outcome"] == "stopped"
    text = subprocess.run([sys.executable, "-m", "draftgen", "status", str(run_dir), "--wide"],
                          capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and "not running" in text.stdout and "local" in text.stdout
