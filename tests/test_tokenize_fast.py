"""Each fast encoder gives HF `tokenizers`' IDs for every text it takes: every code point in
several contexts, random texts with added tokens, texts that normalization could change.
Parametrized over (encoder, tokenizer): fastokens on Qwen3 (NFC) and DeepSeek-R1 (three Split
regexes, no normalizer), tiktoken on Qwen3."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest

from draftgen.testing.assets import deepseek_r1_tokenizer_dir, qwen3_tokenizer_dir
from draftgen.tokenize import FastTokenizer, Tokenizer, load_tokenizer
from draftgen.tokenize import fast as tokenize_fast
from draftgen.tokenize.fast import FastEncoder
from draftgen.tokenize.fastokens import FastokensEncoder, fastokens_encoder
from draftgen.tokenize.tiktoken import TiktokenEncoder

CASES = {
    "fastokens-qwen3": (qwen3_tokenizer_dir, FastokensEncoder, {}),
    "fastokens-deepseek": (deepseek_r1_tokenizer_dir, FastokensEncoder, {}),
    "tiktoken-qwen3": (qwen3_tokenizer_dir, TiktokenEncoder, {"DRAFTGEN_FASTOKENS": "0"}),
}


@pytest.fixture(scope="module", params=list(CASES))
def tok(request: pytest.FixtureRequest) -> FastTokenizer:
    folder, kind, env = CASES[request.param]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        loaded = load_tokenizer(folder())
        assert isinstance(loaded, FastTokenizer)
        loaded.warm_up()
    assert isinstance(loaded._fast, kind), f"{request.param}: {loaded._fast!r}"
    return loaded


def fast_of(tok: FastTokenizer) -> FastEncoder:
    fast = tok._fast_encoder(wait=True)
    assert fast is not None
    return fast


def hf_ids(tok: FastTokenizer, texts: list[str]) -> list[list[int]]:
    return tok._hf_encode_batch(texts)


def code_points() -> list[str]:
    """Every code point Python's Unicode tables assign (others go through HF anyway)."""
    return [c for c in map(chr, range(sys.maxunicode + 1))
            if unicodedata.category(c) not in ("Cn", "Cs")]


@pytest.mark.parametrize("layout", ["{}", " {}", "a{}1", "{}\n"])
def test_every_code_point_encodes_as_hf_does(tok: FastTokenizer, layout: str) -> None:
    """Runs of 24 consecutive code points, each in `layout`: the regex classes (letters,
    numbers, spaces) and the byte merges of every script, as the encoder and HF see them."""
    fast = fast_of(tok)
    cps = code_points()
    texts = ["".join(layout.format(c) for c in cps[i:i + 24]) for i in range(0, len(cps), 24)]
    taken = [t for t in texts if fast.takes(t)]
    assert len(taken) > 0.9 * len(texts)
    assert [fast.encode(t) for t in taken] == hf_ids(tok, taken)


def test_random_texts_and_added_tokens(tok: FastTokenizer) -> None:
    rng = random.Random(7)
    pieces = [c for c in map(chr, range(0x20, 0x3000))
              if unicodedata.category(c)[0] not in "MC"]  # marks could need NFC: HF's then
    pieces = rng.sample(pieces, 3000)
    pieces += [" ", "  ", "\n", "\n\n", "\t", "\r\n", "'s", "'LL", "1", "42", "3.5", "é", "🙂"] * 60
    pieces += ["<|im_end|>", "<|im_start|>", "<think>", "</think>", "<tool_call>",
               "<｜end▁of▁sentence｜>", "<｜Assistant｜>"] * 20
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 80))) for _ in range(20000)]
    assert tok.encode_batch(texts) == hf_ids(tok, texts)
    assert sum(map(fast_of(tok).takes, texts)) > 0.8 * len(texts)
    assert [tok.encode(t) for t in texts[:300]] == hf_ids(tok, texts[:300])


def test_every_added_token_in_text(tok: FastTokenizer) -> None:
    """Each added token alone, glued between words, and two in a row."""
    added = [t.content for t in tok._tok.get_added_tokens_decoder().values()]
    texts = [*added, *(f"a{t}b {t}\n{t}{t}" for t in added)]
    taken = [t for t in texts if fast_of(tok).takes(t)]
    assert len(taken) == len(texts)
    assert [fast_of(tok).encode(t) for t in taken] == hf_ids(tok, taken)


def test_texts_normalization_could_change_go_through_hf(tok: FastTokenizer) -> None:
    fast = fast_of(tok)
    decomposed = "cafe\u0301 A\u030a"  # NFC composes both
    unassigned = "x\U000e0080y"  # no character there in any Unicode version so far
    unassigned_bmp = "x\u0378y"
    assert unicodedata.normalize("NFC", decomposed) != decomposed
    if fast._nfc:  # with no normalizer (DeepSeek): the test after this one
        assert not fast.takes(decomposed) and not fast.takes(unassigned)
        assert not fast.takes(unassigned_bmp) and not fast.takes("\ud800 lone surrogate")
    assert fast.takes("plain ascii") and fast.takes("déjà vu 日本語 🙂")
    texts = [decomposed, "between", unassigned, decomposed + "<|im_end|>"]
    assert tok.encode_batch(texts) == hf_ids(tok, texts)
    assert tok.encode(decomposed) == hf_ids(tok, [decomposed])[0]


def test_fastokens_keeps_unassigned_code_points_on_hf_without_a_normalizer() -> None:
    """DeepSeek has no normalizer: fastokens still leaves to HF a code point Python's tables
    do not assign (the two regex engines' tables may differ there) and a lone surrogate."""
    tok = load_tokenizer(deepseek_r1_tokenizer_dir())
    assert isinstance(tok, FastTokenizer)
    fast = fast_of(tok)
    assert isinstance(fast, FastokensEncoder) and not fast._nfc
    assert not fast.takes("x\U000e0080y") and not fast.takes("x\u0378y")
    assert not fast.takes("\ud800 lone surrogate")
    decomposed = "cafe\u0301"  # no normalizer: taken as it is
    assert fast.takes(decomposed) and fast.encode(decomposed) == hf_ids(tok, [decomposed])[0]


def test_assigned_check_agrees_with_the_unicode_tables() -> None:
    """`assigned_here` (one regex pass, astral characters looked up) against the plain
    definition, on texts mixing ASCII, assigned and unassigned BMP characters, surrogates,
    and assigned and unassigned characters beyond the BMP, in every order."""
    pool = ["a", " ", "é", "東", "\u0378", "\ud800", "🙂", "\U0001f9ff", "\U0002fffe",
            "\U000e0080", "\U0010ffff", "𝔘"]
    rng = random.Random(3)
    for _ in range(3000):
        text = "".join(rng.choice(pool) for _ in range(rng.randrange(8)))
        plain = all(unicodedata.category(c) not in ("Cn", "Cs") for c in text)
        assert tokenize_fast.assigned_here(text) == plain, ascii(text)


def test_the_session_tokenizer_is_on_fastokens(qwen3_tok: Tokenizer) -> None:
    """What every other test's Qwen3 tokenizer encodes with."""
    assert isinstance(qwen3_tok, FastTokenizer)
    assert isinstance(qwen3_tok._fast_encoder(wait=True), FastokensEncoder)



def _copy(qwen3_dir: Path, tmp_path: Path, normalizer: object = "keep") -> FastTokenizer:
    """Qwen3's file copied (so that no encoder built earlier in this process is reused),
    its normalizer replaced unless "keep"."""
    spec = orjson.loads((qwen3_dir / "tokenizer.json").read_bytes())
    if normalizer != "keep":
        spec["normalizer"] = normalizer
    file = tmp_path / "tokenizer.json"
    file.write_bytes(orjson.dumps(spec))
    tok = load_tokenizer(file)
    assert isinstance(tok, FastTokenizer)
    return tok


def test_fastokens_refuses_other_normalizers(qwen3_dir: Path, tmp_path: Path) -> None:
    tok = _copy(qwen3_dir, tmp_path, {"type": "NFKC"})
    assert fastokens_encoder(tok._tok, tok.path, tok._hf_encode_batch) is None
    assert tok._fast_encoder(wait=True) is None  # tiktoken refuses it too: HF
    texts = ["① ½ ﬁ", "Hello <|im_end|>"]
    assert tok.encode_batch(texts) == hf_ids(tok, texts)


def test_fastokens_refuses_when_a_sample_differs(qwen3_dir: Path, tmp_path: Path) -> None:
    tok = _copy(qwen3_dir, tmp_path)

    def off_by_one(texts: Sequence[str]) -> list[list[int]]:
        return [[i + 1 for i in ids] for ids in tok._hf_encode_batch(texts)]

    assert fastokens_encoder(tok._tok, tok.path, off_by_one) is None


def test_without_fastokens_tiktoken_is_used(qwen3_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastokens", None)  # import fails as when not installed
    tok = _copy(qwen3_dir, tmp_path)
    assert isinstance(tok._fast_encoder(wait=True), TiktokenEncoder)


_SHORT_COMMAND = """
import atexit, sys, threading
from draftgen.testing.assets import deepseek_r1_tokenizer_dir
from draftgen.tokenize import load_tokenizer

def report():  # runs after the interpreter joined its non-daemon threads, before shutdown
    alive = [t.name for t in threading.enumerate() if t.name == "draftgen-fast-encoder"]
    print("builds alive at exit:", alive, file=sys.stderr)

atexit.register(report)
print(load_tokenizer(deepseek_r1_tokenizer_dir()).encode("hello world"))
"""


@pytest.mark.timeout(600)
def test_a_short_command_exits_0_with_no_build_running() -> None:
    """A command that encodes once starts the fast encoder's build and may end before it does.
    A build thread still inside fastokens at interpreter shutdown aborted the process (rc 134,
    "FATAL: exception not rethrown"); none may be alive then, and every run exits 0."""
    for _ in range(10):
        done = subprocess.run([sys.executable, "-c", _SHORT_COMMAND], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "DRAFTGEN_FASTOKENS": "1"})
        assert "builds alive at exit: []" in done.stderr, done.stderr
        assert done.returncode == 0, done.stderr
