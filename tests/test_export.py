"""`draftgen export`: formats, round trips, filters, splits, shuffle, broken rows, torn tails.

The run folder is built the way `draftgen run` writes one: records from `runner.make_record`
over the real Qwen3 tokenizer and format, appended through `store.Store`, and a run.json from
`store.runjson_writer`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from draftgen.cli import app
from draftgen.export import (
    MANIFEST,
    ExportError,
    ExportFormat,
    ExportOptions,
    MinCheck,
    Overlong,
    export_run,
)
from draftgen.formats import get_format
from draftgen.run import make_record
from draftgen.store import Store
from draftgen.store.runjson_writer import end_session, start_session
from draftgen.tokenize import Tokenizer
from draftgen.types import Prompt, RawAnswer, Usage

IM_END_ID = 151645

# ---- a realistic run folder -----------------------------------------------------------------

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}}]


@dataclass
class Kind:
    """How one answer is made: which engine path and what goes wrong with it."""

    native: bool = True
    finish: str = "stop"
    check: str = "exact"
    """For rebuilt answers: length_ok, length_mismatch or unverifiable."""
    drop_stop: bool = False
    """Native answer that says "stop" but lacks the stop token (an audit failure)."""


def _kind(i: int) -> Kind:
    """A fixed mix: mostly native exact, some rebuilt, a few truncated or broken."""
    return [
        Kind(), Kind(), Kind(), Kind(native=False, check="length_ok"),
        Kind(), Kind(native=False, check="length_mismatch"), Kind(finish="length"),
        Kind(), Kind(native=False, check="unverifiable"), Kind(drop_stop=True),
    ][i % 10]


def _answer(fmt: Any, tok: Tokenizer, i: int, kind: Kind, with_tool: bool) -> RawAnswer:
    reasoning = f"\nThe user asks question {i}. Let me think step {i % 7} through it.\n"
    content = f"\n\nAnswer number {i}: " + "token " * (5 + i % 13)
    calls = None
    if with_tool:
        calls = [{"id": "call_0", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": f"City{i}"})}}]
    finished = kind.finish != "length"
    text = fmt.answer_text(reasoning, content, calls, finished=finished).text
    ids = tok.encode(text)
    usage = Usage(prompt_tokens=10 + i, completion_tokens=len(ids), reasoning_tokens=12,
                  cost=round(0.0001 * (1 + i % 5), 6))
    raw = RawAnswer(reasoning=reasoning, content=content, tool_calls=calls,
                    finish_reason="tool_calls" if with_tool and finished else kind.finish,
                    usage=usage, provider=["Together", "DeepInfra", None][i % 3],
                    quantization=["fp8", "bf16", None][i % 3], model="qwen/qwen3-8b",
                    request_id=f"gen-{i}")
    if kind.native:
        raw.output_ids = ids[:-1] if kind.drop_stop else ids
    elif kind.check == "length_mismatch":
        usage.completion_tokens = len(ids) + 3
    elif kind.check == "unverifiable":
        usage.completion_tokens = None
    return raw


def write_run(root: Path, tok: Tokenizer, sizes: dict[str, int]) -> Path:
    """A run folder with `sizes[name]` answers per dataset (and a few failures)."""
    fmt = get_format("qwen3", tok)
    config = {
        "output_dir": str(root),
        "model": {"name": "qwen/qwen3-8b", "format": "qwen3", "tokenizer": str(tok.path)},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": None, "max_tokens": 4096,
                     "seed": None, "extra": {"min_p": 0.0}},
        "backends": [{"name": "openrouter"}, {"name": "local-sglang"}],
        "datasets": [{"name": n} for n in sizes],
    }
    session = start_session(root / "run.json", config, {"path": str(tok.path),
                                                          "sha256": tok.sha256})
    store = Store(root, fsync_interval_s=0)
    t0 = 1_750_000_000.0
    for d, (name, count) in enumerate(sizes.items()):
        for i in range(count):
            n = d * 1000 + i
            with_tool = i % 4 == 1
            messages = [{"role": "system", "content": "You are helpful."},
                        {"role": "user", "content": f"Question {n} of {name}?"}]
            prompt = Prompt(id=f"{name}-{i:04d}", dataset=name, messages=messages,
                            tools=TOOLS if with_tool else None)
            input_ids = fmt.render_prompt(prompt.messages, prompt.tools)
            raw = _answer(fmt, tok, n, _kind(i), with_tool)
            rebuilt = fmt.rebuild_batch([raw])[0]
            backend = SimpleNamespace(name="openrouter" if i % 2 else "local-sglang",
                                      cfg=SimpleNamespace(provider_routing=None))
            record = make_record(prompt, input_ids, raw, rebuilt, backend,  # type: ignore[arg-type]
                                 raw.usage.cost or 0.0, 1.0 + (i % 9) * 0.7, i % 3,
                                 cost_source="reported" if raw.usage.cost else "priced")
            record.created_at = t0 + n * 30.0
            store.append_record(name, record)
        for j in range(count // 10):
            store.append_failure(name, {
                "id": f"{name}-f{j}", "dataset": name, "backend": "openrouter",
                "kind": ["rate_limited", "timeout", "server_error"][j % 3], "status": 429,
                "message": "slow down", "created_at": t0 + j * 60.0})
    store.close()
    end_session(root / "run.json", session, "completed", {"done_now": sum(sizes.values())})
    return root


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_tok: Tokenizer) -> Path:
    return write_run(tmp_path_factory.mktemp("run"), qwen3_tok, {"chat": 60, "code": 30})


@pytest.fixture
def run_copy(run_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run_dir, dst)
    return dst


def records(run: Path, dataset: str) -> dict[str, dict[str, Any]]:
    lines = (run / dataset / "responses.jsonl").read_bytes().splitlines()
    return {r["id"]: r for r in map(orjson.loads, lines)}


def all_records(run: Path) -> dict[str, dict[str, Any]]:
    return {**records(run, "chat"), **records(run, "code")}


def opts(out: Path, fmt: ExportFormat = ExportFormat.speculators, **kw: Any) -> ExportOptions:
    return ExportOptions(format=fmt, out=out, **kw)


def expected_row(rec: dict[str, Any]) -> tuple[list[int], list[int]]:
    ids = rec["input_ids"] + rec["output_ids"]
    return ids, [0] * len(rec["input_ids"]) + [1] * len(rec["output_ids"])


def read_hf_arrow(folder: Path) -> list[dict[str, Any]]:
    """A save_to_disk folder read with pyarrow alone, following state.json."""
    state = json.loads((folder / "state.json").read_text())
    rows: list[dict[str, Any]] = []
    for f in state["_data_files"]:
        with pa.memory_map(str(folder / f["filename"])) as src:
            rows += pa.ipc.open_stream(src).read_all().to_pylist()
    return rows


def default_kept(rec: dict[str, Any]) -> bool:
    """What the default filters keep in the fixture run."""
    return (rec["finish_reason"] != "length" and rec["token_check"] in ("exact", "length_ok")
            and rec["output_ids"][-1] == IM_END_ID)


# ---- formats and round trips ----------------------------------------------------------------


def test_speculators_round_trip_datasets_and_pyarrow(run_dir: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "spec"
    summary = export_run(run_dir, opts(out, jsonl=True))
    recs = all_records(run_dir)
    kept = {rid for rid, r in recs.items() if default_kept(r)}
    assert summary.written() == len(kept) > 0

    ds = datasets.load_from_disk(str(out)).with_format(None)  # plain lists, not tensors
    assert len(ds) == len(kept)
    assert set(ds.column_names) == {"input_ids", "loss_mask", "seq_len", "text", "metadata"}
    arrow_rows = read_hf_arrow(out)
    for hf_row, pa_row in zip(ds, arrow_rows, strict=True):
        assert hf_row == pa_row
        rec = recs[hf_row["metadata"]["id"]]
        ids, mask = expected_row(rec)
        assert hf_row["input_ids"] == ids
        assert hf_row["loss_mask"] == mask
        assert hf_row["seq_len"] == len(ids)
        meta = hf_row["metadata"]
        assert meta["dataset"] == rec["dataset"]
        assert meta["finish_reason"] == rec["finish_reason"]
        assert meta["usage"] == {**rec["usage"], "cost": rec["usage"]["cost"]}
        assert meta["backend"] == rec["backend"] and meta["provider"] == rec["provider"]
        assert meta["token_check"] == rec["token_check"]
        assert meta["sampling"]["temperature"] == 0.6
        assert json.loads(meta["sampling"]["extra"]) == {"min_p": 0.0}
        assert hf_row["text"].startswith("<|im_start|>system\n")
        assert hf_row["text"].endswith("<|im_end|>")
    assert {r["metadata"]["id"] for r in arrow_rows} == kept

    jsonl_rows = [orjson.loads(line) for line in (out / "jsonl" / "train.jsonl").open("rb")]
    assert jsonl_rows == arrow_rows
    # speculators' prepare_data reads local JSONL with load_dataset("json"): the pass-through
    # path needs input_ids and loss_mask columns.
    from_json = datasets.load_dataset("json", data_files=str(out / "jsonl" / "train.jsonl"),
                                      split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert {"input_ids", "loss_mask"} <= set(from_json.column_names)
    assert from_json[0]["input_ids"] == arrow_rows[0]["input_ids"]
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["written"] == {"train": len(kept)}


def test_speculators_split_is_a_dataset_dict(run_dir: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "spec"
    summary = export_run(run_dir, opts(out, val_fraction=0.3, seed=7))
    dd = datasets.load_from_disk(str(out))
    assert set(dd) == {"train", "validation"}
    assert len(dd["train"]) == summary.written("train")
    assert len(dd["validation"]) == summary.written("validation") > 0
    train_ids = {m["id"] for m in dd["train"]["metadata"]}
    val_ids = {m["id"] for m in dd["validation"]["metadata"]}
    assert not train_ids & val_ids
    total = len(train_ids) + len(val_ids)
    assert 0.1 < len(val_ids) / total < 0.5
    assert json.loads((out / "dataset_dict.json").read_text()) == {
        "splits": ["train", "validation"]}
    assert {r["metadata"]["id"] for r in read_hf_arrow(out / "validation")} == val_ids


def test_specforge_writes_pretokenized_and_conversations(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sf"
    export_run(run_dir, opts(out, ExportFormat.specforge, shuffle=False))
    pretok = [orjson.loads(x) for x in (out / "pretokenized.jsonl").open("rb")]
    convs = [orjson.loads(x) for x in (out / "conversations.jsonl").open("rb")]
    assert len(pretok) == len(convs) > 0
    recs = all_records(run_dir)
    assert [c["id"] for c in convs] == [rid for rid, r in recs.items() if default_kept(r)]
    for row, conv in zip(pretok, convs, strict=True):
        rec = recs[conv["id"]]
        assert set(row) == {"input_ids", "loss_mask"}
        assert (row["input_ids"], row["loss_mask"]) == expected_row(rec)
        *prompt, answer = conv["conversations"]
        assert prompt == rec["messages"]
        assert answer["role"] == "assistant"
        assert answer["content"] == rec["content"]
        assert answer["reasoning_content"] == rec["reasoning"]
        assert answer.get("tool_calls") == rec["tool_calls"]
        assert conv["tools"] == (rec.get("tools") or [])
    assert any(c["tools"] for c in convs)
    assert any(not c["tools"] for c in convs)


def test_parquet_flat_table(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "pq"
    export_run(run_dir, opts(out, ExportFormat.parquet, min_check=MinCheck.any,
                             exclude_truncated=False, checks=False))
    table = pq.read_table(out / "data.parquet")
    recs = all_records(run_dir)
    assert table.num_rows == len(recs)
    for row in table.to_pylist():
        rec = recs[row["id"]]
        assert (row["input_ids"], row["loss_mask"]) == expected_row(rec)
        assert row["prompt_len"] == len(rec["input_ids"])
        assert row["answer_len"] == len(rec["output_ids"])
        assert row["usage_cost"] == rec["usage"]["cost"]
        assert row["latency_s"] == rec["latency_s"]
        assert row["created_at"].timestamp() == pytest.approx(rec["created_at"])
        assert row["token_check"] == rec["token_check"]
    assert table.schema.field("created_at").type == pa.timestamp("ms", tz="UTC")


# ---- filters, caps, weights -----------------------------------------------------------------


def test_default_filters_and_reasons(run_dir: Path, tmp_path: Path) -> None:
    summary = export_run(run_dir, opts(tmp_path / "o", ExportFormat.parquet))
    chat = summary.tallies["chat"]
    assert chat.records == 60
    assert chat.excluded == {"truncated": 6, "token_check:length_mismatch": 6,
                             "token_check:unverifiable": 6, "check:stop_token_missing": 6}
    assert chat.written["train"] == 36


def test_keep_truncated_exact_only_and_no_checks(run_dir: Path, tmp_path: Path) -> None:
    s = export_run(run_dir, opts(tmp_path / "a", ExportFormat.parquet, exclude_truncated=False,
                                 min_check=MinCheck.exact))
    assert s.tallies["chat"].excluded == {
        "token_check:length_ok": 6, "token_check:length_mismatch": 6,
        "token_check:unverifiable": 6, "check:stop_token_missing": 6}
    table = pq.read_table(tmp_path / "a" / "data.parquet")
    assert set(table.column("token_check").to_pylist()) == {"exact"}
    assert "length" in table.column("finish_reason").to_pylist()
    s = export_run(run_dir, opts(tmp_path / "b", ExportFormat.parquet, checks=False))
    assert "check:stop_token_missing" not in s.tallies["chat"].excluded


def test_dataset_selection_caps_and_weights(run_dir: Path, tmp_path: Path) -> None:
    s = export_run(run_dir, opts(tmp_path / "a", ExportFormat.parquet, datasets=["code"]))
    assert list(s.tallies) == ["code"]
    assert set(pq.read_table(tmp_path / "a" / "data.parquet").column("dataset").to_pylist()) \
        == {"code"}

    s = export_run(run_dir, opts(tmp_path / "b", ExportFormat.parquet, caps={"chat": 10}))
    assert s.tallies["chat"].written["train"] == 10
    assert s.tallies["chat"].excluded["cap"] == 26
    assert s.tallies["code"].written["train"] == 18

    s = export_run(run_dir, opts(tmp_path / "c", ExportFormat.parquet,
                                 weights={"code": 2.0, "chat": 0.5}, caps={"code": 30}))
    ids = pq.read_table(tmp_path / "c" / "data.parquet").column("id").to_pylist()
    code_ids = [i for i in ids if i.startswith("code")]
    assert len(code_ids) == 30 and len(set(code_ids)) < 30  # upsampled, then capped
    chat = s.tallies["chat"]
    assert 8 < chat.written["train"] < 28 and chat.excluded["weight"] == 36 - \
        chat.written["train"]

    with pytest.raises(ExportError, match="nope"):
        export_run(run_dir, opts(tmp_path / "d", datasets=["nope"]))
    with pytest.raises(ExportError, match="--cap names"):
        export_run(run_dir, opts(tmp_path / "e", datasets=["chat"], caps={"code": 1}))


def test_max_len_drop_and_truncate(run_dir: Path, tmp_path: Path) -> None:
    recs = [r for r in all_records(run_dir).values() if default_kept(r)]
    lengths = sorted(len(r["input_ids"]) + len(r["output_ids"]) for r in recs)
    limit = lengths[len(lengths) // 2]
    s = export_run(run_dir, opts(tmp_path / "a", ExportFormat.parquet, max_len=limit))
    over = sum(n > limit for n in lengths)
    assert sum(t.excluded["over_max_len"] for t in s.tallies.values()) == over
    t = pq.read_table(tmp_path / "a" / "data.parquet")
    assert max(len(x) for x in t.column("input_ids").to_pylist()) <= limit

    s = export_run(run_dir, opts(tmp_path / "b", ExportFormat.parquet, max_len=limit,
                                 overlong=Overlong.truncate))
    rows = pq.read_table(tmp_path / "b" / "data.parquet").to_pylist()
    fits = [r for r in recs if len(r["input_ids"]) < limit]
    assert len(fits) < len(recs)  # tool declarations make some prompts long
    assert len(rows) == len(fits)
    assert sum(t.excluded["prompt_fills_max_len"] for t in s.tallies.values()) == \
        len(recs) - len(fits)
    assert sum(r["cut_to_max_len"] for r in rows) == sum(
        len(r["input_ids"]) + len(r["output_ids"]) > limit for r in fits)
    by_id = {r["id"]: r for r in recs}
    for row in rows:
        ids, mask = expected_row(by_id[row["id"]])
        assert row["input_ids"] == ids[:limit] and row["loss_mask"] == mask[:limit]
        assert 0 < sum(row["loss_mask"]) < len(row["loss_mask"])


# ---- shuffle and split ----------------------------------------------------------------------


def _order(run_dir: Path, out: Path, **kw: Any) -> list[str]:
    export_run(run_dir, opts(out, ExportFormat.parquet, **kw))
    return pq.read_table(out / ("train.parquet" if kw.get("val_fraction") else "data.parquet")
                         ).column("id").to_pylist()


def test_seeded_shuffle_is_deterministic_and_differs_across_seeds(run_dir: Path,
                                                                  tmp_path: Path) -> None:
    a = _order(run_dir, tmp_path / "a", seed=1)
    b = _order(run_dir, tmp_path / "b", seed=1)
    c = _order(run_dir, tmp_path / "c", seed=2)
    plain = _order(run_dir, tmp_path / "d", shuffle=False)
    assert a == b
    assert a != c and sorted(a) == sorted(c) == sorted(plain)
    assert plain == sorted(plain)  # run order: chat then code, each in file order
    assert a != plain


def test_shuffle_through_many_buckets_keeps_every_row(run_dir: Path, tmp_path: Path) -> None:
    one = _order(run_dir, tmp_path / "a", seed=3)
    many = opts(tmp_path / "b", ExportFormat.parquet, seed=3, bucket_bytes=4096, batch_rows=7)
    export_run(run_dir, many)
    assert pq.read_table(tmp_path / "b" / "data.parquet").column("id").to_pylist() == one
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers


def test_split_fractions_follow_the_hash(run_dir: Path, tmp_path: Path) -> None:
    s = export_run(run_dir, opts(tmp_path / "a", ExportFormat.parquet, val_fraction=0.5,
                                 min_check=MinCheck.any, exclude_truncated=False, checks=False))
    assert s.written("train") + s.written("validation") == 90
    assert 25 < s.written("validation") < 65
    train = pq.read_table(tmp_path / "a" / "train.parquet").column("id").to_pylist()
    val = pq.read_table(tmp_path / "a" / "validation.parquet").column("id").to_pylist()
    assert not set(train) & set(val)
    again = _order(run_dir, tmp_path / "b", val_fraction=0.5, min_check=MinCheck.any,
                   exclude_truncated=False, checks=False)
    assert again == train


# ---- broken rows, torn tails, the run folder untouched ---------------------------------------


def _append_record(run: Path, dataset: str, **changes: Any) -> str:
    path = run / dataset / "responses.jsonl"
    rec = orjson.loads(path.read_bytes().splitlines()[0])
    rec.update(id="broken-1", **changes)
    with path.open("ab") as f:
        f.write(orjson.dumps(rec) + b"\n")
    return rec["id"]


def test_broken_row_fails_loudly(run_copy: Path, tmp_path: Path) -> None:
    _append_record(run_copy, "code", output_ids=[])
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=r"broken-1.*empty output_ids"):
        export_run(run_copy, opts(out))
    assert not out.exists()
    assert not list(tmp_path.glob(".out*"))
    result = CliRunner().invoke(app, ["export", str(run_copy), "-f", "parquet", "-o", str(out)])
    assert result.exit_code == 1
    assert "broken-1" in result.output
    s = export_run(run_copy, opts(out, skip_broken=True))
    assert s.tallies["code"].excluded["broken_row"] == 1


def test_torn_last_line_is_skipped_and_the_run_folder_untouched(run_copy: Path,
                                                               tmp_path: Path) -> None:
    path = run_copy / "chat" / "responses.jsonl"
    with path.open("ab") as f:
        f.write(b'{"id":"torn","dataset":"chat","input_ids":[1,2')
    before = {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()}
    s = export_run(run_copy, opts(tmp_path / "o", ExportFormat.parquet))
    assert s.tallies["chat"].torn_tail_bytes > 0
    assert s.tallies["chat"].records == 60
    assert {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()} == before


def test_without_tokenizer_text_is_left_out_and_said(run_copy: Path, tmp_path: Path) -> None:
    run_json = orjson.loads((run_copy / "run.json").read_bytes())
    run_json["tokenizer"]["path"] = str(tmp_path / "missing")
    for session in run_json["sessions"]:  # and no copy kept in the run folder
        session["settings"]["tokenizer.path"] = str(tmp_path / "missing")
    (run_copy / "run.json").write_bytes(orjson.dumps(run_json))
    shutil.rmtree(run_copy / ".tokenizers", ignore_errors=True)
    s = export_run(run_copy, opts(tmp_path / "o"))
    assert any("text column left out" in n for n in s.notes)
    assert any("stop-token checks skipped" in n for n in s.notes)
    assert "text" not in read_hf_arrow(tmp_path / "o")[0]

    sf = export_run(run_copy, opts(tmp_path / "sf", ExportFormat.specforge))
    assert any("text.jsonl and round_trip.jsonl left out" in n for n in sf.notes)
    assert sorted(p.name for p in (tmp_path / "sf").iterdir()) == [
        "conversations.jsonl", "draftgen_export.json", "pretokenized.jsonl"]


def test_specforge_counts_the_rows_each_text_route_keeps(run_dir: Path, tmp_path: Path) -> None:
    s = export_run(run_dir, opts(tmp_path / "sf", ExportFormat.specforge, shuffle=False))
    marks = [orjson.loads(x) for x in (tmp_path / "sf" / "round_trip.jsonl").open("rb")]
    texts = [orjson.loads(x) for x in (tmp_path / "sf" / "text.jsonl").open("rb")]
    assert [m["id"] for m in marks] == [t["id"] for t in texts]
    n = len(marks)
    text_ok, conv_ok = sum(m["text"] for m in marks), sum(m["conversation"] for m in marks)
    note = next(x for x in s.notes if x.startswith("specforge:"))
    assert note.startswith(f"specforge: {text_ok}/{n} rows keep their IDs through text.jsonl, "
                           f"{conv_ok}/{n} through conversations.jsonl")
    assert "text.jsonl qwen3-thinking (stock), conversations.jsonl draftgen-qwen3" in note
    manifest = orjson.loads((tmp_path / "sf" / "draftgen_export.json").read_bytes())
    assert note in manifest["notes"]
    assert 0 < conv_ok <= text_ok <= n


def test_existing_output_needs_overwrite(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(ExportError, match="--overwrite"):
        export_run(run_dir, opts(out, ExportFormat.parquet))
    with pytest.raises(ExportError, match="not a draftgen export"):
        export_run(run_dir, opts(out, ExportFormat.parquet, overwrite=True))
    assert (out / "keep").read_text() == "x"
    (out / "keep").unlink()
    export_run(run_dir, opts(out, ExportFormat.parquet))
    (out / "stale").write_text("x")
    export_run(run_dir, opts(out, ExportFormat.parquet, overwrite=True))
    assert not (out / "stale").exists() and (out / "data.parquet").exists()


def test_cli_prints_what_was_written_and_excluded(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = CliRunner().invoke(app, [
        "export", str(run_dir), "--format", "specforge", "--out", str(out),
        "--cap", "chat=5", "--weight", "code=1.5", "--val-fraction", "0.2", "--seed", "3",
    ])
    assert result.exit_code == 0, result.output
    for text in ("excluded", "truncated", "cap", "train", "validation", "pretokenized.jsonl"):
        assert text in result.output
    assert (out / "train" / "conversations.jsonl").exists()
    bad = CliRunner().invoke(app, ["export", str(run_dir), "-f", "parquet", "-o",
                                   str(tmp_path / "x"), "--cap", "chat"])
    assert bad.exit_code == 1 and "NAME=NUMBER" in bad.output
