"""draftgen.datasets: readers, schema detection, IDs, duplicates, bad rows. No network."""

from __future__ import annotations

import gzip
import hashlib
import sys
import types
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftgen.config import DatasetConfig
from draftgen.datasets import (
    MAX_BAD_ROW_EXAMPLES,
    BadRow,
    BadRowError,
    DatasetError,
    LoadStats,
    iter_prompts,
    load_prompts,
    readers,
    rows_to_prompt,
)
from draftgen.types import Prompt

# ---------------------------------------------------------------------------------------------
# Helpers


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def load(path: Path | str, **cfg: Any) -> tuple[list[Prompt], LoadStats]:
    return load_prompts(DatasetConfig(name=cfg.pop("name", "ds"), path=str(path), **cfg))


def prompt_of(row: dict[str, Any]) -> Prompt:
    return rows_to_prompt(row, "ds", "test:1")


def bad_reason(row: Any) -> str:
    with pytest.raises(BadRowError) as caught:
        rows_to_prompt(row, "ds", "test:1")
    return caught.value.reason


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def system(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


def expected_hash_id(messages: list[Any], tools: list[Any] | None) -> str:
    canonical = orjson.dumps([messages, tools], option=orjson.OPT_SORT_KEYS)
    return "h" + hashlib.sha256(canonical).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Schemas


def test_sharegpt_conversations_cut_at_first_assistant() -> None:
    row = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello"},
            {"from": "human", "value": "More"},
        ]
    }
    assert prompt_of(row).messages == [system("Be brief."), user("Hi")]


def test_openai_messages_text_parts_joined_and_optional_fields_kept() -> None:
    row = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Sys"}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                "name": "alice",
                "weight": 1,
            },
            {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "answer", "reasoning_content": "hmm"},
        ]
    }
    assert prompt_of(row).messages == [
        system("Sys"),
        {"role": "user", "content": "a\nb", "name": "alice"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]


def test_non_text_content_part_is_a_bad_row() -> None:
    row = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    assert "'image_url' part" in bad_reason(row)


def test_alpaca_instruction_input_and_system() -> None:
    both = {"instruction": "Translate", "input": "chat", "output": "cat", "system": "S"}
    assert prompt_of(both).messages == [system("S"), user("Translate\n\nchat")]
    no_input = {"instruction": "Say hi", "input": "  ", "output": "hi"}
    assert prompt_of(no_input).messages == [user("Say hi")]


@pytest.mark.parametrize("field", ["prompt", "question", "problem", "query", "input"])
def test_single_field_prompt(field: str) -> None:
    assert prompt_of({field: "What is 2+2?", "answer": "4"}).messages == [user("What is 2+2?")]


def test_prompt_as_a_list_of_messages() -> None:
    row = {"prompt": [user("Q"), {"role": "assistant", "content": "A"}], "completion": "x"}
    assert prompt_of(row).messages == [user("Q")]


def test_top_level_system_prompt_prepended_once() -> None:
    row = {"system_prompt": "You are kind.", "question": "Why?"}
    assert prompt_of(row).messages == [system("You are kind."), user("Why?")]
    same = {"system": "S", "messages": [system("S"), user("Q")]}
    assert prompt_of(same).messages == [system("S"), user("Q")]


def test_public_dataset_rows() -> None:
    magicoder = {"lang": "python", "index": 3, "problem": "Write a parser.", "solution": "..."}
    assert prompt_of(magicoder).messages == [user("Write a parser.")]

    open_thoughts = {
        "system": "Think step by step.",
        "conversations": [
            {"from": "user", "value": "Prove it."},
            {"from": "assistant", "value": "<think>...</think> Done."},
        ],
    }
    assert prompt_of(open_thoughts).messages == [system("Think step by step."), user("Prove it.")]

    mixture_of_thoughts = {
        "messages": [user("Solve x."), {"role": "assistant", "content": "x=1"}],
        "num_tokens": 10,
        "source": "math",
    }
    assert prompt_of(mixture_of_thoughts).messages == [user("Solve x.")]

    ultrachat = {
        "prompt": "Tell me a story.",
        "prompt_id": "abc123",
        "messages": [user("Tell me a story."), {"role": "assistant", "content": "Once"}],
    }
    ultra = prompt_of(ultrachat)
    assert ultra.messages == [user("Tell me a story.")]
    assert ultra.id == "ds/abc123"


def test_function_calling_rows_keep_tools() -> None:
    tools = [{"name": "get_weather", "description": "d", "parameters": {"city": {"type": "str"}}}]
    xlam = {
        "id": 7,
        "query": "Weather in Paris?",
        "tools": orjson.dumps(tools).decode(),
        "answers": "[]",
    }
    prompt = prompt_of(xlam)
    assert prompt.id == "ds/7"
    assert prompt.messages == [user("Weather in Paris?")]
    assert prompt.tools == [{"type": "function", "function": tools[0]}]

    glaive = {
        "tools": orjson.dumps(tools).decode(),
        "conversations": [
            {"from": "human", "value": "Weather?"},
            {"from": "function_call", "value": '{"name": "get_weather"}'},
            {"from": "observation", "value": "sunny"},
            {"from": "gpt", "value": "Sunny."},
        ],
    }
    assert prompt_of(glaive).messages == [user("Weather?")]


def test_tools_as_openai_list() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    prompt = prompt_of({"messages": [user("Q")], "tools": [tool]})
    assert prompt.tools == [tool]
    assert prompt_of({"messages": [user("Q")], "tools": "[]"}).tools is None


@pytest.mark.parametrize(
    ("tools", "reason"),
    [
        ("{not json", "field 'tools' is a string but not valid JSON"),
        ({"name": "f"}, "field 'tools' must be a list (or a JSON string of a list), got dict"),
        (["f"], "field 'tools[0]' must be an object, got str"),
        ([{"type": "function", "function": {"description": "no name"}}], "has no function name"),
    ],
)
def test_bad_tools(tools: Any, reason: str) -> None:
    assert reason in bad_reason({"messages": [user("Q")], "tools": tools})


# ---------------------------------------------------------------------------------------------
# Bad rows


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"messages": "hello"}, "field 'messages' must be a list, got str"),
        ({"messages": [{"role": 1, "content": "x"}]}, "field 'messages[0].role' must be a string"),
        ({"messages": [{"role": "user", "content": 5}]}, "field 'messages[0].content' must be"),
        ({"messages": ["hi"]}, "field 'messages[0]' must be an object, got str"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown role 'wizard'"),
        ({"question": 42}, "field 'question' must be a string, got int"),
        ({"instruction": ["x"]}, "field 'instruction' must be a string, got list"),
        ({"system": 3, "question": "q"}, "field 'system' must be a string, got int"),
        ([1, 2], "row must be a JSON object, got list"),
    ],
)
def test_wrong_types_are_bad_rows(row: Any, reason: str) -> None:
    assert reason in bad_reason(row)


def test_unknown_schema_names_the_keys() -> None:
    assert (
        bad_reason({"chosen": "a", "rejected": "b"})
        == "unknown schema: keys ['chosen', 'rejected']"
    )


@pytest.mark.parametrize(
    "row",
    [
        {"messages": [system("S"), {"role": "assistant", "content": "A"}, user("late")]},
        {"messages": []},
        {"conversations": [{"from": "gpt", "value": "first"}]},
    ],
)
def test_no_user_before_first_assistant(row: dict[str, Any]) -> None:
    assert bad_reason(row) == "no user turn before the first assistant turn"


@pytest.mark.parametrize(
    "row", [{"prompt": "   \n"}, {"messages": [user("")]}, {"instruction": "", "input": ""}]
)
def test_empty_prompt_is_a_bad_row(row: dict[str, Any]) -> None:
    assert "empty user content" in bad_reason(row)


def test_malformed_lines_reported_with_file_and_line_rest_loaded(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(
        b'{"prompt": "one"}\n'
        b'{"prompt": "two"\n'
        b"\n"
        b'{"prompt": "caf\xff"}\n'
        b'{"messages": "nope"}\n'
        b"[1]\n"
        b'{"prompt": "three"}\n'
    )
    prompts, stats = load(path)
    assert [p.messages[0]["content"] for p in prompts] == ["one", "three"]
    assert [p.source for p in prompts] == [f"{path}:1", f"{path}:7"]
    assert (stats.rows, stats.prompts, stats.bad_rows) == (6, 2, 4)
    sources = [b.source for b in stats.examples]
    assert sources == [f"{path}:2", f"{path}:4", f"{path}:5", f"{path}:6"]
    reasons = [b.reason for b in stats.examples]
    assert reasons[0].startswith("not valid JSON: ")
    assert reasons[1].startswith("not UTF-8 at byte 15 of the line")
    assert reasons[2] == "field 'messages' must be a list, got str"
    assert reasons[3] == "row must be a JSON object, got list"


def test_bad_row_examples_are_capped_but_all_counted(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"{oops\n" * (MAX_BAD_ROW_EXAMPLES + 5) + b'{"prompt": "ok"}\n')
    prompts, stats = load(path)
    assert len(prompts) == 1
    assert stats.bad_rows == MAX_BAD_ROW_EXAMPLES + 5
    assert len(stats.examples) == MAX_BAD_ROW_EXAMPLES
    assert stats.examples[0] == BadRow(f"{path}:1", stats.examples[0].reason)


# ---------------------------------------------------------------------------------------------
# Formats


def test_mixed_schemas_in_one_file(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"conversations": [{"from": "human", "value": "a"}]},
            {"messages": [user("b")]},
            {"instruction": "c"},
            {"problem": "d"},
        ],
    )
    prompts, stats = load(path)
    assert [p.messages for p in prompts] == [[user(t)] for t in "abcd"]
    assert stats.bad_rows == 0


def test_jsonl_gz_bom_crlf_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'\xef\xbb\xbf{"prompt": "a"}\r\n\r\n{"prompt": "b"}')
    prompts, stats = load(path)
    assert [p.messages[0]["content"] for p in prompts] == ["a", "b"]
    assert prompts[1].source == f"{path}:3"
    assert stats.rows == 2


def test_json_list_file(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(orjson.dumps([{"prompt": "a"}, {"prompt": ""}, {"prompt": "c"}]))
    prompts, stats = load(path)
    assert [p.source for p in prompts] == [f"{path}[row 0]", f"{path}[row 2]"]
    assert stats.examples == [
        BadRow(f"{path}[row 1]", "empty user content (nothing but whitespace)")
    ]


def test_json_object_with_row_list_and_json_lines_in_a_json_file(tmp_path: Path) -> None:
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_bytes(orjson.dumps({"version": 1, "data": [{"prompt": "a"}]}))
    assert len(load(wrapped)[0]) == 1
    lines = write_jsonl(tmp_path / "lines.json", [{"prompt": "a"}, {"prompt": "b"}])
    assert [p.source for p in load(lines)[0]] == [f"{lines}:1", f"{lines}:2"]
    other = tmp_path / "other.json"
    other.write_bytes(orjson.dumps({"meta": 1}))
    with pytest.raises(DatasetError, match="expected a JSON list of rows"):
        load(other)


def test_parquet_file_with_mixed_schemas(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    table = pa.Table.from_pylist(
        [
            {"id": "r1", "messages": [{"role": "user", "content": "a"}], "prompt": None},
            {"id": "r2", "messages": None, "prompt": "b"},
            {"id": "r3", "messages": None, "prompt": None},
        ]
    )
    pq.write_table(table, path, row_group_size=2)
    prompts, stats = load(path)
    assert [(p.id, p.messages, p.source) for p in prompts] == [
        ("ds/r1", [user("a")], f"{path}[row 0]"),
        ("ds/r2", [user("b")], f"{path}[row 1]"),
    ]
    assert stats.examples[0].source == f"{path}[row 2]"
    assert stats.examples[0].reason.startswith("unknown schema: keys")


def write_save_to_disk(folder: Path, rows: list[dict[str, Any]], shards: int = 1) -> Path:
    """A folder in the layout `datasets.Dataset.save_to_disk` writes."""
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    per_shard = -(-len(rows) // shards)
    names = []
    for shard in range(shards):
        name = f"data-{shard:05d}-of-{shards:05d}.arrow"
        part = table.slice(shard * per_shard, per_shard)
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, part.schema) as w:
            for batch in part.to_batches(max_chunksize=2):
                w.write_batch(batch)
        names.append(name)
    (folder / "dataset_info.json").write_bytes(orjson.dumps({"features": {}}))
    state = {"_data_files": [{"filename": n} for n in names], "_split": None}
    (folder / "state.json").write_bytes(orjson.dumps(state))
    return folder


def test_save_to_disk_folder(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(5)]
    folder = write_save_to_disk(tmp_path / "saved", rows, shards=2)
    prompts, stats = load(folder)
    assert [p.messages[0]["content"] for p in prompts] == [f"q{i}" for i in range(5)]
    assert prompts[3].source == f"{folder / 'data-00001-of-00002.arrow'}[row 0]"
    assert stats.rows == 5


def test_dataset_dict_folder_uses_the_split(tmp_path: Path) -> None:
    root = tmp_path / "dd"
    write_save_to_disk(root / "train", [{"prompt": "train q"}])
    write_save_to_disk(root / "test", [{"prompt": "test q"}])
    (root / "dataset_dict.json").write_bytes(orjson.dumps({"splits": ["train", "test"]}))
    assert load(root)[0][0].messages == [user("train q")]
    assert load(root, split="test")[0][0].messages == [user("test q")]
    with pytest.raises(DatasetError, match="no split 'validation'"):
        load(root, split="validation")


def test_folder_of_files_in_path_order_and_split_files_only(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    (plain / "sub").mkdir(parents=True)
    write_jsonl(plain / "b.jsonl", [{"prompt": "b"}])
    write_jsonl(plain / "a.jsonl", [{"prompt": "a"}])
    pq.write_table(pa.Table.from_pylist([{"prompt": "c"}]), plain / "sub" / "c.parquet")
    (plain / "README.md").write_text("not data")
    (plain / "dataset_info.json").write_text("{}")  # hub metadata, no .arrow files beside it
    assert [p.messages[0]["content"] for p in load(plain)[0]] == ["a", "b", "c"]

    clone = tmp_path / "clone"
    (clone / "data").mkdir(parents=True)
    write_jsonl(clone / "data" / "train-00000.jsonl", [{"prompt": "train"}])
    write_jsonl(clone / "data" / "test-00000.jsonl", [{"prompt": "test"}])
    assert [p.messages[0]["content"] for p in load(clone)[0]] == ["train"]
    assert [p.messages[0]["content"] for p in load(clone, split="test")[0]] == ["test"]


def test_missing_path_and_unknown_format_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match=str(missing)):
        iter_prompts(DatasetConfig(name="ds", path=str(missing)))  # raised before iterating
    unknown = tmp_path / "data.csv"
    unknown.write_text("a,b\n")
    with pytest.raises(DatasetError, match=f"{unknown}: unknown dataset format"):
        load(unknown)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match=f"{empty}: no data files"):
        load(empty)


def test_corrupt_parquet_is_a_dataset_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=f"{path}: cannot read Parquet"):
        load(path)


# ---------------------------------------------------------------------------------------------
# IDs, duplicates, limit


def test_ids_own_field_or_content_hash_and_stable_across_loads(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"id": "x-1", "prompt": "a"},
            {"idx": 5, "prompt": "b"},
            {"uuid": "u", "conversation_id": "c", "prompt": "c"},
            {"prompt": "d", "tools": [{"name": "f"}]},
        ],
    )
    first, _ = load(path, name="set")
    second, _ = load(path, name="set")
    assert [p.id for p in first] == [p.id for p in second]
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert [p.id for p in first] == [
        "set/x-1",
        "set/5",
        "set/u",
        f"set/{expected_hash_id([user('d')], tools)}",
    ]
    assert all(p.dataset == "set" for p in first)


def test_duplicates_dropped_and_id_collisions_suffixed(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"id": 1, "prompt": "a"},
            {"id": 2, "prompt": "a"},  # same content: duplicate, whatever the id
            {"messages": [user("a")]},  # same content again
            {"id": 1, "prompt": "b"},  # same id, other content: collision
            {"prompt": "c"},
            {"question": "c", "answer": "other answer"},  # same prompt: duplicate
        ],
    )
    prompts, stats = load(path)
    hash_b = expected_hash_id([user("b")], None)
    assert [p.id for p in prompts] == [
        "ds/1",
        f"ds/1-{hash_b}",
        f"ds/{expected_hash_id([user('c')], None)}",
    ]
    assert (stats.rows, stats.prompts, stats.duplicates, stats.id_collisions) == (6, 3, 3, 1)
    assert stats.bad_rows == 0
    assert "3 duplicates" in stats.summary()


def test_tools_are_part_of_the_identity(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "a"}, {"prompt": "a", "tools": [{"name": "f"}]}],
    )
    prompts, stats = load(path)
    assert len(prompts) == 2
    assert prompts[0].id != prompts[1].id
    assert stats.duplicates == 0


def test_limit_counts_prompts_yielded(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "a"}, {"bad": 1}, {"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}],
    )
    prompts, stats = load(path, limit=2)
    assert [p.messages[0]["content"] for p in prompts] == ["a", "b"]
    assert (stats.prompts, stats.bad_rows, stats.duplicates, stats.limited) == (2, 1, 1, True)
    everything, stats = load(path, limit=3)
    assert len(everything) == 3
    assert stats.limited is False


def test_iter_prompts_streams_and_fills_stats(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": str(i)} for i in range(10)])
    stats = LoadStats()
    iterator = iter_prompts(DatasetConfig(name="ds", path=str(path)), stats)
    first = next(iterator)
    assert first.messages == [user("0")]
    assert (stats.rows, stats.prompts) == (1, 1)
    assert sum(1 for _ in iterator) == 9
    assert stats.prompts == 10


# ---------------------------------------------------------------------------------------------
# Very long lines


def test_twenty_megabyte_line_streams_fine(tmp_path: Path) -> None:
    big = "x" * (20 * 1024 * 1024)
    path = tmp_path / "big.jsonl"
    with path.open("wb") as f:
        f.write(orjson.dumps({"prompt": big}) + b"\n")
        f.write(b'{"prompt": "' + b"y" * (20 * 1024 * 1024) + b"\n")  # unterminated: bad row
        f.write(b'{"prompt": "after"}\n')
    prompts, stats = load(path)
    assert len(prompts) == 2
    assert len(prompts[0].messages[0]["content"]) == len(big)
    assert prompts[1].source == f"{path}:3"
    assert stats.examples[0].source == f"{path}:2"
    assert stats.examples[0].reason.startswith("not valid JSON")


def test_line_over_the_cap_is_skipped_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(readers, "_SKIP_CHUNK_BYTES", 300)
    path = tmp_path / "d.jsonl"
    path.write_bytes(orjson.dumps({"prompt": "z" * 5000}) + b'\n{"prompt": "ok"}\n')
    prompts, stats = load(path)
    assert [p.source for p in prompts] == [f"{path}:2"]
    assert stats.examples == [BadRow(f"{path}:1", "line longer than 1000 bytes, skipped")]


# ---------------------------------------------------------------------------------------------
# Hub


def test_hub_name_without_datasets_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DatasetError, match=r"org/name: .*needs the 'datasets' package"):
        iter_prompts(DatasetConfig(name="ds", path="org/name"))


def fake_datasets_module(load_dataset: Any) -> types.ModuleType:
    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    return module


def test_hub_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("Couldn't reach 'org/name' on the Hub")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets_module(unreachable))
    with pytest.raises(DatasetError, match=r"org/name: .*hub reachable.*ConnectionError"):
        iter_prompts(DatasetConfig(name="ds", path="org/name"))


def test_hub_rows_streamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def load_dataset(path: str, name: str | None, *, split: str, streaming: bool) -> Any:
        calls.append((path, name, split, streaming))
        return iter([{"prompt": "a"}, {"prompt": 1}])

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets_module(load_dataset))
    prompts, stats = load("org/name", subset="default", split="test")
    assert calls == [("org/name", "default", "test", True)]
    assert [p.source for p in prompts] == ["org/name[row 0]"]
    assert stats.examples[0].source == "org/name[row 1]"


def test_non_hub_looking_missing_path_is_not_sent_to_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DatasetError, match="no such file or folder"):
        iter_prompts(DatasetConfig(name="ds", path="data/sub/set.jsonl"))


@pytest.mark.parametrize("path,folder", [("data/chta.jsonl", False), ("org/rows.parquet", False),
                                         ("data/chta", True)])
def test_a_missing_path_that_looks_local_is_not_sent_to_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, folder: bool
) -> None:
    """`org/name`-shaped, but a data file's name, or under a local folder: a typo."""
    calls: list[Any] = []
    monkeypatch.chdir(tmp_path)
    if folder:
        (tmp_path / path.split("/")[0]).mkdir()
    monkeypatch.setitem(sys.modules, "datasets", fake_datasets_module(
        lambda *args, **kwargs: calls.append(args) or iter([])))
    with pytest.raises(DatasetError, match=f"^{path}: no such file or folder$"):
        iter_prompts(DatasetConfig(name="ds", path=path))
    assert calls == []
