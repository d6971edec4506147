"""A byte-level BPE `tokenizer.json` encoded through `tiktoken`: the same IDs as HF
`tokenizers`, for about a fifth of the CPU (bench/tokenization.py).

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
logs why at DEBUG). Per text, `takes` keeps HF for what normalization could change: with the NFC
normalizer, a text goes through tiktoken only if it is ASCII, or NFC already (by Python's
Unicode tables) without any code point those tables do not assign (HF's Rust tables may be a
newer Unicode version; for assigned characters NFC is stable across versions). The tests check
the equality on every code point in several contexts and on random texts (tests/test_tokenize.py).
`DRAFTGEN_TIKTOKEN=0` turns it off.
"""

from __future__ import annotations

import logging
import operator
import os
import re
import threading
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
from tokenizers import Tokenizer as HFTokenizer

log = logging.getLogger(__name__)

_SAMPLE_TEXTS = (
    "Hello, world! It's 2026; we'll see. I'M HERE, you've been, they'd gone, she's 'quoted'.",
    "  leading spaces\n\n\ttabs\r\nwindows line\n   \n trailing   ",
    "12345678901234567890 3.14159 1e-9 0x1F -42 1,000,000 ①②③ ½ ٣٤٥ १२३",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\nclass A:\n\tpass\n",
    "日本語のテキストと中文文本，还有한국어 텍스트。Ελληνικά, русский, עברית, العربية, हिन्दी",
    "emoji 🙂👍🏽👨‍👩‍👧 flags 🇫🇷 math ∑∫√∞ ≠ ≤ ≥ → ← ✓ café naïve Zürich",
    "\u00a0non-breaking\u2003em space\u200bzero width\u3000ideographic\u0085next line",
    "<think>\nreasoning</think>\n\nanswer<|im_end|>\n<|im_start|>user\nmore<|endoftext|>",
    "''''' ---- ____ ==== !!!! ???? .... ,,,, ;;;; :::: \"\"\"\" ```python\n``` ~~~ ***",
    "URL https://example.org/a/b?c=d&e=f#g and mail a.b@c.de, path C:\\Users\\x\\file.txt",
)
"""Texts checked through both encoders when the tiktoken one is built."""


def _assigned_here(text: str) -> bool:
    """No code point of `text` is unassigned in Python's Unicode tables, or a surrogate: one
    regex pass for the Basic Multilingual Plane (~1 µs for a 2 kB answer), the few characters
    beyond it (emoji) looked up one by one."""
    if _unassigned_bmp().search(text):
        return False
    return all(unicodedata.category(c) != "Cn" for c in _ASTRAL.findall(text))


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


@cache
def _unassigned_bmp() -> re.Pattern[str]:
    """A class of the BMP code points Python does not assign, and surrogates (a class of BMP
    ranges compiles to a bitmap: one lookup per character; 0.02 s to build)."""
    ranges: list[str] = []
    start: int | None = None
    for cp in range(0x10001):
        missing = cp < 0x10000 and unicodedata.category(chr(cp)) in ("Cn", "Cs")
        if missing and start is None:
            start = cp
        elif not missing and start is not None:
            ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(cp - 1))}")
            start = None
    return re.compile(f"[{''.join(ranges)}]")


class TiktokenEncoder:
    """`tiktoken` over a byte-level BPE vocabulary; `takes(text)` says whether it gives HF's
    IDs for that text (see the module doc)."""

    def __init__(self, encoding: Any, *, nfc: bool) -> None:
        # `Encoding.encode` checks its special-token arguments on every call before it calls
        # the core encoder: a fifth of its time on a chat answer. The core is called directly
        # where it is there; the sample check at build covers whichever is used.
        core = getattr(encoding, "_core_bpe", None)
        self._encode: Callable[[str, frozenset[str]], list[int]] = (
            core.encode if core is not None else
            lambda text, special: encoding.encode(text, allowed_special=special))
        self._special = frozenset(encoding.special_tokens_set)
        self._nfc = nfc
        self.encoding = encoding
        """The `tiktoken.Encoding`."""

    def takes(self, text: str) -> bool:
        if not self._nfc or text.isascii():
            return True
        return unicodedata.is_normalized("NFC", text) and _assigned_here(text)

    def encode(self, text: str) -> list[int]:
        """Text → IDs, added tokens in it recognized (as HF does); only for `takes(text)`."""
        return self._encode(text, self._special)


_built: dict[tuple[str, int, int], TiktokenEncoder | None] = {}
"""Encoders built in this process, by tokenizer file (path, size, mtime): a run, the audit and
the tests load the same file many times."""
_build_lock = threading.Lock()


def tiktoken_encoder(backend: HFTokenizer, file: Path,
                     byte_table: Callable[[Mapping[str, int]], Mapping[bytes, int]],
                     reference: Callable[[Sequence[str]], list[list[int]]]
                     ) -> TiktokenEncoder | None:
    """The tiktoken encoder of `backend` (loaded from `file`), or None when it cannot give the
    same IDs as `reference` (HF's batch encode of it), or `DRAFTGEN_TIKTOKEN=0`. `byte_table`:
    token bytes → ID of every token, added ones included (`Tokenizer.bytes_to_id`), given the
    base vocabulary read from the file."""
    if os.environ.get("DRAFTGEN_TIKTOKEN", "1") == "0":
        return None
    try:
        st = file.stat()
    except OSError:
        return None
    key = (str(file.resolve()), st.st_size, st.st_mtime_ns)
    with _build_lock:
        if key not in _built:
            _built[key] = _build(backend, file, byte_table, reference)
        return _built[key]


def _build(backend: HFTokenizer, file: Path,
           byte_table: Callable[[Mapping[str, int]], Mapping[bytes, int]],
           reference: Callable[[Sequence[str]], list[list[int]]]) -> TiktokenEncoder | None:
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
    samples = [t for t in _SAMPLE_TEXTS if encoder.takes(t)] + list(added)
    try:
        same = [encoder.encode(t) for t in samples] == reference(samples)
    except Exception as e:  # a tiktoken whose core takes other arguments
        log.debug("%s stays on tokenizers: tiktoken failed on the sample texts: %s", file, e)
        return None
    if not same:
        log.debug("%s stays on tokenizers: the sample texts encode differently", file)
        return None
    return encoder


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
