"""The HF tokenizers behind the `Tokenizer` interface:

- `FastTokenizer`: a `tokenizer.json` loaded with HF `tokenizers` (Qwen3, DeepSeek, gpt-oss...),
  encoding through a fast encoder (`fastokens`, else `tiktoken`) where it gives the same IDs.
- `TransformersTokenizer`: a HF folder without `tokenizer.json`, loaded through
  `transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=True)` (Kimi's tiktoken
  tokenizer: see `load`). transformers is the optional extra `hf`, imported only then.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from draftgen.tokenize.base import Tokenizer
from draftgen.tokenize.fast import FastEncoder
from draftgen.tokenize.fastokens import fastokens_encoder
from draftgen.tokenize.tiktoken import tiktoken_encoder


class FastTokenizer(Tokenizer):
    """A `tokenizer.json` through HF `tokenizers`."""

    def __init__(self, backend: HFTokenizer, path: Path) -> None:
        super().__init__(path)
        self._tok = backend
        self._encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
        self._fast: FastEncoder | None = None
        self._fast_build: threading.Thread | None = None

    @cached_property
    def vocab_size(self) -> int:
        # Computed once: tokenizers 0.22 builds the whole vocabulary on every call (~50 ms).
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        fast = self._fast_encoder()
        if fast is not None and fast.takes(text):
            return fast.encode(text)
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Through the fast encoder where it gives the same IDs (see `_fast_encoder`), the
        rest in one HF batch."""
        fast = self._fast_encoder()
        if fast is None:
            return self._hf_encode_batch(texts)
        out = [fast.encode(t) if fast.takes(t) else None for t in texts]
        rest = [i for i, ids in enumerate(out) if ids is None]
        for i, ids in zip(rest, self._hf_encode_batch([texts[i] for i in rest]), strict=True):
            out[i] = ids
        return out  # type: ignore[return-value]  # every None replaced above

    @property
    def batches_gain_from_a_thread(self) -> bool:
        """Until the fast encoder is ready, and where there is none, batches go to HF's
        `encode_batch`, which releases the GIL for the whole batch."""
        return self._fast is None

    def _hf_encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # `tokenizers` releases the GIL inside encode_batch: a batch runs across cores.
        # encode_batch_fast (tokenizers >= 0.20) gives the same IDs without computing character
        # offsets: about 1.4x faster (bench/tokenization.py).
        if not texts:
            return []
        return [e.ids for e in self._encode_batch(list(texts), add_special_tokens=False)]

    def warm_up(self, wait: bool = True) -> None:
        """Build the fast encoder here and now, or (`wait=False`) start building it. A run
        starts it first thing, and waits for it before its first request: fastokens' load
        (~1.5 s of CPU) releases the interpreter lock, so the run's start (prompts, resume
        scan, backends) goes on beside it. tiktoken's build (~0.4 s, where fastokens cannot be
        used) holds the lock for long stretches: beside the start it slows the start's file
        operations by about its own length (docs/benchmarks.md)."""
        self._fast_encoder(wait=wait)

    def _fast_encoder(self, wait: bool = False) -> FastEncoder | None:
        """The fast encoder: `fastokens` (`draftgen.tokenize.fastokens`), else `tiktoken`
        (`draftgen.tokenize.tiktoken`), whichever gives HF's IDs for this tokenizer first;
        None while it is being built and when neither can. Built once per file and process, on
        a background thread started by `warm_up` or the first encode (HF encodes meanwhile,
        with the same IDs); `wait` waits for it."""
        if self._fast_build is None:
            # Not a daemon: the interpreter joins it before it shuts down. A daemon thread still
            # inside fastokens then (its calls release the interpreter lock) is ended by
            # pthread_exit when it takes the lock back, and the forced unwind through the
            # extension's frames aborts the process ("FATAL: exception not rethrown", rc 134)
            # after a command that did its job. The wait is the rest of a build: ~1.5 s at most.
            self._fast_build = threading.Thread(
                target=self._build_fast_encoder, name="draftgen-fast-encoder", daemon=False)
            self._fast_build.start()
        if wait:
            self._fast_build.join()
        return self._fast

    def _build_fast_encoder(self) -> None:
        reference = self._hf_encode_batch
        self._fast = (fastokens_encoder(self._tok, self.path, reference)
                      or tiktoken_encoder(self._tok, self.path, self._bytes_to_id_from_file,
                                          reference))

    def _bytes_to_id_from_file(self, file_vocab: Mapping[str, int]) -> dict[bytes, int]:
        """`bytes_to_id`, from the base vocabulary as the tiktoken build read it from the file
        (the entries `get_vocab` gives, without its 0.2 s)."""
        if self._bytes_to_id is None:
            return self._build_bytes_to_id(*self._vocab_parts(file_vocab))
        return self._bytes_to_id

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def _vocab_parts(self, file_vocab: Mapping[str, int] | None = None
                     ) -> tuple[Mapping[str, int], Mapping[str, int]]:
        added = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}
        vocab = self._tok.get_vocab(with_added_tokens=False) if file_vocab is None else file_vocab
        return {t: i for t, i in vocab.items() if t not in added}, added


_KIMI_ENCODE_LOG = "Calling super().encode with"


class _DropKimiEncodeWarning(logging.Filter):
    """Kimi's `tokenization_kimi.py` logs this at WARNING on every encode() with keyword
    arguments (SGLang filters it the same way)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_KIMI_ENCODE_LOG)


class TransformersTokenizer(Tokenizer):
    """A transformers tokenizer (slow or remote code) behind the same interface.

    `encode` calls the backend with no keyword arguments when that adds no special tokens
    (Kimi's tiktoken tokenizer: the keyword path is slower and logs a warning per call);
    otherwise with `add_special_tokens=False`. Which one is decided once, at load.
    """

    def __init__(self, backend: Any, path: Path) -> None:
        super().__init__(path)
        self._tok = backend
        module = type(backend).__module__
        if "tokenization_kimi" in module:
            logging.getLogger(module).addFilter(_DropKimiEncodeWarning())
        self._added: dict[str, int] = dict(getattr(backend, "added_tokens_encoder", {}) or {})
        self._vocab: dict[str, int] = dict(backend.get_vocab())
        probe = "Hello, world"
        self._plain_encode = list(backend.encode(probe)) == list(
            backend.encode(probe, add_special_tokens=False)
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        if self._plain_encode:
            return list(self._tok.encode(text))
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if skip_special_tokens:
            return str(self._tok.decode(list(ids), skip_special_tokens=True))
        return str(self._tok.decode(list(ids)))  # no keyword: Kimi's fast path

    def token_to_id(self, token: str) -> int | None:
        if token in self._added:
            return self._added[token]
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        tok = self._tok.convert_ids_to_tokens(token_id)
        return tok if isinstance(tok, str) else None

    def _vocab_parts(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        base = {t: i for t, i in self._vocab.items() if t not in self._added}
        return base, self._added
