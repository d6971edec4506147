"""The tiktoken encoder gives HF `tokenizers`' IDs exactly, or is not used."""

from __future__ import annotations

import json
import random
import sys
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer

from draftgen import tokenize_tiktoken
from draftgen.testing.assets import deepseek_r1_tokenizer_dir, family_tokenizer
from draftgen.tokenize import FastTokenizer, Tokenizer, load_tokenizer
from draftgen.tokenize_tiktoken import TiktokenEncoder, tiktoken_encoder


def hf_ids(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    assert isinstance(tok, FastTokenizer)
    return tok._hf_encode_batch(texts)


def fast_of(tok: Tokenizer) -> TiktokenEncoder:
    assert isinstance(tok, FastTokenizer)
    fast = tok._fast_encoder(wait=True)
    assert fast is not None, "Qwen3's tokenizer.json is plain byte-level BPE: tiktoken must take it"
    return fast


def code_points() -> list[str]:
    """Every code point Python's Unicode tables assign (others go through HF anyway)."""
    return [c for c in map(chr, range(sys.maxunicode + 1))
            if unicodedata.category(c) not in ("Cn", "Cs")]


@pytest.mark.parametrize("layout", ["{}", " {}", "a{}1", "{}\n"])
def test_every_code_point_encodes_as_hf_does(qwen3_tok: Tokenizer, layout: str) -> None:
    """Runs of 24 consecutive code points, each in `layout`: the regex classes (letters,
    numbers, spaces) and the byte merges of every script, as tiktoken and HF see them."""
    fast = fast_of(qwen3_tok)
    cps = code_points()
    texts = ["".join(layout.format(c) for c in cps[i:i + 24]) for i in range(0, len(cps), 24)]
    taken = [t for t in texts if fast.takes(t)]
    assert len(taken) > 0.9 * len(texts)
    assert [fast.encode(t) for t in taken] == hf_ids(qwen3_tok, taken)


def test_random_texts_and_added_tokens(qwen3_tok: Tokenizer) -> None:
    rng = random.Random(7)
    pieces = [c for c in map(chr, range(0x20, 0x3000))
              if unicodedata.category(c)[0] not in "MC"]  # marks could need NFC: HF's then
    pieces = rng.sample(pieces, 3000)
    pieces += [" ", "  ", "\n", "\n\n", "\t", "\r\n", "'s", "'LL", "1", "42", "3.5", "é", "🙂"] * 60
    pieces += ["<|im_end|>", "<|im_start|>", "<think>", "</think>", "<tool_call>"] * 20
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 80))) for _ in range(20000)]
    assert qwen3_tok.encode_batch(texts) == hf_ids(qwen3_tok, texts)
    assert sum(map(fast_of(qwen3_tok).takes, texts)) > 0.8 * len(texts)
    assert [qwen3_tok.encode(t) for t in texts[:300]] == hf_ids(qwen3_tok, texts[:300])


def test_texts_normalization_could_change_go_through_hf(qwen3_tok: Tokenizer) -> None:
    fast = fast_of(qwen3_tok)
    decomposed = "cafe\u0301 A\u030a"  # NFC composes both
    unassigned = "x\U000e0080y"  # no character there in any Unicode version so far
    unassigned_bmp = "x\u0378y"
    assert unicodedata.normalize("NFC", decomposed) != decomposed
    assert not fast.takes(decomposed) and not fast.takes(unassigned)
    assert not fast.takes(unassigned_bmp) and not fast.takes("\ud800 lone surrogate")
    assert fast.takes("plain ascii") and fast.takes("déjà vu 日本語 🙂")
    texts = [decomposed, "between", unassigned, decomposed + "<|im_end|>"]
    assert qwen3_tok.encode_batch(texts) == hf_ids(qwen3_tok, texts)
    assert qwen3_tok.encode(decomposed) == hf_ids(qwen3_tok, [decomposed])[0]


def test_other_pipelines_stay_on_hf() -> None:
    """DeepSeek's pre-tokenizer is three Split regexes: nothing tiktoken's one regex matches."""
    ds = load_tokenizer(deepseek_r1_tokenizer_dir())
    assert isinstance(ds, FastTokenizer) and ds._fast_encoder(wait=True) is None
    # The Qwen3 BPE padded with tokens no merge makes (tiktoken would emit a whole one).
    padded = family_tokenizer("gpt-oss")
    assert isinstance(padded, FastTokenizer) and padded._fast_encoder(wait=True) is None


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
    assert len(tokenize_tiktoken._built) >= 1


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


def test_assigned_check_agrees_with_the_unicode_tables() -> None:
    """`_assigned_here` (one regex pass, astral characters looked up) against the plain
    definition, on texts mixing ASCII, assigned and unassigned BMP characters, surrogates,
    and assigned and unassigned characters beyond the BMP, in every order."""
    pool = ["a", " ", "é", "東", "\u0378", "\ud800", "🙂", "\U0001f9ff", "\U0002fffe",
            "\U000e0080", "\U0010ffff", "𝔘"]
    rng = random.Random(3)
    for _ in range(3000):
        text = "".join(rng.choice(pool) for _ in range(rng.randrange(8)))
        plain = all(unicodedata.category(c) not in ("Cn", "Cs") for c in text)
        assert tokenize_tiktoken._assigned_here(text) == plain, ascii(text)
