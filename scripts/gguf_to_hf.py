"""A GGUF model as a Hugging Face folder (float32 safetensors, config, tokenizer, chat template),
for engines with no GGUF loader (vLLM 0.32 on CPU). Run by scripts/build_vllm.sh.

    python scripts/gguf_to_hf.py MODEL.gguf OUT_DIR

transformers (with `gguf`) loads the GGUF dequantized, but the model it gives is marked
GGUF-quantized and `save_pretrained` refuses it ("The model is quantized with
QuantizationMethod.GGUF and is not serializable"), so the same architecture is built afresh
from its config, given the loaded weights, and saved. The saved model's logits are checked
against the GGUF-loaded model's on a few tokens before OUT_DIR is written (atomically: a
folder beside it, renamed at the end).

The tokenizer: transformers' GGUF conversion keeps the vocabulary, special tokens and chat
template but not the pre-tokenizer the GGUF names (SmolLM2's "smollm" splits each digit alone
before the byte-level regex: "\\n    1.0" is 'ĊĠĠĠĠ','1',... not 'ĊĠĠĠ','Ġ','1',...). So
tokenizer.json is draftgen's tokenizer built from the GGUF (draftgen.tokenize.gguf, equal to
llama.cpp's), beside transformers' tokenizer_config.json and chat template; the folder, loaded
by transformers' AutoTokenizer, must give the GGUF tokenizer's IDs on TOKENIZER_SAMPLE.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

# draftgen is not installed in vLLM's venv: its GGUF tokenizer is read from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from draftgen.tokenize.gguf import gguf_hf_tokenizer
from draftgen.tokenize.gguf_meta import read_gguf_metadata

# Texts on which the folder's tokenizer must give the GGUF's IDs: digits after spaces and
# newlines, code indentation, Unicode (numerals outside 0-9 too), special tokens.
TOKENIZER_SAMPLE = (
    'def half(x):\n    """Half of x.\n\n    >>> half(2)\n    1.0\n    """\n    return x / 2\n',
    "\n    1.0\n\t2\n  34 apples, 567 pears\n\n 8,9 10.25 +1e-3 x99",
    "Prix : 12,50 € — naïve café, 日本語の文章, Ελληνικά, 🙂👍🏽, ½ ² ٣٤ Ⅻ",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2 + 2?"
    "<|im_end|>\n<|im_start|>assistant\n4<|im_end|><|endoftext|>",
    "   leading spaces\r\n\ttabs\t\t and trailing   ",
)


def fail(message: str) -> None:
    sys.exit(f"gguf_to_hf: {message}")


def stage_tokenizer(tokenizer: PreTrainedTokenizerBase, gguf: Path, folder: Path) -> None:
    """transformers' tokenizer files (config, chat template, special tokens) in `folder`, its
    tokenizer.json replaced by the GGUF's own pipeline."""
    tokenizer.save_pretrained(folder)
    gguf_hf_tokenizer(gguf).save(str(folder / "tokenizer.json"))


def check_tokenizer(gguf: Path, folder: Path) -> None:
    """Exits unless `folder`'s tokenizer, as transformers loads it, is the GGUF's: the same IDs
    on TOKENIZER_SAMPLE (special tokens added or not: none is), the same text back, the GGUF's
    chat template and end-of-sequence token."""
    reference = gguf_hf_tokenizer(gguf)
    staged = AutoTokenizer.from_pretrained(folder)
    for text in TOKENIZER_SAMPLE:
        want = reference.encode(text).ids
        for add_special_tokens in (True, False):
            got = staged.encode(text, add_special_tokens=add_special_tokens)
            if got != want:
                fail(f"{folder}'s tokenizer gives {got} for {text!r}, the GGUF's {want}")
        if staged.decode(want) != text:
            fail(f"{folder}'s tokenizer decodes {want} as {staged.decode(want)!r}, not {text!r}")
    meta = read_gguf_metadata(gguf, ("tokenizer.chat_template", "tokenizer.ggml.eos_token_id"))
    if staged.chat_template != meta.get("tokenizer.chat_template"):
        fail(f"{folder}'s chat template is not the GGUF's")
    if staged.eos_token_id != meta.get("tokenizer.ggml.eos_token_id"):
        fail(f"{folder}'s eos token {staged.eos_token_id} is not the GGUF's "
             f"{meta.get('tokenizer.ggml.eos_token_id')}")


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
        fail(f"{gguf} has no chat template")
    ids = torch.tensor([gguf_hf_tokenizer(gguf).encode("The capital of France is").ids])
    with torch.no_grad():
        if not torch.equal(loaded(ids).logits, plain(ids).logits):
            fail("the rebuilt model's logits differ from the GGUF-loaded one's")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial)
    stage_tokenizer(tokenizer, gguf, partial)
    check_tokenizer(gguf, partial)
    partial.rename(out)
    print(f"gguf_to_hf: {out} in {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
