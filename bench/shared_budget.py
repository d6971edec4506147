"""A dollar budget shared by N shard processes (`draftgen run CONFIG --shard I/N`): how much of it
the run spends, how often the shards ask the pool, and what one pool step costs.

The loopback test server (its own process, OpenRouter mode, billing exactly its configured price,
`--latency` seconds per answer) answers a dataset of `--n` prompts. N processes run one shard each
(`python -m draftgen run --shard I/N --no-probe --no-live`) at the same time, each with one
backend at `--concurrency`, sharing `budget.usd` through the run folder's budget_pool.json. The
budget is set to run out before the prompts do. Printed: spend against the budget, the unspent
part in units of one request's worst case (the documented bound: less than one), the pool
calls of each shard (`takes`), and the time of one `FilePool` step (lock, read, rewrite, fsync)
measured apart.

    python bench/shared_budget.py [--n 4000] [--shards 4] [--concurrency 64] [--usd 0.6]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

PRICE = {"prompt": 0.5, "completion": 2.5}
"""USD per million tokens, both the server's bill and the configured price."""


def _run_shards(config: Path, shards: int) -> float:
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "draftgen", "run", str(config), "--shard",
                               f"{i}/{shards}", "--no-probe", "--no-live"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(shards)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a shard failed: exit codes {codes}")
    return time.monotonic() - started


def _pool_step_ms(folder: Path, steps: int = 500) -> float:
    from draftgen.budget import USD, FilePool, PoolState

    pool = FilePool(folder)
    pool.apply_now(partial(PoolState.adopt, shard="0-of-1", totals={USD: 1e9}, spent={}))
    take = partial(PoolState.take, shard="0-of-1", resource=USD, committed=0.0, need=1.0,
                   want=1.0, settling=False)
    started = time.perf_counter()
    for _ in range(steps):
        pool.apply_now(take)
    return (time.perf_counter() - started) / steps * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--usd", type=float, default=0.6)
    p.add_argument("--latency", type=float, default=0.5)
    args = p.parse_args()

    from draftgen.budget import FilePool
    from draftgen.config.backends import Price
    from draftgen.store.shards import shard_folders

    common.print_machine()
    server_args = ["--mode", "openrouter", "--prices", f"{PRICE['prompt']},{PRICE['completion']}",
                   "--reasoning-tokens", "150,300", "--content-tokens", "100,200",
                   "--latency", str(args.latency)]
    with common.scratch("dg-shared-budget-") as tmp:
        dataset = common.write_jsonl(tmp / "prompts.jsonl", common.prompt_rows(args.n))
        with common.test_server(server_args) as url:
            config = common.run_config(
                tmp, url, [{"name": "bench", "path": str(dataset)}],
                concurrency=args.concurrency, max_tokens=args.max_tokens,
                backend_extra={"price": PRICE}, budget={"usd": args.usd})
            wall = _run_shards(config, args.shards)
        records = [orjson.loads(line) for folder in shard_folders(tmp / "run")
                   for line in (folder / "bench" / "responses.jsonl").read_bytes().splitlines()]
        state = FilePool(tmp / "run").read()
        step_ms = _pool_step_ms(tmp / "pool-steps")
    spent = sum(r["cost_usd"] for r in records)
    worst = Price(**PRICE).cost(max(len(r["input_ids"]) for r in records), args.max_tokens)
    unspent = (args.usd - spent) / worst
    takes = {name: lease.takes for name, lease in sorted(state.leases.items())}
    print(f"{args.shards} shards × concurrency {args.concurrency}, {args.n:,} prompts, "
          f"max_tokens {args.max_tokens}, latency {args.latency}s: {wall:.1f}s", flush=True)
    print(f"  budget ${args.usd:.4f}: spent ${spent:.4f} in {len(records):,} answers; unspent "
          f"{unspent:.2f} × one request's worst case (${worst:.6f}); bound: < 1 "
          f"({'within' if 0 <= unspent < 1 else 'OUTSIDE'})")
    print(f"  pool calls per shard: {takes}; one FilePool step {step_ms:.2f} ms")
    print(orjson.dumps({"budget": args.usd, "spent": spent, "answers": len(records),
                        "worst": worst, "unspent_units": unspent, "takes": takes,
                        "pool_step_ms": step_ms, "wall_s": wall}).decode())
    return 0 if 0 <= unspent < 1 else 1


if __name__ == "__main__":
    sys.exit(main())
