"""Status and audit on a run of a million answers, against `wc -l` on the same files.

Generates a run folder as `draftgen run` leaves it after a kill -9 (two datasets, responses.jsonl
with its index and the index's binary copy, failures.jsonl, a journal of two lines per answer
with requests still open at the end, run.json), from a few hundred distinct realistic records
(Qwen3 format, real tokenizer: ~300-token prompts rendered by the format, ~500-token answers of
reasoning + content, some tool calls, some cut off) whose IDs and times vary. Then times:

* `wc -l` over the responses.jsonl files (what one did over ssh after the emergency stop);
* `draftgen status RUN --json` in a fresh process (first call, then the best of three), and once
  with the index's binary copy hidden (the JSON-index path, what a run written before the copy
  existed gets);
* `draftgen audit RUN --json` in a fresh process, on the whole run when its estimated time (from
  a first audit of a subset) is under `--audit-budget-s`, else on the subset; answers/s.

    python bench/status_audit.py                    # 1,000,000 answers, ~9 GB, removed after
    python bench/status_audit.py --answers 50000    # a quick look
    python bench/status_audit.py --json out.json --keep DIR

Disk: about 9 KB per answer (the token ID lists dominate). The folder is removed afterwards
unless --keep.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from draftgen.formats import get_format
from draftgen.store.appender import JsonlAppender
from draftgen.store.columns import rows_for
from draftgen.store.index import IndexEntry, entry_for, read_index
from draftgen.store.journal import OpenTracker
from draftgen.store.layout import RunLayout
from draftgen.testing.assets import qwen3_tokenizer_dir
from draftgen.testing.fake_engine import TOOL_ARGUMENTS, TOOL_NAME, fake_text
from draftgen.tokenize import load_tokenizer

WEATHER = {"type": "function", "function": {
    "name": TOOL_NAME, "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
DATASETS = (("math", 0.6), ("chat", 0.4))
T0 = 1_790_000_000.0
RATE = 200.0
"""Answers per second of the simulated run (sets created_at and the journal times)."""
IN_FLIGHT_AT_KILL = 64
BLOCK = 20_000


# ---- records ----------------------------------------------------------------------------------


def templates(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """`n` distinct records as the runner writes them (native, exact IDs)."""
    tok = load_tokenizer(qwen3_tokenizer_dir())
    fmt = get_format("qwen3", tok)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tools = [WEATHER] if i % 10 == 0 else None
        messages = [{"role": "system", "content": "You are a careful assistant."},
                    {"role": "user", "content": fake_text(rng, rng.randint(240, 300))}]
        reasoning = fake_text(rng, rng.randint(250, 330))
        content = fake_text(rng, rng.randint(120, 200))
        calls = ([{"id": "call_0", "type": "function", "function": {
            "name": TOOL_NAME, "arguments": orjson.dumps(TOOL_ARGUMENTS).decode()}}]
            if tools else None)
        cut = i % 50 == 1
        text = fmt.answer_text(reasoning, content, calls, finished=True).text
        input_ids, output_ids = tok.encode_batch([fmt.prompt_text(messages, tools), text])
        finish = "tool_calls" if calls else "stop"
        if cut:
            output_ids = output_ids[: len(output_ids) * 2 // 3]
            parsed = fmt.parse_answer_text(tok.decode(output_ids))
            reasoning, content, calls, finish = parsed.reasoning, parsed.content, None, "length"
        paid = i % 2 == 1
        record: dict[str, Any] = {"id": "", "dataset": "", "messages": messages}
        if tools:
            record["tools"] = tools
        record.update({
            "input_ids": input_ids, "output_ids": output_ids, "token_source": "native",
            "token_check": "exact", "flags": ["ids_from_logprobs"] if paid else [],
            "reasoning": reasoning, "content": content, "tool_calls": calls,
            "finish_reason": finish, "backend": "openrouter" if paid else "sglang",
            "provider": ("Alpha", "Beta")[i % 4 // 2] if paid else None,
            "quantization": ("fp8", "bf16")[i % 4 // 2] if paid else None,
            "model": "qwen/qwen3-32b",
            "usage": {"prompt_tokens": len(input_ids), "completion_tokens": len(output_ids),
                      "reasoning_tokens": len(tok.encode(reasoning or "")), "cached_tokens": 0,
                      "cost": round(len(output_ids) * 6e-7, 8) if paid else None},
            "cost_usd": round(len(output_ids) * 6e-7, 8) if paid else 0.0,
            "request_id": f"gen-{i}", "latency_s": round(rng.uniform(5, 60), 3),
            "retries": 0, "created_at": 0.0,
        })
        out.append(record)
    return out


class Template:
    """A record serialized once, cut around its ID, dataset and time."""

    def __init__(self, record: dict[str, Any], dataset: str) -> None:
        rec = {**record, "id": "@@ID@@", "dataset": dataset, "created_at": 0.5}
        raw = orjson.dumps(rec)
        head, rest = raw.split(b"@@ID@@")
        self.head = head
        body, tail = rest.rsplit(b'"created_at":0.5}', 1)
        assert not tail
        self.body = body + b'"created_at":'
        self.entry = entry_for({**record, "dataset": dataset}, 0)

    def line(self, rid: str, t: float) -> bytes:
        return b"%s%s%s%.3f}\n" % (self.head, rid.encode(), self.body, t)


# ---- the run folder ---------------------------------------------------------------------------


def _write_dataset(layout: RunLayout, name: str, count: int, first: int,
                   temps: list[Template]) -> tuple[int, list[str]]:
    """`count` answers; returns the bytes written and the IDs (in order)."""
    data = JsonlAppender(layout.responses(name), fsync_interval_s=3600)
    index = JsonlAppender(layout.index(name), fsync_interval_s=3600)
    entries: list[IndexEntry] = []
    line_ends: list[int] = []
    ids = []
    for start in range(0, count, BLOCK):
        lines, index_lines = [], []
        end = data.size
        for k in range(start, min(count, start + BLOCK)):
            g = first + k
            tpl = temps[g % len(temps)]
            rid = f"{name}/q{g:07d}"
            t = round(T0 + g / RATE, 3)
            line = tpl.line(rid, t)
            end += len(line)
            e = tpl.entry
            entry = IndexEntry(rid, end, e.backend, e.provider, e.out, e.reasoning, e.cost,
                               e.finish, e.check, t, e.lat, e.quant)
            lines.append(line)
            index_lines.append(entry.to_json())
            entries.append(entry)
            ids.append(rid)
        data.append_bytes(b"".join(lines))
        iend = index.size
        for il in index_lines:
            iend += len(il)
            line_ends.append(iend)
        index.append_bytes(b"".join(index_lines))
    size = data.size
    data.close()
    index.close()
    rows_for(entries, line_ends).tofile(layout.columns(name))
    return size, ids


def _journal(layout: RunLayout, ids: list[tuple[str, str]], open_ids: list[tuple[str, str]],
             failed: list[tuple[str, str]]) -> None:
    """Two lines per answer (sent, ok), the failures, then the requests open at the kill, with
    the checkpoint lines `Store.journal` adds (through the same OpenTracker)."""
    tracker = OpenTracker()
    parts: list[bytes] = []

    def event(ev: str, name: str, rid: str, t: float, **extra: Any) -> None:
        e = {"ev": ev, "id": rid, "dataset": name, "t": round(t, 3), "session": 1, **extra}
        parts.append(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE))
        checkpoint = tracker.note(e)
        if checkpoint is not None:
            parts.append(orjson.dumps(checkpoint, option=orjson.OPT_APPEND_NEWLINE))

    with open(layout.journal, "wb") as f:
        for g, (name, rid) in enumerate(ids):
            t = T0 + g / RATE
            event("sent", name, rid, t - 20, backend="sglang", max_tokens=4096)
            event("ok", name, rid, t)
            if len(parts) >= 2 * BLOCK:
                f.write(b"".join(parts))
                parts.clear()
        t = T0 + len(ids) / RATE
        for name, rid in failed:
            event("sent", name, rid, t)
            event("failed", name, rid, t, kind="timeout")
        for name, rid in open_ids:
            event("sent", name, rid, t)
        f.write(b"".join(parts))


def generate(root: Path, answers: int, n_templates: int = 300) -> dict[str, Any]:
    t0 = time.perf_counter()
    layout = RunLayout(root)
    records = templates(n_templates)
    all_ids: list[tuple[str, str]] = []
    totals: dict[str, dict[str, Any]] = {}
    first = 0
    rng = random.Random(1)
    open_ids, failed = [], []
    for name, share in DATASETS:
        count = round(answers * share) if name != DATASETS[-1][0] else answers - first
        (root / name).mkdir(parents=True, exist_ok=True)
        temps = [Template(r, name) for r in records]
        _, ids = _write_dataset(layout, name, count, first, temps)
        all_ids.extend((name, i) for i in ids)
        extra = [f"{name}/f{k}" for k in range(count // 1000)]
        failed.extend((name, rid) for rid in extra)
        with open(layout.failures(name), "wb") as f:
            for rid in extra:
                f.write(orjson.dumps({"id": rid, "dataset": name, "backend": "openrouter",
                                      "kind": rng.choice(["timeout", "server_error"]),
                                      "status": None, "message": "bench",
                                      "created_at": T0 + first / RATE},
                                     option=orjson.OPT_APPEND_NEWLINE))
        opened = [(name, f"{name}/o{k}") for k in range(IN_FLIGHT_AT_KILL // len(DATASETS))]
        open_ids.extend(opened)
        totals[name] = {"total": count + len(extra) + len(opened) + 1000, "rows": count,
                        "bad_rows": 0, "duplicates": 0, "skipped_budget": 0,
                        "out_of_attempts": 0}
        first += count
    _journal(layout, all_ids, open_ids, failed)
    _run_json(layout, totals)
    return {"generate_s": round(time.perf_counter() - t0, 1), "bytes": _du(root)}


def _run_json(layout: RunLayout, totals: dict[str, dict[str, Any]]) -> None:
    tok = load_tokenizer(qwen3_tokenizer_dir())
    config = {
        "output_dir": str(layout.root),
        "model": {"name": "qwen/qwen3-32b", "format": "qwen3", "tokenizer": str(tok.path),
                  "format_options": {}},
        "backends": [{"name": "sglang", "type": "sglang", "provider": None},
                     {"name": "openrouter", "type": "openrouter",
                      "provider": {"ignore": ["fireworks"]}}],
        "datasets": [{"name": n, "path": f"{n}.jsonl"} for n, _ in DATASETS],
        "max_attempts": 3,
    }
    run_json = {"created_at": T0 - 60, "config": config,
                "tokenizer": {"path": str(tok.path), "sha256": tok.sha256},
                "sessions": [{"started_at": T0 - 3600, "stopped_at": T0 - 3000,
                              "outcome": "stopped"},
                             {"started_at": T0 - 60, "stopped_at": None, "outcome": None}],
                "datasets": totals}
    layout.run_json.write_bytes(orjson.dumps(run_json, option=orjson.OPT_INDENT_2))


def _du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# ---- timing -----------------------------------------------------------------------------------


def timed(cmd: list[str], *, check: bool = True) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, timeout=3600)
    took = time.perf_counter() - t0
    if check and proc.returncode not in (0, 1):
        raise RuntimeError(f"{cmd}: exit {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return took, proc.stdout


def best(cmd: list[str], n: int = 3) -> tuple[float, float, bytes]:
    """First time, best time of `n`, and the last output."""
    times, out = [], b""
    for _ in range(n):
        took, out = timed(cmd)
        times.append(took)
    return times[0], min(times), out


def _draftgen(*args: str) -> list[str]:
    return [sys.executable, "-m", "draftgen", *args]


def subset(root: Path, dest: Path, answers: int) -> Path:
    """A run folder holding the first `answers` answers of the first dataset (same run.json)."""
    layout, out = RunLayout(root), RunLayout(dest)
    name = DATASETS[0][0]
    (dest / name).mkdir(parents=True, exist_ok=True)
    shutil.copy(layout.run_json, out.run_json)
    with open(layout.responses(name), "rb") as src, open(out.responses(name), "wb") as dst:
        for k, line in enumerate(src):
            if k >= answers:
                break
            dst.write(line)
    read_index(out.index(name), out.responses(name), repair=True)
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--answers", type=int, default=1_000_000)
    ap.add_argument("--audit-subset", type=int, default=100_000,
                    help="answers in the first (estimating) audit")
    ap.add_argument("--audit-budget-s", type=float, default=600,
                    help="audit the whole run when the estimate is under this")
    ap.add_argument("--keep", type=Path, help="generate here and keep it")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="draftgen-bench-status-"))
    root = base / "run"
    res: dict[str, Any] = {"answers": args.answers, "nproc": os.cpu_count(),
                           "mem_gib": round(os.sysconf("SC_PAGE_SIZE")
                                            * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}
    try:
        print(f"generating {args.answers:,} answers in {root} ...", flush=True)
        res.update(generate(root, args.answers))
        print(f"  {res['bytes'] / 1e9:.2f} GB in {res['generate_s']}s", flush=True)
        measure(root, base, args, res)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    report(res)
    if args.json:
        args.json.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    return 0


def measure(root: Path, base: Path, args: argparse.Namespace, res: dict[str, Any]) -> None:
    files = [str(RunLayout(root).responses(n)) for n, _ in DATASETS]
    res["responses_bytes"] = sum(os.path.getsize(f) for f in files)
    res["wc_first_s"], res["wc_s"], out = best(["wc", "-l", *files])
    res["wc_lines"] = int(out.split()[-2])
    res["status_first_s"], res["status_s"], out = best(_draftgen("status", str(root), "--json"))
    status = orjson.loads(out)
    res["status_done"] = status["total"]["done"]
    res["status_in_flight"] = status["total"]["in_flight"]
    assert res["status_done"] == res["wc_lines"], (res["status_done"], res["wc_lines"])
    _, res["status_module_s"], _ = best([sys.executable, "-m", "draftgen.status", str(root),
                                         "--json"])
    hidden = _hide_binary(root)
    try:
        res["status_json_index_s"], _ = timed(_draftgen("status", str(root), "--json"))
    finally:
        for src, dst in hidden:
            src.rename(dst)
    res["python_startup_s"] = min(timed(_draftgen("--help"))[0] for _ in range(3))
    res["loadavg_during"] = round(os.getloadavg()[0], 2)
    n_sub = min(args.audit_subset, args.answers)
    sub = subset(root, base / "subset", n_sub) if n_sub < args.answers else root
    took, out = timed(_draftgen("audit", str(sub), "--json"))
    audit = orjson.loads(out)
    res["audit_subset"] = {"answers": audit["answers"], "seconds": round(took, 1),
                           "answers_per_s": round(audit["answers"] / took, 1),
                           "failing": audit["failing"], "workers": audit["workers"]}
    estimate = args.answers / (audit["answers"] / took)
    res["audit_full_estimate_s"] = round(estimate, 1)
    if sub != root and estimate <= args.audit_budget_s:
        shutil.rmtree(sub, ignore_errors=True)
        took, out = timed(_draftgen("audit", str(root), "--json"))
        audit = orjson.loads(out)
        res["audit_full"] = {"answers": audit["answers"], "seconds": round(took, 1),
                             "answers_per_s": round(audit["answers"] / took, 1),
                             "failing": audit["failing"], "workers": audit["workers"]}


def _hide_binary(root: Path) -> list[tuple[Path, Path]]:
    moved = []
    for name, _ in DATASETS:
        path = RunLayout(root).columns(name)
        hidden = path.with_name(path.name + ".hidden")
        path.rename(hidden)
        moved.append((hidden, path))
    return moved


def report(res: dict[str, Any]) -> None:
    print(f"\n{res['answers']:,} answers, {res.get('responses_bytes', 0) / 1e9:.2f} GB of "
          f"responses.jsonl; {res['nproc']} CPUs, {res['mem_gib']} GiB RAM, load average "
          f"{res.get('loadavg_during', '?')}")
    if "wc_s" not in res:
        return
    wc = res["wc_s"]
    rows = [
        ("wc -l (best of 3)", wc),
        ("draftgen status --json, first call", res["status_first_s"]),
        ("draftgen status --json (best of 3)", res["status_s"]),
        ("python -m draftgen.status --json (best of 3)", res["status_module_s"]),
        ("draftgen status without the binary index copy", res["status_json_index_s"]),
        ("python -m draftgen --help (startup alone)", res["python_startup_s"]),
    ]
    for label, s in rows:
        print(f"  {label:50s} {s:8.2f} s   {s / wc:5.2f}x wc -l")
    for key in ("audit_subset", "audit_full"):
        if key in res:
            a = res[key]
            print(f"  audit ({key}): {a['answers']:,} answers in {a['seconds']}s = "
                  f"{a['answers_per_s']:,.0f} answers/s ({a['workers']} workers), "
                  f"{a['failing']} failing")
    print(f"  audit of all {res['answers']:,}: estimated {res['audit_full_estimate_s']:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
