"""llama-server processes that draftgen starts and stops itself.

A `llamacpp` backend with `model: PATH.gguf` (and no `url`) runs on a managed server:

    llama-server -m MODEL --host 127.0.0.1 --port FREE_PORT --parallel N --threads T
                 --ctx-size C [server_args...]

- N: the summed `concurrency` of the backends sharing the server (backends with the same model
  and server_args share one: a native and a chat backend on one model see one engine).
- C: N × per-slot context; per slot `max_tokens + prompt_tokens` (prompt_tokens default 4096),
  capped at the model's training context (GGUF `<arch>.context_length`).
- `--threads`: see `default_threads()`.
- `--ctx-size`/`-c`, `--parallel`/`-np`, `--threads`/`-t` in server_args win over ours;
  `--host`, `--port`, `-m` are refused.
- The log goes to `RUN_DIR/logs/llama-server-<name>.log` (appended; a header line per start).
- Ready when `GET /health` answers 200; a server that exits or is not ready within
  `startup_timeout_s` raises ManagedServerError with the log's tail. A port taken between our
  probe and the server's bind is retried on a new port.
- Stopped with SIGTERM, then SIGKILL after `stop_timeout_s`, on context exit whatever the
  reason. The server runs in its own session (a Ctrl-C at the terminal reaches draftgen, which
  stops gracefully, not the server), and on Linux it gets SIGTERM if draftgen dies without
  cleaning up (PR_SET_PDEATHSIG).

Runner use (see ManagedServers):

    async with ManagedServers(cfg.backends, run_dir=root,
                              max_tokens=cfg.sampling.max_tokens) as backend_cfgs:
        backends = [make_backend(b, cfg.model, cfg.sampling) for b in backend_cfgs]
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import aiohttp

from draftgen.assets import llama_server_binary
from draftgen.backends.llamacpp import LlamaCppConfig
from draftgen.config.backends import BackendConfig
from draftgen.errors import DraftgenError
from draftgen.store.nofollow import dataset_run, make_folders, open_file
from draftgen.tokenize import GGUFError, read_gguf_metadata

log = logging.getLogger("draftgen")

DEFAULT_PROMPT_TOKENS = 4096
_RESERVED = {"-m", "--model", "--host", "--port"}
_CTX_FLAGS = {"-c", "--ctx-size"}
_PARALLEL_FLAGS = {"-np", "--parallel"}
_THREAD_FLAGS = {"-t", "--threads"}
_BIND_ERRORS = ("couldn't bind", "address already in use", "failed to bind")


class ManagedServerError(DraftgenError):
    """A managed llama-server did not start (the message carries its log's tail)."""

    exit_code = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def model_context_length(model: Path) -> int | None:
    """`<arch>.context_length` from the GGUF metadata, if present."""
    try:
        arch = read_gguf_metadata(model, ["general.architecture"]).get("general.architecture")
        if not isinstance(arch, str):
            return None
        value = read_gguf_metadata(model, [f"{arch}.context_length"]).get(
            f"{arch}.context_length")
    except GGUFError:
        return None
    return value if isinstance(value, int) and value > 0 else None


def default_threads() -> int:
    """CPU threads for a managed server: leave one core to draftgen on small machines (up to 4
    CPUs), half the CPUs (one per physical core, assuming SMT) on bigger ones.

    Why: llama.cpp's worker threads spin at barriers; when they outnumber the free cores
    (draftgen itself, the client, other jobs) decoding collapses. Measured on 2 shared cores
    with SmolLM2, 4 slots busy: 2 threads gave 1.7 tokens/s per slot, 1 thread 22-24."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, n - 1) if n <= 4 else n // 2


def _has_flag(args: Sequence[str], flags: set[str]) -> bool:
    return any(a in flags or a.split("=", 1)[0] in flags for a in args)


def _pdeathsig_hook() -> Callable[[], None] | None:
    """A preexec_fn that asks Linux to SIGTERM the child when draftgen dies (even by SIGKILL).
    libc is loaded here, in the parent: loading a library between fork and exec can deadlock."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return hook


def tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ManagedLlamaServer:
    """One llama-server process. `start()` returns the base URL once `/health` is ready."""

    def __init__(
        self,
        model: str | Path,
        *,
        name: str,
        log_path: Path,
        parallel: int = 1,
        max_tokens: int = 4096,
        prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
        server_args: Sequence[str] = (),
        binary: str | Path | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 180.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.model = Path(model).expanduser()
        self.name = name
        self.log_path = log_path
        self.parallel = max(1, parallel)
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.server_args = list(server_args)
        self._binary = Path(binary) if binary is not None else None
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.url: str | None = None
        self.port: int | None = None
        self.ctx_size: int | None = None
        self.startup_s: float | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log_file: IO[bytes] | None = None
        bad = [a for a in self.server_args if a.split("=", 1)[0] in _RESERVED]
        if bad:
            raise ManagedServerError(
                f"llama-server {name!r}: server_args may not set {bad} (draftgen sets them)")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def command(self, port: int) -> list[str]:
        binary = self._binary or llama_server_binary()
        cmd = [str(binary), "-m", str(self.model), "--host", self.host, "--port", str(port)]
        if not _has_flag(self.server_args, _PARALLEL_FLAGS):
            cmd += ["--parallel", str(self.parallel)]
        if not _has_flag(self.server_args, _THREAD_FLAGS):
            cmd += ["--threads", str(default_threads())]
        if not _has_flag(self.server_args, _CTX_FLAGS):
            per_slot = self.max_tokens + self.prompt_tokens
            train = model_context_length(self.model)
            if train:
                per_slot = min(per_slot, train)
            self.ctx_size = per_slot * self.parallel
            cmd += ["--ctx-size", str(self.ctx_size)]
        return cmd + self.server_args

    async def start(self, attempts: int = 3) -> str:
        if self.running:
            assert self.url is not None
            return self.url
        if not self.model.is_file():
            raise ManagedServerError(f"llama-server {self.name!r}: model not found: {self.model}")
        # RUN/logs/FILE: never written through a link (store.nofollow)
        make_folders(self.log_path.parent, dataset_run(self.log_path))
        for attempt in range(1, attempts + 1):
            try:
                return await self._start_once()
            except _PortTaken:
                log.warning("llama-server %s: port taken, retrying (%d/%d)", self.name,
                            attempt, attempts)
        raise ManagedServerError(
            f"llama-server {self.name!r}: could not bind a port in {attempts} attempts; "
            f"log {self.log_path}:\n{tail(self.log_path)}")

    async def _start_once(self) -> str:
        port = free_port(self.host)
        try:
            cmd = self.command(port)
        except FileNotFoundError as e:
            raise ManagedServerError(f"llama-server {self.name!r}: {e}") from None
        started = time.monotonic()
        log_file = open_file(self.log_path, "ab", root=dataset_run(self.log_path))
        log_file.write(f"\n=== draftgen {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                       f"{shlex.join(cmd)}\n".encode())
        log_file.flush()
        offset = log_file.tell()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=log_file,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                preexec_fn=_pdeathsig_hook(),
            )
        except OSError as e:
            log_file.close()
            raise ManagedServerError(f"llama-server {self.name!r}: cannot run {cmd[0]}: {e}") \
                from None
        self._log_file = log_file
        self.port = port
        url = f"http://{self.host}:{port}"
        log.info("llama-server %s: starting (pid %d, port %d, log %s)", self.name,
                 self._proc.pid, port, self.log_path)
        try:
            await self._wait_ready(url, offset)
        except BaseException:
            await self.stop()
            raise
        self.url = url
        self.startup_s = time.monotonic() - started
        log.info("llama-server %s: ready at %s in %.1fs", self.name, url, self.startup_s)
        return url

    def _new_log_text(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    async def _wait_ready(self, url: str, offset: int) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.05
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if self._proc.returncode is not None:
                    text = self._new_log_text(offset).lower()
                    if any(e in text for e in _BIND_ERRORS):
                        await self.stop()
                        raise _PortTaken()
                    rc = self._proc.returncode
                    hint = (" (SIGILL: a binary built for another CPU; rebuild it with "
                            "scripts/build_llama_server.sh)"
                            if rc in (-signal.SIGILL, 128 + signal.SIGILL) else "")
                    raise ManagedServerError(
                        f"llama-server {self.name!r} exited with code {rc} before it was "
                        f"ready{hint}; log {self.log_path}:\n{tail(self.log_path)}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with session.get(url + "/health") as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise ManagedServerError(
                        f"llama-server {self.name!r} not ready after {self.startup_timeout_s:.0f}s"
                        f"; log {self.log_path}:\n{tail(self.log_path)}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._proc.wait(), timeout=delay)
                delay = min(delay * 2, 0.5)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after stop_timeout_s. Safe to call twice."""
        proc, self._proc = self._proc, None
        self.url = None
        try:
            if proc is not None and proc.returncode is None:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), timeout=self.stop_timeout_s)
                except TimeoutError:
                    log.warning("llama-server %s: no exit %.0fs after SIGTERM; killing",
                                self.name, self.stop_timeout_s)
                    _signal_group(proc.pid, signal.SIGKILL)
                    await proc.wait()
                log.info("llama-server %s: stopped (exit %s)", self.name, proc.returncode)
        finally:
            log_file, self._log_file = self._log_file, None
            if log_file is not None:
                log_file.close()

    async def __aenter__(self) -> ManagedLlamaServer:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


class _PortTaken(Exception):
    pass


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """The server leads its own session: signal its group (it and anything it spawned)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class ManagedServers:
    """Starts one llama-server per distinct (model, server_args) among the `llamacpp` backends
    that give `model:`; yields the backend configs with `url` filled in (others unchanged, same
    order). Every server is stopped on exit, whatever the reason; if one fails to start, those
    already started are stopped before the error propagates."""

    def __init__(
        self,
        backends: Sequence[BackendConfig],
        *,
        run_dir: str | Path,
        max_tokens: int,
        prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
        startup_timeout_s: float = 180.0,
        binary: str | Path | None = None,
    ) -> None:
        self.backends = list(backends)
        self.run_dir = Path(run_dir)
        self.servers: list[ManagedLlamaServer] = []
        self._by_key: dict[tuple[str, tuple[str, ...]], ManagedLlamaServer] = {}
        self._key_of: dict[str, tuple[str, tuple[str, ...]]] = {}
        groups: dict[tuple[str, tuple[str, ...]], list[BackendConfig]] = {}
        for b in self.backends:
            if isinstance(b, LlamaCppConfig) and b.model is not None and b.starts_own_server:
                key = (str(Path(b.model).expanduser().resolve()), tuple(b.server_args))
                groups.setdefault(key, []).append(b)
                self._key_of[b.name] = key
        for key, members in groups.items():
            name = members[0].name
            self._by_key[key] = ManagedLlamaServer(
                key[0], name=name,
                log_path=self.run_dir / "logs" / f"llama-server-{name}.log",
                parallel=sum(m.concurrency for m in members),
                max_tokens=max_tokens, prompt_tokens=prompt_tokens,
                server_args=key[1], binary=binary, startup_timeout_s=startup_timeout_s,
            )
        self.servers = list(self._by_key.values())

    async def start(self) -> list[BackendConfig]:
        try:
            for server in self.servers:
                await server.start()
        except BaseException:
            await self.stop()
            raise
        return self.resolved()

    def resolved(self) -> list[BackendConfig]:
        out = []
        for b in self.backends:
            key = self._key_of.get(b.name)
            if key is None:
                out.append(b)
                continue
            url = self._by_key[key].url
            if url is None:
                raise ManagedServerError(f"llama-server for backend {b.name!r} is not running")
            # model_copy skips validation: url + model together is fine here.
            out.append(b.model_copy(update={"url": url}))
        return out

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()

    async def __aenter__(self) -> list[BackendConfig]:
        return await self.start()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
