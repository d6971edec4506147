"""A `turns: all` turn's prompt written as the earlier turn it extends plus what it adds
(`store.prompt_refs`): the file grows with the conversation's length, every reader gets the
whole record back, only durable lines are named, and rewriting a file (quarantine) leaves no
reference dangling."""

from __future__ import annotations

from itertools import zip_longest
from pathlib import Path

import msgspec
import orjson
import pytest

from draftgen.run.turns import written_turns
from draftgen.store import RunLayout, Store
from draftgen.store.appender import JsonlAppender
from draftgen.store.index import read_index
from draftgen.store.prompt_refs import LineReader
from draftgen.store.quarantine_move import MovedLine, move_lines
from draftgen.store.record import Damaged, Record, encode_record, record_as_dict

DATASET = "agent"
TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]


def conversation(name: str, turns: int, *, context: int = 20, answer: int = 30,
                 rerender: bool = False) -> list[Record]:
    """The records of a conversation whose turn k's prompt is turn k-1's prompt, its answer
    (`rerender`: the answer's last token rendered back otherwise, as a template that drops
    part of the history does) and `context` new IDs."""
    records: list[Record] = []
    messages: list[dict] = [{"role": "system", "content": "Be brief."}]
    prompt: list[int] = list(range(1000, 1000 + context))
    for k in range(turns):
        messages = [*messages, {"role": "user", "content": f"question {k} of {name}"}]
        output = [5000 + k * answer + i for i in range(answer)]
        records.append(Record(
            id=f"{DATASET}/{name}#{k}", dataset=DATASET, messages=messages, tools=TOOLS,
            input_ids=prompt, output_ids=output, token_source="native", token_check="exact",
            flags=[], reasoning=None, content=f"answer {k}", tool_calls=None,
            finish_reason="stop", backend="engine", created_at=1.0 + k,
            conversation=f"{DATASET}/{name}", turn=k,
            end="last_turn" if k == turns - 1 else None, sampling={}))
        messages = [*messages, {"role": "assistant", "content": f"answer {k}"}]
        history = [*output[:-1], 7] if rerender else output
        prompt = [*prompt, *history, *range(2000 + k * context, 2000 + (k + 1) * context)]
    return records


def write(root: Path, *conversations: list[Record], interleaved: bool = True) -> Path:
    store = Store(root, fsync_interval_s=0)
    rows = ([r for turn in zip_longest(*conversations) for r in turn if r is not None]
            if interleaved else [r for c in conversations for r in c])
    for record in rows:
        store.append_record(DATASET, record)
    store.close()
    return RunLayout(root).responses(DATASET)


def read_back(path: Path) -> list[Record | Damaged | None]:
    out = []
    start = 0
    with LineReader(path) as reader:
        for line in path.read_bytes().splitlines(keepends=True):
            out.append(reader.read(line, start))
            start += len(line)
    return out


def extends(path: Path) -> list[dict | None]:
    return [orjson.loads(line).get("extends") for line in path.read_bytes().splitlines()]


def whole_size(records: list[Record]) -> int:
    return sum(len(encode_record(r)) + 1 for r in records)


def test_a_long_conversation_grows_with_its_length_and_reads_back_whole(tmp_path: Path
                                                                        ) -> None:
    records = conversation("long", 60)
    path = write(tmp_path, records)
    assert read_back(path) == records
    assert path.stat().st_size * 10 < whole_size(records)
    refs = extends(path)
    assert refs[0] is None and all(r is not None for r in refs[1:])
    assert [r["keep"] for r in refs[1:3]] == [20 + 30, 20 + 30 + 20 + 30]  # prompt + answer


def test_interleaved_conversations_each_name_their_own_last_turn(tmp_path: Path) -> None:
    a, b, c = conversation("a", 5), conversation("b", 3), conversation("c", 4)
    path = write(tmp_path, a, b, c)
    assert {r.id: r for r in read_back(path)} == {  # type: ignore[union-attr]
        r.id: r for r in [*a, *b, *c]}
    lines = path.read_bytes().splitlines(keepends=True)
    assert sum(r is not None for r in extends(path)) == len(lines) - 3  # all but turns 0
    starts = {orjson.loads(x)["id"]: sum(map(len, lines[:i])) for i, x in enumerate(lines)}
    for line in lines:
        ref = orjson.loads(line).get("extends")
        if ref is not None:
            me = orjson.loads(line)
            assert ref["id"] == f"{me['conversation']}#{me['turn'] - 1}"
            assert ref["at"] == starts[ref["id"]]


def test_a_history_rendered_otherwise_keeps_the_prompt_it_shares(tmp_path: Path) -> None:
    records = conversation("branch", 4, rerender=True)
    path = write(tmp_path, records)
    assert read_back(path) == records
    refs = extends(path)
    # turn 1 shares turn 0's prompt and all of its answer but the last token
    assert refs[1]["keep"] == 20 + 29


def test_a_turn_that_does_not_extend_the_last_is_written_whole(tmp_path: Path) -> None:
    records = conversation("odd", 4)
    records[2].messages = [{"role": "user", "content": "another history"}]
    records[3].input_ids = [9, *records[3].input_ids]  # shares no first ID
    path = write(tmp_path, records)
    assert [r is not None for r in extends(path)] == [False, True, False, False]
    assert read_back(path) == records


def test_a_turn_extends_only_a_line_an_fsync_covered(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(JsonlAppender, "sync_soon", lambda self: None)
    records = conversation("slow", 4)
    store = Store(tmp_path, fsync_interval_s=3600)  # no fsync while the turns are written
    for record in records[:2]:
        store.append_record(DATASET, record)
    store.sync()  # turn 1's line is durable from here
    for record in records[2:]:
        store.append_record(DATASET, record)
    store.close()
    path = RunLayout(tmp_path).responses(DATASET)
    assert [r is not None for r in extends(path)] == [False, False, True, False]
    assert read_back(path) == records


def test_a_reference_to_no_such_turn_is_a_damaged_line_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, conversation("gone", 3))
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[1] + lines[2])  # the first turn removed by hand
    got = read_back(path)
    assert all(isinstance(r, Damaged) for r in got)
    assert "extends" in got[0].error  # type: ignore[union-attr]


def test_old_full_lines_still_read_and_resume(tmp_path: Path) -> None:
    records = conversation("old", 3)[:2]
    store = Store(tmp_path, fsync_interval_s=0)
    for record in records:  # as a run before references wrote them
        store.append_record(DATASET, record_as_dict(record))
    store.close()
    path = RunLayout(tmp_path).responses(DATASET)
    assert extends(path) == [None, None]
    assert read_back(path) == records
    assert written_turns([tmp_path], DATASET) == {f"{DATASET}/old": records}


def test_resume_reads_each_conversation_whole(tmp_path: Path) -> None:
    a, b = conversation("a", 4), conversation("b", 6)
    assert any(extends(write(tmp_path, a[:3], b[:5])))
    assert written_turns([tmp_path], DATASET) == {f"{DATASET}/a": a[:3], f"{DATASET}/b": b[:5]}


def _spans(path: Path) -> dict[str, tuple[int, int]]:
    out, start = {}, 0
    for line in path.read_bytes().splitlines(keepends=True):
        out[orjson.loads(line)["id"]] = (start, start + len(line))
        start += len(line)
    return out


@pytest.mark.parametrize("moved", [["agent/a#1"], ["agent/b#0", "agent/b#1"], ["agent/a#0"]])
def test_quarantine_leaves_no_reference_dangling(tmp_path: Path, moved: list[str]) -> None:
    """A moved turn's later turns still read whole (their references re-pointed at the lines'
    new places, or written whole where the line they named moved); the moved turns are whole
    in quarantine.jsonl; the index is in step with the file."""
    a, b = conversation("a", 5), conversation("b", 4)
    path = write(tmp_path, a, b)
    spans = _spans(path)
    move_lines(tmp_path, DATASET, [MovedLine(*spans[rid], ["test"]) for rid in
                                   sorted(moved, key=lambda r: spans[r])])
    kept = [r for r in [*a, *b] if r.id not in moved]
    assert sorted(read_back(path), key=lambda r: r.id) == sorted(  # type: ignore[union-attr]
        kept, key=lambda r: r.id)
    quarantined = [orjson.loads(x) for x in
                   RunLayout(tmp_path).quarantine(DATASET).read_bytes().splitlines()]
    assert {q["id"] for q in quarantined} == set(moved)
    for q in quarantined:
        q.pop("quarantine")
        assert msgspec.convert(q, Record) in [*a, *b]
    entries, bad = read_index(RunLayout(tmp_path).index(DATASET), path, repair=False)
    assert bad == 0 and [e.end for e in entries] == [e for _, e in _spans(path).values()]
    assert [e.id for e in entries] == list(_spans(path))
    assert written_turns([tmp_path], DATASET)[f"{DATASET}/b"] == ([] if "agent/b#0" in moved
                                                                  else b)


def test_the_first_turn_after_a_resume_extends_the_last_turn_written(tmp_path: Path) -> None:
    """A resumed session hands each conversation's last written turn to the writer (after one
    sync of the file), so the turn it writes next names it instead of repeating its prompt."""
    records = conversation("resumed", 4)
    path = write(tmp_path, records[:2])
    spans: dict[str, tuple[int, int]] = {}
    turns = written_turns([tmp_path], DATASET, spans)[f"{DATASET}/resumed"]
    assert set(spans) == {r.id for r in records[:2]}
    store = Store(tmp_path, fsync_interval_s=0)
    store.continue_turn(DATASET, turns[-1], *spans[turns[-1].id])
    for record in records[2:]:
        store.append_record(DATASET, record)
    store.close()
    assert [e and e["id"] for e in extends(path)] == [None, *(r.id for r in records[:3])]
    assert read_back(path) == records


def test_a_resumed_turn_is_named_only_once_its_file_is_synced(tmp_path: Path, monkeypatch
                                                             ) -> None:
    """What an earlier process wrote counts as durable only after this one's fsync."""
    write(tmp_path, conversation("unsynced", 1))
    synced: list[int] = []
    monkeypatch.setattr("os.fsync", lambda fd: synced.append(fd))
    appender = JsonlAppender(RunLayout(tmp_path).responses(DATASET), fsync_interval_s=3600)
    assert appender.durable_size == 0
    appender.sync()
    assert synced and appender.durable_size == appender.size > 0
    appender.close()
