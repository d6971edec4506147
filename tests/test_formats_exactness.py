"""Exact IDs from per-token logprobs, on the real Qwen3 tokenizer: a non-canonical BPE split
(what a model can sample, and re-encoding the text cannot give back) is recovered exactly."""

from __future__ import annotations

import pytest

from draftgen.formats import Format, get_format
from draftgen.tokenize import Tokenizer
from draftgen.types import LogprobToken, RawAnswer, Usage

IM_END = 151645


@pytest.fixture(scope="module")
def hybrid(qwen3_tok: Tokenizer) -> Format:
    return get_format("qwen3", qwen3_tok)


def non_canonical(tok: Tokenizer, ids: list[int]) -> list[int]:
    """`ids` with its first splittable word token replaced by two tokens that spell the same
    bytes: the same text, a sequence `encode` never produces."""
    for k, tid in enumerate(ids):
        piece = tok.id_to_token(tid) or ""
        if not piece[1:].isalpha():
            continue
        for cut in range(2, len(piece) - 1):
            head, tail = tok.token_to_id(piece[:cut]), tok.token_to_id(piece[cut:])
            if head is not None and tail is not None:
                return [*ids[:k], head, tail, *ids[k + 1 :]]
    raise AssertionError("no splittable token")


def as_logprobs(tok: Tokenizer, ids: list[int]) -> list[LogprobToken]:
    """Entries as an OpenAI-compatible endpoint returns them: text and bytes, no IDs."""
    table = {v: k for k, v in tok.bytes_to_id().items()}
    return [LogprobToken(token=table[i].decode("utf-8", "replace"), bytes=list(table[i]))
            for i in ids]


def test_logprobs_recover_a_non_canonical_sample(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    reasoning, content = "\nThe user greets me in French.\n", "\n\nBonjour, toujours prêt!"
    text = hybrid.answer_text(reasoning, content, None, finished=True).text
    canonical = qwen3_tok.encode(text)
    sampled = [*non_canonical(qwen3_tok, canonical[:-1]), IM_END]
    assert sampled != canonical
    assert qwen3_tok.decode(sampled) == text and qwen3_tok.encode(text) == canonical
    # The endpoint reports every sampled token but the stop token, which it never returns.
    raw = RawAnswer(reasoning=reasoning, content=content, finish_reason="stop",
                    usage=Usage(completion_tokens=len(sampled)),
                    logprobs=as_logprobs(qwen3_tok, sampled[:-1]))
    text_only = RawAnswer(reasoning=reasoning, content=content, finish_reason="stop",
                          usage=Usage(completion_tokens=len(sampled)))
    exact, rebuilt = hybrid.rebuild_batch([raw, text_only])
    assert exact.output_ids == sampled
    assert (exact.token_source, exact.token_check) == ("native", "exact")
    assert exact.flags == ["ids_from_logprobs", "stop_token_appended"]
    # Text reconstruction gives the canonical split: wrong, and the length check cannot tell
    # when the split keeps the length (here it adds one token).
    assert rebuilt.output_ids == canonical != sampled
    assert rebuilt.token_source == "reconstructed"


def test_logprobs_over_content_only_are_incomplete(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    """Many endpoints return logprobs for the content only: not the whole answer, so the
    record falls back to reconstruction and says why."""
    content = "\n\nHello there!"
    raw = RawAnswer(reasoning="\nR\n", content=content, finish_reason="stop",
                    logprobs=as_logprobs(qwen3_tok, qwen3_tok.encode(content)))
    [rebuilt] = hybrid.rebuild_batch([raw])
    assert rebuilt.token_source == "reconstructed"
    assert "logprobs_incomplete" in rebuilt.flags


def test_logprobs_of_a_truncated_answer(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    text = hybrid.answer_text("\nR\n", "\n\nPartial answ", None, finished=False).text
    ids = qwen3_tok.encode(text)
    raw = RawAnswer(reasoning="\nR\n", content="\n\nPartial answ", finish_reason="length",
                    logprobs=[LogprobToken(token=f"token_id:{i}") for i in ids])
    [rebuilt] = hybrid.rebuild_batch([raw])
    assert rebuilt.output_ids == ids and IM_END not in rebuilt.output_ids
    assert rebuilt.flags == ["ids_from_logprobs"] and rebuilt.token_check == "exact"


def test_logprobs_with_stripped_fields(hybrid: Format, qwen3_tok: Tokenizer) -> None:
    """A gateway stripped the fields but reported raw logprobs: the restored layout is the
    one they decode to, which proves the restoration."""
    text = hybrid.answer_text("\nR\n", "\n\nHi", None, finished=True).text
    ids = qwen3_tok.encode(text)
    raw = RawAnswer(reasoning="R", content="Hi", finish_reason="stop",
                    logprobs=as_logprobs(qwen3_tok, ids))
    [rebuilt] = hybrid.rebuild_batch([raw])
    assert rebuilt.output_ids == ids and rebuilt.flags == ["ids_from_logprobs"]


def test_unknown_logprob_bytes_fall_back(hybrid: Format) -> None:
    raw = RawAnswer(reasoning="R", content="Hi", finish_reason="stop",
                    logprobs=[LogprobToken(token="?", bytes=[0xFF, 0xFF, 0xFF])])
    [rebuilt] = hybrid.rebuild_batch([raw])
    assert rebuilt.token_source == "reconstructed" and "logprobs_incomplete" in rebuilt.flags


def test_rebuild_with_prompts_checks_lengths(hybrid: Format) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        hybrid.rebuild_batch([RawAnswer(content="x")], prompts=[])
