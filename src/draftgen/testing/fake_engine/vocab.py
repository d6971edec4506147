"""The vocabulary: every token ID's bytes, and back, for a byte-level BPE tokenizer."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE table, inverted: vocabulary character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return {c: b for b, c in chars.items()}


@dataclass(frozen=True)
class Vocab:
    tokenizer: HFTokenizer
    token_bytes: dict[int, bytes]
    """Every ID's bytes: byte-level tokens through the byte decoder, added tokens as UTF-8."""
    added: frozenset[int]
    special: frozenset[int]
    by_bytes: dict[bytes, int]
    """Bytes -> ID for the byte-level (not added) tokens."""
    char_starts: dict[int, int]
    """Per ID: how many UTF-8 characters start in its bytes."""
    continues: frozenset[int]
    """The IDs whose bytes begin inside a UTF-8 character (a continuation byte)."""
    stop_ids: frozenset[int]
    """`<|im_end|>` and `<|endoftext|>` (the engine stops on them)."""
    think_end: int | None
    """The ID of `</think>`, when it is a single token."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def text(self, ids: Sequence[int], skip_special: bool = False) -> str:
        if skip_special:
            ids = [i for i in ids if i not in self.special]
        data = b"".join(map(self.token_bytes.__getitem__, ids))
        return data.decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=4)
def load_vocab(path: Path) -> Vocab:
    """Load a byte-level BPE tokenizer and its byte tables (cached per path: ~1 s)."""
    tokenizer = HFTokenizer.from_file(str(path))
    added = tokenizer.get_added_tokens_decoder()
    decoder = _byte_decoder()
    token_bytes = {
        i: added[i].content.encode() if i in added else bytes(decoder[c] for c in piece)
        for piece, i in tokenizer.get_vocab(with_added_tokens=True).items()
    }
    by_bytes = {b: i for i, b in token_bytes.items() if i not in added}
    special = frozenset(i for i, tok in added.items() if tok.special)
    char_starts = {i: sum(not _is_continuation(b) for b in data) for i, data in token_bytes.items()}
    continues = frozenset(i for i, data in token_bytes.items() if _is_continuation(data[0]))
    stops = (tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>"))
    return Vocab(
        tokenizer,
        token_bytes,
        frozenset(added),
        special,
        by_bytes,
        char_starts,
        continues,
        stop_ids=frozenset(i for i in stops if i is not None),
        think_end=tokenizer.token_to_id("</think>"),
    )


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80
