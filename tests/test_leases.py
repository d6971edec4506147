"""One budget shared by the shards of a run: the pool, the leases, and shard processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from draftgen.budget import (
    STALE_S,
    USD,
    BudgetPool,
    FilePool,
    Ledger,
    PoolError,
    PoolOp,
    PoolState,
    PriceWatch,
    ShardLease,
    tokens_key,
)
from draftgen.config import load_config
from draftgen.config.backends import Price
from draftgen.run import Runner, prepare
from draftgen.store.shards import ShardSpec, run_folders
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import fast_backend, read_records, write_config
from tests.shard_helpers import (
    SERVER,
    assert_each_answered_once,
    run_records,
    run_shard_processes,
    sharded_config,
    spend,
    uneven_rows,
    worst_case_usd,
)

T = TypeVar("T")
NOW = 1_000_000.0


class MemoryPool(BudgetPool):
    """The pool's state in this process: the lease logic without a file or an actor."""

    def __init__(self) -> None:
        self.state = PoolState()
        self.now = NOW

    async def apply(self, op: PoolOp[T]) -> T:
        return op(self.state, now=self.now)


def _pool(total: float, shards: int, resource: str = USD) -> PoolState:
    state = PoolState()
    for i in range(shards):
        state.adopt(f"{i}-of-{shards}", {resource: total}, {}, now=NOW)
    return state


def _held(state: PoolState, resource: str = USD) -> float:
    return sum(lease.held.get(resource, 0.0) for lease in state.leases.values())


# ---- the pool's state ------------------------------------------------------------------------


def test_a_slice_is_what_was_asked_but_at_most_a_fair_share() -> None:
    state = _pool(10.0, 4)
    big = state.take("0-of-4", USD, committed=0, need=0.1, want=8.0, settling=False, now=NOW)
    assert big.granted and big.held == pytest.approx(2.5)  # 10 left over 4 live shards
    small = state.take("1-of-4", USD, committed=0, need=0.1, want=1.0, settling=False, now=NOW)
    assert small.held == pytest.approx(1.0)
    # a need above the fair share is still granted while the pool has it
    huge = state.take("2-of-4", USD, committed=0, need=5.0, want=5.0, settling=False, now=NOW)
    assert huge.granted and huge.held == pytest.approx(5.0)
    assert state.free(USD) == pytest.approx(1.5)
    # growing a lease counts what the shard already committed
    again = state.take("1-of-4", USD, committed=0.9, need=0.5, want=0.5, settling=False, now=NOW)
    assert again.held == pytest.approx(1.4) and state.free(USD) == pytest.approx(1.1)


def test_a_denied_shard_gives_back_what_it_cannot_use_and_stops_only_when_nobody_may_give(
) -> None:
    state = _pool(1.0, 2)
    state.take("0-of-2", USD, committed=0, need=0.6, want=0.6, settling=False, now=NOW)
    state.take("1-of-2", USD, committed=0, need=0.3, want=0.3, settling=False, now=NOW)
    # shard 1 spent 0.25 of its 0.3; needs 0.2 more: only 0.05 + 0.1 free
    denied = state.take("1-of-2", USD, committed=0.25, need=0.2, want=0.2, settling=False,
                        now=NOW)
    assert not denied.granted and denied.held == pytest.approx(0.25)
    assert denied.others_busy  # shard 0 is live and not waiting: it may give back
    assert state.free(USD) == pytest.approx(0.15)
    # shard 0 finishes having spent 0.5: its 0.1 goes back and shard 1 gets its request
    state.release("0-of-2", {USD: 0.5}, now=NOW)
    granted = state.take("1-of-2", USD, committed=0.25, need=0.2, want=0.2, settling=False,
                         now=NOW)
    assert granted.granted and granted.held == pytest.approx(0.45)
    assert not granted.others_busy


def test_shards_that_all_wait_all_stop() -> None:
    state = _pool(1.0, 2)
    state.take("0-of-2", USD, committed=0, need=0.6, want=0.6, settling=False, now=NOW)
    state.take("1-of-2", USD, committed=0, need=0.3, want=0.3, settling=False, now=NOW)
    # both spent their lease and need 0.3 more: 0.1 is free
    a = state.take("0-of-2", USD, committed=0.6, need=0.3, want=0.3, settling=False, now=NOW)
    b = state.take("1-of-2", USD, committed=0.3, need=0.3, want=0.3, settling=False, now=NOW)
    assert not a.granted and not b.granted
    assert a.others_busy  # shard 1 had not asked yet
    assert not b.others_busy  # shard 0 waits with nothing in flight: nobody may give
    again = state.take("0-of-2", USD, committed=0.6, need=0.3, want=0.3, settling=False, now=NOW)
    assert not again.others_busy
    assert state.free(USD) == pytest.approx(0.1)  # less than one request: the bound


def test_a_shard_with_requests_in_flight_is_not_waiting() -> None:
    state = _pool(1.0, 2)
    state.take("0-of-2", USD, committed=0.9, need=0.3, want=0.3, settling=True, now=NOW)
    b = state.take("1-of-2", USD, committed=0.0, need=0.3, want=0.3, settling=False, now=NOW)
    assert not b.granted and b.others_busy  # shard 0's requests may settle below their worst


def test_a_dead_lease_is_not_waited_for_and_its_restart_reconciles_with_disk() -> None:
    state = _pool(10.0, 2)
    state.take("0-of-2", USD, committed=0, need=1, want=4, settling=False, now=NOW)
    later = NOW + STALE_S + 1
    b = state.take("1-of-2", USD, committed=0, need=9, want=9, settling=False, now=later)
    assert not b.granted and not b.others_busy  # shard 0 was killed: nobody waits for it
    assert state.free(USD) == pytest.approx(6.0)  # its slice is stranded until it restarts
    held = state.adopt("0-of-2", {USD: 10.0}, {USD: 1.25}, now=later)  # 1.25 on its disk
    assert held == {USD: 1.25} and state.free(USD) == pytest.approx(8.75)


def test_token_slices_are_whole_tokens() -> None:
    key = tokens_key("d")
    state = _pool(1000, 3, key)
    take = state.take("0-of-3", key, committed=0, need=64, want=10_000, settling=False, now=NOW)
    assert take.held == 333


def test_the_pool_never_grants_more_than_the_total() -> None:
    rng = random.Random(7)
    shards = [f"{i}-of-4" for i in range(4)]
    state = _pool(5.0, 4)
    committed = dict.fromkeys(shards, 0.0)
    for _ in range(2000):
        shard = rng.choice(shards)
        action = rng.random()
        if action < 0.05:
            state.release(shard, {USD: committed[shard]}, now=NOW)
        elif action < 0.08:
            state.adopt(shard, {USD: 5.0}, {USD: committed[shard]}, now=NOW)
        else:
            take = state.take(shard, USD, committed=committed[shard], need=rng.uniform(0, 0.2),
                              want=rng.uniform(0, 1), settling=rng.random() < 0.3, now=NOW)
            if take.granted:  # spend part of what the request was granted
                committed[shard] += rng.uniform(0, take.held - committed[shard])
        assert _held(state) <= 5.0 + 1e-9
    assert sum(committed.values()) <= 5.0 + 1e-9


def test_a_file_pool_keeps_its_state_and_names_a_bad_file(tmp_path: Path) -> None:
    pool = FilePool(tmp_path)
    asyncio.run(pool.adopt("0-of-2", {USD: 2.0}, {USD: 0.5}))
    take = asyncio.run(pool.take("0-of-2", USD, committed=0.5, need=0.1, want=1.0,
                                 settling=False))
    assert take.held == pytest.approx(1.5)
    assert FilePool(tmp_path).read().leases["0-of-2"].held == {USD: pytest.approx(1.5)}
    (tmp_path / "budget_pool.json").write_text('{"totals": {"usd": "lots"}}')
    with pytest.raises(PoolError, match=r"budget_pool\.json: not a budget pool.*totals\.usd"):
        asyncio.run(pool.heartbeat("0-of-2"))


def _grab(root: str, shard: str, rounds: int, seed: int) -> float:
    """A shard process that spends everything it is granted, in small requests."""
    pool = FilePool(Path(root))
    rng = random.Random(seed)
    committed = pool.apply_now(partial(PoolState.adopt, shard=shard, totals={USD: 3.0},
                                       spent={}))[USD]
    for _ in range(rounds):
        need = rng.uniform(0.001, 0.05)
        take = pool.apply_now(partial(PoolState.take, shard=shard, resource=USD,
                                      committed=committed, need=need, want=need * 4,
                                      settling=False))
        if take.granted:
            committed = take.held
    return committed


@pytest.mark.slow
def test_a_file_pool_shared_by_four_processes_hands_out_the_total_once(tmp_path: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(4) as workers:
        spent = workers.starmap(_grab, [(str(tmp_path), f"{i}-of-4", 150, i) for i in range(4)])
    state = FilePool(tmp_path).read()
    assert sum(spent) == pytest.approx(_held(state))
    assert 3.0 - 0.05 <= sum(spent) <= 3.0 + 1e-9  # all of it, less than one request left


# ---- a shard's lease and its ledger ----------------------------------------------------------


def _lease(tmp_path: Path, qwen3_dir: Path, budget: dict, shard: ShardSpec | None,
           pool: BudgetPool, **dataset: int) -> ShardLease | None:
    cfg = load_config(write_config(tmp_path, qwen3_dir, backends=[
        fast_backend("or", "openrouter", "http://127.0.0.1:9", concurrency=8)],
        datasets=[{"name": "d", "path": str(tmp_path / "d.jsonl"), **dataset}], budget=budget))
    ledger = Ledger(usd=cfg.budget.usd, usd_per_minute=cfg.budget.usd_per_minute)
    ledger.add_dataset("d", dataset.get("max_output_tokens"), spent_tokens=0)
    return ShardLease.for_run(cfg, shard, ledger, pool)


def test_unsharded_runs_and_runs_without_budgets_have_no_lease(tmp_path: Path,
                                                              qwen3_dir: Path) -> None:
    pool = MemoryPool()
    assert _lease(tmp_path, qwen3_dir, {"usd": 1.0}, None, pool) is None
    assert _lease(tmp_path, qwen3_dir, {"usd_per_minute": 0.4}, ShardSpec(0, 4), pool) is None
    lease = _lease(tmp_path, qwen3_dir, {"usd": 1.0, "usd_per_minute": 0.4}, ShardSpec(1, 4),
                   pool)
    assert lease is not None and lease.ledger.usd_per_minute == pytest.approx(0.1)


def test_a_shard_ledger_admits_what_its_lease_holds_and_grows_it(tmp_path: Path,
                                                                qwen3_dir: Path) -> None:
    price = Price(prompt=1_000_000, completion=0)  # $1 per prompt token
    pool = MemoryPool()
    lease = _lease(tmp_path, qwen3_dir, {"usd": 20.0}, ShardSpec(0, 2), pool)
    assert lease is not None

    async def scenario() -> None:
        await lease.adopt([])
        ledger = lease.ledger
        assert ledger.usd == 0.0
        first = ledger.admit("d", 10, 2, PriceWatch(price))
        assert first.exhausted and first.worst_usd == 2.0
        assert await lease.more_usd(first.worst_usd, first.settling)
        assert ledger.usd == pytest.approx(16.0)  # concurrency 8 × $2, under the fair share
        for _ in range(8):
            assert ledger.admit("d", 10, 2, PriceWatch(price)).reservation is not None
        await lease.release()

    asyncio.run(scenario())
    # nothing settled: the 8 reservations count as spent, the rest went back
    assert pool.state.free(USD) == pytest.approx(4.0)
    assert pool.state.leases["0-of-2"].done


def test_a_shard_token_lease_tops_up_towards_a_full_request(tmp_path: Path,
                                                           qwen3_dir: Path) -> None:
    pool = MemoryPool()
    lease = _lease(tmp_path, qwen3_dir, {}, ShardSpec(0, 2), pool, max_output_tokens=3000)
    assert lease is not None

    async def scenario() -> None:
        await lease.adopt([])
        ledger = lease.ledger
        assert ledger.max_tokens_for("d", 512) is None
        await lease.more_tokens("d", 512)
        assert ledger.max_tokens_for("d", 512) == 512  # 3000 / 1 live shard, not 8 × 512
        assert ledger.datasets["d"].max_output_tokens == 3000
        pool.state.adopt("1-of-2", lease.totals, {}, now=NOW)  # the other shard starts
        for used in (512, 512, 512, 512, 512, 400):
            ledger.settle(ledger.admit("d", used, 10, None).reservation, used, 0)
        assert ledger.max_tokens_for("d", 512) is None  # 40 left: below a useful answer
        await lease.more_tokens("d", 512)
        assert ledger.max_tokens_for("d", 512) is None
        assert lease.others_busy(tokens_key("d"))  # shard 1 may still give some back
        assert pool.state.free(tokens_key("d")) == 40  # denied: the 40 went back to the pool
        await lease.release()

    asyncio.run(scenario())
    assert pool.state.leases["0-of-2"].held == {tokens_key("d"): 2960}


# ---- shard processes sharing the run folder's pool ---------------------------------------------


@pytest.mark.slow
def test_four_shard_processes_answer_every_prompt_once_within_a_shared_budget(
    tmp_path: Path, qwen3_dir: Path
) -> None:
    rows = uneven_rows([15, 15, 15, 15])
    with TestServer(latency_s=0.02, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=1.0,
                                concurrency=4)
        statuses = run_shard_processes(config, 4)
    assert all(s.startswith("completed") for s in statuses), statuses
    records = run_records(tmp_path / "run")
    assert_each_answered_once(records, rows)
    state = FilePool(tmp_path / "run").read()
    assert all(lease.done for lease in state.leases.values())
    # every shard gave back what it did not spend: the pool holds exactly the spend
    assert state.free(USD) == pytest.approx(1.0 - spend(records), abs=1e-9)


@pytest.mark.slow
def test_four_shard_processes_spend_the_budget_to_within_one_request(
    tmp_path: Path, qwen3_dir: Path
) -> None:
    # shard 0 has 3 prompts: it finishes early, and must not keep the slice it took
    rows = uneven_rows([3, 100, 100, 100])  # no shard alone finishes within the budget
    budget = 0.02  # ~50 answers of ~$0.0004; one request's worst case ~$0.0008
    with TestServer(latency_s=0.05, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=budget,
                                concurrency=4)
        statuses = run_shard_processes(config, 4, first_answers=1)
    records = run_records(tmp_path / "run")
    spent, worst = spend(records), worst_case_usd(records)
    print(f"\nfile pool: budget ${budget}, spent ${spent:.6f} in {len(records)} answers, "
          f"unspent {(budget - spent) / worst:.2f} × one request's worst case (${worst:.6f})")
    assert statuses[0].startswith("completed"), statuses
    assert all(s.startswith("budget") for s in statuses[1:]), statuses
    assert spent <= budget + 1e-9  # billed as priced: no overshoot
    assert spent >= budget - worst  # and less than one request's worst case left unspent
    assert len({r["id"] for r in records}) == len(records)


@pytest.mark.slow
def test_four_shard_processes_share_a_token_budget(tmp_path: Path, qwen3_dir: Path) -> None:
    rows = uneven_rows([3, 40, 40, 40])
    budget = 6000  # ~40 answers of ~140 tokens; max_tokens 300
    with TestServer(latency_s=0.05, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=None,
                                concurrency=4, max_output_tokens=budget)
        statuses = run_shard_processes(config, 4)
    records = run_records(tmp_path / "run")
    spent = sum(len(r["output_ids"]) for r in records)
    print(f"\nfile pool: token budget {budget}, spent {spent} in {len(records)} answers, "
          f"{sum(r['finish_reason'] == 'length' for r in records)} cut to what was left")
    assert all(s.startswith("completed") for s in statuses), statuses  # skipped, not stopped
    assert budget - 64 < spent <= budget  # less than one useful answer (64 tokens) left
    assert len({r["id"] for r in records}) == len(records) < len(rows)


@pytest.mark.slow
def test_an_unsharded_run_after_shards_counts_their_spend(tmp_path: Path, qwen3_dir: Path
                                                          ) -> None:
    """Shard 0 of 2 spends part of the budget; the run then goes on unsharded (no pool): the
    budget is the whole run's, so the shard's spend counts against it."""
    rows = uneven_rows([20, 60])
    budget = 0.02  # shard 0's 20 answers spend ~$0.008; the 60 left would need ~$0.024
    with TestServer(latency_s=0.02, **SERVER) as server:
        config = sharded_config(tmp_path, qwen3_dir, server.url, rows, budget_usd=budget,
                                concurrency=4)
        cfg = load_config(config)
        shard = asyncio.run(Runner(prepare(cfg, shard=ShardSpec(0, 2))).execute())
        rest = asyncio.run(Runner(prepare(cfg)).execute())
    assert (shard.status, rest.status) == ("completed", "budget"), rest.message
    records = [r for folder in run_folders(tmp_path / "run") for r in read_records(folder, "d")]
    spent, worst = spend(records), worst_case_usd(records)
    assert spent <= budget + 1e-9  # the shard's spend was counted: no overshoot
    assert spent >= budget - worst
    assert len({r["id"] for r in records}) == len(records) < len(rows)
