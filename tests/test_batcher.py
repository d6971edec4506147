"""`OffLoopBatcher`: single calls batched, each batch run in a worker thread or on the event
loop, as `in_thread` says for that batch; the tokenizers say which suits them."""

from __future__ import annotations

import asyncio
import threading
from itertools import pairwise
from pathlib import Path

import pytest

from draftgen.testing.assets import deepseek_r1_tokenizer_dir
from draftgen.tokenize import FastTokenizer, OffLoopBatcher, Tokenizer, load_tokenizer


class Recorder:
    """A batch function that notes each batch's items and thread."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.threads: list[int] = []
        self.fail_on = fail_on

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        self.threads.append(threading.get_ident())
        if self.fail_on in items:
            raise ValueError(f"bad item {self.fail_on}")
        return [i * 10 for i in items]


async def _call_all(batcher: OffLoopBatcher[int, int], items: range) -> list[int | str]:
    results = await asyncio.gather(*(batcher(i) for i in items), return_exceptions=True)
    return [r if isinstance(r, int) else f"{type(r).__name__}: {r}" for r in results]


@pytest.mark.parametrize("in_thread", [True, False])
def test_every_caller_gets_its_own_result_in_batches(in_thread: bool) -> None:
    fn = Recorder()

    async def main() -> tuple[list[int | str], int]:
        batcher = OffLoopBatcher(fn, max_batch=4, in_thread=lambda: in_thread)
        return await _call_all(batcher, range(10)), threading.get_ident()

    results, loop_thread = asyncio.run(main())
    assert results == [i * 10 for i in range(10)]
    assert [len(b) for b in fn.batches] == [4, 4, 2]
    assert sorted(i for b in fn.batches for i in b) == list(range(10))
    on_loop = [t == loop_thread for t in fn.threads]
    assert on_loop == [not in_thread] * 3


def test_the_choice_is_asked_for_each_batch() -> None:
    fn = Recorder()
    answers = iter([False, True, False])

    async def main() -> int:
        batcher = OffLoopBatcher(fn, max_batch=3, in_thread=lambda: next(answers))
        assert await _call_all(batcher, range(9)) == [i * 10 for i in range(9)]
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert [t == loop_thread for t in fn.threads] == [True, False, True]


def test_the_loop_runs_between_batches_run_on_it() -> None:
    fn = Recorder()
    events: list[str] = []

    def batch(items: list[int]) -> list[int]:
        events.append(f"batch {items}")
        return fn(items)

    async def ticker() -> None:
        for _ in range(10):
            events.append("tick")
            await asyncio.sleep(0)

    async def main() -> None:
        batcher = OffLoopBatcher(batch, max_batch=2, in_thread=lambda: False)
        await asyncio.gather(_call_all(batcher, range(6)), ticker())

    asyncio.run(main())
    batches = [i for i, e in enumerate(events) if e.startswith("batch")]
    assert len(batches) == 3
    assert all("tick" in events[a:b] for a, b in pairwise(batches))


@pytest.mark.parametrize("in_thread", [True, False])
def test_a_failed_item_fails_its_caller_only(in_thread: bool) -> None:
    """The batch with the bad item is run again one item at a time: its neighbours get their
    results, only the bad item's caller its error."""
    fn = Recorder(fail_on=5)

    async def main() -> list[int | str]:
        return await _call_all(OffLoopBatcher(fn, max_batch=4, in_thread=lambda: in_thread),
                               range(10))

    results = asyncio.run(main())
    assert results == [0, 10, 20, 30, 40, "ValueError: bad item 5", 60, 70, 80, 90]
    assert fn.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [4], [5], [6], [7], [8, 9]]


def test_fast_encoder_batches_run_on_the_loop_hf_batches_in_a_thread(
        qwen3_tok: Tokenizer, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast encoder (fastokens, tiktoken) takes tens of µs per text: on the loop. HF's
    `encode_batch` releases the GIL for the whole batch: in a thread, until the fast encoder
    is ready and where there is none."""
    assert isinstance(qwen3_tok, FastTokenizer)
    qwen3_tok._fast_encoder(wait=True)
    assert not qwen3_tok.batches_gain_from_a_thread
    deepseek = load_tokenizer(deepseek_r1_tokenizer_dir())
    assert isinstance(deepseek, FastTokenizer)
    assert deepseek._fast_encoder(wait=True) is not None  # fastokens; tiktoken refuses it
    assert not deepseek.batches_gain_from_a_thread
    monkeypatch.setenv("DRAFTGEN_FASTOKENS", "0")
    monkeypatch.setenv("DRAFTGEN_TIKTOKEN", "0")
    off = load_tokenizer(qwen3_dir)
    assert isinstance(off, FastTokenizer) and off._fast_encoder(wait=True) is None
    assert off.batches_gain_from_a_thread


def test_a_run_is_prepared_with_its_tables_built(tmp_path: Path, qwen3_dir: Path) -> None:
    """`prepare` starts building the fast encoder (the run waits for it before its first
    request, see `test_the_first_request_waits_for_the_fast_encoder`).
    A logprob backend builds its spelling tables when given the vocabulary, before the first
    request, not on the first answer (which held up every answer in flight). A copy of the
    tokenizer file, so that no encoder built earlier in this process is reused."""
    from draftgen.backends import make_backend
    from draftgen.config import load_config
    from draftgen.run import prepare
    from tests.e2e_helpers import fast_backend, write_config, write_jsonl

    tokenizer = tmp_path / "tok" / "tokenizer.json"
    tokenizer.parent.mkdir()
    tokenizer.write_bytes((qwen3_dir / "tokenizer.json").read_bytes())
    row = {"id": "a", "messages": [{"role": "user", "content": "Hi"}]}
    data = write_jsonl(tmp_path / "p.jsonl", [row])
    cfg = load_config(write_config(
        tmp_path, tokenizer, [fast_backend("b", "openrouter", "http://127.0.0.1:9",
                                           logprobs=True)],
        [{"name": "d", "path": str(data)}]))
    plan = prepare(cfg)
    assert isinstance(plan.tokenizer, FastTokenizer)
    assert plan.tokenizer._fast_build is not None  # started
    plan.tokenizer.warm_up()
    assert not plan.tokenizer.batches_gain_from_a_thread  # the fast encoder is ready
    assert plan.tokenizer._spelling_to_id is None
    backend = make_backend(cfg.backends[0], cfg.model, cfg.sampling)
    backend.use_vocabulary(plan.tokenizer)
    assert plan.tokenizer._spelling_to_id is not None


def test_the_first_request_waits_for_the_fast_encoder(
        tmp_path: Path, qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder is built beside the run's start (here made to take 0.5 s more) and the
    first request goes out once it is ready: every answer then goes through it."""
    import time

    from draftgen.testing.fake_engine import ServerStats, TestServer
    from tests.e2e_helpers import fast_backend, read_records, run_config, write_config, write_jsonl

    built_at: list[float] = []
    received_at: list[float] = []
    build = FastTokenizer._build_fast_encoder

    def slow_build(self: FastTokenizer) -> None:
        time.sleep(0.5)
        build(self)
        built_at.append(time.monotonic())

    received = ServerStats.received

    def stamped(self: ServerStats, body: object) -> None:
        received_at.append(time.monotonic())
        received(self, body)

    monkeypatch.setattr(FastTokenizer, "_build_fast_encoder", slow_build)
    monkeypatch.setattr(ServerStats, "received", stamped)
    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Hi {i}"}]}
            for i in range(20)]
    with TestServer(mode="openrouter") as server:
        outcome = run_config(write_config(
            tmp_path, qwen3_dir, [fast_backend("b", "openrouter", server.url)],
            [{"name": "d", "path": str(write_jsonl(tmp_path / "p.jsonl", rows))}]))
    assert outcome.status == "completed"
    assert len(built_at) == 1 and received_at and min(received_at) >= built_at[0]
    assert len(read_records(tmp_path / "run", "d")) == 20
