"""A model's tokenizer built from its GGUF file (no tokenizer.json needed).

Choice: the tokenizer comes from the GGUF, not from llama-server's `/tokenize`. The GGUF holds
the model's own vocabulary and merge list (copied from its tokenizer.json at conversion) and
names its pre-tokenizer (`tokenizer.ggml.pre`); we rebuild the same HF `tokenizers` pipeline
from them. It is local, fast, usable before any server runs (the runner renders prompts before
dispatch) and deterministic. Exactness is proven in tests/test_llamacpp.py: our encoding equals
the server's `/tokenize` on a few hundred strings (special tokens, digits, whitespace runs,
Unicode, code) and decode(encode(x)) == x.

Only byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`) with a pre-tokenizer we
know exactly are accepted; anything else raises TokenizerError instead of tokenizing almost
right. Point `model.tokenizer` at the model's tokenizer.json for other models.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from draftgen.tokenize.base import Tokenizer, TokenizerError
from draftgen.tokenize.gguf_meta import GGUFError, read_gguf_metadata

_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
)

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp pre-tokenizer names -> the HF pre-tokenizer with the same regexes (llama.cpp
# src/llama-vocab.cpp). Measured exact against /tokenize: "smollm". The others use the very
# same regex lists in llama.cpp.
# smollm family: "\p{N}" (each digit alone), then the GPT-2 pattern.
_DIGITS_THEN_GPT2 = {"smollm", "codeshell"}
# gpt2 family: the GPT-2 pattern alone.
_GPT2 = {"gpt-2", "phi-2", "mpt", "olmo"}
SUPPORTED_PRE = frozenset(_DIGITS_THEN_GPT2 | _GPT2)


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                          use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    return byte_level


def build_hf_tokenizer(meta: dict) -> HFTokenizer:
    """The HF tokenizer for a GGUF's tokenizer metadata (see `_KEYS`)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
            "give the model's tokenizer.json as model.tokenizer"
        )
    pre = meta.get("tokenizer.ggml.pre") or "default"  # llama.cpp's own, different regexes
    if pre not in SUPPORTED_PRE:
        raise TokenizerError(
            f"GGUF pre-tokenizer {pre!r} is not supported (known: {sorted(SUPPORTED_PRE)}); "
            "give the model's tokenizer.json as model.tokenizer"
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    merges_raw: list[str] = meta.get("tokenizer.ggml.merges") or []
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise TokenizerError("GGUF vocabulary has duplicate tokens")
    merges = []
    for m in merges_raw:
        left, sep, right = m.partition(" ")
        if not sep:
            raise TokenizerError(f"GGUF merge without a space: {m!r}")
        merges.append((left, right))
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                 byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, <|im_end|>, ...) are split out of the text whole, as
    # llama.cpp does with parse_special and as HF does with added special tokens.
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types, strict=True) if ty == CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True) if ty == USER_DEFINED]
    if specials:
        tok.add_special_tokens(specials)
    if user:
        tok.add_tokens(user)
    return tok


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


def gguf_hf_tokenizer(file: Path) -> HFTokenizer:
    """The HF tokenizer built from a GGUF file's tokenizer metadata."""
    try:
        meta = read_gguf_metadata(file, _KEYS)
    except GGUFError as e:
        raise TokenizerError(str(e)) from None
    if "tokenizer.ggml.tokens" not in meta:
        raise TokenizerError(f"{file}: GGUF has no tokenizer vocabulary")
    return build_hf_tokenizer(meta)


def load_gguf_tokenizer(path: str | Path) -> Tokenizer:
    """A `FastTokenizer` over the GGUF's vocabulary. `.path` is the GGUF file
    and `.sha256` its hash (the whole file, so the record names the exact model)."""
    # Imported here: scripts/gguf_to_hf.py runs `gguf_hf_tokenizer` in vLLM's venv, which
    # lacks the fast encoders' dependencies (orjson).
    from draftgen.tokenize.hf import FastTokenizer

    file = Path(path).expanduser()
    if not file.is_file():
        raise TokenizerError(f"GGUF model not found: {path}")
    return FastTokenizer(gguf_hf_tokenizer(file), file)
