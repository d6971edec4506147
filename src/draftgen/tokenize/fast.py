"""What the fast encoders share: each gives HF `tokenizers`' IDs for the texts it `takes`, or is
not used.

A fast encoder (`fastokens`, `tiktoken` in this package) is built once per tokenizer file and
process, and only kept when a sample of awkward texts (every script, digits, whitespace runs,
contractions, added tokens) encodes to HF's IDs through it. Per text, `takes` keeps on HF what
the two could read differently: with the NFC normalizer, a text must be NFC already (by Python's
Unicode tables: then neither normalizer changes it), and, with NFC or where asked, every code
point must be assigned in Python's tables (regex classes such as `\\p{L}` and the
normalization of characters newer than either side's tables are where two implementations of
different Unicode versions part; for assigned characters both stay put).
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

SAMPLE_TEXTS = (
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
"""Texts checked through both encoders when a fast one is built."""

Reference = Callable[[Sequence[str]], list[list[int]]]
"""HF's batch encode of the tokenizer: the IDs a fast encoder must give."""


class FastEncoder:
    """Gives HF's IDs for every text it `takes` (see the module doc); `encode` is the
    encoder's own."""

    def __init__(self, *, nfc: bool, assigned_only: bool) -> None:
        self._nfc = nfc
        self._assigned_only = assigned_only or nfc

    def takes(self, text: str) -> bool:
        if text.isascii():
            return True
        if self._nfc and not unicodedata.is_normalized("NFC", text):
            return False
        return not self._assigned_only or assigned_here(text)

    def encode(self, text: str) -> list[int]:
        """Text → IDs, added tokens in it recognized (as HF does); only for `takes(text)`."""
        raise NotImplementedError


def same_ids_on_samples(encoder: FastEncoder, added: Iterable[str], reference: Reference,
                        what: str) -> bool:
    """`encoder` gives `reference`'s IDs for the sample texts it takes and for each added
    token alone; a failure is logged (DEBUG) with `what` (the file and the encoder)."""
    samples = [t for t in SAMPLE_TEXTS if encoder.takes(t)] + list(added)
    try:
        same = [encoder.encode(t) for t in samples] == reference(samples)
    except Exception as e:  # an encoder of another version, taking other arguments
        log.debug("%s: not used, it failed on the sample texts: %s", what, e)
        return False
    if not same:
        log.debug("%s: not used, the sample texts encode differently", what)
    return same


E = TypeVar("E", bound=FastEncoder)

_built: dict[tuple[str, str, int, int], FastEncoder | None] = {}
"""Encoders built in this process, by kind and tokenizer file (path, size, mtime): a run, the
audit and the tests load the same file many times."""
_build_lock = threading.Lock()


def built_once(kind: str, file: Path, build: Callable[[], E | None]) -> E | None:
    """`build()`'s encoder for `file`, built at most once per process and file version; None
    when the file cannot be read."""
    try:
        st = file.stat()
    except OSError:
        return None
    key = (kind, str(file.resolve()), st.st_size, st.st_mtime_ns)
    with _build_lock:
        if key not in _built:
            _built[key] = build()
        return _built[key]  # type: ignore[return-value]  # each kind's builder makes its own E


def assigned_here(text: str) -> bool:
    """No code point of `text` is unassigned in Python's Unicode tables, or a surrogate: one
    regex pass for the Basic Multilingual Plane, one to find the characters beyond it (emoji),
    looked up one by one (~13 µs for a 1.4 kB test-server answer with non-ASCII text; one pass
    that stops at each emoji measured slower)."""
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
