"""`load_tokenizer`: the implementation for a path (a `tokenizer.json` or a folder holding one,
a GGUF model file, a transformers folder) or a Hugging Face Hub repo ID (`tokenize.hub`), and
the start-up `self_check` of a format's special tokens.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from draftgen.tokenize.base import Tokenizer, TokenizerError
from draftgen.tokenize.gguf import is_gguf, load_gguf_tokenizer
from draftgen.tokenize.hf import FastTokenizer, TransformersTokenizer
from draftgen.tokenize.hub import hub_tokenizer_folder, is_hub_id


def find_tokenizer_file(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise TokenizerError(
            f"tokenizer not found: {path} (expected a tokenizer.json file or a folder with one)"
        )
    return p


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A `tokenizer.json` (or a folder holding one) through `tokenizers`; a GGUF model file
    through its own vocabulary (see `draftgen.tokenize.gguf`); any other HF tokenizer folder
    through transformers with `trust_remote_code=True`; a Hub repo ID (`owner/name[@revision]`,
    not an existing path) as the folder of its tokenizer files in the Hub cache."""
    if is_hub_id(path):
        path = hub_tokenizer_folder(str(path))
    if is_gguf(path):
        return load_gguf_tokenizer(path)
    p = Path(path).expanduser()
    if p.is_dir() and not (p / "tokenizer.json").is_file():
        if not (p / "tokenizer_config.json").is_file():
            raise TokenizerError(
                f"tokenizer not found: {path} (a folder needs tokenizer.json, or "
                "tokenizer_config.json for a transformers tokenizer)"
            )
        return _load_transformers(p)
    file = find_tokenizer_file(p)
    try:
        return FastTokenizer(HFTokenizer.from_file(str(file)), file)
    except Exception as e:  # the Rust side raises plain Exception subclasses
        raise TokenizerError(f"{file}: cannot load tokenizer: {e}") from None


def _load_transformers(folder: Path) -> Tokenizer:
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise TokenizerError(
            f"{folder} has no tokenizer.json: loading it needs transformers "
            "(pip install 'draftgen[hf]'; Kimi's tokenizer also needs tiktoken)"
        ) from None
    try:
        backend = transformers.AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
    except Exception as e:  # remote code can raise anything
        raise TokenizerError(f"{folder}: cannot load tokenizer through transformers: {e}") from None
    return TransformersTokenizer(backend, folder)


def self_check(tokenizer: Tokenizer, expected: dict[str, int]) -> None:
    """Each special token must encode to exactly its own single ID and decode back.

    A mis-loaded tokenizer (as some transformers releases do with Kimi's) fails here, before
    any request is sent.
    """
    problems = []
    for token, token_id in expected.items():
        ids = tokenizer.encode(token)
        if ids != [token_id]:
            problems.append(f"{token!r} encodes to {ids}, expected [{token_id}]")
            continue
        back = tokenizer.decode([token_id])
        if back != token:
            problems.append(f"ID {token_id} decodes to {back!r}, expected {token!r}")
    if problems:
        raise TokenizerError(
            f"tokenizer self-check failed for {tokenizer.path} (a wrong tokenizer for this "
            "model format, or a mis-loaded one: check the transformers version):\n  "
            + "\n  ".join(problems)
        )
