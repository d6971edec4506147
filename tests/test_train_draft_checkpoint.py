"""examples/train_draft_speculators.py hands back the last epoch's draft (issue 43).

It passed `--checkpoint-freq=1000`, and speculators (0.9.0) saves only after epoch 0 and after
each epoch E with (E + 1) % freq == 0: a 15-epoch run (examples/train_draft_vllm.py's full
mode) kept epoch 0's weights alone. Here speculators' own epoch loop (`Trainer.run_training`,
with its `maybe_save_checkpoint`, `maybe_update_best` and `SingleGPUCheckpointer`) runs on the
configuration the example's flags resolve to, each epoch's "training" stood in for by setting
a tiny model's weights to the epoch's number; the checkpoint `last_checkpoint` finds must hold
the last epoch's weights."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

if not os.environ.get("DRAFTGEN_REQUIRE_TRAINERS"):
    pytest.importorskip("speculators.train.trainer")
    pytest.importorskip("transformers")

import torch
from safetensors.torch import load_file
from speculators.train.checkpointer import SingleGPUCheckpointer
from speculators.train.config import TrainConfig
from speculators.train.trainer import Trainer, TrainerConfig
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "train_draft_speculators", ROOT / "examples" / "train_draft_speculators.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _example()


def _run_epochs(save: Path, epochs: int, extra: tuple[str, ...] = ()) -> None:
    """speculators' `Trainer.run_training` on the example's flags (resolved by speculators'
    TrainConfig, passed on as `speculators.train.cli.main` passes them), each epoch setting
    every weight to its number."""
    flags = example.train_args(save.parent / "data", save.parent / "verifier", save, epochs,
                               draft_vocab=32, seq_len=64, lr=1e-3, extra=extra)
    flat = TrainConfig.resolve(flags).flatten()
    config = TrainerConfig(
        lr=flat["lr"], num_epochs=flat["epochs"], save_path=flat["save_path"],
        resume_from_checkpoint=not flat["no_resume_from_checkpoint"],
        checkpoint_freq=flat["checkpoint_freq"], save_best=flat["save_best"])
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1))
    trainer = Trainer.__new__(Trainer)  # no data loaders, model setup or device
    trainer.config = config
    trainer.model = model
    trainer.optimizers = [torch.optim.AdamW(model.parameters(), lr=config.lr)]
    trainer.schedulers = []
    trainer.checkpointer = SingleGPUCheckpointer(config.save_path)
    trainer.is_distributed = False
    trainer.current_epoch = 0
    trainer.global_step = 0
    trainer.best_val_loss = float("inf")
    trainer.val_loader = [None]

    @torch.no_grad()
    def train_epoch(epoch: int, **_kw: object) -> None:
        for p in model.parameters():
            p.fill_(float(epoch))
        trainer.global_step += 1

    trainer.train_epoch = train_epoch
    trainer.val_epoch = lambda epoch: {"loss_epoch": 100.0 - epoch}
    trainer.run_training()


def _weights_epoch(folder: Path) -> float:
    tensors = load_file(str(folder / "model.safetensors"))
    values = {t.float().unique().item() for t in tensors.values()}
    assert len(values) == 1, values
    return values.pop()


@pytest.mark.parametrize("epochs", [1, 2, 15])
def test_the_last_epochs_draft_is_saved_and_handed_back(epochs: int, tmp_path: Path) -> None:
    save = tmp_path / "checkpoints"
    _run_epochs(save, epochs)
    folder = example.last_checkpoint(save)
    assert folder == save / str(epochs - 1)
    assert _weights_epoch(folder) == epochs - 1
    # epoch 0 and the last one: no checkpoint of each of the 15 epochs
    saved = {int(d.name) for d in save.iterdir() if d.name.isdigit() and not d.is_symlink()}
    assert saved == {0, epochs - 1}
    assert (save / "checkpoint_best").resolve() == folder.resolve()


def test_the_old_frequency_handed_back_the_first_epoch(tmp_path: Path) -> None:
    """The harness shows issue 43: with --checkpoint-freq=1000 (the old flag) 15 epochs leave
    epoch 0's weights alone."""
    save = tmp_path / "checkpoints"
    _run_epochs(save, 15, extra=("--checkpoint-freq=1000",))
    folder = example.last_checkpoint(save)
    assert folder == save / "0" and _weights_epoch(folder) == 0


def test_no_checkpoint_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        example.last_checkpoint(tmp_path / "checkpoints")
