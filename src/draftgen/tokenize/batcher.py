"""Batched work off the event loop: `OffLoopBatcher` gathers single calls from many coroutines
into batches (a run's encodes, the test server's), and `chunked` cuts an iterable into lists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class OffLoopBatcher(Generic[T, R]):
    """Collects single calls from many coroutines into batches and runs `fn(batch)` in an
    executor thread, or on the event loop itself where a thread would only cost more.

    `tokenizers` releases the GIL once for a whole `encode_batch`: in a thread, a batch runs
    in parallel with the loop and across cores. The fast encoders (`fastokens`, `tiktoken`) and
    Python code release it for each text at most: in a thread, each text then waits for the
    busy loop to hand the GIL back (up to the 5 ms switch interval), so a batch of 128 answers
    could wait longer than the loop takes to encode them, and the hand-offs cost CPU of their
    own. `in_thread()`, asked for each batch, chooses; on the loop a batch blocks it for a few
    ms at most (128 answers at ~15 µs with fastokens, ~80 µs with tiktoken), and the loop runs
    between batches.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int = 256,
        executor: Executor | None = None,
        in_thread: Callable[[], bool] = lambda: True,
    ) -> None:
        self._fn = fn
        self._max_batch = max_batch
        self._executor = executor
        self._in_thread = in_thread
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._running = False
        self._drainer: asyncio.Task[None] | None = None

    async def __call__(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        if not self._running:
            self._running = True
            self._drainer = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                items = [item for item, _ in batch]
                try:
                    results = await self._run(loop, items)
                except Exception:  # one bad item must not fail its neighbours
                    await self._run_alone(loop, batch)
                    continue
                for (_, fut), res in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(res)
        finally:
            self._running = False

    async def _run_alone(self, loop: asyncio.AbstractEventLoop,
                         batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        """A batch that failed, run again one item at a time: each caller gets its own item's
        result or error."""
        for item, fut in batch:
            try:
                result = (await self._run(loop, [item]))[0]
            except Exception as e:
                if not fut.done():
                    fut.set_exception(e)
                continue
            if not fut.done():
                fut.set_result(result)

    async def _run(self, loop: asyncio.AbstractEventLoop, items: list[T]) -> Sequence[R]:
        if self._in_thread():
            return await loop.run_in_executor(self._executor, self._fn, items)
        await asyncio.sleep(0)  # the loop runs between batches run on it
        return self._fn(items)


def chunked(items: Iterable[T], size: int) -> Iterable[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
