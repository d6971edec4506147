"""Peak RSS of a run whose endpoints send answers no `max_tokens` allows, against the same run
with good answers only (the baseline, measured in the same invocation).

Two backends (JSON and SSE) on one loopback test server (its own process), each with
`max_response_mb` and `max_in_flight_response_mb` at `--mb` (default 200: what the hostile
round used). Per case, `draftgen run` in a child process; its peak RSS from wait4:

- baseline: `--good` good answers only;
- hostile: the same good answers and `--bad` answers of `--huge-mb` MiB (valid JSON and SSE
  whose content is the megabytes), at `max_tokens` `--max-tokens` (256): each body is refused
  once it passes what that many tokens can take on the wire (`answer_byte_bound`);
- hostile, roomy: the same at `max_tokens` 65,536, whose byte bound lets the bodies through to
  `max_response_mb`: what the one bound on answers in flight, shared by both backends, holds.

Printed: each case's peak RSS, its ratio to the baseline, answers written and failures.

    .venv/bin/python bench/answer_memory.py [--huge-mb 100] [--bad 8] [--good 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common

ROOMY_MAX_TOKENS = 65536


def _rows(args: argparse.Namespace, hostile: bool) -> list[dict[str, Any]]:
    rows = list(common.prompt_rows(args.good))
    if hostile:
        rows += [{"id": f"huge{i}", "messages": [{"role": "user", "content": (
            f"Question {i} [[fault:{('huge_body', 'huge_chunked')[i % 2]}]]")}]}
            for i in range(args.bad)]
    return rows


def _config(folder: Path, url: str, args: argparse.Namespace, max_tokens: int,
            hostile: bool) -> Path:
    from draftgen.testing.assets import qwen3_tokenizer_dir

    data = common.write_jsonl(folder / "prompts.jsonl", iter(_rows(args, hostile)))
    bound = {"max_response_mb": args.mb, "max_in_flight_response_mb": args.mb,
             "max_retries": 0, "concurrency": 8, "url": url}
    cfg = {
        "output_dir": str(folder / "run"),
        "model": {"name": "test/qwen3", "format": "qwen3",
                  "tokenizer": str(qwen3_tokenizer_dir())},
        "sampling": {"max_tokens": max_tokens},
        "backends": [{"name": "json", "type": "openai", **bound},
                     {"name": "sse", "type": "openai", "stream": True, **bound}],
        "datasets": [{"name": "d", "path": str(data)}],
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _measure(cfg: Path) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "draftgen", "run", str(cfg), "--no-live",
                             "--no-probe"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    run = cfg.parent / "run" / "d"
    failures = [orjson.loads(x) for x in (run / "failures.jsonl").read_bytes().splitlines()
                ] if (run / "failures.jsonl").exists() else []
    answers = (run / "responses.jsonl").read_bytes().count(b"\n")
    return {"exit": os.waitstatus_to_exitcode(status), "peak_rss_mb": usage.ru_maxrss / 1024,
            "wall_s": time.perf_counter() - started, "answers": answers,
            "failed": sorted({f["kind"] for f in failures}), "failures": len(failures),
            "tail": err.decode(errors="replace")[-400:]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--huge-mb", type=int, default=100)
    p.add_argument("--bad", type=int, default=8)
    p.add_argument("--good", type=int, default=20)
    p.add_argument("--mb", type=float, default=200.0)
    p.add_argument("--max-tokens", type=int, default=256)
    args = p.parse_args()
    common.print_machine()
    cases = [("baseline (good answers only)", args.max_tokens, False),
             (f"hostile, max_tokens {args.max_tokens}", args.max_tokens, True),
             (f"hostile, max_tokens {ROOMY_MAX_TOKENS:,}", ROOMY_MAX_TOKENS, True)]
    server_args = ["--huge-body-mb", str(args.huge_mb), "--reasoning-tokens", "5,30",
                   "--content-tokens", "5,30"]
    results = []
    with common.scratch("dg-answer-memory-") as tmp, common.test_server(server_args) as url:
        for n, (name, max_tokens, hostile) in enumerate(cases):
            folder = tmp / f"case{n}"
            folder.mkdir()
            results.append((name, _measure(_config(folder, url, args, max_tokens, hostile))))
    base = results[0][1]["peak_rss_mb"]
    print(f"{args.bad} answers of {args.huge_mb} MiB among {args.good} good ones; two backends, "
          f"max_response_mb and max_in_flight_response_mb {args.mb:g} each")
    print(f"{'case':<32} {'peak RSS':>9} {'x base':>7} {'answers':>8} {'failed':>7}  kinds")
    for name, r in results:
        print(f"{name:<32} {r['peak_rss_mb']:>7.0f}MB {r['peak_rss_mb'] / base:>7.2f} "
              f"{r['answers']:>8} {r['failures']:>7}  {','.join(r['failed'])}"
              + ("" if r["exit"] == 0 else f"  exit {r['exit']}: {r['tail']}"))
    return 0 if all(r["exit"] == 0 for _, r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
