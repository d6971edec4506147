#!/usr/bin/env python
"""Token fidelity on a real engine: how often do draftgen's token IDs equal the engine's?

The same prompts (210 of seven kinds by default, in bench/_fidelity_prompts.py) go through
llama.cpp's `llama-server` serving SmolLM2-135M-Instruct, greedy (temperature 0, seed 42), on
three paths, each a real `draftgen run` (one run.yaml per path, a managed server per run):

  text      `endpoint: chat, logprobs: false`: the OpenAI chat endpoint; IDs are the answer's
            text encoded again (`token_source: reconstructed`, checked by length only).
  logprobs  `endpoint: chat, logprobs: true`: the same endpoint; IDs recovered from the
            per-token logprobs (`flags: [ids_from_logprobs]`, `token_check: exact`).
  native    `endpoint: native`: `/completion` with the prompt as IDs; the engine's own IDs.
            The truth the other two are measured against.

Records are joined by prompt ID. Where a path's answer decodes to other text than the native
answer (generation diverged, or the server changed the text) the pair says nothing about
tokenization: it is counted apart, as "text differs", and left out of the token figures. One
exception: a native answer cut off by max_tokens inside a multi-byte character, whose chat text
the server ends before that character; it is the same answer and is compared (its last tokens
are in no text and no logprob entry, so the path's IDs cannot be right; they must not be
labelled `exact`).

Usage:
    python bench/fidelity.py                      # 210 prompts, max_tokens 150 (~30 min, 2 cores)
    python bench/fidelity.py --limit 30 --out /tmp/fid  # a quick look
    python bench/fidelity.py --json fidelity.json # also write the figures as JSON

Re-running with the same --out resumes the runs (draftgen skips answered prompts) and
recomputes the figures; --fresh starts over. Exit code 1 when an answer labelled `exact` is
wrong (the one figure that must be 0), 2 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from _fidelity_prompts import builtin_prompts

from draftgen.tokenize import Tokenizer, byte_decoder, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
DATASET = "fidelity"
PATHS: dict[str, dict[str, Any]] = {
    "text": {"endpoint": "chat", "logprobs": False},
    "logprobs": {"endpoint": "chat", "logprobs": True},
    "native": {"endpoint": "native"},
}
PATH_TITLES = {
    "text": "(a) chat, IDs reconstructed from text",
    "logprobs": "(b) chat, IDs recovered from logprobs",
    "native": "(c) native /completion (engine IDs, the truth)",
}

def kind_of(record_id: str) -> str:
    return record_id.split("/")[-1].rsplit("-", 1)[0]


# ---- runs ------------------------------------------------------------------------------------


def write_config(out: Path, path: str, prompts_file: Path, args: argparse.Namespace) -> Path:
    backend: dict[str, Any] = {"name": path, "type": "llamacpp", "model": args.model,
                               "concurrency": args.concurrency, **PATHS[path]}
    cfg = {
        "output_dir": str(out / path / "run"),
        "model": {"name": "smollm2-135m-instruct", "format": args.format,
                  "tokenizer": args.tokenizer or args.model},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": args.max_tokens,
                     "seed": args.seed},
        "backends": [backend],
        "datasets": [{"name": DATASET, "path": str(prompts_file)}],
    }
    cfg_path = out / path / "run.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return cfg_path


def run_path(out: Path, path: str, cfg_path: Path) -> float:
    """`draftgen run` on one path's config; its output goes to OUT/PATH/draftgen.log."""
    log_path = out / path / "draftgen.log"
    started = time.monotonic()
    with log_path.open("ab") as log:
        rc = subprocess.call([sys.executable, "-m", "draftgen", "run", "--no-live",
                              str(cfg_path)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    wall = time.monotonic() - started
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        print(f"fidelity: draftgen run failed on path {path!r} (exit {rc}); log {log_path}",
              file=sys.stderr)
        sys.exit(2)
    return wall


def load_records(out: Path, path: str) -> tuple[dict[str, dict[str, Any]], int]:
    folder = out / path / "run" / DATASET
    records = {}
    with (folder / "responses.jsonl").open("rb") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                records[r["id"]] = r
    failures = folder / "failures.jsonl"
    failed = set()
    if failures.exists():
        with failures.open("rb") as f:
            failed = {json.loads(line)["id"] for line in f if line.strip()}
    return records, len(failed - set(records))


# ---- comparison ------------------------------------------------------------------------------


def token_bytes(tok: Tokenizer, tid: int, table: dict[str, int]) -> bytes:
    """A token's bytes (byte-level BPE form decoded); an added token (<|im_end|>) is its text."""
    name = tok.id_to_token(tid)
    if name is None:
        return f"<{tid}?>".encode()
    try:
        return bytes(table[ch] for ch in name)
    except KeyError:
        return name.encode()


def piece(tok: Tokenizer, tid: int, table: dict[str, int]) -> str:
    """A token's bytes as text, e.g. ' tou'; a cut character's bytes as escapes."""
    return token_bytes(tok, tid, table).decode("utf-8", errors="backslashreplace")


def complete_prefix(data: bytes) -> bytes:
    """`data` less a multi-byte character cut at its end (llama-server's validate_utf8: the
    server sends no text, and no logprob entry, for tokens that end inside a character)."""
    n = len(data)
    for i in range(1, min(4, n) + 1):
        c = data[n - i]
        if ((c & 0xE0) == 0xC0 and i < 2) or ((c & 0xF0) == 0xE0 and i < 3) or (
                (c & 0xF8) == 0xF0 and i < 4):
            return data[: n - i]
    return data


def cut_inside_char(tok: Tokenizer, truth: list[int], got_text: str, table: dict[str, int]
                    ) -> bool:
    """The engine's answer was cut off (max_tokens) inside a multi-byte character, and the
    path's answer is that answer less the cut character (and at most a few characters more):
    the same answer, whose last tokens no text or logprob entry carries."""
    data = b"".join(token_bytes(tok, t, table) for t in truth)
    kept = complete_prefix(data)
    if kept == data:
        return False
    text = kept.decode("utf-8", errors="replace")
    return text.startswith(got_text) and len(text) - len(got_text) <= 4


def diff_window(tok: Tokenizer, truth: list[int], got: list[int], table: dict[str, int],
                context: int = 1) -> tuple[int, list[int], list[int]]:
    """The first place two ID lists differ: (start, truth window, other window), the windows
    covering the same bytes (where the splits meet again), a token of context each side."""
    p = 0
    while p < min(len(truth), len(got)) and truth[p] == got[p]:
        p += 1
    i = j = p
    bi = bj = 0
    while i < len(truth) or j < len(got):
        if (bi <= bj and i < len(truth)) or j >= len(got):
            bi += len(token_bytes(tok, truth[i], table))
            i += 1
        else:
            bj += len(token_bytes(tok, got[j], table))
            j += 1
        if bi == bj:
            break
    start = max(0, p - context)
    return start, truth[start:i + context], got[start:j + context]


def show(tok: Tokenizer, ids: list[int], table: dict[str, int]) -> str:
    return " ".join(repr(piece(tok, i, table)) for i in ids) + f"  {tuple(ids)}"


@dataclass
class PathStats:
    answered: int = 0
    failed: int = 0
    compared: int = 0
    """Pairs with the same decoded text as the native answer."""
    equal: int = 0
    wrong_by_check: Counter[str] = field(default_factory=Counter)
    exact_wrong: int = 0
    checks: Counter[str] = field(default_factory=Counter)
    flags: Counter[str] = field(default_factory=Counter)
    text_differs: int = 0
    """Pairs whose answers differ as text (generation or server text handling), left out."""
    cut_inside_char: int = 0
    """Pairs compared although the texts differ: the engine's answer was cut inside a
    character (see `cut_inside_char`); its IDs cannot be recovered from text or logprobs."""
    prompt_differs: int = 0
    wrong_by_finish: Counter[str] = field(default_factory=Counter)
    wrong_by_kind: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    divergent: list[dict[str, Any]] = field(default_factory=list)


def compare(tok: Tokenizer, native: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]],
            n_examples: int) -> PathStats:
    table = byte_decoder()
    st = PathStats(answered=len(other))
    for rid in sorted(set(native) & set(other)):
        truth_rec, rec = native[rid], other[rid]
        truth, got = truth_rec["output_ids"], rec["output_ids"]
        st.checks[rec["token_check"]] += 1
        st.flags.update(rec.get("flags") or [])
        if (rec["usage"].get("prompt_tokens") is not None
                and rec["usage"]["prompt_tokens"] != len(truth_rec["input_ids"])):
            st.prompt_differs += 1
        got_text = tok.decode(got)
        cut = False
        if got_text != tok.decode(truth):
            cut = (truth_rec["finish_reason"] == "length"
                   and cut_inside_char(tok, truth, got_text, table))
        if got_text != tok.decode(truth) and not cut:
            # Not a tokenization question: the answers differ as text.
            st.text_differs += 1
            if rec["token_check"] == "exact" and got != truth:
                st.exact_wrong += 1
            if len(st.divergent) < n_examples:
                st.divergent.append({
                    "id": rid, "native": tok.decode(truth)[:160], "path": tok.decode(got)[:160],
                    "finish": (truth_rec["finish_reason"], rec["finish_reason"]),
                    "prompt_tokens": (len(truth_rec["input_ids"]),
                                      rec["usage"].get("prompt_tokens"))})
            continue
        st.compared += 1
        st.cut_inside_char += cut
        if got == truth:
            st.equal += 1
            continue
        st.wrong_by_check[rec["token_check"]] += 1
        st.wrong_by_finish[rec["finish_reason"] or "?"] += 1
        st.wrong_by_kind[kind_of(rid)] += 1
        if rec["token_check"] == "exact":
            st.exact_wrong += 1
        if len(st.examples) < n_examples:
            start, tw, gw = diff_window(tok, truth, got, table)
            st.examples.append({
                "id": rid, "check": rec["token_check"], "finish": rec["finish_reason"],
                "lengths": (len(truth), len(got)), "at": start,
                "engine": show(tok, tw, table), "draftgen": show(tok, gw, table),
            })
    return st


def pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.1f}%)" if d else f"{n}/0"


def report(stats: dict[str, PathStats], native: dict[str, dict[str, Any]], n_failed_native: int,
           walls: dict[str, float], args: argparse.Namespace, n_prompts: int) -> str:
    lines = []
    finish = Counter(r["finish_reason"] for r in native.values())
    lines.append(f"prompts: {n_prompts}; native answers: {len(native)} "
                 f"(failed {n_failed_native}; finish: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(finish.items())) + ")")
    lines.append(f"greedy: temperature 0, seed {args.seed}, max_tokens {args.max_tokens}, "
                 f"concurrency {args.concurrency}; model {args.model}")
    for path in ("text", "logprobs"):
        st = stats[path]
        lines.append("")
        lines.append(f"{PATH_TITLES[path]}  [{walls.get(path, 0):.0f}s]")
        lines.append(f"  answered {st.answered} (failed {st.failed}); token_check: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(st.checks.items())))
        if st.flags:
            lines.append("  flags: " + ", ".join(f"{k} {v}" for k, v in sorted(st.flags.items())))
        lines.append(f"  text differs from the native answer (left out): {st.text_differs}"
                     f"; prompt token count differs: {st.prompt_differs}")
        if st.cut_inside_char:
            lines.append(f"  engine answer cut off inside a character (compared, tail tokens "
                         f"in no text): {st.cut_inside_char}")
        lines.append(f"  IDs equal to the engine's: {pct(st.equal, st.compared)}")
        wrong = st.compared - st.equal
        lines.append(f"  wrong: {wrong}: length_mismatch {st.wrong_by_check['length_mismatch']}, "
                     f"length_ok {st.wrong_by_check['length_ok']} (same-length drift), "
                     f"exact {st.wrong_by_check['exact']}, "
                     f"unverifiable {st.wrong_by_check['unverifiable']}")
        if wrong:
            lines.append("  wrong by finish: " + ", ".join(
                f"{k} {v}" for k, v in sorted(st.wrong_by_finish.items()))
                + "; by kind: " + ", ".join(f"{k} {v}" for k, v in
                                            sorted(st.wrong_by_kind.items())))
        lines.append(f"  labelled exact but wrong (must be 0): {st.exact_wrong}")
        for ex in st.examples:
            lines.append(f"  - {ex['id']} [{ex['check']}, finish {ex['finish']}, "
                         f"{ex['lengths'][0]} vs {ex['lengths'][1]} tokens, at token {ex['at']}]")
            lines.append(f"      engine:   {ex['engine']}")
            lines.append(f"      draftgen: {ex['draftgen']}")
        for dv in st.divergent:
            lines.append(f"  ~ {dv['id']} text differs (finish {dv['finish']}, prompt tokens "
                         f"{dv['prompt_tokens']}):")
            lines.append(f"      native: {dv['native']!r}")
            lines.append(f"      path:   {dv['path']!r}")
    lines.append("")
    lines.append(f"native run: {walls.get('native', 0):.0f}s")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench-fidelity",
                    help="working folder: prompts, one run per path (default runs/bench-fidelity)")
    ap.add_argument("--prompts", type=Path, default=None,
                    help="a JSONL prompt file instead of the 210 built-in prompts")
    ap.add_argument("--limit", type=int, default=None, help="use the first N prompts only")
    ap.add_argument("--max-tokens", type=int, default=150)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--concurrency", type=int, default=2,
                    help="requests in flight per run (llama-server slots)")
    ap.add_argument("--model", default="builtin:smollm2", help="GGUF file (default SmolLM2)")
    ap.add_argument("--format", default="smollm2", help="draftgen model format")
    ap.add_argument("--tokenizer", default=None, help="default: the GGUF's own vocabulary")
    ap.add_argument("--paths", default="native,text,logprobs",
                    help="paths to run (native is always needed for the comparison)")
    ap.add_argument("--examples", type=int, default=6, help="mismatch examples per path")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--fresh", action="store_true", help="delete --out first")
    args = ap.parse_args()

    out: Path = args.out.resolve()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    if args.prompts is not None:
        rows = [json.loads(line) for line in args.prompts.open(encoding="utf-8") if line.strip()]
    else:
        rows = builtin_prompts()
    if args.limit:
        rows = rows[: args.limit]
    prompts_file = out / "prompts.jsonl"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if prompts_file.exists() and prompts_file.read_text(encoding="utf-8") != text:
        print(f"fidelity: {out} holds runs of other prompts; use --fresh or another --out",
              file=sys.stderr)
        return 2
    prompts_file.write_text(text, encoding="utf-8")

    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        print(f"fidelity: unknown --paths {unknown}; known: {', '.join(PATHS)}", file=sys.stderr)
        return 2
    if "native" not in paths:
        paths.insert(0, "native")
    walls: dict[str, float] = {}
    for path in paths:
        cfg_path = write_config(out, path, prompts_file, args)
        print(f"fidelity: running {path} ({PATH_TITLES[path]}) on {len(rows)} prompts ...",
              file=sys.stderr, flush=True)
        walls[path] = run_path(out, path, cfg_path)
        print(f"fidelity: {path} done in {walls[path]:.0f}s", file=sys.stderr, flush=True)

    from draftgen.assets import resolve_builtin
    tok = load_tokenizer(resolve_builtin(args.tokenizer or args.model))
    native, native_failed = load_records(out, "native")
    stats: dict[str, PathStats] = {}
    for path in paths:
        if path == "native":
            continue
        records, failed = load_records(out, path)
        stats[path] = compare(tok, native, records, args.examples)
        stats[path].failed = failed
    for path in ("text", "logprobs"):
        stats.setdefault(path, PathStats())
    print(report(stats, native, native_failed, walls, args, len(rows)))
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{platform.platform()}; python {platform.python_version()}")

    if args.json is not None:
        figures = {
            "prompts": len(rows), "max_tokens": args.max_tokens, "seed": args.seed,
            "concurrency": args.concurrency, "model": args.model,
            "native_answers": len(native), "native_failed": native_failed,
            "native_finish": dict(Counter(r["finish_reason"] for r in native.values())),
            "wall_s": walls,
            "paths": {p: {
                "answered": s.answered, "failed": s.failed, "compared": s.compared,
                "equal": s.equal, "wrong_by_check": dict(s.wrong_by_check),
                "wrong_by_finish": dict(s.wrong_by_finish),
                "wrong_by_kind": dict(s.wrong_by_kind), "exact_wrong": s.exact_wrong,
                "token_check": dict(s.checks), "flags": dict(s.flags),
                "text_differs": s.text_differs, "prompt_differs": s.prompt_differs,
                "cut_inside_char": s.cut_inside_char,
                "examples": s.examples, "divergent": s.divergent,
            } for p, s in stats.items()},
        }
        args.json.write_text(json.dumps(figures, indent=2, ensure_ascii=False) + "\n")
    return 1 if any(s.exact_wrong for s in stats.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
