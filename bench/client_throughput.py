"""Client throughput: draftgen's full pipeline against the raw aiohttp floor and the `openai`
SDK in a thread pool, at 2,000 requests in flight, on one machine in one run.

The loopback test server runs in its own process (answers instantly; a few hundred tokens with
reasoning). Every client runs in its own child process, measured by wait4 (peak RSS) and by
getrusage inside the child around the measured phase (CPU seconds, all threads):

- raw: aiohttp, a semaphore of CONCURRENCY, POST the very bodies draftgen sends, read the
  answer, discard it. The floor: what any asyncio client must at least spend.
- read: the same loop, and each answer decoded by msgspec into its text fields (and logprob
  tokens), a stream event by event and its deltas joined (`_answer_reader`): the least any
  client must spend to hold the answer, without checking, tokenizing or storing it. Measured
  for this checkout only; draftgen's rows give their ratio to it beside the floor's.
- sdk: `openai.OpenAI(...).chat.completions.create` in a ThreadPoolExecutor of WORKERS threads,
  each answer written to a JSONL file (`model_dump_json`): the pattern of today's regeneration
  scripts, asking for logprobs the way draftgen's backend does. No tokenization (it does less
  work than draftgen).
- draftgen: `Runner.execute()` on a run.yaml with one openrouter backend at CONCURRENCY:
  rendering, sending, reconstruction + tokenization (or IDs from logprobs), store + index +
  journal, progress counters, budget ledger.
- draftgen --procs N: `draftgen run --procs N` (`scale.local.run_local`): the run as N shard
  processes sharing the concurrency; CPU of the child and of the processes it waited for, their
  start included.

answers/s is measured over each client's dispatch phase, from its first request to its last
answer (draftgen: its journal's first `sent` and last `ok` events): the rate at 2,000 in
flight. The whole pass (the floor's `asyncio.run`; draftgen's `prepare` and `Runner.execute`:
loading the tokenizer and its tables, reading the prompts, opening the run folder, closing it)
is reported beside it, with its seconds outside the dispatch phase; CPU is over the whole pass.

Variants: logprobs off, logprobs on, streaming (logprobs off). Before each variant a warm-up
pass fills the server's answer cache, so the server spends as little CPU as it can.

Every row also gives the server's CPU per 1,000 answers over that client's pass: the server is
one process, so 1,000 divided by it is the most answers/s it can serve on one CPU, the ceiling
of every client's rate (the floor's too, when it comes near it).

Before/after in one run: `--baseline-src DIR` measures the floor and draftgen a second time with
the draftgen package of DIR (the `src` folder of an earlier checkout, put first on PYTHONPATH
of those children; the floor then sends that tree's request bodies). With `--repeat R`, each
pass runs every client of both trees in turn. Each draftgen row also gives its event-loop
thread's CPU per answer ("loop").

    python bench/client_throughput.py [--n 20000] [--concurrency 2000]
        [--variants plain,logprobs,stream] [--uvloop] [--procs N] [--repeat R] [--skip-sdk]
        [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

SERVER_ARGS = ["--mode", "openrouter", "--reasoning-tokens", "150,300",
               "--content-tokens", "100,200"]


# ---- children ---------------------------------------------------------------------------------


def _bodies(config: Path) -> tuple[str, list[dict[str, Any]]]:
    """The chat URL and the exact request bodies draftgen's backend sends for this run."""
    from draftgen.backends import make_backend
    from draftgen.config import load_config
    from draftgen.datasets import iter_prompts

    cfg = load_config(config)
    backend = make_backend(cfg.backends[0], cfg.model, cfg.sampling)
    prompts = [p for ds in cfg.datasets for p in iter_prompts(ds)]
    max_tokens = cfg.sampling.max_tokens
    return backend.url, [backend.build_body(p, max_tokens) for p in prompts]


def _draftgen_src() -> str:
    """Where the child imported draftgen from (the tree under test, see --baseline-src)."""
    import draftgen

    return str(Path(draftgen.__file__).parent)


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning: str | None = None


class _Entry(msgspec.Struct, gc=False):
    token: str = ""


class _Logprobs(msgspec.Struct, gc=False):
    content: list[_Entry] | None = None


class _Choice(msgspec.Struct, gc=False):
    message: _Delta | None = None
    delta: _Delta | None = None
    logprobs: _Logprobs | None = None


class _Body(msgspec.Struct, gc=False):
    """The few fields of an answer or a stream event that the read floor decodes."""

    choices: list[_Choice] = []


def _answer_reader(stream: bool) -> Any:
    """The least any client must do to hold an answer's text (and logprob tokens): decode the
    body, or each SSE event, with msgspec into the few fields read, and join a stream's
    deltas. No checks, no tokenization, no store: the floor of reading, not of keeping."""
    decode = msgspec.json.Decoder(_Body).decode

    async def read(resp: Any) -> int:
        if not stream:
            data = await resp.read()
            decode(data)
            return len(data)
        parts: list[str] = []
        partial, size = b"", 0
        async for data in resp.content.iter_any():
            size += len(data)
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            for line in lines:
                if line.startswith(b"data: {"):
                    for choice in decode(line[6:]).choices:
                        if choice.delta is not None:
                            parts.append(choice.delta.reasoning or choice.delta.content or "")
        "".join(parts)
        return size

    return read


def child_raw(config: Path, concurrency: int, parse: bool = False) -> dict[str, Any]:
    import aiohttp

    url, built = _bodies(config)
    bodies = [orjson.dumps(b) for b in built]
    reader = _answer_reader(bool(built[0].get("stream"))) if parse else None

    async def main() -> int:
        sem = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
        received = 0
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one(body: bytes) -> None:
                nonlocal received
                async with sem:
                    window.sent()
                    async with session.post(url, data=body, headers={
                            "Content-Type": "application/json"}) as resp:
                        if resp.status != 200:
                            raise RuntimeError(f"HTTP {resp.status}")
                        received += (await reader(resp) if reader is not None
                                     else len(await resp.read()))
                        window.answered()

            await asyncio.gather(*(one(b) for b in bodies))
        return received

    window = DispatchWindow()
    with common.PhaseMeter() as m:
        received = asyncio.run(main())
    return {"answers": len(bodies), "wall_s": m.wall_s, "cpu_s": m.cpu_s,
            "dispatch_s": window.seconds(), "mb_received": received / 1e6,
            "src": _draftgen_src()}


class DispatchWindow:
    """The floor's dispatch phase: from its first request to its last answer (draftgen's is
    read from its journal, `dispatch_window`)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0

    def sent(self) -> None:
        if self.first is None:
            self.first = time.time()

    def answered(self) -> None:
        self.last = time.time()

    def seconds(self) -> float:
        return self.last - (self.first or self.last)


def dispatch_window(run_root: Path) -> float:
    """Seconds from draftgen's first request to its last answer stored, over every journal
    under `run_root` (shard folders too): the journal's first `sent` event and its last `ok`
    event, stamped when the request went out and when its record was written."""
    first, last = float("inf"), 0.0
    for journal in run_root.rglob("journal.jsonl"):
        for line in journal.read_bytes().splitlines():
            event = orjson.loads(line)
            if event.get("ev") == "sent":
                first = min(first, event["t"])
            elif event.get("ev") == "ok":
                last = max(last, event["t"])
    return last - first


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
    # The same logprob fields as draftgen's own request.
    logprob_fields = {k: v for k, v in _bodies(config)[1][0].items()
                      if k in ("logprobs", "top_logprobs")}

    def one(prompt: Any) -> None:
        window.sent()
        kw: dict[str, Any] = {"model": cfg.model.name, "messages": prompt.messages,
                              "max_tokens": s.max_tokens, "temperature": s.temperature,
                              "top_p": s.top_p, "extra_body": extra}
        kw.update(logprob_fields)
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
            window.answered()

    window = DispatchWindow()
    with open(out_path, "w") as f, common.PhaseMeter() as m, ThreadPoolExecutor(workers) as pool:
        for fut in [pool.submit(one, p) for p in prompts]:
            fut.result()
    return {"answers": len(prompts), "wall_s": m.wall_s, "cpu_s": m.cpu_s,
            "dispatch_s": window.seconds(), "workers": workers}


def child_draftgen(config: Path, uvloop: bool) -> dict[str, Any]:
    from draftgen.config import load_config

    try:
        from draftgen.run import Runner, prepare
    except ImportError:  # a --baseline-src tree from before draftgen.run (issue 26)
        from draftgen.runner import Runner, prepare  # type: ignore[no-redef]

    cfg = load_config(config)
    with common.ThreadCPU() as threads, common.PhaseMeter() as m:
        # `prepare` is in the pass: it loads the tokenizer and builds its tables (since
        # session 8 before the run starts, not on a thread beside it) and reads the prompts.
        runner = Runner(prepare(cfg), live_display=False)
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
            "dispatch_s": dispatch_window(Path(cfg.output_dir)), "not_exact": t.not_exact,
            "main_thread_cpu_s": threads.main_s, "other_threads_cpu_s": threads.other_s,
            "src": _draftgen_src()}


def child_draftgen_procs(config: Path, procs: int) -> dict[str, Any]:
    """`draftgen run --procs N`: N shard processes, started and waited for by this child."""
    import math

    from draftgen.config import load_config
    from draftgen.scale.local import run_local
    from draftgen.status import collect_status

    with common.PhaseMeter(children=True) as m:
        code = run_local(config, procs=procs, probe=None, progress_every_s=math.inf)
    if code != 0:
        raise SystemExit(f"draftgen run --procs {procs}: exit code {code}")
    root = Path(load_config(config).output_dir)
    status = collect_status(root)
    return {"answers": status.total.sums.answers, "wall_s": m.wall_s, "cpu_s": m.cpu_s,
            "dispatch_s": dispatch_window(root), "procs": procs, "src": _draftgen_src()}


# ---- the parent -----------------------------------------------------------------------------


def _measure(kind: str, config: Path, args: argparse.Namespace, *, uvloop: bool = False,
             src: Path | None = None) -> dict[str, Any]:
    """One child run; `src`: import draftgen from that tree instead (PYTHONPATH). Each
    draftgen run starts on an empty output folder (else it would resume a finished run)."""
    cmd = [sys.executable, __file__, "--child", kind, "--config", str(config),
           "--concurrency", str(args.concurrency), "--workers", str(args.workers),
           "--procs", str(args.procs)]
    if uvloop:
        cmd.append("--uvloop")
    if src is not None:
        cmd = ["env", f"PYTHONPATH={src}", *cmd]  # env execs python: wait4 still measures it
    if kind in ("draftgen", "procs"):
        shutil.rmtree(config.parent / "run", ignore_errors=True)
    server_cpu_s = common.process_cpu_s(args.server_pid)
    r = common.run_child(cmd)
    r["server_cpu_s"] = common.process_cpu_s(args.server_pid) - server_cpu_s
    r["answers_s"] = r["answers"] / r["dispatch_s"]
    r["pass_answers_s"] = r["answers"] / r["wall_s"]
    r["cpu_per_1k"] = r["cpu_s"] / r["answers"] * 1000
    return r


def _row(name: str, r: dict[str, Any], floor: dict[str, Any], pool: dict[str, Any] | None,
         read: dict[str, Any] | None = None) -> str:
    ratio = f"{r['answers_s'] / floor['answers_s']:.2f}× floor"
    if read is not None:
        ratio += f", {r['answers_s'] / read['answers_s']:.2f}× read floor"
    if pool is not None:
        ratio += f", {r['answers_s'] / pool['answers_s']:.2f}× sdk"
    whole = (f"  whole pass {r['pass_answers_s']:.0f}/s "
             f"({r['pass_answers_s'] / floor['pass_answers_s']:.2f}×, "
             f"{r['wall_s'] - r['dispatch_s']:.1f} s not dispatching)")
    loop = (f"  loop {r['main_thread_cpu_s'] / r['answers'] * 1000:.2f} ms/answer"
            if "main_thread_cpu_s" in r else "")
    passes = r.get("answers_s_passes", [])
    spread = f"  passes {'/'.join(map(str, passes))}" if len(passes) > 1 else ""
    server = f"  server {r['server_cpu_s'] / r['answers'] * 1000:.2f} CPU s/1k"
    return (f"  {name:<30} {r['answers_s']:8.0f} answers/s  {r['cpu_per_1k']:6.2f} CPU s/1k  "
            f"peak RSS {r['peak_rss_mb']:6.0f} MB   {ratio}{whole}{loop}{server}{spread}")


def _measure_trees(config: Path, args: argparse.Namespace,
                   trees: list[tuple[Path | None, str]]) -> dict[str, dict[str, Any]]:
    """The floor, then draftgen (on uvloop too, and as --procs N), for each draftgen tree
    (`src`, the tag of its rows; None: this checkout); `--repeat R` takes every client of every
    tree in turn R times and keeps each one's median pass, so that a slow or fast moment of the
    shared machine does not land on one client or one tree only."""
    _measure("raw", config, args)  # warm-up: fills the server's answer cache
    clients: dict[str, dict[str, Any]] = {}
    for src, tag in trees:
        clients[f"raw{tag}"] = {"kind": "raw", "src": src}
        if src is None:
            clients["read"] = {"kind": "read", "src": src}
        clients[f"draftgen{tag}"] = {"kind": "draftgen", "src": src}
        if args.uvloop:
            clients[f"draftgen+uvloop{tag}"] = {"kind": "draftgen", "src": src, "uvloop": True}
        if args.procs > 1 and src is None:  # --procs is newer than the trees compared against
            clients[f"draftgen --procs {args.procs}{tag}"] = {"kind": "procs", "src": src}
    passes: dict[str, list[dict[str, Any]]] = {name: [] for name in clients}
    for _ in range(args.repeat):
        for name, how in clients.items():
            passes[name].append(_measure(how["kind"], config, args, src=how["src"],
                                         uvloop=how.get("uvloop", False)))
    return {name: _median_pass(runs) for name, runs in passes.items()}


def _median_pass(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The pass with the median answers/s (the lower middle of an even count), with every
    pass's answers/s beside it."""
    ordered = sorted(runs, key=lambda r: r["answers_s"])
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["answers_s_passes"] = [round(r["answers_s"]) for r in runs]
    return median


def _print_variant(variant: str, runs: dict[str, dict[str, Any]],
                   pool: dict[str, Any] | None, args: argparse.Namespace) -> None:
    """Each draftgen run against the floor measured with the same tree (and the SDK)."""
    for tag in ("", " (before)"):
        floor = runs.get(f"raw{tag}")
        if floor is None:
            continue
        print(f"{variant}{tag}: {floor['mb_received'] / args.n * 1000:.0f} kB per answer, "
              f"draftgen from {floor['src']}")
        print(_row("raw aiohttp (floor)", floor, floor, None))
        read = runs.get("read") if not tag else None
        if read is not None:
            print(_row("raw aiohttp + decode (read)", read, floor, None))
        if pool is not None and not tag:
            print(_row(f"openai SDK, {args.workers} thr", pool, floor, None))
        for name in (f"draftgen{tag}", f"draftgen+uvloop{tag}",
                     f"draftgen --procs {args.procs}{tag}"):
            if name in runs:
                print(_row(name, runs[name], floor, pool, read), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--workers", type=int, default=256, help="sdk thread pool size")
    p.add_argument("--variants", default="plain,logprobs,stream")
    p.add_argument("--uvloop", action="store_true", help="also run draftgen under uvloop")
    p.add_argument("--skip-sdk", action="store_true")
    p.add_argument("--repeat", type=int, default=1, help="take the clients in turn this many "
                   "times; each one's median pass is reported")
    p.add_argument("--procs", type=int, default=2, help="also run `draftgen run --procs N` "
                   "(N shard processes; 1: not measured)")
    p.add_argument("--baseline-src", type=Path, help="also measure the floor and draftgen "
                   "with the draftgen package of this tree (the `src` folder of an earlier "
                   "checkout): before/after in one run")
    p.add_argument("--child")
    p.add_argument("--config", type=Path)
    args = p.parse_args()
    if args.child:
        if args.child in ("raw", "read"):
            common.emit(child_raw(args.config, args.concurrency, parse=args.child == "read"))
        elif args.child == "sdk":
            common.emit(child_sdk(args.config, args.workers))
        elif args.child == "procs":
            common.emit(child_draftgen_procs(args.config, args.procs))
        else:
            common.emit(child_draftgen(args.config, args.uvloop))
        return 0

    common.print_machine()
    print(f"{args.n:,} requests at {args.concurrency:,} in flight; sdk: ThreadPoolExecutor "
          f"({args.workers} workers); server: {' '.join(SERVER_ARGS)}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    with common.scratch("dg-bench-") as tmp, common.serving(
            SERVER_ARGS, cache_size=args.n + 1000) as (url, args.server_pid):
        dataset = common.write_jsonl(tmp / "prompts.jsonl", common.prompt_rows(args.n))
        for variant in args.variants.split(","):
            folder = tmp / variant
            folder.mkdir()
            config = common.run_config(folder, url, [{"name": "bench", "path": str(dataset)}],
                                       logprobs=variant == "logprobs",
                                       stream=variant == "stream")
            trees: list[tuple[Path | None, str]] = [(None, "")]
            if args.baseline_src:
                trees.append((args.baseline_src, " (before)"))
            runs = _measure_trees(config, args, trees)
            pool = None if args.skip_sdk else _measure("sdk", config, args)
            _print_variant(variant, runs, pool, args)
            results[variant] = {"sdk": pool, **runs}
    print(orjson.dumps(results).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
