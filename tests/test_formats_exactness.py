"""Exact IDs from per-token logprobs, on the real Qwen3 tokenizer: a non-canonical BPE split
(what a model can sample, and re-encoding the text cannot give back) is recovered exactly."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from draftgen.backends import chat_logprobs
from draftgen.backends.openai_chat import answer_from_body, answer_from_json
from draftgen.formats import Format, get_format
from draftgen.tokenize import Tokenizer
from draftgen.tokenize.logprob_tokens import LogprobToken, LogprobTokens
from draftgen.types import RawAnswer, Usage

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


# ---- whole chat answers: the backend's lazy reading against the generic one -------------------

MULTIBYTE = [
    ("\nThe user greets me: café 東京 🙂.\n", "\n\nBonjour, toujours prêt! naïve — ✓"),
    ("\n𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👩\u200d👩\u200d👧 नमस्ते\n", "\n\n안녕하세요 龘靐齉 𠀋 ☃︎ ﷽ greetings"),
    ("\nplain words only, and some more words\n", "\n\nZürich costs €5, 日本語 too."),
    ("\nA clef 𝄞 in the reasoning.\n", "\n\nAnd an owl ꙮ in the content."),
]


def _cut(data: bytes) -> bool:
    """`data` ends inside a UTF-8 character (llama-server holds the token back then)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.reason == "unexpected end of data"
    return False


def _wire_entries(tok: Tokenizer, ids: list[int], *, with_ids: bool, held_back: bool
                  ) -> list[dict[str, Any]]:
    """Logprob entries as JSON objects: text (cut characters as U+FFFD), bytes, `id` when
    `with_ids`; `held_back`: llama-server's, a token that leaves the text inside a character
    reported with the next one (its bytes first, the next one's `id`)."""
    out: list[dict[str, Any]] = []
    pending, text = b"", b""
    for tid in ids:
        data = tok.id_to_bytes(tid)
        assert data is not None
        pending, text = pending + data, text + data
        if held_back and _cut(text):
            continue
        entry = {"token": pending.decode("utf-8", "replace"), "logprob": -0.25,
                 "bytes": list(pending), "top_logprobs": []}
        out.append({**entry, "id": tid} if with_ids else entry)
        pending = b""
    assert not pending
    return out


def _chat_body(reasoning: str, content: str, entries: list[dict[str, Any]], n: int,
               spaced: bool) -> bytes:
    body = {"id": "gen-1", "model": "m", "choices": [{
        "index": 0, "finish_reason": "stop", "logprobs": {"content": entries},
        "message": {"role": "assistant", "content": content, "reasoning": reasoning}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": n}}
    return json.dumps(body).encode() if spaced else orjson.dumps(body)


@pytest.mark.parametrize("shape", ["ids", "no_ids", "ids_spaced", "no_ids_spaced", "held_back"])
def test_lazy_logprobs_rebuild_as_the_generic_reading(
        hybrid: Format, qwen3_tok: Tokenizer, shape: str) -> None:
    """Whole chat answers with characters cut across tokens, canonical and not: the answer
    read by `answer_from_body` (bytes checked as one string, IDs through the spelling table
    when the entries have none, no column built) rebuilds to what the generic reading's
    columns rebuild to, and to the engine's IDs. Compact spellings never build the bytes
    column, nor do spaced ones with IDs."""
    cut_tokens = exact = held_exact = 0
    for reasoning, content in MULTIBYTE:
        text = hybrid.answer_text(reasoning, content, None, finished=True).text
        canonical = qwen3_tok.encode(text)
        for ids in (canonical, [*non_canonical(qwen3_tok, canonical[:-1]), IM_END]):
            assert qwen3_tok.decode(ids) == text
            entries = _wire_entries(qwen3_tok, ids[:-1], with_ids="no_ids" not in shape,
                                    held_back=shape == "held_back")
            cut_tokens += sum("\ufffd" in e["token"] for e in entries)
            raw = _chat_body(reasoning, content, entries, len(ids), "spaced" in shape)
            lazy, generic = answer_from_body(raw, {}), answer_from_json(orjson.loads(raw), {})
            [fast], [full] = hybrid.rebuild_batch([lazy]), hybrid.rebuild_batch([generic])
            assert fast == full
            nothing_held = len(entries) == len(ids) - 1
            if fast.token_check == "exact":
                exact += 1
                held_exact += not nothing_held
                assert fast.output_ids == ids
                assert fast.flags == ["ids_from_logprobs", "stop_token_appended"]
            else:  # held back, split more than one way: the count cannot single one out
                assert shape == "held_back" and "logprobs_incomplete" in fast.flags
            assert isinstance(lazy.logprobs, LogprobTokens)
            # After the rebuild: the bytes as sent, unless the rebuild read the bytes column
            # (spaced values without IDs, tokens held back), which drops them.
            sent = lazy.logprobs.sent_bytes()
            assert (sent is not None) == (shape in ("ids", "no_ids", "ids_spaced")
                                          or (shape == "held_back" and nothing_held))
            if shape in ("ids", "no_ids"):
                assert sent is not None
                assert sent.spelled == b"|".join(orjson.dumps(e["bytes"]) for e in entries)
            assert lazy == generic  # every column, the bytes and values read now
    if shape == "held_back":
        assert held_exact > 0  # entries standing for several tokens, split one way
    else:
        assert cut_tokens > 0 and exact == 2 * len(MULTIBYTE)


def test_rebuilding_reads_no_logprob_value(hybrid: Format, qwen3_tok: Tokenizer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def unread(body: bytes, count: int) -> list[Any]:
        raise AssertionError("logprob values read")

    monkeypatch.setattr(chat_logprobs, "_logprob_values", unread)
    reasoning, content = MULTIBYTE[0]
    ids = qwen3_tok.encode(hybrid.answer_text(reasoning, content, None, finished=True).text)
    for with_ids in (True, False):
        entries = _wire_entries(qwen3_tok, ids[:-1], with_ids=with_ids, held_back=False)
        answer = answer_from_body(_chat_body(reasoning, content, entries, len(ids), False), {})
        [rebuilt] = hybrid.rebuild_batch([answer])
        assert rebuilt.output_ids == ids
        assert answer.logprobs is not None
        with pytest.raises(AssertionError, match="logprob values read"):
            answer.logprobs.logprobs  # noqa: B018  # the lazy column, read now


@pytest.mark.parametrize("bad", [10**9, 151_669, -5], ids=["huge", "vocab_size", "negative"])
@pytest.mark.parametrize("spelled", [False, True], ids=["id", "token_id_text"])
def test_a_logprob_id_outside_the_vocabulary_is_never_an_answer_token(
        hybrid: Format, qwen3_tok: Tokenizer, bad: int, spelled: bool) -> None:
    """An engine's logprob entry naming no token of the vocabulary (reported as `id`, or as
    vLLM's `token_id:N`) decodes to nothing, so the other entries alone would match the text:
    the answer is rebuilt from its text instead, with the bad ID nowhere, and never breaks the
    batch (a negative ID raised in decoding)."""
    text = hybrid.answer_text("\nR\n", "\n\nHi", None, finished=True).text
    ids = qwen3_tok.encode(text)[:-1]
    extra = (LogprobToken(token=f"token_id:{bad}") if spelled
             else LogprobToken(token="", bytes=[], id=bad))
    entries = [*as_logprobs(qwen3_tok, ids), extra]
    raw = RawAnswer(reasoning="\nR\n", content="\n\nHi", finish_reason="stop",
                    usage=Usage(completion_tokens=len(ids) + 2), logprobs=entries)
    fine = RawAnswer(reasoning="\nR\n", content="\n\nHi", finish_reason="stop",
                     logprobs=as_logprobs(qwen3_tok, ids))
    rebuilt, other = hybrid.rebuild_batch([raw, fine])
    assert bad not in rebuilt.output_ids and max(rebuilt.output_ids) < qwen3_tok.vocab_size
    assert rebuilt.token_source == "reconstructed" and "logprobs_incomplete" in rebuilt.flags
    assert other.flags == ["ids_from_logprobs", "stop_token_appended"]
