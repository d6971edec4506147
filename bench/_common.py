"""Shared helpers of the benchmarks in bench/: the machine, the test server in its own process,
child processes measured with wait4 and per-thread CPU, prompt datasets, run configs. (Stored
runs of any size: `status_audit.generate`, used by status_audit.py and resume_ready.py.)

Run as a script, this module is the test-server launcher the benchmarks start::

    python bench/_common.py serve [--cache-size N] [draftgen.testing.fake_engine options]

(the server's own CLI, plus the size of its answer cache, so that a warm-up pass can leave every
answer of a benchmark cached and the server spends as little CPU as it can beside the client).
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


# ---- the machine ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """nproc, memory, CPU model, Python and key package versions."""
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {"python": platform.python_version()}
    from importlib import metadata

    for name in ("aiohttp", "orjson", "msgspec", "tokenizers", "fastokens", "tiktoken", "openai",
                 "uvloop"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return {"nproc": os.cpu_count(), "mem_gib": round(mem_gib, 1), "cpu": cpu,
            "versions": versions}


def print_machine() -> None:
    m = machine()
    vers = " ".join(f"{k} {v}" for k, v in m["versions"].items())
    print(f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem_gib']} GiB RAM; {vers}", flush=True)


# ---- the test server in its own process --------------------------------------------------------


@contextlib.contextmanager
def test_server(args: Sequence[str], cache_size: int | None = None) -> Iterator[str]:
    """Start the loopback test server in its own process; yield its URL; stop it."""
    with serving(args, cache_size) as server:
        yield server.url


class Served(NamedTuple):
    url: str
    pid: int


@contextlib.contextmanager
def serving(args: Sequence[str], cache_size: int | None = None) -> Iterator[Served]:
    """`test_server`, yielding the server's pid beside its URL (to read its CPU time)."""
    cmd = [sys.executable, str(BENCH / "_common.py"), "serve", *args]
    if cache_size:
        cmd += ["--cache-size", str(cache_size)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("LISTENING "):
            raise RuntimeError(f"test server did not start: {line!r}")
        yield Served(line.split()[1], proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serve(argv: list[str]) -> int:
    import asyncio

    from draftgen.testing import fake_engine

    cache_size = None
    if "--cache-size" in argv:
        i = argv.index("--cache-size")
        cache_size = int(argv[i + 1])
        del argv[i : i + 2]
    config = fake_engine.config_from_args(argv)
    if cache_size:
        config.cache_size = cache_size
    threading.Thread(target=_freeze_survivors, daemon=True).start()
    asyncio.run(fake_engine.serve_until_signal(config))
    return 0


def _freeze_survivors(every_s: float = 2.0) -> None:
    """In the server: move what survived the last seconds (its answer cache, tens of millions
    of objects over a run) out of the collector's reach. Otherwise every full collection
    re-scans the cache: pauses of seconds with 2,000 requests waiting, which land on whichever
    client is being measured."""
    while True:
        time.sleep(every_s)
        gc.freeze()


# ---- measured child processes -----------------------------------------------------------------


def run_child(cmd: Sequence[str], timeout_s: float = 900) -> dict[str, Any]:
    """Run a child that prints one JSON object as its last stdout line; add what wait4 says
    about it: CPU seconds (user + system, all its threads) and peak RSS in MB."""
    started = time.perf_counter()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited {proc.returncode}: {out[-2000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    result: dict[str, Any] = orjson.loads(lines[-1]) if lines else {}
    result["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    result["peak_rss_mb"] = usage.ru_maxrss / 1024  # KiB on Linux
    result["process_wall_s"] = time.perf_counter() - started
    del timeout_s
    return result


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PhaseMeter:
    """Inside a child: wall and CPU seconds (this process, all threads; with `children`, also
    the processes it started and waited for) of the measured phase."""

    def __init__(self, children: bool = False) -> None:
        self.children = children

    def _cpu_now(self) -> float:
        who = [resource.RUSAGE_SELF] + ([resource.RUSAGE_CHILDREN] if self.children else [])
        return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, who))

    def __enter__(self) -> PhaseMeter:
        self._wall = time.perf_counter()
        self._cpu = self._cpu_now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_s = self._cpu_now() - self._cpu
        self.wall_s = time.perf_counter() - self._wall


class ThreadCPU:
    """Inside a child: CPU seconds per thread (main thread vs the rest), sampled from
    /proc/self/task every 0.2 s, so that threads which end before the phase does still count."""

    def __init__(self) -> None:
        import threading

        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._self_tid = 0

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        with contextlib.suppress(OSError):
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(OSError):
                    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1]
                    parts = fields.split()
                    self._seen[int(tid)] = (int(parts[11]) + int(parts[12])) / tick

    def _loop(self) -> None:
        import threading

        self._self_tid = threading.get_native_id()
        while not self._stop.wait(0.2):
            self._sample()

    def __enter__(self) -> ThreadCPU:
        self._sample()
        self._start = dict(self._seen)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        main = os.getpid()
        used = {t: s - self._start.get(t, 0.0) for t, s in self._seen.items()
                if t != self._self_tid}
        self.main_s = used.get(main, 0.0)
        self.other_s = sum(v for t, v in used.items() if t != main)


def emit(result: dict[str, Any]) -> None:
    """A child's result: one JSON line on stdout."""
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()


# ---- datasets and configs ---------------------------------------------------------------------

_TOPICS = ("binary search trees", "the French revolution", "photosynthesis", "TCP congestion "
           "control", "Bayes' theorem", "the water cycle", "Rust lifetimes", "supply and demand",
           "plate tectonics", "Fourier transforms", "the immune system", "SQL joins")


def prompt_rows(n: int, tag: str = "") -> Iterator[dict[str, Any]]:
    """`n` distinct single-turn chat prompts of a realistic size (a few dozen tokens)."""
    for i in range(n):
        topic = _TOPICS[i % len(_TOPICS)]
        yield {"id": f"q{tag}{i}", "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer carefully."},
            {"role": "user", "content": f"Question {tag}{i}: explain {topic} to a second-year "
                                        f"student, with one worked example (variant {i % 97})."},
        ]}


def write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for row in rows:
            f.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    return path


def run_config(folder: Path, url: str, datasets: list[dict[str, Any]], *, backend_type: str =
               "openrouter", concurrency: int = 2000, logprobs: bool = False, stream: bool = False,
               max_tokens: int = 2048, **top: Any) -> Path:
    """A run.yaml: qwen3 format with the real Qwen3 tokenizer, one chat backend."""
    from draftgen.testing.assets import qwen3_tokenizer_dir

    backend = {"name": "bench", "type": backend_type, "url": url, "concurrency": concurrency,
               "logprobs": logprobs, "stream": stream, "backoff_base_s": 0.05,
               **top.pop("backend_extra", {})}
    cfg = {
        "output_dir": str(folder / "run"),
        "model": {"name": "test/qwen3", "format": "qwen3",
                  "tokenizer": str(qwen3_tokenizer_dir())},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "max_tokens": max_tokens},
        "backends": [backend],
        "datasets": datasets,
        **top,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary folder, removed afterwards (on the disk, not /dev/shm: fsync is real)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(_serve(sys.argv[2:]))
    print(__doc__)
