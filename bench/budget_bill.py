"""The bill is the truth: what a provider whose listing is not its bill charges a run with a
dollar budget, against that budget.

The loopback test server (OpenRouter mode, in this process) lists PRICE in its `/models` and
bills each answer at `factor` times it, reporting that bill in `usage.cost`. A run of N
prompts at concurrency C with `budget.usd` = B, the price taken from the listing, once without
the probe (one request in flight until the backend's first answer tells what it charges) and
once with it (the probe's requests tell it, and are paid from B). A listing of 0 is refused
before any request; declared free (`paid: false`) its reported costs are counted.

Printed per case: the server's bill, the bill over the budget, what draftgen counted, and the
documented bound for the bill: B + (factor - 1) × the worst case, at the listing, of what was
sent before anything told the factor and held without a margin: the run's first request, or
the probe's first request (the probe's others are held at 20x, as the run's are).

    .venv/bin/python bench/budget_bill.py [--n 800] [--concurrency 64] [--usd 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

PRICE = (10.0, 10.0)
"""USD per million tokens (prompt, completion), as listed."""


def _case(tmp: Path, name: str, args: argparse.Namespace, factor: float, probe: bool,
          listed: tuple[float, float] | None = None, **backend: Any) -> dict[str, Any]:
    from draftgen.config import ConfigError, load_config
    from draftgen.probe import ProbeOptions
    from draftgen.run import Runner, prepare
    from draftgen.status import collect_status
    from draftgen.store.runjson_writer import read_run_json
    from draftgen.testing.fake_engine import TestServer

    folder = tmp / name
    dataset = common.write_jsonl(folder / "prompts.jsonl", common.prompt_rows(args.n))
    with TestServer(mode="openrouter", prices=PRICE, listed_prices=listed, bill_factor=factor,
                    latency_s=args.latency, reasoning_tokens=(20, 60),
                    content_tokens=(20, 60)) as server:
        config = common.run_config(
            folder, server.url + "/api/v1", [{"name": "d", "path": str(dataset)}],
            concurrency=args.concurrency, max_tokens=args.max_tokens,
            budget={"usd": args.usd}, backend_extra=backend)
        runner_probe = ProbeOptions() if probe else None
        try:
            outcome = asyncio.run(Runner(prepare(load_config(config)), live_display=False,
                                         probe=runner_probe).execute())
            status: str = outcome.status
        except ConfigError as e:
            status = f"refused: {str(e)[:60]}…"
        bill = float(server.stats.snapshot(bodies=False)["billed_usd"])
    counted, probe_unguarded, probe_ran = 0.0, 0.0, False
    if (folder / "run" / "run.json").exists():
        st = collect_status(folder / "run")
        counted = st.total.sums.cost + st.probe_usd + st.total.cost_not_kept_usd
        session = read_run_json(folder / "run" / "run.json")["sessions"][-1]
        probe_unguarded = session.get("probe_unguarded_usd", 0.0)
        probe_ran = "probe_reserved_usd" in session
    return {"case": name, "factor": factor, "probe": probe, "status": status, "bill": bill,
            "counted": counted, "over_budget": bill / args.usd, "probe_unguarded": probe_unguarded,
            "probe_ran": probe_ran}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=800)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--usd", type=float, default=1.0)
    p.add_argument("--latency", type=float, default=0.2)
    args = p.parse_args()
    common.print_machine()
    worst = (60 + args.max_tokens) * PRICE[1] / 1e6  # the bench's prompts are < 60 tokens
    print(f"{args.n} prompts, concurrency {args.concurrency}, max_tokens {args.max_tokens}, "
          f"budget.usd ${args.usd}, listed ${PRICE[0]}/${PRICE[1]} per M tokens; one "
          f"request's worst case at the listing ≤ ${worst:.6f}", flush=True)
    print(f"{'case':<22}{'status':<12}{'bill $':>10}{'bill/budget':>13}{'counted $':>11}"
          f"{'bound $':>10}", flush=True)
    results = []
    ok = True
    with common.scratch("dg-bill-") as tmp:
        cases = [(f"{f}x{' +probe' if pr else ''}", f, pr, None, {})
                 for f in (1, 9, 15) for pr in (False, True)]
        cases += [("listing 0", 1, False, (0.0, 0.0), {}),
                  ("listing 0, paid: false", 1, False, (0.0, 0.0), {"paid": False})]
        for name, factor, probe, listed, backend in cases:
            r = _case(tmp, name.replace(" ", "_").replace(":", ""), args, factor, probe,
                      listed, **backend)
            free = backend.get("paid") is False
            # sent before the factor was known, held without a margin
            first = r["probe_unguarded"] if r["probe_ran"] else worst
            bound = args.usd + (factor - 1) * first
            held = r["bill"] <= bound + 1e-12 or free
            ok &= held and r["counted"] >= r["bill"] - 1e-9
            label = name if r["probe_ran"] or not probe else f"{name} (no room)"
            print(f"{label:<22}{r['status'][:11]:<12}{r['bill']:>10.4f}{r['over_budget']:>12.2f}x"
                  f"{r['counted']:>11.4f}{'' if free else f'{bound:.4f}':>10}", flush=True)
            results.append({**r, "bound": bound})
    print(orjson.dumps(results).decode())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
