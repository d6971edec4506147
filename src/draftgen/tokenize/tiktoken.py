"""A byte-level BPE `tokenizer.json` encoded through `tiktoken`: the same IDs as HF
`tokenizers`, for about a fifth of the CPU (bench/tokenization.py). The second choice, where
`fastokens` (`draftgen.tokenize.fastokens`, ~10x faster still) is not installed or refuses the file.

Reconstruction encodes every answer (~380 tokens each with reasoning): at ~1.1 µs of CPU per
token, HF `tokenizers` was the largest single cost of a run without logprobs. `tiktoken`'s BPE
over the same vocabulary costs ~0.2 µs per token. Both implement byte-level BPE, so for the
tokenizers whose `tokenizer.json` is exactly that (Qwen2/Qwen3, Llama 3, gpt-oss...) they give
the same IDs, provided that:

- the file is one `Split` regex (isolated) then `ByteLevel` without its own regex, with no
  normalizer or NFC, a BPE model without dropout, byte fallback or word affixes, and added
  tokens that strip nothing, match raw text, and are no prefix of one another (HF matches them
  leftmost-longest, tiktoken leftmost-first: the same only then);
- the merges come in vocabulary-ID order, each making its own token (tiktoken ranks pairs by
  the merged token's ID, HF by the merge's position), and the 256 bytes are tokens;
- a sample of awkward texts (every script, digits, whitespace runs, added tokens, contractions)
  encodes the same through both when the encoder is built.

Any of these failing leaves the tokenizer on HF `tokenizers` (`tiktoken_encoder` gives None and
logs why at DEBUG). Per text, `takes` keeps HF for what normalization could change
(`draftgen.tokenize.fast`). The tests check the equality on every code point in several
contexts and on random texts (tests/test_tokenize_fast.py). `DRAFTGEN_TIKTOKEN=0` turns it off.
"""

from __future__ import annotations

import logging
import operator
import os
from collections.abc import Callable, Mapping
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
from tokenizers import Tokenizer as HFTokenizer

from draftgen.tokenize.fast import FastEncoder, Reference, built_once, same_ids_on_samples

log = logging.getLogger(__name__)


class TiktokenEncoder(FastEncoder):
    """`tiktoken` over a byte-level BPE vocabulary."""

    def __init__(self, encoding: Any, *, nfc: bool) -> None:
        super().__init__(nfc=nfc, assigned_only=False)
        # `Encoding.encode` checks its special-token arguments on every call before it calls
        # the core encoder: a fifth of its time on a chat answer. The core is called directly
        # where it is there; the sample check at build covers whichever is used.
        core = getattr(encoding, "_core_bpe", None)
        self._encode: Callable[[str, frozenset[str]], list[int]] = (
            core.encode if core is not None else
            lambda text, special: encoding.encode(text, allowed_special=special))
        self._special = frozenset(encoding.special_tokens_set)
        self.encoding = encoding
        """The `tiktoken.Encoding`."""

    def encode(self, text: str) -> list[int]:
        return self._encode(text, self._special)


def tiktoken_encoder(backend: HFTokenizer, file: Path,
                     byte_table: Callable[[Mapping[str, int]], Mapping[bytes, int]],
                     reference: Reference
                     ) -> TiktokenEncoder | None:
    """The tiktoken encoder of `backend` (loaded from `file`), or None when it cannot give the
    same IDs as `reference` (HF's batch encode of it), or `DRAFTGEN_TIKTOKEN=0`. `byte_table`:
    token bytes → ID of every token, added ones included (`Tokenizer.bytes_to_id`), given the
    base vocabulary read from the file."""
    if os.environ.get("DRAFTGEN_TIKTOKEN", "1") == "0":
        return None
    return built_once("tiktoken", file, partial(_build, backend, file, byte_table, reference))


def _build(backend: HFTokenizer, file: Path,
           byte_table: Callable[[Mapping[str, int]], Mapping[bytes, int]],
           reference: Reference) -> TiktokenEncoder | None:
    parts = (type(backend.normalizer).__name__, type(backend.pre_tokenizer).__name__,
             type(backend.model).__name__)
    if parts not in (("NFC", "Sequence", "BPE"), ("NoneType", "Sequence", "BPE")):
        log.debug("%s stays on tokenizers: normalizer, pre-tokenizer, model are %s", file, parts)
        return None
    try:
        import tiktoken
    except ImportError:
        log.debug("tiktoken is not installed: %s stays on tokenizers", file)
        return None
    # The file as it is, when there is one: half the time of serializing the loaded one.
    spec = orjson.loads(file.read_bytes() if file.suffix == ".json" else backend.to_str())
    vocab = (spec.get("model") or {}).get("vocab")
    if not isinstance(vocab, dict):
        log.debug("%s stays on tokenizers: no BPE vocabulary in the file", file)
        return None
    table = byte_table(vocab)
    why = _unsupported(spec, table)
    if why is not None:
        log.debug("%s stays on tokenizers: %s", file, why)
        return None
    added = {t["content"]: t["id"] for t in spec["added_tokens"]}
    added_ids = set(added.values())
    ranks = {b: i for b, i in table.items() if i not in added_ids}
    try:
        encoding = tiktoken.Encoding(file.name, pat_str=_split_regex(spec), mergeable_ranks=ranks,
                                     special_tokens=added)
    except Exception as e:  # the Rust side rejects a regex it cannot compile
        log.debug("%s stays on tokenizers: tiktoken refused it: %s", file, e)
        return None
    encoder = TiktokenEncoder(encoding, nfc=spec.get("normalizer") is not None)
    return encoder if same_ids_on_samples(encoder, added, reference, f"{file} (tiktoken)") else None


def _split_regex(spec: Mapping[str, Any]) -> str:
    return str(spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"])


def _unsupported(spec: Mapping[str, Any], byte_table: Mapping[bytes, int]) -> str | None:
    """Why `spec` is not plain byte-level BPE that tiktoken reproduces; None when it is."""
    for check in (_unsupported_pipeline, _unsupported_model, _unsupported_added):
        why = check(spec)
        if why is not None:
            return why
    return _unsupported_merges(spec, byte_table)


def _unsupported_pipeline(spec: Mapping[str, Any]) -> str | None:
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer != {"type": "NFC"}:
        return f"normalizer {normalizer.get('type')}"
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return "pre-tokenizer is not one Split then ByteLevel"
    split, byte_level = steps
    if (split.get("type") != "Split" or "Regex" not in (split.get("pattern") or {})
            or split.get("behavior") != "Isolated" or split.get("invert")):
        return "pre-tokenizer's first step is not an isolating Split regex"
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex") or byte_level.get(
            "add_prefix_space"):
        return "pre-tokenizer's second step is not ByteLevel without its own regex"
    return None


def _unsupported_model(spec: Mapping[str, Any]) -> str | None:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"model {model.get('type')}"
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"BPE {key}"
    if model.get("byte_fallback"):
        return "BPE byte_fallback"
    return None


def _unsupported_added(spec: Mapping[str, Any]) -> str | None:
    tokens = spec.get("added_tokens") or []
    for t in tokens:
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word") or (
                t.get("normalized") and spec.get("normalizer") is not None):
            return f"added token {t.get('content')!r} strips or is normalized"
    contents = sorted(t["content"] for t in tokens)
    for a, b in pairwise(contents):
        if b.startswith(a):
            return f"added token {a!r} is a prefix of {b!r}"
    return None


def _unsupported_merges(spec: Mapping[str, Any], byte_table: Mapping[bytes, int]) -> str | None:
    """The merges must rank as tiktoken ranks them: by the ID of the token each makes."""
    if not all(bytes([b]) in byte_table for b in range(256)):
        return "not every byte is a token"
    vocab: Mapping[str, int] = spec["model"]["vocab"]
    merges = spec["model"]["merges"]
    added = {t["id"] for t in spec.get("added_tokens") or []}
    if len(merges) + 256 != len(vocab) - sum(map(added.__contains__, vocab.values())):
        return "some tokens are made by no merge"
    # Each merge's token, "left right" (older files) or [left, right]: C-level passes over the
    # 151k merges (0.24 s as a Python loop, a third of the build).
    made = list(map(vocab.get, (m.replace(" ", "", 1) if isinstance(m, str) else "".join(m)
                                for m in merges)))
    if None in made or not all(map(operator.lt, [-1, *made], made)):
        return "merges are not in the order of the IDs they make"
    return None
