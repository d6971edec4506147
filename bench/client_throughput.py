"""Client throughput: draftgen's full pipeline against the raw aiohttp floor and the `openai`
SDK in a thread pool, at 2,000 requests in flight, on one machine in one run.

The loopback test server runs in its own process (answers instantly; a few hundred tokens with
reasoning). Every client runs in its own child process, measured by wait4 (peak RSS) and by
getrusage inside the child around the measured phase (CPU seconds, all threads):

- raw: aiohttp, a semaphore of CONCURRENCY, POST the very bodies draftgen sends, read the
  answer, discard it. The floor: what any asyncio client must at least spend.
- sdk: `openai.OpenAI(...).chat.completions.create` in a ThreadPoolExecutor of WORKERS threads,
  each answer written to a JSONL file (`model_dump_json`): the pattern of today's regeneration
  scripts. No tokenization (it does less work than draftgen).
- draftgen: `Runner.execute()` on a run.yaml with one openrouter backend at CONCURRENCY:
  rendering, sending, reconstruction + tokenization (or IDs from logprobs), store + index +
  journal, progress counters, budget ledger.

Variants: logprobs off, logprobs on, streaming (logprobs off). Before each variant a warm-up
pass fills the server's answer cache, so the server spends as little CPU as it can.

    /work/venv/bin/python bench/client_throughput.py [--n 20000] [--concurrency 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

SERVER_ARGS = ["--mode", "openrouter", "--reasoning-tokens", "150,300",
               "--content-tokens", "100,200"]


# ---- children ---------------------------------------------------------------------------------


def _bodies(config: Path) -> tuple[str, list[bytes]]:
    """The chat URL and the exact request bodies draftgen's backend sends for this run."""
    from draftgen.backends import make_backend
    from draftgen.config import load_config
    from draftgen.datasets import iter_prompts

    cfg = load_config(config)
    backend = make_backend(cfg.backends[0], cfg.model, cfg.sampling)
    prompts = [p for ds in cfg.datasets for p in iter_prompts(ds)]
    max_tokens = cfg.sampling.max_tokens
    return backend.url, [orjson.dumps(backend.build_body(p, max_tokens)) for p in prompts]


def child_raw(config: Path, concurrency: int) -> dict[str, Any]:
    import aiohttp

    url, bodies = _bodies(config)

    async def main() -> int:
        sem = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
        received = 0
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one(body: bytes) -> None:
                nonlocal received
                async with sem, session.post(url, data=body, headers={
                        "Content-Type": "application/json"}) as resp:
                    data = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}")
                    received += len(data)

            await asyncio.gather(*(one(b) for b in bodies))
        return received

    with common.PhaseMeter() as m:
        received = asyncio.run(main())
    return {"answers": len(bodies), "wall_s": m.wall_s, "cpu_s": m.cpu_s,
            "mb_received": received / 1e6}


def child_sdk(config: Path, workers: int) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    import httpx2
    import openai

    from draftgen.config import load_config
    from draftgen.datasets import iter_prompts

    cfg = load_config(config)
    b = cfg.backends[0]
    prompts = [p for ds in cfg.datasets for p in iter_prompts(ds)]
    client = openai.OpenAI(
        base_url=b.url.rstrip("/") + "/v1", api_key="bench", max_retries=2,
        http_client=openai.DefaultHttpxClient(limits=httpx2.Limits(
            max_connections=workers, max_keepalive_connections=workers)),
    )
    out_path = Path(cfg.output_dir) / "sdk.jsonl"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    extra = {"usage": {"include": True}, "reasoning": {"enabled": True}}
    s = cfg.sampling

    def one(prompt: Any) -> None:
        kw: dict[str, Any] = {"model": cfg.model.name, "messages": prompt.messages,
                              "max_tokens": s.max_tokens, "temperature": s.temperature,
                              "top_p": s.top_p, "extra_body": extra}
        if b.logprobs:
            kw.update(logprobs=True, top_logprobs=1)
        if b.stream:
            parts = []
            for chunk in client.chat.completions.create(stream=True, **kw):
                for choice in chunk.choices:
                    delta = choice.delta
                    parts.append((delta.content or "", (delta.model_extra or {}).get(
                        "reasoning") or ""))
            line = orjson.dumps({"id": prompt.id, "content": "".join(c for c, _ in parts),
                                 "reasoning": "".join(r for _, r in parts)}).decode()
        else:
            line = client.chat.completions.create(**kw).model_dump_json()
        with lock:
            f.write(line + "\n")

    with open(out_path, "w") as f, common.PhaseMeter() as m, ThreadPoolExecutor(workers) as pool:
        for fut in [pool.submit(one, p) for p in prompts]:
            fut.result()
    return {"answers": len(prompts), "wall_s": m.wall_s, "cpu_s": m.cpu_s, "workers": workers}


def child_draftgen(config: Path, uvloop: bool) -> dict[str, Any]:
    from draftgen.config import load_config
    from draftgen.runner import Runner, prepare

    plan = prepare(load_config(config))
    runner = Runner(plan, live_display=False)
    with common.ThreadCPU() as threads, common.PhaseMeter() as m:
        if uvloop:
            import uvloop as uv
            outcome = uv.run(runner.execute())
        else:
            outcome = asyncio.run(runner.execute())
    t = outcome.counters.total() if outcome.counters else None
    done = t.done if t else 0
    if outcome.status != "completed" or t is None or t.failed:
        raise SystemExit(f"draftgen run: {outcome.status} {outcome.message} "
                         f"failed={t.failed if t else '?'}")
    return {"answers": done, "wall_s": m.wall_s, "cpu_s": m.cpu_s,
            "not_exact": t.not_exact, "main_thread_cpu_s": threads.main_s,
            "other_threads_cpu_s": threads.other_s}


# ---- the parent -----------------------------------------------------------------------------


def _measure(kind: str, config: Path, args: argparse.Namespace, **kw: Any) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, "--config", str(config),
           "--concurrency", str(args.concurrency), "--workers", str(kw.get("workers",
                                                                            args.workers))]
    if kw.get("uvloop"):
        cmd.append("--uvloop")
    r = common.run_child(cmd)
    r["answers_s"] = r["answers"] / r["wall_s"]
    r["cpu_per_1k"] = r["cpu_s"] / r["answers"] * 1000
    return r


def _row(name: str, r: dict[str, Any], floor: dict[str, Any], pool: dict[str, Any] | None
         ) -> str:
    ratio = f"{r['answers_s'] / floor['answers_s']:.2f}× floor"
    if pool is not None:
        ratio += f", {r['answers_s'] / pool['answers_s']:.2f}× sdk"
    return (f"  {name:<22} {r['answers_s']:8.0f} answers/s  {r['cpu_per_1k']:6.2f} CPU s/1k  "
            f"peak RSS {r['peak_rss_mb']:6.0f} MB   {ratio}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--workers", type=int, default=256, help="sdk thread pool size")
    p.add_argument("--variants", default="plain,logprobs,stream")
    p.add_argument("--uvloop", action="store_true", help="also run draftgen under uvloop")
    p.add_argument("--skip-sdk", action="store_true")
    p.add_argument("--child")
    p.add_argument("--config", type=Path)
    args = p.parse_args()
    if args.child:
        if args.child == "raw":
            common.emit(child_raw(args.config, args.concurrency))
        elif args.child == "sdk":
            common.emit(child_sdk(args.config, args.workers))
        else:
            common.emit(child_draftgen(args.config, args.uvloop))
        return 0

    common.print_machine()
    print(f"{args.n:,} requests at {args.concurrency:,} in flight; sdk: ThreadPoolExecutor "
          f"({args.workers} workers); server: {' '.join(SERVER_ARGS)}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    with common.scratch("dg-bench-") as tmp, common.test_server(
            SERVER_ARGS, cache_size=args.n + 1000) as url:
        dataset = common.write_jsonl(tmp / "prompts.jsonl", common.prompt_rows(args.n))
        for variant in args.variants.split(","):
            folder = tmp / variant
            folder.mkdir()
            config = common.run_config(folder, url, [{"name": "bench", "path": str(dataset)}],
                                       logprobs=variant == "logprobs",
                                       stream=variant == "stream")
            _measure("raw", config, args)  # warm-up: fills the server's answer cache
            floor = _measure("raw", config, args)
            print(f"{variant}: {floor['mb_received'] / args.n * 1000:.0f} kB per answer",
                  flush=True)
            pool = None if args.skip_sdk else _measure("sdk", config, args)
            runs = {"draftgen": _measure("draftgen", config, args)}
            if args.uvloop:
                (folder / "run").rename(folder / "run-asyncio")
                runs["draftgen+uvloop"] = _measure("draftgen", config, args, uvloop=True)
            print(_row("raw aiohttp (floor)", floor, floor, None))
            if pool is not None:
                print(_row(f"openai SDK, {args.workers} thr", pool, floor, None))
            for name, r in runs.items():
                print(_row(name, r, floor, pool), flush=True)
            results[variant] = {"raw": floor, "sdk": pool, **runs}
    print(orjson.dumps(results).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
