from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import orjson
import pytest

from draftgen.store import RunLayout, RunLock, RunLocked, Store, lock_holder, scan_dataset
from draftgen.store.appender import JsonlAppender, StoreError


def _record(i: int) -> dict:
    return {"id": f"ds/{i}", "dataset": "ds", "output_ids": list(range(i % 7))}


def test_records_are_whole_lines_and_ids_read_back(tmp_path: Path) -> None:
    store = Store(tmp_path, fsync_interval_s=0)
    for i in range(50):
        store.append_record("ds", _record(i))
    store.append_record("ds", {"id": 'ds/"quoted"\\id', "dataset": "ds"})
    store.close()
    lines = RunLayout(tmp_path).responses("ds").read_bytes().splitlines()
    assert [orjson.loads(x)["id"] for x in lines[:50]] == [f"ds/{i}" for i in range(50)]
    on_disk, torn = scan_dataset(RunLayout(tmp_path), "ds")
    assert torn == []
    assert on_disk.done == {f"ds/{i}" for i in range(50)} | {'ds/"quoted"\\id'}
    assert on_disk.bad_lines == 0 and on_disk.duplicates == 0


def test_torn_tail_is_cut_and_kept_aside(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    store = Store(tmp_path)
    for i in range(3):
        store.append_record("ds", _record(i))
    store.close()
    path = layout.responses("ds")
    with open(path, "ab") as f:
        f.write(b'{"id":"ds/99","dataset":"ds","output_ids":[1,2')  # kill -9 mid-line
    on_disk, torn = scan_dataset(layout, "ds")
    assert [t.bytes_cut for t in torn] == [len(b'{"id":"ds/99","dataset":"ds","output_ids":[1,2')]
    assert on_disk.done == {"ds/0", "ds/1", "ds/2"}
    assert path.read_bytes().endswith(b"\n")
    assert all(orjson.loads(x) for x in path.read_bytes().splitlines())
    assert b"ds/99" in layout.torn("ds").read_bytes()
    # appending after the cut keeps the file valid
    store = Store(tmp_path)
    store.append_record("ds", _record(99))
    store.close()
    assert scan_dataset(layout, "ds")[0].done == {"ds/0", "ds/1", "ds/2", "ds/99"}


def test_duplicates_and_foreign_lines_are_counted(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    store = Store(tmp_path)
    store.append_record("ds", _record(1))
    store.append_record("ds", _record(1))
    store.close()
    with open(layout.responses("ds"), "ab") as f:
        f.write(b'{"not_a_record": true}\n')
    on_disk, _ = scan_dataset(layout, "ds")
    assert on_disk.done == {"ds/1"}
    assert on_disk.duplicates == 1
    assert on_disk.bad_lines == 1


def test_failed_attempts_are_counted_per_id(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for kind in ("rate_limited", "timeout"):
        store.append_failure("ds", {"id": "ds/1", "kind": kind})
    store.append_failure("ds", {"id": "ds/2", "kind": "timeout"})
    store.close()
    on_disk, _ = scan_dataset(RunLayout(tmp_path), "ds")
    assert on_disk.failed_attempts == {"ds/1": 2, "ds/2": 1}
    assert on_disk.failure_kinds == {"timeout": 2, "rate_limited": 1}


def test_unwritable_file_is_a_clear_store_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores permission bits; a path under a regular file fails for everyone
        target = tmp_path / "file" / "responses.jsonl"
        (tmp_path / "file").write_text("x")
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        target = tmp_path / "ro" / "responses.jsonl"
    with pytest.raises(StoreError, match=r"responses\.jsonl"):
        JsonlAppender(target)


def test_failed_write_leaves_no_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    app = JsonlAppender(path)
    app.append({"id": "a"})
    os.close(app._fd)
    app._fd = os.open("/dev/full", os.O_WRONLY)  # every write fails with ENOSPC
    with pytest.raises(StoreError, match="write failed"):
        app.append({"id": "b"})
    assert path.read_bytes() == b'{"id":"a"}\n'


def _hold_lock(path: str, ready: multiprocessing.synchronize.Event) -> None:
    RunLock(Path(path)).acquire()
    ready.set()
    time.sleep(60)


def test_lock_refuses_a_second_run_and_a_dead_holder_is_taken_over(tmp_path: Path) -> None:
    lock_path = tmp_path / "lock"
    ready = multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold_lock, args=(str(lock_path), ready))
    holder.start()
    try:
        assert ready.wait(10)
        assert lock_holder(lock_path)["pid"] == holder.pid
        with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
            RunLock(lock_path).acquire()
    finally:
        holder.kill()  # like kill -9: the kernel drops the flock
        holder.join()
    assert lock_holder(lock_path) is None
    lock = RunLock(lock_path)
    lock.acquire()
    assert lock.took_over_stale
    assert lock_holder(lock_path)["pid"] == os.getpid()
    lock.release()
    assert lock_holder(lock_path) is None


def test_a_damaged_run_json_is_set_aside_never_replaced(tmp_path: Path) -> None:
    """Damaged twice in one second: both damaged files kept; the session count goes on from
    the journal's last session."""
    from draftgen.store.runjson_writer import RunJsonDamaged, read_run_json, start_session

    path = tmp_path / "run.json"
    (tmp_path / "journal.jsonl").write_bytes(b'{"ev":"sent","id":"a","session":2}\n')
    for bad in (b'{"sessions": [', b"\x00garbage"):
        path.write_bytes(bad)
        with pytest.raises(RunJsonDamaged, match=r"run\.json: damaged.*`draftgen run`"):
            read_run_json(path)
        index = start_session(path, {"k": 1}, {})
    kept = sorted(p.read_bytes() for p in tmp_path.glob("run.json.damaged-*"))
    assert kept == sorted([b'{"sessions": [', b"\x00garbage"])
    assert index == 3 and read_run_json(path)["config"] == {"k": 1}
