"""A GGUF model as a Hugging Face folder (float32 safetensors, config, tokenizer, chat template),
for engines with no GGUF loader (vLLM 0.32 on CPU). Run by scripts/build_vllm.sh.

    python scripts/gguf_to_hf.py MODEL.gguf OUT_DIR

transformers (with `gguf`) loads the GGUF dequantized, but the model it gives is marked
GGUF-quantized and `save_pretrained` refuses it ("The model is quantized with
QuantizationMethod.GGUF and is not serializable"), so the same architecture is built afresh
from its config, given the loaded weights, and saved. The saved model's logits are checked
against the GGUF-loaded model's on a few tokens before OUT_DIR is written (atomically: a
folder beside it, renamed at the end).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def convert(gguf: Path, out: Path) -> None:
    started = time.monotonic()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32).eval()
    config = loaded.config
    for marker in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, marker):
            delattr(config, marker)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    plain.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        sys.exit(f"gguf_to_hf: {gguf} has no chat template")
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        if not torch.equal(loaded(ids).logits, plain(ids).logits):
            sys.exit("gguf_to_hf: the rebuilt model's logits differ from the GGUF-loaded one's")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out)
    print(f"gguf_to_hf: {out} in {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
