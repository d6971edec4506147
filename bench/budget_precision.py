"""Budget precision: how far a run at 2,000 requests in flight goes past its budget, in units of
one request's worst case.

The loopback test server (its own process, OpenRouter mode, prices set so that it reports
`usage.cost`, 1 s latency so that 2,000 requests really are in flight) answers a dataset of N
prompts. Two runs, each through `Runner.execute()` with one backend at concurrency 2,000:

- dollars: `budget.usd` = B, the backend's configured price equal to what the server bills
  ("billed as priced"); spent = the sum of `cost_usd` over the stored answers;
- tokens: `datasets[].max_output_tokens` = T; spent = the sum of `len(output_ids)`.

One request's worst case: price(prompt tokens of the longest prompt, max_tokens) dollars, and
`max_tokens` tokens. The documented bound (src/draftgen/budget/ledger.py, docs/budgets.md): no
overshoot when billed as priced; the token budget is never exceeded. So the printed overshoot
is expected to be <= 0; "used" says how much of the budget the run got to spend.

    /work/venv/bin/python bench/budget_precision.py [--n 12000] [--usd 7] [--tokens 3000000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

PRICE = {"prompt": 1.0, "completion": 2.0}
"""USD per million tokens, both the server's bill and the configured price."""


def _run(folder: Path, url: str, dataset: Path, max_tokens: int, concurrency: int,
         dataset_extra: dict[str, Any], **top: Any) -> dict[str, Any]:
    from draftgen.config import load_config
    from draftgen.run import Runner, prepare

    config = common.run_config(
        folder, url, [{"name": "bench", "path": str(dataset), **dataset_extra}],
        concurrency=concurrency, max_tokens=max_tokens, logprobs=False,
        backend_extra={"price": PRICE}, **top)
    outcome = asyncio.run(Runner(prepare(load_config(config)), live_display=False).execute())
    records = [orjson.loads(line) for line in
               (folder / "run" / "bench" / "responses.jsonl").read_bytes().splitlines()]
    stats = orjson.loads(urllib.request.urlopen(url + "/stats?bodies=0").read())
    t = outcome.counters.total() if outcome.counters else None
    return {"status": outcome.status, "answers": len(records),
            "cost": sum(r["cost_usd"] for r in records),
            "tokens": sum(len(r["output_ids"]) for r in records),
            "max_prompt": max((len(r["input_ids"]) for r in records), default=0),
            "failed": t.failed if t else None, "skipped": t.skipped if t else None,
            "max_in_flight": stats.get("max_in_flight")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=12_000)
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--usd", type=float, default=7.0)
    p.add_argument("--tokens", type=int, default=3_000_000)
    p.add_argument("--latency", type=float, default=1.0)
    args = p.parse_args()

    from draftgen.config.backends import Price

    price = Price(**PRICE)
    common.print_machine()
    server_args = ["--mode", "openrouter", "--prices", f"{PRICE['prompt']},{PRICE['completion']}",
                   "--reasoning-tokens", "150,300", "--content-tokens", "100,200",
                   "--latency", str(args.latency)]
    print(f"{args.n:,} prompts, concurrency {args.concurrency:,}, max_tokens {args.max_tokens}, "
          f"server latency {args.latency}s, price ${PRICE['prompt']}/${PRICE['completion']} "
          "per M tokens", flush=True)
    with common.scratch("dg-budget-") as tmp:
        dataset = common.write_jsonl(tmp / "prompts.jsonl", common.prompt_rows(args.n))
        with common.test_server(server_args) as url:
            usd = _run(tmp / "usd", url, dataset, args.max_tokens, args.concurrency, {},
                       budget={"usd": args.usd})
        worst_usd = price.cost(usd["max_prompt"], args.max_tokens)
        over_usd = (usd["cost"] - args.usd) / worst_usd
        print(f"  $ budget      ${args.usd:.4f}: spent ${usd['cost']:.4f} in {usd['answers']:,} "
              f"answers ({usd['cost'] / args.usd:.1%} used), status {usd['status']}, "
              f"max in flight {usd['max_in_flight']:,}", flush=True)
        print(f"    overshoot {over_usd:+.2f} × one request's worst case (${worst_usd:.6f}); "
              f"bound: 0 ({'within' if over_usd <= 0 else 'OUTSIDE'} the bound)", flush=True)
        with common.test_server(server_args) as url:
            tok = _run(tmp / "tokens", url, dataset, args.max_tokens, args.concurrency,
                       {"max_output_tokens": args.tokens})
        over_tok = (tok["tokens"] - args.tokens) / args.max_tokens
        print(f"  token budget  {args.tokens:,}: spent {tok['tokens']:,} in {tok['answers']:,} "
              f"answers ({tok['tokens'] / args.tokens:.1%} used), {tok['skipped']:,} skipped, "
              f"max in flight {tok['max_in_flight']:,}", flush=True)
        print(f"    overshoot {over_tok:+.2f} × one request's worst case ({args.max_tokens} "
              f"tokens); bound: 0 ({'within' if over_tok <= 0 else 'OUTSIDE'} the bound)",
              flush=True)
    print(orjson.dumps({"usd": {**usd, "budget": args.usd, "worst": worst_usd,
                                "overshoot_units": over_usd},
                        "tokens": {**tok, "budget": args.tokens,
                                   "overshoot_units": over_tok}}).decode())
    return 0 if over_usd <= 0 and over_tok <= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
