"""A `tokenizer.json` encoded through `fastokens`: the same IDs as HF `tokenizers`, for about a
tenth of tiktoken's CPU (bench/tokenization.py).

`fastokens` (Rust, PCRE2) reads the whole `tokenizer.json` pipeline (normalizer, pre-tokenizer
regexes, BPE model, added tokens), so it takes tokenizers tiktoken cannot reproduce (DeepSeek's
three Split regexes) as well as the plain byte-level BPE ones. It is used where it gives HF's
IDs: the file's normalizer is none or NFC, the build loads it, and the sample texts and every
added token encode to HF's IDs (`fast.same_ids_on_samples`). Per text, `takes` keeps
on HF anything beyond ASCII that has a code point Python's Unicode tables do not assign (PCRE2's
and Oniguruma's character classes come from their own tables), and, with NFC, any text not NFC
already. The tests check the equality on every code point in several contexts and on random
texts (tests/test_tokenize_fast.py).

Loading costs ~1.5 s of CPU (tiktoken's build: 0.4 s) but releases the interpreter lock: a run
builds it on a thread beside its start (`FastTokenizer.warm_up`). Memory: ~70 MB stay of the
load for Qwen3 once its freed pages are handed back, the first encode adds ~45 MB, and a word
cache grows to a bound of ~115 MB (docs/benchmarks.md). `DRAFTGEN_FASTOKENS=0` turns it off
(tiktoken, then HF, are used).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from functools import partial
from pathlib import Path
from typing import Any

import orjson
from tokenizers import Tokenizer as HFTokenizer

from draftgen.tokenize.fast import FastEncoder, Reference, built_once, same_ids_on_samples

log = logging.getLogger(__name__)


class FastokensEncoder(FastEncoder):
    """`fastokens` over the same `tokenizer.json`."""

    def __init__(self, tokenizer: Any, *, nfc: bool) -> None:
        super().__init__(nfc=nfc, assigned_only=True)
        self._encode = partial(tokenizer.encode, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self._encode(text).ids  # type: ignore[no-any-return]


def fastokens_encoder(backend: HFTokenizer, file: Path,
                      reference: Reference) -> FastokensEncoder | None:
    """The fastokens encoder of `backend` (loaded from `file`), or None when it cannot give the
    same IDs as `reference` (HF's batch encode of it), or `DRAFTGEN_FASTOKENS=0`."""
    if os.environ.get("DRAFTGEN_FASTOKENS", "1") == "0":
        return None
    return built_once("fastokens", file, partial(_build, backend, file, reference))


def _build(backend: HFTokenizer, file: Path, reference: Reference) -> FastokensEncoder | None:
    normalizer = _normalizer(backend)
    if normalizer not in (None, "NFC"):
        log.debug("%s: fastokens not used, normalizer %s", file, normalizer)
        return None
    try:
        import fastokens
    except ImportError:
        log.debug("%s: fastokens is not installed", file)
        return None
    try:
        tokenizer = (fastokens.Tokenizer.from_file(str(file)) if file.suffix == ".json" else
                     fastokens.Tokenizer.from_json_str(backend.to_str()))
    except Exception as e:  # a pipeline step it does not implement
        log.debug("%s: fastokens refused it: %s", file, e)
        return None
    encoder = FastokensEncoder(tokenizer, nfc=normalizer == "NFC")
    added = [t.content for t in backend.get_added_tokens_decoder().values()]
    same = same_ids_on_samples(encoder, added, reference, f"{file} (fastokens)")
    _return_freed_memory()
    return encoder if same else None


def _return_freed_memory() -> None:
    """Hand the memory freed since the load back to the system: the load parses the whole
    file into a tree it then drops, and glibc's allocator keeps those pages (~65 MB for
    Qwen3's file, ~30 % of what the load leaves in RSS). Nothing where libc is not glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _normalizer(backend: HFTokenizer) -> str | None:
    """The normalizer: "NFC", None for none (an empty `Sequence` too, as DeepSeek's files
    have), else its JSON."""
    if backend.normalizer is None:
        return None
    spec = orjson.loads(backend.normalizer.__getstate__())
    if spec == {"type": "Sequence", "normalizers": []}:
        return None
    return "NFC" if spec == {"type": "NFC"} else orjson.dumps(spec).decode()
