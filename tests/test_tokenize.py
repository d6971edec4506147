"""Tokenizer loading, the self-check, the byte → ID table and IDs from logprobs, on the real
Qwen3 and DeepSeek-R1 tokenizers."""

from __future__ import annotations

import json
import logging
import random
import sys
import types
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.testing.assets import (
    KIMI_SPECIAL_TOKENS,
    cached_tokenizer,
    deepseek_r1_tokenizer_dir,
    family_tokenizer,
)
from draftgen.tokenize import (
    FastTokenizer,
    LogprobIds,
    Tokenizer,
    TokenizerError,
    TransformersTokenizer,
    build_bytes_to_id,
    byte_decoder,
    find_tokenizer_file,
    ids_from_logprobs,
    last_logprob_id,
    load_tokenizer,
    logprob_ids,
    self_check,
)
from draftgen.tokenize.logprob_tokens import LogprobToken, LogprobTokens, SentBytes

QWEN_SPECIALS = {"<|im_end|>": 151645, "<|im_start|>": 151644, "</think>": 151668}


def entries(tok: Tokenizer, ids: list[int]) -> list[LogprobToken]:
    """Logprob entries as an OpenAI endpoint gives them: token text and UTF-8 bytes, no ID."""
    out = []
    for i in ids:
        raw = _token_bytes(tok, i)
        out.append(LogprobToken(token=raw.decode("utf-8", "replace"), bytes=list(raw)))
    return out


def _token_bytes(tok: Tokenizer, token_id: int) -> bytes:
    piece = tok.id_to_token(token_id)
    assert piece is not None
    table = byte_decoder()
    if all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return piece.encode("utf-8")  # an added token is its own text


# ---- loading and the self-check -------------------------------------------------------------


def test_load_file_and_folder(qwen3_dir: Path, qwen3_tok: Tokenizer) -> None:
    assert find_tokenizer_file(qwen3_dir) == qwen3_dir / "tokenizer.json" == qwen3_tok.path
    assert isinstance(qwen3_tok, FastTokenizer)
    assert len(qwen3_tok.sha256) == 64
    assert qwen3_tok.encode("<|im_end|>") == [151645]


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="tokenizer not found"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path)


def test_self_check_passes(qwen3_tok: Tokenizer) -> None:
    self_check(qwen3_tok, QWEN_SPECIALS)


def test_mis_loaded_tokenizer_is_caught(qwen3_dir: Path, tmp_path: Path) -> None:
    """A tokenizer.json whose added tokens carry the wrong IDs (two swapped), as a broken
    transformers release produces for Kimi's tokenizer."""
    data = json.loads((qwen3_dir / "tokenizer.json").read_text(encoding="utf-8"))
    added = {a["content"]: a for a in data["added_tokens"]}
    added["<|im_end|>"]["content"], added["<|im_start|>"]["content"] = "<|im_start|>", "<|im_end|>"
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    broken = load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError) as err:
        self_check(broken, QWEN_SPECIALS)
    message = str(err.value)
    assert "self-check failed" in message and "mis-loaded" in message
    assert "'<|im_end|>' encodes to [151644], expected [151645]" in message
    assert "'<|im_start|>' encodes to [151645], expected [151644]" in message
    assert "</think>" not in message


def test_special_ids_beyond_the_vocabulary() -> None:
    tok = family_tokenizer("kimi")
    self_check(tok, {t: i for i, t in KIMI_SPECIAL_TOKENS.items()})
    assert tok.encode("Hi<|im_end|>") == [13048, 163586]


# ---- transformers tokenizers (Kimi's tiktoken one) ------------------------------------------


class _KimiLike:
    """Stands in for Kimi's remote-code TikTokenTokenizer over a real BPE vocabulary: encode()
    with keyword arguments logs a warning (and takes a slower path); without, it adds no
    special tokens."""

    __module__ = "transformers_modules.Kimi.tokenization_kimi"

    def __init__(self, tok: FastTokenizer) -> None:
        self._tok = tok
        self.kw_calls = 0
        self.added_tokens_encoder = {
            t.content: i for i, t in tok._tok.get_added_tokens_decoder().items()
        }

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        if kwargs:
            self.kw_calls += 1
            logging.getLogger(type(self).__module__).warning("Calling super().encode with %s",
                                                             kwargs)
        return self._tok.encode(text)

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return self._tok.decode(ids, skip_special_tokens=kwargs.get("skip_special_tokens", False))

    def get_vocab(self) -> dict[str, int]:
        return self._tok._tok.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def __len__(self) -> int:
        return self._tok.vocab_size


def _fake_transformers(monkeypatch: pytest.MonkeyPatch, backend: Any) -> list[tuple[str, bool]]:
    calls: list[tuple[str, bool]] = []

    def from_pretrained(path: str, trust_remote_code: bool = False) -> Any:
        calls.append((path, trust_remote_code))
        return backend

    module = types.ModuleType("transformers")
    module.AutoTokenizer = types.SimpleNamespace(from_pretrained=from_pretrained)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", module)
    return calls


def _hf_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "kimi"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "TikTokenTokenizer"}')
    (folder / "tiktoken.model").write_bytes(b"vocab")
    return folder


def test_transformers_tokenizer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fast = family_tokenizer("kimi")
    assert isinstance(fast, FastTokenizer)
    backend = _KimiLike(fast)
    folder = _hf_folder(tmp_path)
    calls = _fake_transformers(monkeypatch, backend)
    tok = load_tokenizer(folder)
    assert isinstance(tok, TransformersTokenizer)
    assert calls == [(str(folder), True)]
    with caplog.at_level(logging.WARNING):
        before = backend.kw_calls
        ids = tok.encode("Hello<|im_end|>")
        assert backend.kw_calls == before  # the fast path: no keyword arguments
        backend.encode("x", add_special_tokens=False)  # the slow path's warning is filtered
    assert ids == fast.encode("Hello<|im_end|>")
    assert "Calling super().encode" not in caplog.text
    assert tok.decode(ids) == "Hello<|im_end|>"
    assert tok.token_to_id("<|im_end|>") == 163586 and tok.token_to_id("nope-nope") is None
    assert tok.id_to_token(163586) == "<|im_end|>"
    self_check(tok, {t: i for i, t in KIMI_SPECIAL_TOKENS.items()})
    assert tok.bytes_to_id()[b"<|im_end|>"] == 163586
    assert tok.bytes_to_id()[b" Hello"] == fast.encode(" Hello")[0]
    digest = tok.sha256
    (folder / "weights.safetensors").write_bytes(b"x" * 10)
    assert TransformersTokenizer(backend, folder).sha256 == digest  # weights are not hashed
    (folder / "tiktoken.model").write_bytes(b"other vocab")
    assert TransformersTokenizer(backend, folder).sha256 != digest


def test_transformers_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(TokenizerError, match=r"needs transformers \(pip install 'draftgen\[hf\]'"):
        load_tokenizer(_hf_folder(tmp_path))


def test_transformers_load_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    module = types.ModuleType("transformers")

    def broken(path: str, trust_remote_code: bool = False) -> Any:
        raise ValueError("tiktoken is not installed")

    module.AutoTokenizer = types.SimpleNamespace(from_pretrained=broken)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", module)
    with pytest.raises(TokenizerError, match="tiktoken is not installed"):
        load_tokenizer(_hf_folder(tmp_path))


# ---- bytes → IDs ----------------------------------------------------------------------------


def test_byte_decoder_is_a_bijection() -> None:
    table = byte_decoder()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 32 and table["Ċ"] == 10 and table["A"] == 65


@pytest.mark.parametrize("which", ["qwen3", "deepseek"])
def test_bytes_to_id_recovers_every_token(which: str, qwen3_tok: Tokenizer) -> None:
    tok = qwen3_tok if which == "qwen3" else cached_tokenizer(str(deepseek_r1_tokenizer_dir()))
    text = "héllo 世界 <think>\n\nx🚀 \t tab </think> ``` {\"a\": 1}"
    ids = tok.encode(text)
    assert ids_from_logprobs(tok, entries(tok, ids)) == ids
    table = tok.bytes_to_id()
    assert len(table) == tok.vocab_size  # one entry per token: byte-level BPE is a bijection


def _bytes_one_by_one(base: dict[str, int]) -> dict[bytes, int]:
    """The table entry by entry: byte-level when every entry is, else SentencePiece pieces."""
    to_byte = byte_decoder()
    byte_level = all(c in to_byte for tok in base for c in tok)
    out: dict[bytes, int] = {}
    for tok, tid in base.items():
        if byte_level:
            spelled = bytes(to_byte[c] for c in tok)
        elif tok.startswith("<0x") and tok.endswith(">") and len(tok) == 6:
            spelled = bytes([int(tok[3:5], 16)])
        else:
            spelled = tok.replace("\u2581", " ").encode()
        out.setdefault(spelled, tid)
    return out


@pytest.mark.parametrize("which", ["qwen3", "deepseek"])
def test_byte_table_of_a_real_vocabulary_entry_by_entry(which: str, qwen3_tok: Tokenizer) -> None:
    """The table is built in one translate call: the same as translating entry by entry."""
    tok = qwen3_tok if which == "qwen3" else cached_tokenizer(str(deepseek_r1_tokenizer_dir()))
    base, added = tok._vocab_parts()
    expected = _bytes_one_by_one(dict(base))
    expected.update({t.encode(): i for t, i in added.items()})
    assert build_bytes_to_id(base, added) == expected


@pytest.mark.parametrize("base", [
    {"ĠHello": 5, "Hello": 6, "ĠHello\U0010ffff": 7},  # the joining character in an entry
    {"Ċ": 0, "a\nb": 1},  # a raw newline: not byte-level
    {"▁the": 3, "<0x0A>": 4, "Ġx": 5},  # SentencePiece pieces
    {"ab": 1, "Ġa": 2, "a": 3, "aĠ": 4},
    {"x": 9, "\u00e9": 10},  # "é" is no byte-level character
    {},
])
def test_byte_table_of_odd_vocabularies(base: dict[str, int]) -> None:
    assert build_bytes_to_id(base, {"<|im_end|>": 99}) == {
        **_bytes_one_by_one(base), b"<|im_end|>": 99}


def test_byte_table_keeps_the_first_id_of_equal_bytes() -> None:
    assert build_bytes_to_id({"▁a": 7, " a": 8, "Ġa\u0100": 9}, {}) == {
        b" a": 7, "Ġa\u0100".encode(): 9}
    assert build_bytes_to_id({"Ġa": 7, "Ġb": 8, "Ġa\u0100": 9}, {}) == {
        b" a": 7, b" b": 8, b" a\x00": 9}
    assert build_bytes_to_id({"x": 1, "y": 2}, {"x": 5}) == {b"x": 5, b"y": 2}


def test_logprob_ids_and_unknown_tokens(qwen3_tok: Tokenizer) -> None:
    assert ids_from_logprobs(qwen3_tok, [LogprobToken(token="x", id=42)]) == [42]
    assert ids_from_logprobs(qwen3_tok, [LogprobToken(token="token_id:151645")]) == [151645]
    assert ids_from_logprobs(qwen3_tok, [LogprobToken(token="Hello")]) == [9707]
    assert ids_from_logprobs(qwen3_tok, [LogprobToken(token="x", bytes=[0xFF, 0xFE, 0xFD])]) is None


def _as_sent(tokens: list[str], data: list[bytes], ids: list[int | None] | None = None,
             spelled: bytes | None = None) -> LogprobTokens:
    """Columns as the chat backend keeps them: the bytes as sent, the column read if asked."""
    spelled = spelled or b"|".join(orjson.dumps(list(d)) for d in data)
    return LogprobTokens(tokens, lambda: list(data), ids or [None] * len(tokens),
                         sent=SentBytes(b"".join(data), spelled))


def test_logprob_ids_from_the_bytes_as_sent(qwen3_tok: Tokenizer) -> None:
    """Entries without IDs are read through each token's spelling, as their bytes would give
    them, without building the bytes column; the bytes decide over the text, and vLLM's
    `token_id:N` over the bytes, as before; spaces and unknown bytes go through the column."""
    hello = [b"Hello", b" world"]
    ids = qwen3_tok.encode("Hello world")
    lp = _as_sent(["Hello", " world"], hello)
    assert logprob_ids(qwen3_tok, lp) == LogprobIds(ids, b"Hello world")
    assert last_logprob_id(qwen3_tok, lp) == ids[-1]
    assert lp.sent_bytes() is not None  # the column never built
    assert ids_from_logprobs(qwen3_tok, _as_sent(["\ufffd", "x"], hello)) == ids
    assert ids_from_logprobs(qwen3_tok, _as_sent(["token_id:5", " world"], hello)) == [5, ids[1]]
    assert last_logprob_id(qwen3_tok, _as_sent(["token_id:5"], [b"Hello"])) == 5
    spaced = _as_sent(["Hello", " world"], hello,
                      spelled=b"[72, 101, 108, 108, 111]|[32,119,111,114,108,100]")
    assert last_logprob_id(qwen3_tok, spaced) == ids[-1]
    assert ids_from_logprobs(qwen3_tok, spaced) == ids and spaced.sent_bytes() is None
    assert ids_from_logprobs(qwen3_tok, _as_sent(["x"], [b"\xff\xfe\xfd"])) is None
    assert last_logprob_id(qwen3_tok, [LogprobToken("x", b"Hello")]) == 9707
    assert last_logprob_id(qwen3_tok, LogprobTokens(["x"], [b"x"], [42])) == 42
    assert last_logprob_id(qwen3_tok, []) is None


def test_text_of_bytes_is_text_of(qwen3_tok: Tokenizer) -> None:
    """The text of recovered IDs, read from the bytes the check computed: decode's, cut
    characters included (those go through decode)."""
    samples = [qwen3_tok.encode("<think>\nhéllo 世界 🚀</think>\n\nx = {'a': 1}<|im_end|>")]
    samples += [qwen3_tok.encode("🚀 世界")[:k] for k in range(1, 6)]
    for ids in samples:
        found = logprob_ids(qwen3_tok, _as_sent([""] * len(ids), [
            qwen3_tok.id_to_bytes(i) or b"" for i in ids], list(ids)))
        assert found is not None and found.data == qwen3_tok.bytes_of(ids)
        assert qwen3_tok.text_of_bytes(ids, found.data) == qwen3_tok.decode(ids)


# ---- text_of: decode through the byte table ---------------------------------------------------


@pytest.mark.parametrize("which", ["qwen3", "deepseek"])
def test_text_of_is_decode(which: str, qwen3_tok: Tokenizer) -> None:
    """The byte join gives decode's text for real answers and for random ID runs, including
    runs cut inside a character (those go through decode)."""
    tok = qwen3_tok if which == "qwen3" else cached_tokenizer(str(deepseek_r1_tokenizer_dir()))
    assert tok._joins_like_decode()
    texts = ["<think>\nplan: héllo 世界 🚀</think>\n\nAnswer:\t```py\nx = {'a': 1}\n```<|im_end|>",
             " leading space,  two spaces . , ! ? n't", "\n\n\n", "é"]
    rng = random.Random(7)
    samples = [tok.encode(t) for t in texts]
    samples += [[rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
                for _ in range(300)]
    samples += [tok.encode("🚀 世界")[:k] for k in range(1, 6)]  # cut inside characters
    for ids in samples:
        assert tok.text_of(ids) == tok.decode(ids), ids


def test_text_of_falls_back_when_decode_is_not_a_join(qwen3_dir: Path, tmp_path: Path) -> None:
    """A decoder that strips the leading space (as SentencePiece's does) is not a join: the
    check finds it, and text_of gives decode's text."""
    data = json.loads((qwen3_dir / "tokenizer.json").read_text())
    data["decoder"] = {"type": "Sequence", "decoders": [
        data["decoder"], {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert not tok._joins_like_decode()
    ids = tok.encode(" Hello world")
    assert tok.text_of(ids) == tok.decode(ids) == "Hello world"
