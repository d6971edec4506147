"""The whole chain on a real vLLM, on CPU: prompts → draftgen → speculators → a draft checkpoint.

    bash scripts/build_vllm.sh                       # once: vLLM-CPU and SmolLM2 (cached)
    python examples/train_draft_vllm.py --small      # 3 prompts, 1 training step (CI)
    python examples/train_draft_vllm.py              # the quickstart's 30 prompts, 15 epochs

1. `draftgen run`: a `vllm` backend on `vllm serve` (SmolLM2-135M-Instruct, float32, one
   core), greedy; every record must be native and exact (the engine's own IDs).
2. `draftgen export --format speculators`: the rows speculators trains on.
3. `speculators generate-offline-data` against vLLM restarted for hidden-state extraction
   (`extract_hidden_states` speculative method, vLLM's example hidden-states connector): the
   target's states at the draft's layers (speculators' EAGLE-3 default: 2, 15, 27) and the last
   layer (30), written by vLLM for the export's own token IDs; checked by speculators
   (`--validate-outputs`: token IDs equal the row's, one state per token).
4. speculators' trainer on CPU (examples/train_draft_speculators.py `train`: the stock
   `speculators.train.cli.main` with its two CPU changes), the verifier being the very folder
   vLLM served; the last epoch's checkpoint, WORK/checkpoints/<epoch>/ (the one handed back:
   "checkpoint" in WORK/chain.json).

The two vLLM servers run one after the other (hidden-state extraction writes a file per
request, which a generation run does not want). Each step's seconds are printed and written to
WORK/chain.json. Runs in draftgen's venv (speculators there, installed --no-deps); vLLM runs
in its own (scripts/build_vllm.sh).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
import yaml

from draftgen.assets import find_smollm2_hf, vllm_missing
from draftgen.testing.vllm_server import VLLMServer, hidden_state_args

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "examples" / "data"
T = TypeVar("T")


def timed(steps: dict[str, float], name: str, fn: Callable[[], T]) -> T:
    t0 = time.monotonic()
    out = fn()
    steps[name] = round(time.monotonic() - t0, 1)
    print(f"[chain] {name}: {steps[name]:.0f} s", file=sys.stderr, flush=True)
    return out


def run(cmd: list[str], **kw: Any) -> None:
    print("[chain] $ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "COLUMNS": "160"}, **kw)


def prompts(work: Path, small: bool) -> list[dict[str, Any]]:
    """The quickstart's single-turn prompts and its multi-turn ones (last turn answered)."""
    if small:
        rows = orjson.loads(b"[" + b",".join(
            (DATA / "quickstart.jsonl").read_bytes().splitlines()[:3]) + b"]")
        path = work / "prompts.jsonl"
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        return [{"name": "quickstart", "path": str(path)}]
    return [{"name": "quickstart", "path": str(DATA / "quickstart.jsonl")},
            {"name": "quickstart_multiturn", "path": str(DATA / "quickstart_multiturn.jsonl"),
             "turns": "last"}]


def generate(work: Path, server: VLLMServer, small: bool) -> Path:
    cfg = {
        "output_dir": str(work / "run"),
        "model": {"name": server.served_name, "format": "smollm2",
                  "tokenizer": "builtin:smollm2"},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "seed": 42,
                     "max_tokens": 24 if small else 96},
        "backends": [{"name": "vllm", "type": "vllm", "url": server.url, "concurrency": 4}],
        "datasets": prompts(work, small),
    }
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    run([sys.executable, "-m", "draftgen", "run", str(path), "--no-live"])
    records = [orjson.loads(line) for f in sorted((work / "run").glob("*/responses.jsonl"))
               for line in f.read_bytes().splitlines()]
    bad = [r["id"] for r in records
           if (r["token_source"], r["token_check"]) != ("native", "exact")]
    if not records or bad:
        sys.exit(f"[chain] records not native/exact: {bad or 'none written'}")
    return work / "run"


def hidden_states(export: Path, server: VLLMServer) -> int:
    run([sys.executable, "-m", "speculators", "generate-offline-data",
         "--model", server.served_name, "--endpoint", server.url + "/v1",
         "--preprocessed-data", str(export), "--concurrency", "2", "--validate-outputs",
         "--fail-on-error"])
    return len(list((export / "hidden_states").glob("hs_*.safetensors")))


def load_trainer() -> Any:
    """examples/train_draft_speculators.py as a module (its `train`: speculators on CPU)."""
    spec = importlib.util.spec_from_file_location(
        "train_draft_speculators", REPO / "examples" / "train_draft_speculators.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true",
                   help="3 prompts, 24 tokens each, one epoch (one optimizer step): CI's mode")
    p.add_argument("--work", type=Path, default=Path("runs/vllm-chain"))
    p.add_argument("--epochs", type=int, default=15)
    args = p.parse_args()
    missing = vllm_missing()
    if missing:
        sys.exit(f"[chain] {missing}")
    model = find_smollm2_hf()
    assert model is not None
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    steps: dict[str, float] = {}
    t0 = time.monotonic()

    server = VLLMServer(work / "logs" / "vllm.log")
    timed(steps, "vllm start", server.start)
    try:
        run_dir = timed(steps, "draftgen run", lambda: generate(work, server, args.small))
    finally:
        server.stop()
    export = work / "export"
    shutil.rmtree(export, ignore_errors=True)  # derived from the run: made afresh
    timed(steps, "draftgen export", lambda: run([
        sys.executable, "-m", "draftgen", "export", str(run_dir), "--format", "speculators",
        "--keep-truncated", "--out", str(export)]))
    server = VLLMServer(work / "logs" / "vllm-hidden-states.log",
                        extra_args=hidden_state_args(work / "hs-staging"))
    timed(steps, "vllm start (hidden states)", server.start)
    try:
        rows = timed(steps, "speculators generate-offline-data",
                     lambda: hidden_states(export, server))
    finally:
        server.stop()
    trainer = load_trainer()
    # Made afresh, as the export: speculators would resume from an earlier run's checkpoints.
    shutil.rmtree(work / "checkpoints", ignore_errors=True)
    losses = timed(steps, "speculators train", lambda: trainer.train(
        export, model, work / "checkpoints", 1 if args.small else args.epochs,
        draft_vocab=4096, seq_len=2048, lr=3e-4))
    checkpoints = sorted(str(p.relative_to(work)) for p in (work / "checkpoints").rglob(
        "*.safetensors"))
    if not checkpoints:
        sys.exit("[chain] training wrote no checkpoint")
    # The last epoch's (not the first of `checkpoints`, which sorts as text: epoch 0's).
    checkpoint = str((trainer.last_checkpoint(work / "checkpoints") / "model.safetensors")
                     .relative_to(work))
    summary = {"small": args.small, "rows": rows, "steps_s": steps,
               "total_s": round(time.monotonic() - t0, 1), "train": losses.train,
               "val": losses.val, "checkpoint": checkpoint, "checkpoints": checkpoints}
    (work / "chain.json").write_text(json.dumps(summary, indent=1))
    for m in losses.train:
        print(f"step {m['global_step']:>3}  loss {m['loss']:.4f}")
    print(f"[chain] {rows} rows, draft checkpoint: {checkpoint}; "
          f"{summary['total_s']:.0f} s in all ({work / 'chain.json'})")


if __name__ == "__main__":
    main()
