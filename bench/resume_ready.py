"""Resume ready: how long `draftgen run` takes, on a run folder of a million answers, until it is
ready to send its first request.

The run folder is the one bench/status_audit.py generates (one generator for both benchmarks:
`status_audit.generate`): two datasets, math (60 %) and chat (40 %), responses.jsonl with its
index and the index's binary copy, failures, a journal with requests left open by a kill -9,
run.json. Beside it, one prompt file per dataset holding every answered prompt (same IDs) plus
`--pending` (default 5 %) not yet answered, so the resumed run has work to do: 1,050,000 prompts
for 1,000,000 answers by default.

Measured, each in a fresh process, page cache warm (the files were just written), best of
`--repeat`:

- `breakdown`: inside one process, with `draftgen.run`'s own functions timed: imports, config,
  tokenizer (load + self-check), reading each dataset (`load_prompt_table`: the prompt cache, or
  the full parse when there is none), `Runner._resume()` (writing the prompt cache when it was
  just built, the scan of each dataset's index and failures, and the queue building), and the
  rest of `Runner.execute()` up to `_dispatch` (the lock, run.json, backends): "ready" is the
  moment `_dispatch` is entered. Once with the prompt cache removed (the first resume after
  this change, or after the prompt files changed), then `--repeat` times with it;
- `first request`: `draftgen run RUN.yaml --no-live --no-probe` against the loopback test
  server, from the process start until the server has received its first chat request.

Both in two states of the run folder (with the prompt cache): *in step* (the data, the JSON
index and its binary copy agree, as after a graceful stop) and *after kill -9* (`simulate_kill`,
redone before each measure: the data's last `--behind` records of each dataset in neither the
JSON index nor the binary copy, the copy one row further behind, a torn record at the end of the
data), which the resume repairs. Then once, after a kill with the binary copy removed: the full
JSON repair (`read_index(repair=True)`), what every resume after a kill cost before the repair
that costs only what is behind.

Target: ready in <= 5 s.

    /work/venv/bin/python bench/resume_ready.py [--answers 1000000] [--behind 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

from draftgen.store.columns import ROW, read_rows
from draftgen.store.index import in_step
from draftgen.store.layout import CACHE, RunLayout

# ---- the breakdown child ----------------------------------------------------------------------


def child_breakdown(config: Path, started: float) -> dict[str, Any]:
    """Runs in a fresh process; `started` is the parent's time.time() at spawn."""
    phases: dict[str, float] = {"process_start": time.time() - started}
    t = time.perf_counter()
    import draftgen.datasets as datasets_mod
    import draftgen.datasets.table as table_mod
    import draftgen.run.plan as plan_mod
    import draftgen.run.resume as resume_mod
    from draftgen.config import load_config
    from draftgen.run import Runner, prepare
    phases["imports"] = time.perf_counter() - t

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    ready: dict[str, float] = {}

    async def dispatch(self: Any, slots: Any) -> None:
        ready["t"] = time.perf_counter()
        self.state.stop()  # ready: send nothing

    plan_mod.load_tokenizer = timed("tokenizer_load", plan_mod.load_tokenizer)
    plan_mod.self_check = timed("tokenizer_self_check", plan_mod.self_check)
    plan_mod.load_prompt_table = timed("datasets_read", datasets_mod.load_prompt_table)
    table_mod.write_cache = timed("prompt_cache_write", table_mod.write_cache)
    Runner._resume = timed("resume_scan_and_queues", Runner._resume)
    from_columns: list[bool] = []
    real_scan = resume_mod.scan_dataset

    def scan(*a: Any) -> Any:
        on_disk, torn = real_scan(*a)
        from_columns.append(on_disk.from_columns)
        return on_disk, torn

    resume_mod.scan_dataset = timed("index_scan", scan)
    Runner._dispatch = dispatch

    t = time.perf_counter()
    cfg = load_config(config)
    phases["config"] = time.perf_counter() - t
    t_prepare = time.perf_counter()
    plan = prepare(cfg)
    phases["prepare"] = time.perf_counter() - t_prepare
    runner = Runner(plan, live_display=False)
    import asyncio

    t_exec = time.perf_counter()
    outcome = asyncio.run(runner.execute())
    phases["execute_to_dispatch"] = ready["t"] - t_exec
    phases["ready_in_process"] = ready["t"] - t  # from config load on
    phases["ready_from_spawn"] = phases["process_start"] + phases["imports"] + ready["t"] - t
    queued = sum(len(q) for q in runner.queues.values())
    done = sum(c.done_before for c in runner.counters.datasets.values())
    return {"phases": phases, "queued": queued, "done_before": done, "status": outcome.status,
            "from_columns": from_columns}


# ---- the parent -------------------------------------------------------------------------------


def write_prompts(folder: Path, datasets: list[tuple[str, int, int]], pending: float
                  ) -> list[dict[str, Any]]:
    """One prompt file per dataset: rows "q%07d" for the answered range, then pending ones."""
    out = []
    for name, first, count in datasets:
        extra = round(count * pending)
        path = folder / f"{name}.jsonl"
        with open(path, "wb") as f:
            for g in [*range(first, first + count),
                      *range(10_000_000 + first, 10_000_000 + first + extra)]:
                f.write(orjson.dumps({"id": f"q{g:07d}", "messages": [
                    {"role": "system", "content": "You are a careful assistant."},
                    {"role": "user", "content": f"Problem {g}: prove that the sum of the first "
                                                f"{g % 1000 + 2} odd numbers is a square."}]},
                    option=orjson.OPT_APPEND_NEWLINE))
        out.append({"name": name, "path": str(path)})
    return out


def simulate_kill(root: Path, datasets: list[str], behind: int) -> None:
    """What a kill -9 commonly leaves, from an in-step run folder: in each dataset the data's
    last `behind` records in neither the JSON index nor its binary copy, the copy one row
    further behind the index, and a torn record at the end of the data."""
    layout = RunLayout(root)
    for name in datasets:
        index, columns = layout.index(name), layout.columns(name)
        if not in_step(columns, index):
            raise RuntimeError(f"{columns}: not in step with {index} before the kill")
        rows = read_rows(columns)
        os.truncate(index, int(rows["iend"][-behind - 1]))
        os.truncate(columns, (len(rows) - behind - 1) * ROW.itemsize)
        with open(layout.responses(name), "ab") as f:
            f.write(b'{"id":"' + name.encode() + b'/torn","dataset":"' + name.encode()
                    + b'","output_ids":[151644,872,198')


def _first_request(config: Path, url: str, timeout_s: float = 120) -> float:
    """Seconds from spawning `draftgen run` until the server saw its first chat request."""
    def chats() -> int:
        stats = orjson.loads(urllib.request.urlopen(url + "/stats?bodies=0").read())
        return sum(v for k, v in stats["requests"].items() if k == "chat")

    before = chats()
    draftgen = Path(sys.executable).parent / "draftgen"
    started = time.perf_counter()
    proc = subprocess.Popen([str(draftgen), "run", str(config), "--no-live", "--no-probe"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while chats() == before:
            if proc.poll() is not None:
                raise RuntimeError(f"draftgen run exited {proc.returncode}: "
                                   f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError("no request within the timeout")
            time.sleep(0.02)
        return time.perf_counter() - started
    finally:
        proc.send_signal(signal.SIGUSR1)  # stop now: drop what is in flight
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _breakdown(config: Path) -> dict[str, Any]:
    r = common.run_child([sys.executable, __file__, "--child", str(config),
                          "--started", repr(time.time())])
    r["wall_s"] = r.pop("process_wall_s")
    return r


def _best_breakdown(config: Path, repeat: int, before: Callable[[], None] | None = None
                    ) -> dict[str, Any]:
    """The fastest of `repeat` breakdowns, `before()` run ahead of each."""
    runs = []
    for _ in range(repeat):
        if before:
            before()
        runs.append(_breakdown(config))
    return min(runs, key=lambda r: r["phases"]["ready_from_spawn"])


def _best_first_request(config: Path, url: str, repeat: int,
                        before: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if before:
            before()
        times.append(_first_request(config, url))
    return min(times)


def _print_breakdown(title: str, r: dict[str, Any]) -> None:
    ph = r["phases"]
    path = "binary copy" if all(r["from_columns"]) else "JSON index"
    print(f"{title}: resume of {r['done_before']:,} answers, {r['queued']:,} prompts queued; "
          f"done IDs from the {path}; peak RSS {r['peak_rss_mb']:.0f} MB:")
    for key in ("process_start", "imports", "config", "tokenizer_load",
                "tokenizer_self_check", "datasets_read", "resume_scan_and_queues",
                "index_scan", "prompt_cache_write", "execute_to_dispatch",
                "ready_from_spawn"):
        print(f"  {key:<24} {ph.get(key, 0.0):6.2f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--answers", type=int, default=1_000_000)
    p.add_argument("--pending", type=float, default=0.05)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--behind", type=int, default=3,
                   help="records a simulated kill leaves past the index, per dataset")
    p.add_argument("--keep", type=Path, help="generate into (or reuse) this folder, keep it")
    p.add_argument("--child", type=Path)
    p.add_argument("--started", type=float)
    args = p.parse_args()
    if args.child:
        common.emit(child_breakdown(args.child, args.started))
        return 0

    import status_audit  # the colleague's generator: one run folder format for both benches

    common.print_machine()
    base = args.keep or Path(tempfile.mkdtemp(prefix="dg-resume-"))
    root = base / "run"
    try:
        counts, first = [], 0
        for i, (name, share) in enumerate(status_audit.DATASETS):
            n = (round(args.answers * share) if i < len(status_audit.DATASETS) - 1
                 else args.answers - first)
            counts.append((name, first, n))
            first += n
        if not (root / "run.json").exists():
            t = time.perf_counter()
            info = status_audit.generate(root, args.answers)
            print(f"generated {args.answers:,} answers in {time.perf_counter() - t:.0f} s "
                  f"({info.get('bytes', 0) / 1e9:.1f} GB)", flush=True)
        datasets = write_prompts(base, counts, args.pending)
        n_prompts = sum(c + round(c * args.pending) for _, _, c in counts)
        print(f"{n_prompts:,} prompts in {len(datasets)} files, "
              f"{sum((Path(d['path'])).stat().st_size for d in datasets) / 1e6:.0f} MB",
              flush=True)
        names = [name for name, _ in status_audit.DATASETS]

        def kill() -> None:
            simulate_kill(root, names, args.behind)

        def kill_without_copy() -> None:
            kill()
            for name in names:
                RunLayout(root).columns(name).unlink()

        with common.test_server(["--mode", "openrouter"]) as url:
            config = common.run_config(base, url, datasets, concurrency=2000)
            shutil.rmtree(root / CACHE, ignore_errors=True)  # the first resume builds it
            results = {
                "first": _breakdown(config),
                "in_step": _best_breakdown(config, args.repeat),
                "after_kill": _best_breakdown(config, args.repeat, kill),
                "after_kill_json": _best_breakdown(config, 1, kill_without_copy),
                "first_request_s": _best_first_request(config, url, args.repeat),
                "first_request_after_kill_s": _best_first_request(config, url, args.repeat,
                                                                  kill),
            }
        _print_breakdown("first resume: no prompt cache yet (reads the prompt files, writes "
                         "the cache)", results["first"])
        _print_breakdown(f"later resumes, in step: prompt cache; best of {args.repeat}",
                         results["in_step"])
        _print_breakdown(f"later resumes, after kill -9 ({args.behind} records behind per "
                         f"dataset); best of {args.repeat}", results["after_kill"])
        _print_breakdown("after kill -9, binary copy removed: the full JSON repair",
                         results["after_kill_json"])
        for key, label in (("first_request_s", "in step"),
                           ("first_request_after_kill_s", "after kill -9")):
            verdict = "met" if results[key] <= 5 else "MISSED"
            print(f"  `draftgen run` start → first request at the server, {label}: "
                  f"{results[key]:.2f} s (target ≤ 5 s: {verdict})", flush=True)
        print(orjson.dumps(results).decode())
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
