"""Tokenizers: loading, the start-up self-check, token IDs recovered from logprobs, and batched
encoding off the event loop.

- `base`: the `Tokenizer` interface, `TokenizerError`, the vocabulary's bytes ↔ IDs;
- `hf`: `FastTokenizer` (a `tokenizer.json` through HF `tokenizers`) and
  `TransformersTokenizer` (a transformers folder);
- `fast`, `fastokens`, `tiktoken`: the fast encoders a `FastTokenizer` uses where they give
  HF's IDs;
- `gguf`, `gguf_meta`: a GGUF model's own vocabulary, and the file's metadata reader;
- `load`: `load_tokenizer` (which implementation for a path) and `self_check`;
- `hub`: a Hub repo ID's tokenizer files, from the Hugging Face cache;
- `logprob_tokens`: an answer's logprob entries as columns (`LogprobTokens`), as the chat
  backends read them;
- `logprobs`: an answer's IDs recovered from those entries;
- `batcher`: `OffLoopBatcher` and `chunked`.
"""

from typing import TYPE_CHECKING

from draftgen.lazy_exports import lazy_exports
from draftgen.tokenize.base import Tokenizer, TokenizerError, build_bytes_to_id, byte_decoder

if TYPE_CHECKING:
    from draftgen.tokenize.batcher import OffLoopBatcher, chunked
    from draftgen.tokenize.gguf import load_gguf_tokenizer
    from draftgen.tokenize.gguf_meta import GGUFError, read_gguf_metadata
    from draftgen.tokenize.hf import FastTokenizer, TransformersTokenizer
    from draftgen.tokenize.load import find_tokenizer_file, load_tokenizer, self_check
    from draftgen.tokenize.logprobs import (
        LogprobIds,
        TokenSpellings,
        ids_from_logprobs,
        last_logprob_id,
        logprob_ids,
        logprob_token_id,
    )

# Imported on first use: `tokenizers`, asyncio and the logprob types cost ~0.1 s, which the
# command-line tool's error types (`TokenizerError`) and the interface do not need.
__getattr__ = lazy_exports(__name__, {
    "draftgen.tokenize.batcher": ("OffLoopBatcher", "chunked"),
    "draftgen.tokenize.gguf": ("load_gguf_tokenizer",),
    "draftgen.tokenize.gguf_meta": ("GGUFError", "read_gguf_metadata"),
    "draftgen.tokenize.hf": ("FastTokenizer", "TransformersTokenizer"),
    "draftgen.tokenize.load": ("find_tokenizer_file", "load_tokenizer", "self_check"),
    "draftgen.tokenize.logprobs": ("LogprobIds", "TokenSpellings", "ids_from_logprobs",
                                   "last_logprob_id", "logprob_ids", "logprob_token_id"),
})

__all__ = [
    "FastTokenizer",
    "GGUFError",
    "LogprobIds",
    "OffLoopBatcher",
    "TokenSpellings",
    "Tokenizer",
    "TokenizerError",
    "TransformersTokenizer",
    "build_bytes_to_id",
    "byte_decoder",
    "chunked",
    "find_tokenizer_file",
    "ids_from_logprobs",
    "last_logprob_id",
    "load_gguf_tokenizer",
    "load_tokenizer",
    "logprob_ids",
    "logprob_token_id",
    "read_gguf_metadata",
    "self_check",
]
