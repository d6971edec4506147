"""What the reliability tests share: a test server in its own process, `draftgen` as a
subprocess, and the invariants a run folder must keep whatever happened to the run."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, run_config, write_config

DRAFTGEN = [sys.executable, "-m", "draftgen"]
JSONL_FILES = ("responses.jsonl", "failures.jsonl", "index.jsonl")


# ---- the test server in its own process --------------------------------------------------


class ServerProcess:
    """`python -m draftgen.testing.fake_engine` in its own process (so that the run under test
    and the server do not share a GIL, and a kill of one leaves the other alone)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "draftgen.testing.fake_engine", "--port", "0", *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, **(self.env or {})})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING "):
            self.proc.kill()
            raise RuntimeError(f"test server did not start: {line!r}")
        self.url = line.split()[1]
        return self

    def stats(self, timeout: float = 10.0) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/stats?bodies=0", timeout=timeout) as resp:
            return orjson.loads(resp.read())

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- draftgen as a subprocess --------------------------------------------------------------


def draftgen(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
             **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DRAFTGEN, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, **kw)


def start_run(cfg: Path, *extra: str, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*DRAFTGEN, "run", str(cfg), "--no-live", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})


@functools.cache
def has_command(*words: str) -> bool:
    """Whether `draftgen WORDS... --help` exists (commands colleagues may still be adding)."""
    return draftgen(*words, "--help", timeout=60).returncode == 0


@functools.cache
def has_option(option: str, *words: str) -> bool:
    proc = draftgen(*words, "--help", timeout=60, env={"COLUMNS": "200"})
    return proc.returncode == 0 and option in proc.stdout


@functools.cache
def no_probe() -> tuple[str, ...]:
    """`--no-probe` where `draftgen run` probes backends first: tests whose subject is not the
    probe keep their request counts and fault sequences their own."""
    return ("--no-probe",) if has_option("--no-probe", "run") else ()


def wait_until(predicate: Any, timeout: float, what: str, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout}s")


def line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def prompt_rows(n: int, tag: str = "p") -> list[dict[str, Any]]:
    return [{"id": f"{tag}{i}", "messages": [
        {"role": "user", "content": f"Question {tag}{i}: say something about {i}."}]}
        for i in range(n)]


def merge_config(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`a` with `b`'s keys over it, nested mappings merged key by key."""
    out = dict(a)
    for k, v in b.items():
        out[k] = (merge_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict)
                  else v)
    return out


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


# ---- what a run folder must always hold -------------------------------------------------------


@dataclass
class FolderCheck:
    """The state of a run folder, read without trusting anything in it."""

    answered: dict[str, list[str]] = field(default_factory=dict)
    """dataset -> answered IDs in file order (duplicates kept, to be counted)."""
    failed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    corrupt: list[str] = field(default_factory=list)
    """'file:line: why' for every line that is not a whole JSON object."""

    def ids(self, dataset: str) -> set[str]:
        return set(self.answered.get(dataset, []))

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for ids in self.answered.values() for n in Counter(ids).values()
                   if n > 1)

    def failed_kinds(self, dataset: str) -> Counter[str]:
        return Counter(f["kind"] for f in self.failed.get(dataset, []))


def _lines(path: Path) -> Iterator[tuple[int, bytes | None]]:
    data = path.read_bytes()
    if not data:
        return
    lines = data.split(b"\n")
    torn = lines.pop() or None
    yield from enumerate(lines, 1)
    if torn is not None:
        yield len(lines) + 1, None


def check_folder(run_dir: Path, *, extra_files: Sequence[str] = ("journal.jsonl",)
                 ) -> FolderCheck:
    """Every line of every JSONL file in the run folder parses as an object; answers and
    failures are read back."""
    out = FolderCheck()
    paths = [p for p in sorted(run_dir.glob("*/*.jsonl")) if p.name in JSONL_FILES]
    paths += [run_dir / name for name in extra_files if (run_dir / name).exists()]
    for path in paths:
        rel = path.relative_to(run_dir)
        for n, line in _lines(path):
            if line is None:
                out.corrupt.append(f"{rel}:{n}: no newline at the end (torn)")
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                out.corrupt.append(f"{rel}:{n}: {e}")
                continue
            if not isinstance(obj, dict):
                out.corrupt.append(f"{rel}:{n}: not an object")
                continue
            dataset = path.parent.name
            if path.name == "responses.jsonl":
                if not (isinstance(obj.get("id"), str) and isinstance(obj.get("output_ids"), list)
                        and all(isinstance(t, int) for t in obj["output_ids"])):
                    out.corrupt.append(f"{rel}:{n}: not a record")
                    continue
                out.answered.setdefault(dataset, []).append(obj["id"])
            elif path.name == "failures.jsonl":
                out.failed.setdefault(dataset, []).append(obj)
    return out


def index_matches_data(run_dir: Path, dataset: str) -> bool:
    """The index's IDs and offsets agree with the data file (after a run has repaired it)."""
    data = (run_dir / dataset / "responses.jsonl").read_bytes()
    ends, offset = [], 0
    for line in data.splitlines(keepends=True):
        offset += len(line)
        ends.append((orjson.loads(line)["id"], offset))
    index = [orjson.loads(x) for x in (run_dir / dataset / "index.jsonl").read_bytes().splitlines()]
    return [(e["id"], e["end"]) for e in index] == ends


def all_bytes(*folders: Path) -> Iterator[tuple[Path, bytes]]:
    for folder in folders:
        if folder.is_file():
            yield folder, folder.read_bytes()
            continue
        for p in folder.rglob("*"):
            if p.is_file():
                with contextlib.suppress(OSError):
                    yield p, p.read_bytes()


@dataclass
class Base:
    """A run folder answered in full by a test server that is still up."""
    server: TestServer
    root: Path
    data: Path
    run_dir: Path
    cfg: dict[str, Any]


@contextlib.contextmanager
def completed_run(root: Path, qwen3_dir: Path, rows: Sequence[dict[str, Any]], *,
                  latency_s: float, tokens: tuple[int, int], max_tokens: int) -> Iterator[Base]:
    """`rows` answered by a local SGLang-style test server (reasoning and content each of
    `tokens` tokens) into ROOT/run; the server stays up while the context is open."""
    data = write_jsonl(root / "d.jsonl", rows)
    with TestServer(latency_s=latency_s, reasoning_tokens=tokens, content_tokens=tokens
                    ) as server:
        path = write_config(root, qwen3_dir, backends=[
            fast_backend("local", "sglang", server.url, concurrency=8)],
            datasets=[{"name": "d", "path": str(data)}], sampling={"max_tokens": max_tokens})
        assert run_config(path).status == "completed"
        yield Base(server, root, data, root / "run", yaml.safe_load(path.read_text()))
