"""Process-level tuning for a run with thousands of requests in flight: the event loop and the
cyclic garbage collector."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

RUN_GC_GEN0 = 50_000


@contextlib.contextmanager
def tuned_gc(gen0: int = RUN_GC_GEN0) -> Iterator[None]:
    """Collect the youngest generation every `gen0` allocations instead of 700, for the
    duration of a run; everything already loaded (tokenizer tables, prompts) is frozen out of
    the collector's reach.

    Answers in flight are trees of short-lived dicts and lists (a chat answer with logprobs is
    some 5,000 objects). At 2,000 in flight, the default threshold makes the collector re-scan
    the same live answers again and again: it took over half of the event loop's time on
    logprob answers (bench/client_throughput.py). Reference counting frees them as before; the
    collector is only needed for cycles, and still runs."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(gen0, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`; on uvloop's event loop instead when the environment says
    DRAFTGEN_UVLOOP=1 (and uvloop is installed: the optional extra `draftgen[fast]`).

    asyncio's own loop is the default because it was the faster one with draftgen's full
    pipeline: at 2,000 requests in flight, 7-12 % more answers/s and 10-12 % less CPU per answer
    than uvloop in all three variants, three passes each (bench/client_throughput.py,
    docs/benchmarks.md). Earlier figures that favoured uvloop were taken against a benchmark
    server that stalled."""
    if os.environ.get("DRAFTGEN_UVLOOP", "0") == "1":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)
