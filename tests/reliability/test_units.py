"""Fast checks of the fixes the reliability suite led to (the suite itself is slow)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from draftgen.formats import get_format
from draftgen.run import PromptTooLong, render_within
from draftgen.store import Store, StoreError
from draftgen.store.runjson_writer import write_atomic
from draftgen.tokenize import Tokenizer
from draftgen.types import Prompt


def test_the_journal_never_glues_a_line_onto_a_torn_one(tmp_path: Path) -> None:
    (tmp_path / "journal.jsonl").write_bytes(b'{"ev":"sent","id":"a"}\n{"ev":"ok","i')
    store = Store(tmp_path)
    store.journal({"ev": "sent", "id": "b"})
    store.close()
    lines = (tmp_path / "journal.jsonl").read_bytes().splitlines()
    assert [orjson.loads(x)["id"] for x in lines] == ["a", "b"]
    assert (tmp_path / "torn_tail.bin").read_bytes() == b'{"ev":"ok","i\n'


def test_run_json_that_cannot_be_written_is_a_store_error(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.with_name("run.json.partial").mkdir()  # the file beside cannot be created
    with pytest.raises(StoreError, match=r"run\.json: cannot write"):
        write_atomic(target, {"a": 1})
    assert not target.exists()


def _prompt(text: str, n: int = 0) -> Prompt:
    return Prompt(id=f"d/{n}", dataset="d", messages=[{"role": "user", "content": text}],
                  source=f"d.jsonl:{n + 1}")


def test_prompts_over_the_context_are_refused(qwen3_tok: Tokenizer) -> None:
    fmt = get_format("qwen3", qwen3_tok)
    short, long_ = _prompt("hello"), _prompt("word " * 300, 1)
    fits = render_within(fmt, [short, long_], None)
    assert all(isinstance(x, list) for x in fits)
    limit = len(fits[0]) + 1  # room for exactly one answer token
    out = render_within(fmt, [short, long_], limit)
    assert out[0] == fits[0]
    assert isinstance(out[1], PromptTooLong) and "d.jsonl:2" in str(out[1])
    assert isinstance(render_within(fmt, [short], limit - 1)[0], PromptTooLong)


def test_a_huge_prompt_is_refused_without_tokenizing_it(qwen3_tok: Tokenizer) -> None:
    fmt = get_format("qwen3", qwen3_tok)
    huge = _prompt("word " * 4_000_000)  # 20 MB: minutes to tokenize
    t0 = time.monotonic()
    out = render_within(fmt, [huge], 8192)
    assert isinstance(out[0], PromptTooLong) and "20,000,000 characters" in str(out[0])
    assert time.monotonic() - t0 < 10
