#!/usr/bin/env python
"""draftgen beside speculators' own `regenerate-responses`, on one real vLLM (CPU).

Both regenerate the same prompts (examples/data/quickstart.jsonl, 24, greedy, seed 42; given
to both as `messages` rows, as draftgen reads each of the file's four schemas: the peer reads
`messages`, `conversations` or `prompt` only and skips the other 18 rows without a word) on the
same `vllm serve` (scripts/build_vllm.sh: SmolLM2-135M-Instruct, float32, one core), at the same
concurrency, one after the other:

  draftgen   `draftgen run` with a `vllm` backend (`--no-probe`: requests for answers only)
  peer       `speculators regenerate-responses` (its chat-completions client with
             `return_token_ids`)

For each: exact rows (prompt and answer IDs equal to the engine's: for draftgen, the records
labelled native/exact; for the peer, rows whose IDs equal draftgen's, as both take the engine's
`return_token_ids`), answers/s, peak RSS and CPU seconds of the client process (wait4). Then
each is killed with SIGKILL once a third of the rows are on disk, and what it kept is read
back (whole rows, torn lines), and each is run again to completion (draftgen: the same command;
the peer: `--resume`): rows missing or written twice.

Usage:
    python bench/peer_regenerate.py [--concurrency 4] [--max-tokens 96] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import yaml

from draftgen.assets import vllm_missing
from draftgen.datasets.schema import conversation_from_row
from draftgen.testing.vllm_server import VLLMServer

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "data" / "quickstart.jsonl"
DATASET = "q"


class Tool:
    """One client: how to start it, where its rows land and how to read them back."""

    def __init__(self, name: str, folder: Path, prompts: Path) -> None:
        self.name = name
        self.folder = folder
        self.prompts = prompts

    def command(self, server: VLLMServer, args: argparse.Namespace, resume: bool) -> list[str]:
        raise NotImplementedError

    @property
    def output(self) -> Path:
        raise NotImplementedError

    def rows(self) -> tuple[dict[str, list[int]], int]:
        """{prompt id: prompt + answer IDs} of the whole rows on disk, and the torn lines."""
        out: dict[str, list[int]] = {}
        torn = 0
        for line in _lines(self.output):
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                torn += 1
                continue
            kept = self.row_ids(row)
            if kept is not None:
                out[kept[0]] = kept[1]
        return out, torn

    def row_ids(self, row: dict) -> tuple[str, list[int]] | None:
        """A row's prompt id and its IDs, or None for a row that does not count."""
        raise NotImplementedError

    def errors(self) -> list[str]:
        """What the tool recorded as failed prompts."""
        raise NotImplementedError


class Draftgen(Tool):
    def command(self, server: VLLMServer, args: argparse.Namespace, resume: bool) -> list[str]:
        cfg = {
            "output_dir": str(self.folder / "run"),
            "model": {"name": server.served_name, "format": "smollm2",
                      "tokenizer": "builtin:smollm2"},
            "sampling": {"temperature": 0.0, "top_p": 1.0, "seed": 42,
                         "max_tokens": args.max_tokens},
            "backends": [{"name": "vllm", "type": "vllm", "url": server.url,
                          "concurrency": args.concurrency}],
            "datasets": [{"name": DATASET, "path": str(self.prompts)}],
        }
        path = self.folder / "run.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return [sys.executable, "-m", "draftgen", "run", str(path), "--no-live", "--no-probe"]

    @property
    def output(self) -> Path:
        return self.folder / "run" / DATASET / "responses.jsonl"

    def row_ids(self, row: dict) -> tuple[str, list[int]] | None:
        if (row["token_source"], row["token_check"]) != ("native", "exact"):
            return None
        return row["id"].split("/", 1)[1], row["input_ids"] + row["output_ids"]

    def errors(self) -> list[str]:
        return [orjson.loads(line).get("error", "?") for line in
                _lines(self.folder / "run" / DATASET / "failures.jsonl")]


class Peer(Tool):
    def command(self, server: VLLMServer, args: argparse.Namespace, resume: bool) -> list[str]:
        return [sys.executable, "-m", "speculators", "regenerate-responses",
                "--endpoint", server.url + "/v1/chat/completions",
                # a path: its detokenizer loads the tokenizer from --model
                "--model", server.served_name, "--dataset", str(self.prompts),
                "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens),
                "--sampling-params", json.dumps({"temperature": 0.0, "top_p": 1.0, "seed": 42}),
                "--outfile", str(self.output), *(["--resume"] if resume else [])]

    @property
    def output(self) -> Path:
        return self.folder / "peer.jsonl"

    def row_ids(self, row: dict) -> tuple[str, list[int]] | None:
        return row["primary_id"], row["input_ids"]

    def errors(self) -> list[str]:
        return [str(orjson.loads(line)["metadata"].get("error")) for line in
                _lines(self.folder / "peer.errors.jsonl")]


def messages_rows(out: Path) -> Path:
    """The quickstart's prompts as `messages` rows, each as draftgen reads its row."""
    rows = [orjson.loads(line) for line in _lines(QUICKSTART)]
    out.write_bytes(b"".join(orjson.dumps(
        {"id": r["id"], "messages": conversation_from_row(r).messages}) + b"\n" for r in rows))
    return out


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines() if path.exists() else []


def _count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def run_to_end(cmd: list[str]) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[2:4]} failed: {err[-2000:].decode(errors='replace')}")
    return {"wall_s": round(time.monotonic() - t0, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024)}


def killed_part_way(tool: Tool, cmd: list[str], at: int) -> dict[str, Any]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while proc.poll() is None and _count_lines(tool.output) < at:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    ended_first = proc.poll() is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept, torn = tool.rows()
    return {"ended_before_kill": ended_first, "rows_kept": len(kept), "torn_lines": torn}


def measure(tool_cls: type[Tool], name: str, root: Path, server: VLLMServer,
            args: argparse.Namespace, n: int) -> tuple[dict[str, Any], dict[str, list[int]]]:
    prompts = root / "prompts.jsonl"
    full = tool_cls(name, root / f"{name}-full", prompts)
    full.folder.mkdir(parents=True)
    cost = run_to_end(full.command(server, args, resume=False))
    rows, torn = full.rows()
    errors = full.errors()
    result: dict[str, Any] = {**cost, "rows": len(rows), "torn_lines": torn,
                              "answers_per_s": round(len(rows) / cost["wall_s"], 2),
                              "errors": len(errors),
                              "error_kinds": dict(Counter(e[:160] for e in errors))}
    killed = tool_cls(name, root / f"{name}-killed", prompts)
    killed.folder.mkdir(parents=True)
    result["kill"] = killed_part_way(killed, killed.command(server, args, resume=False), n // 3)
    run_to_end(killed.command(server, args, resume=True))
    ids = [_row_id(tool_cls, line) for line in _lines(killed.output)]
    counts = Counter(i for i in ids if i is not None)
    after, torn_after = killed.rows()
    result["resumed"] = {"rows": len(after), "missing": n - len(counts),
                         "written_twice": sum(1 for c in counts.values() if c > 1),
                         "torn_lines": torn_after,
                         "same_ids_as_uninterrupted": sum(after.get(k) == v
                                                          for k, v in rows.items())}
    return result, rows


def _row_id(tool_cls: type[Tool], line: bytes) -> str | None:
    try:
        r = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return str(r["primary_id"] if tool_cls is Peer else r["id"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--json", type=Path)
    p.add_argument("--keep", type=Path, help="keep the run folders here (default: a temp dir)")
    args = p.parse_args()
    missing = vllm_missing()
    if missing:
        sys.exit(missing)
    with tempfile.TemporaryDirectory(prefix="peer-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        n = len(_lines(messages_rows(root / "prompts.jsonl")))
        server = VLLMServer(root / "vllm.log")
        server.served_name = str(server.model)
        with server:
            ours, our_rows = measure(Draftgen, "draftgen", root, server, args, n)
            peer, peer_rows = measure(Peer, "peer", root, server, args, n)
    ours["exact_rows"] = len(our_rows)
    peer["exact_rows"] = sum(peer_rows.get(k) == v for k, v in our_rows.items())
    result = {"prompts": n, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
              "vllm_start_s": round(server.started_s, 1), "draftgen": ours, "peer": peer}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
