"""The tiktoken encoder gives HF `tokenizers`' IDs exactly, or is not used (with fastokens off:
the encoder used where fastokens is not installed or refuses a tokenizer). The equality on every
code point and on random texts: tests/test_tokenize_fast.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

from draftgen.testing.assets import deepseek_r1_tokenizer_dir, family_tokenizer
from draftgen.tokenize import FastTokenizer, Tokenizer, load_tokenizer
from draftgen.tokenize import fast as tokenize_fast
from draftgen.tokenize.tiktoken import TiktokenEncoder, tiktoken_encoder


@pytest.fixture(autouse=True)
def fastokens_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGEN_FASTOKENS", "0")


@pytest.fixture(scope="module")
def qwen3_tok(qwen3_dir: Path) -> Tokenizer:
    """Qwen3's tokenizer on tiktoken (this module's own: the session's is on fastokens)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTGEN_FASTOKENS", "0")
        tok = load_tokenizer(qwen3_dir)
        tok.warm_up()
    return tok


def hf_ids(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    assert isinstance(tok, FastTokenizer)
    return tok._hf_encode_batch(texts)


def fast_of(tok: Tokenizer) -> TiktokenEncoder:
    assert isinstance(tok, FastTokenizer)
    fast = tok._fast_encoder(wait=True)
    assert fast is not None, "Qwen3's tokenizer.json is plain byte-level BPE: tiktoken must take it"
    return fast


def test_other_pipelines_stay_off_tiktoken() -> None:
    """DeepSeek's pre-tokenizer is three Split regexes: nothing tiktoken's one regex matches."""
    # ...and the Qwen3 BPE padded with tokens no merge makes (tiktoken would emit a whole one;
    # a tokenizer shared by other tests, that may have built fastokens: asked directly).
    for tok in (load_tokenizer(deepseek_r1_tokenizer_dir()), family_tokenizer("gpt-oss")):
        assert isinstance(tok, FastTokenizer)
        assert tiktoken_encoder(tok._tok, tok.path, tok._bytes_to_id_from_file,
                                tok._hf_encode_batch) is None


def _variant(qwen3_dir: Path, tmp_path: Path, change: str) -> FastTokenizer:
    spec = json.loads((qwen3_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if change == "lstrip":
        spec["added_tokens"][0]["lstrip"] = True
    elif change == "prefix":
        spec["added_tokens"].append({**spec["added_tokens"][-1], "id": 151669,
                                     "content": spec["added_tokens"][-1]["content"] + "x"})
    elif change == "merges":
        merges = spec["model"]["merges"]
        merges[10], merges[11] = merges[11], merges[10]
    elif change == "last merges":
        merges = spec["model"]["merges"]
        merges[-1], merges[-2] = merges[-2], merges[-1]
    elif change == "strings":  # the older file format: each merge one "left right" string
        spec["model"]["merges"] = [" ".join(pair) for pair in spec["model"]["merges"]]
    elif change == "normalizer":
        spec["normalizer"] = {"type": "NFKC"}
    file = tmp_path / change / "tokenizer.json"
    file.parent.mkdir()
    file.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    tok = load_tokenizer(file)
    assert isinstance(tok, FastTokenizer)
    return tok


def test_merges_as_strings_are_taken(qwen3_dir: Path, tmp_path: Path) -> None:
    tok = _variant(qwen3_dir, tmp_path, "strings")
    assert tok._fast_encoder(wait=True) is not None
    texts = ["Hello, world! <|im_end|> x", "  spaced  \n\nout", "日本語 123"]
    assert tok.encode_batch(texts) == hf_ids(tok, texts)


@pytest.mark.parametrize("change", ["lstrip", "prefix", "merges", "last merges", "normalizer"])
def test_what_tiktoken_cannot_reproduce_is_refused(qwen3_dir: Path, tmp_path: Path,
                                                    change: str) -> None:
    tok = _variant(qwen3_dir, tmp_path, change)
    assert tok._fast_encoder(wait=True) is None
    texts = ["Hello, world! <|im_end|> x", "  spaced  \n\nout", "日本語 123"]
    assert tok.encode_batch(texts) == hf_ids(tok, texts)


def test_a_sample_that_differs_refuses(qwen3_dir: Path, tmp_path: Path) -> None:
    file = tmp_path / "tokenizer.json"
    file.write_bytes((qwen3_dir / "tokenizer.json").read_bytes())
    tok = load_tokenizer(file)
    assert isinstance(tok, FastTokenizer)

    def off_by_one(texts: object) -> list[list[int]]:
        return [[i + 1 for i in ids] for ids in tok._hf_encode_batch(texts)]  # type: ignore[arg-type]

    backend = HFTokenizer.from_file(str(file))
    assert tiktoken_encoder(backend, file, tok._bytes_to_id_from_file, off_by_one) is None


def test_switched_off(qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGEN_TIKTOKEN", "0")
    tok = load_tokenizer(qwen3_dir)
    assert isinstance(tok, FastTokenizer) and tok._fast_encoder(wait=True) is None


def test_the_byte_table_read_from_the_file_is_hfs(qwen3_dir: Path, tmp_path: Path) -> None:
    """The tiktoken build makes the byte table from the vocabulary it read from the file: the
    same table as from the loaded tokenizer's `get_vocab`."""
    file = tmp_path / "tokenizer.json"
    file.write_bytes((qwen3_dir / "tokenizer.json").read_bytes())
    built, loaded = load_tokenizer(file), load_tokenizer(qwen3_dir)
    assert isinstance(built, FastTokenizer) and isinstance(loaded, FastTokenizer)
    assert built._bytes_to_id is None
    built.warm_up()
    assert built._bytes_to_id is not None
    assert built._bytes_to_id == loaded._build_bytes_to_id(*loaded._vocab_parts())
    assert built._added_ids == loaded._added_ids


def test_built_once_per_file(qwen3_dir: Path) -> None:
    a, b = load_tokenizer(qwen3_dir), load_tokenizer(qwen3_dir)
    assert isinstance(a, FastTokenizer) and isinstance(b, FastTokenizer)
    assert a._fast_encoder(wait=True) is b._fast_encoder(wait=True) is not None
    assert len(tokenize_fast._built) >= 1


def test_public_encode_gives_the_core_ids(qwen3_tok: Tokenizer) -> None:
    """Without tiktoken's core encoder (another tiktoken version), `Encoding.encode` is used:
    the same IDs, added tokens included."""
    core_path = fast_of(qwen3_tok)
    assert type(core_path._encode.__self__).__name__ == "CoreBPE"  # type: ignore[attr-defined]
    texts = ["Hello <|im_end|> wörld", "</think>\n\nx = 1", "<tool_call>{}</tool_call>", ""]

    class PublicOnly:
        def __init__(self, real: object) -> None:
            self.encode = real.encode  # type: ignore[attr-defined]
            self.special_tokens_set = real.special_tokens_set  # type: ignore[attr-defined]

    real = core_path.encoding
    public = TiktokenEncoder(PublicOnly(real), nfc=True)
    assert [public.encode(t) for t in texts] == [core_path.encode(t) for t in texts] \
        == hf_ids(qwen3_tok, texts)


def test_an_encoder_that_fails_refuses(qwen3_dir: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "tokenizer.json"
    file.write_bytes((qwen3_dir / "tokenizer.json").read_bytes())
    tok = load_tokenizer(file)
    assert isinstance(tok, FastTokenizer)

    def fails(self: TiktokenEncoder, text: str) -> list[int]:
        raise TypeError("encode() takes 2 positional arguments but 3 were given")

    monkeypatch.setattr(TiktokenEncoder, "encode", fails)
    backend = HFTokenizer.from_file(str(file))
    assert tiktoken_encoder(backend, file, tok._bytes_to_id_from_file, tok._hf_encode_batch) is None
