"""`draftgen run`: datasets → scheduler → backends → format → store, crash-safe and resumable.

Every answer is appended to its dataset's responses.jsonl as soon as it arrives; re-running
on the same folder skips completed IDs, retries failed ones (up to `max_attempts`), and cuts a
torn last line left by a kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftgen.backends import Backend, make_backend
from draftgen.config import RunConfig
from draftgen.datasets import LoadStats, iter_prompts
from draftgen.formats import Format, get_format
from draftgen.progress import DatasetCounters, ProgressDisplay, RunCounters
from draftgen.scheduler import BackendSlots, NoBackendLeft, send_with_retries
from draftgen.store import RunLock, Store, StoreError, scan_dataset
from draftgen.store.runinfo import end_session, start_session
from draftgen.tokenize import OffLoopBatcher, Tokenizer, load_tokenizer, self_check
from draftgen.types import BackendError, Prompt, RawAnswer, Rebuilt

log = logging.getLogger("draftgen")


@dataclass
class DatasetPlan:
    name: str
    prompts: list[Prompt]
    load: LoadStats


@dataclass
class Plan:
    cfg: RunConfig
    tokenizer: Tokenizer
    fmt: Format
    datasets: list[DatasetPlan] = field(default_factory=list)


def prepare(cfg: RunConfig) -> Plan:
    """Load the tokenizer, check it against the format, read every dataset. Sends nothing."""
    tokenizer = load_tokenizer(cfg.model.tokenizer)
    fmt = get_format(cfg.model.format, tokenizer)
    self_check(tokenizer, fmt.special_tokens())
    plan = Plan(cfg=cfg, tokenizer=tokenizer, fmt=fmt)
    for ds in cfg.datasets:
        stats = LoadStats()
        prompts = list(iter_prompts(ds, stats))
        plan.datasets.append(DatasetPlan(ds.name, prompts, stats))
    return plan


class StopRequested(Exception):
    pass


@dataclass
class Outcome:
    status: str
    """"completed", "stopped", "aborted", or "failed"."""
    message: str = ""
    counters: RunCounters | None = None

    @property
    def exit_code(self) -> int:
        return {"completed": 0, "stopped": 0, "aborted": 130}.get(self.status, 1)


class Runner:
    def __init__(self, plan: Plan, *, live_display: bool | None = None) -> None:
        self.plan = plan
        self.cfg = plan.cfg
        self.root = Path(self.cfg.output_dir)
        self.store = Store(self.root, self.cfg.fsync_interval_s)
        self.counters = RunCounters()
        self.live_display = live_display
        self.queue: deque[Prompt] = deque()
        self._stopping = False
        self._aborting = False
        self._fatal: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._render = OffLoopBatcher(self.plan.fmt.render_prompts, max_batch=128)
        self._rebuild = OffLoopBatcher(self.plan.fmt.rebuild_batch, max_batch=128)

    # ---- set-up ------------------------------------------------------------------------

    def _resume(self) -> None:
        """Queue every prompt not yet answered and not out of attempts."""
        for ds in self.plan.datasets:
            on_disk, _ = scan_dataset(self.store.layout, ds.name)
            counters = DatasetCounters(total=len(ds.prompts))
            for prompt in ds.prompts:
                if prompt.id in on_disk.done:
                    counters.done_before += 1
                elif on_disk.failed_attempts[prompt.id] >= self.cfg.max_attempts:
                    counters.exhausted += 1
                else:
                    self.queue.append(prompt)
            self.counters.datasets[ds.name] = counters
            if counters.done_before or counters.exhausted:
                log.info("%s: resuming: %d done, %d out of attempts, %d to go", ds.name,
                         counters.done_before, counters.exhausted, counters.pending)

    # ---- the run -----------------------------------------------------------------------

    async def execute(self) -> Outcome:
        lock = RunLock(self.store.layout.lock)
        lock.acquire()
        if lock.took_over_stale:
            log.warning("%s: previous run did not exit cleanly; resuming", self.root)
        session = start_session(self.store.layout.run_json, self.cfg.redacted(), {
            "path": str(self.plan.tokenizer.path), "sha256": self.plan.tokenizer.sha256,
        })
        outcome = Outcome("failed", "interrupted")
        try:
            self._resume()
            outcome = await self._run_backends()
        finally:
            self.store.close()
            end_session(self.store.layout.run_json, session, outcome.status, self._summary())
            lock.release()
        outcome.counters = self.counters
        return outcome

    async def _run_backends(self) -> Outcome:
        backends = [make_backend(b, self.cfg.model, self.cfg.sampling) for b in self.cfg.backends]
        for b in backends:
            await b.start()
        display = ProgressDisplay(self.counters, live=self.live_display)
        display_task = asyncio.create_task(display.run())
        self._install_signal_handlers()
        try:
            await self._dispatch(BackendSlots(backends))
        except NoBackendLeft as e:
            self._fatal = str(e)
        finally:
            self._remove_signal_handlers()
            display_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await display_task
            for b in backends:
                await b.close()
        return self._outcome()

    def _outcome(self) -> Outcome:
        if self._fatal:
            self.counters.status = "failed"
            return Outcome("failed", self._fatal)
        if self._aborting:
            self.counters.status = "aborted"
            return Outcome("aborted", "stopped at once; answers in flight were dropped")
        if self._stopping:
            self.counters.status = "stopped"
            return Outcome("stopped", "stopped; answers in flight were saved")
        self.counters.status = "completed"
        return Outcome("completed")

    async def _dispatch(self, slots: BackendSlots) -> None:
        while (self.queue or self._tasks) and not self._stopping:
            if not self.queue:
                await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                backend = await slots.acquire()
            except NoBackendLeft:
                await self._drain()
                raise
            if self._stopping:
                slots.release(backend)
                break
            prompt = self.queue.popleft()
            self.counters.datasets[prompt.dataset].in_flight += 1
            task = asyncio.create_task(self._answer(prompt, backend, slots))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await self._drain()

    async def _drain(self) -> None:
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _answer(self, prompt: Prompt, backend: Backend, slots: BackendSlots) -> None:
        counters = self.counters.datasets[prompt.dataset]
        started = time.monotonic()
        try:
            input_ids = await self._render(prompt)
            raw, retries = await send_with_retries(
                backend, prompt, input_ids, self.cfg.sampling.max_tokens
            )
            rebuilt = await self._rebuild(raw)
            record = make_record(prompt, input_ids, raw, rebuilt, backend.name,
                                 time.monotonic() - started, retries)
            self.store.append_record(prompt.dataset, record)
            self._count_answer(counters, raw, rebuilt)
        except BackendError as e:
            self._on_failure(prompt, backend, slots, e, counters)
        except StoreError as e:
            self._fatal = str(e)
            self._stopping = True
            log.error("%s; stopping dispatch, everything written so far is kept", e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug must not take the other 1,999 requests down with it
            log.exception("%s: unexpected error", prompt.id)
            self._write_failure(prompt, backend, "internal_error", f"{type(e).__name__}: {e}",
                                None, counters)
        finally:
            counters.in_flight -= 1
            slots.release(backend)

    def _count_answer(self, counters: DatasetCounters, raw: RawAnswer, rebuilt: Rebuilt) -> None:
        counters.done += 1
        counters.output_tokens += len(rebuilt.output_ids)
        counters.reasoning_tokens += raw.usage.reasoning_tokens or 0
        counters.cost += raw.usage.cost or 0.0
        counters.truncated += raw.finish_reason == "length"
        counters.not_exact += rebuilt.token_check != "exact"

    def _on_failure(self, prompt: Prompt, backend: Backend, slots: BackendSlots,
                    e: BackendError, counters: DatasetCounters) -> None:
        if e.permanent_for_backend:
            # Not the prompt's fault: give it to another backend.
            slots.disable(backend, str(e))
            self.queue.appendleft(prompt)
            return
        if e.usage and e.usage.cost:
            counters.cost += e.usage.cost
        self._write_failure(prompt, backend, e.kind, e.message, e.status, counters)

    def _write_failure(self, prompt: Prompt, backend: Backend, kind: str, message: str,
                       status: int | None, counters: DatasetCounters) -> None:
        counters.failed += 1
        counters.failure_kinds[kind] += 1
        try:
            self.store.append_failure(prompt.dataset, {
                "id": prompt.id, "dataset": prompt.dataset, "backend": backend.name,
                "kind": kind, "status": status, "message": message,
                "created_at": round(time.time(), 3),
            })
        except StoreError as err:
            self._fatal = str(err)
            self._stopping = True

    # ---- stopping ------------------------------------------------------------------------

    def request_stop(self, now: bool = False) -> None:
        if now or self._stopping:
            self._aborting = True
            self._stopping = True
            self.counters.status = "aborting"
            for task in list(self._tasks):
                task.cancel()
            return
        self._stopping = True
        self.counters.status = "stopping (waiting for requests in flight; Ctrl-C again aborts)"
        log.warning("stop requested: no new requests; waiting for %d in flight",
                    len(self._tasks))

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self.request_stop)
            loop.add_signal_handler(signal.SIGTERM, self.request_stop)
            loop.add_signal_handler(signal.SIGUSR1, lambda: self.request_stop(now=True))

    def _remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)

    def _summary(self) -> dict[str, Any]:
        t = self.counters.total()
        return {"done_now": t.done, "failed_now": t.failed, "done_total": t.done_before + t.done,
                "total": t.total, "output_tokens_now": t.output_tokens,
                "cost_usd_now": round(t.cost, 6)}


def make_record(prompt: Prompt, input_ids: list[int], raw: RawAnswer, rebuilt: Rebuilt,
                backend: str, latency_s: float, retries: int) -> dict[str, Any]:
    """One line of responses.jsonl. "id" must stay the first key (see store.resume)."""
    flags = list(rebuilt.flags)
    if raw.prompt_ids is not None and raw.prompt_ids != input_ids:
        flags.append("prompt_ids_differ_from_engine")
        input_ids = raw.prompt_ids  # what the engine actually saw
    record: dict[str, Any] = {
        "id": prompt.id,
        "dataset": prompt.dataset,
        "messages": prompt.messages,
    }
    if prompt.tools:
        record["tools"] = prompt.tools
    record.update({
        "input_ids": input_ids,
        "output_ids": rebuilt.output_ids,
        "token_source": rebuilt.token_source,
        "token_check": rebuilt.token_check,
        "flags": flags,
        "reasoning": rebuilt.reasoning,
        "content": rebuilt.content,
        "tool_calls": rebuilt.tool_calls,
        "finish_reason": raw.finish_reason,
        "backend": backend,
        "provider": raw.provider,
        "quantization": raw.quantization,
        "model": raw.model,
        "usage": raw.usage.as_dict(),
        "request_id": raw.request_id,
        "latency_s": round(latency_s, 3),
        "retries": retries,
        "created_at": round(time.time(), 3),
    })
    return record
