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
    """`asyncio.run(main)`, on uvloop's event loop when uvloop is installed (the optional extra
    `draftgen[fast]`) and the environment does not say DRAFTGEN_UVLOOP=0.

    At 2,000 requests in flight it gave +7 % to +45 % answers/s over asyncio's own loop in the
    same run (once -1 %), at about the same CPU per answer (bench/client_throughput.py,
    docs/benchmarks.md); nothing else changes."""
    if os.environ.get("DRAFTGEN_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)
