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

- `breakdown`: inside one process, with `draftgen.runner`'s own functions timed: imports, config,
  tokenizer (load + self-check), reading each dataset (`iter_prompts`), `Runner._resume()` (the
  scan of each dataset's index and failures, and the queue building), and the rest of
  `Runner.execute()` up to `_dispatch` (the lock, run.json, backends): "ready" is the moment
  `_dispatch` is entered;
- `first request`: `draftgen run RUN.yaml --no-live --no-probe` against the loopback test
  server, from the process start until the server has received its first chat request.

Target: ready in <= 5 s.

    /work/venv/bin/python bench/resume_ready.py [--answers 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

# ---- the breakdown child ----------------------------------------------------------------------


def child_breakdown(config: Path, started: float) -> dict[str, Any]:
    """Runs in a fresh process; `started` is the parent's time.time() at spawn."""
    phases: dict[str, float] = {"process_start": time.time() - started}
    t = time.perf_counter()
    import draftgen.datasets as datasets_mod
    import draftgen.runner as runner_mod
    from draftgen.config import load_config
    phases["imports"] = time.perf_counter() - t

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    def timed_iter(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = list(fn(*a, **kw))
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
            return iter(out)
        return wrapper

    ready: dict[str, float] = {}

    async def dispatch(self: Any, slots: Any) -> None:
        ready["t"] = time.perf_counter()
        self._stopping = True  # ready: send nothing

    runner_mod.load_tokenizer = timed("tokenizer_load", runner_mod.load_tokenizer)
    runner_mod.self_check = timed("tokenizer_self_check", runner_mod.self_check)
    runner_mod.iter_prompts = timed_iter("datasets_read", datasets_mod.iter_prompts)
    runner_mod.Runner._resume = timed("resume_scan_and_queues", runner_mod.Runner._resume)
    runner_mod.Runner._dispatch = dispatch

    t = time.perf_counter()
    cfg = load_config(config)
    phases["config"] = time.perf_counter() - t
    t_prepare = time.perf_counter()
    plan = runner_mod.prepare(cfg)
    phases["prepare"] = time.perf_counter() - t_prepare
    runner = runner_mod.Runner(plan, live_display=False)
    import asyncio

    t_exec = time.perf_counter()
    outcome = asyncio.run(runner.execute())
    phases["execute_to_dispatch"] = ready["t"] - t_exec
    phases["ready_in_process"] = ready["t"] - t  # from config load on
    phases["ready_from_spawn"] = phases["process_start"] + phases["imports"] + ready["t"] - t
    queued = sum(len(q) for q in runner.queues.values())
    done = sum(c.done_before for c in runner.counters.datasets.values())
    return {"phases": phases, "queued": queued, "done_before": done, "status": outcome.status}


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--answers", type=int, default=1_000_000)
    p.add_argument("--pending", type=float, default=0.05)
    p.add_argument("--repeat", type=int, default=3)
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
        with common.test_server(["--mode", "openrouter"]) as url:
            config = common.run_config(base, url, datasets, concurrency=2000)
            best: dict[str, Any] | None = None
            for _ in range(args.repeat):
                r = common.run_child([sys.executable, __file__, "--child", str(config),
                                      "--started", repr(time.time())])
                r["wall_s"] = r.pop("process_wall_s")
                if best is None or (r["phases"]["ready_from_spawn"]
                                    < best["phases"]["ready_from_spawn"]):
                    best = r
            assert best is not None
            first_request = min(_first_request(config, url) for _ in range(args.repeat))
        ph = best["phases"]
        print(f"resume of {best['done_before']:,} answers, {best['queued']:,} prompts queued; "
              f"best of {args.repeat}; peak RSS {best['peak_rss_mb']:.0f} MB:")
        for key in ("process_start", "imports", "config", "tokenizer_load",
                    "tokenizer_self_check", "datasets_read", "resume_scan_and_queues",
                    "execute_to_dispatch", "ready_from_spawn"):
            print(f"  {key:<24} {ph.get(key, 0.0):6.2f} s")
        verdict = "met" if first_request <= 5 else "MISSED"
        print(f"  `draftgen run` start → first request at the server: {first_request:.2f} s "
              f"(target ≤ 5 s: {verdict})", flush=True)
        print(orjson.dumps({**best, "first_request_s": first_request}).decode())
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
