"""draftgen audit: a real run (loopback test server, real Qwen3 tokenizer) passes; crafted
defective copies of its records are each caught by the right check; quarantine moves failing
answers out atomically and the next run regenerates exactly them."""

from __future__ import annotations

import copy
import multiprocessing
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from draftgen.audit import PROBLEMS, audit_run
from draftgen.audit.checks import (
    LooseRecord,
    TokenSpec,
    end_think_problems,
    spec_for,
    token_problems,
    tool_token_pairs,
)
from draftgen.audit.engine import Auditor, Routing
from draftgen.audit.quarantine import QuarantineError, quarantine
from draftgen.cli import app
from draftgen.export.checks import audit_problems
from draftgen.formats import get_format
from draftgen.status import collect_status
from draftgen.store import RunLayout, RunLock, Store
from draftgen.store.index import read_index
from draftgen.store.record import Record
from draftgen.testing.assets import family_tokenizer
from draftgen.testing.fake_engine import TestServer
from draftgen.tokenize import Tokenizer
from tests.e2e_helpers import (
    fast_backend,
    mixed_rows,
    read_records,
    run_config,
    write_config,
    write_jsonl,
)
from tests.test_export import write_run

IM_END, END_THINK, TOOL_CALL, END_TOOL_CALL = 151645, 151668, 151657, 151658
ROUTING = {"ignore": ["fireworks"], "quantizations": ["fp8", "bf16"]}


def _make_run(tmp: Path, qwen3_dir: Path, n: int, max_tokens: int = 4096) -> Path:
    data = write_jsonl(tmp / "d.jsonl", mixed_rows(n))
    with TestServer(mode="openrouter", providers=["Alpha", "Beta"]) as paid, \
         TestServer() as local:
        cfg = write_config(tmp, qwen3_dir, backends=[
            fast_backend("local", "sglang", local.url, concurrency=4),
            fast_backend("paid", "openrouter", paid.url, concurrency=4, priority=1,
                         provider=ROUTING)],
            datasets=[{"name": "d", "path": str(data)}])
        raw = yaml.safe_load(cfg.read_text())
        raw["sampling"]["max_tokens"] = max_tokens
        cfg.write_text(yaml.safe_dump(raw))
        assert run_config(cfg).status == "completed"
    return tmp / "run"


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Path:
    return _make_run(tmp_path_factory.mktemp("audit-base"), qwen3_dir, 60, max_tokens=220)


def _pick(records: list[dict[str, Any]], **want: Any) -> dict[str, Any]:
    for r in records:
        tools = bool(r.get("tools"))
        if want.get("tools", tools) != tools:
            continue
        if "finish" in want and r["finish_reason"] != want["finish"]:
            continue
        if want.get("reasoning") and END_THINK not in r["output_ids"]:
            continue
        return copy.deepcopy(r)
    raise AssertionError(f"no record with {want}")


def _defects(records: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (defective record, the problem it must raise)."""
    plain = {"tools": False, "finish": "stop", "reasoning": True}
    tool = {"tools": True, "finish": "tool_calls"}
    out: dict[str, tuple[dict[str, Any], str]] = {}

    def add(name: str, problem: str, rec: dict[str, Any]) -> None:
        rec["id"] = f"d/defect-{name}"
        out[name] = (rec, problem)

    r = _pick(records, **plain)
    r["output_ids"] = r["output_ids"][:-1]
    add("stop_dropped", "stop_token_missing", r)
    r = _pick(records, **plain)
    r["output_ids"].insert(len(r["output_ids"]) // 2, IM_END)
    add("stop_inside", "stop_token_inside_answer", r)
    r = _pick(records, finish="length")
    r["output_ids"].append(IM_END)
    add("stop_on_cut", "stop_token_on_cut_off_answer", r)
    r = _pick(records, **plain)
    r["output_ids"] = []
    add("empty", "output_empty", r)
    r = _pick(records, **plain)
    r["input_ids"][3] += 1
    add("input_ids", "input_ids_not_native", r)
    r = _pick(records, **plain)
    r["reasoning"] = "A different line of thought entirely."
    add("reasoning", "reasoning_mismatch", r)
    r = _pick(records, **plain)
    r["content"] = (r["content"] or "") + " and words the model never wrote"
    add("content", "content_mismatch", r)
    r = _pick(records, **plain)
    r["output_ids"].remove(END_THINK)
    add("end_think_missing", "end_think_missing", r)
    r = _pick(records, **plain)
    r["output_ids"].insert(3, END_THINK)
    add("end_think_repeated", "end_think_repeated", r)
    r = _pick(records, **tool)
    r["output_ids"].remove(END_TOOL_CALL)
    add("tool_unbalanced", "tool_tokens_unbalanced", r)
    r = _pick(records, **tool)
    del r["tools"]
    add("tool_undeclared", "tool_tokens_without_tools", r)
    r = _pick(records, **tool)
    r["tool_calls"][0]["function"]["name"] = "get_time"
    add("tool_calls", "tool_calls_mismatch", r)
    r = _pick(records, **plain)
    r["token_source"], r["token_check"] = "reconstructed", "exact"
    add("exact_claimed", "exact_not_native", r)
    r = _pick(records, **plain)
    r["backend"], r["provider"] = "paid", "Fireworks"
    add("provider", "provider_excluded", r)
    r = _pick(records, **plain)
    r["backend"], r["provider"], r["quantization"] = "paid", "Alpha", "int4"
    add("quantization", "quantization_excluded", r)
    r = _pick(records, **plain)
    r["flags"] = [*r["flags"], "special_token_in_content"]
    add("special_text", "special_token_in_content", r)
    r = _pick(records, **plain)
    for key in ("token_source", "token_check", "messages"):
        del r[key]
    add("old_schema", "missing_fields", r)
    return out


def _craft(root: Path, base: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A run folder: the base run's run.json and answers, the defective copies, a duplicate of
    one answer in a second dataset, a line that is not a record."""
    root.mkdir(parents=True)
    (root / "run.json").write_bytes((base / "run.json").read_bytes())
    defects = _defects(records)
    store = Store(root)
    for r in records:
        store.append_record("d", r)
    for rec, _ in defects.values():
        store.append_record("d", rec)
    store.append_record("e", records[0])  # the same ID in another dataset's file
    store.close()
    with open(root / "d" / "responses.jsonl", "ab") as f:
        f.write(b'["not", "a", "record"]\n')
    return defects


def test_a_real_run_passes(base_run: Path) -> None:
    report = audit_run(base_run, workers=1)
    assert report.ok, report.as_json()["checks"]
    records = read_records(base_run, "d")
    assert report.answers == len(records) == 60
    assert any(r["finish_reason"] == "length" for r in records)  # cut-off answers pass too
    assert any(r.get("tools") for r in records)


def test_each_defect_is_caught_by_its_check(base_run: Path, tmp_path: Path) -> None:
    records = read_records(base_run, "d")
    defects = _craft(tmp_path / "run", base_run, records)
    report = audit_run(tmp_path / "run", workers=1)
    assert not report.ok
    by_id = _failing_ids(report, tmp_path / "run")
    for name, (rec, problem) in defects.items():
        assert problem in by_id.get(rec["id"], []), (name, by_id.get(rec["id"]))
    assert by_id[records[0]["id"]] == ["duplicate_id"]  # the second copy only
    assert report.datasets["e"].problems == {"duplicate_id": 1}
    assert report.problems["not_a_record"] == 1
    clean = {r["id"] for r in records[1:]}
    assert not clean & set(by_id), clean & set(by_id)
    data = report.as_json()
    assert data["checks"]["stop_token_missing"]["examples"] == ["d/defect-stop_dropped"]
    assert data["by_backend"]["paid"]["problems"]["provider_excluded"] == 1
    assert all(len(c["examples"]) <= 5 for c in data["checks"].values())
    # the pool of workers finds the same
    pooled = audit_run(tmp_path / "run", workers=2, per_chunk=16)
    assert pooled.workers == 2
    assert pooled.problems == report.problems and pooled.failing == report.failing
    # the command: JSON, exit status 1
    proc = subprocess.run([sys.executable, "-m", "draftgen", "audit", str(tmp_path / "run"),
                           "--json", "-j", "1"], capture_output=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert orjson.loads(proc.stdout)["checks"]["duplicate_id"]["failed"] == 1


def _audit_output(run_dir: Path, *options: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["audit", str(run_dir), "-j", "1", *options],
                                env={"COLUMNS": "200"})
    return result.exit_code, result.output


def _checks_named(output: str) -> set[str]:
    return {code for code in PROBLEMS if re.search(rf"\b{code}\b", output)}


def test_only_failing_checks_are_listed_unless_all_checks(base_run: Path, tmp_path: Path,
                                                          qwen3_tok: Tokenizer) -> None:
    code, output = _audit_output(base_run)
    assert code == 0 and "all answers pass" in output
    assert output.count("\n") == 1 and not _checks_named(output), output
    code, output = _audit_output(base_run, "--all-checks")
    assert code == 0 and _checks_named(output) == set(PROBLEMS), output
    failing = write_run(tmp_path, qwen3_tok, {"chat": 12})  # one answer lacks its stop token
    code, output = _audit_output(failing)
    assert code == 1 and "1 failing line(s)" in output
    assert _checks_named(output) == {"stop_token_missing"}, output
    assert "chat-0009" in output and "by backend" in output
    code, output = _audit_output(failing, "--all-checks")
    assert code == 1 and _checks_named(output) == set(PROBLEMS), output


def _failing_ids(report: Any, root: Path) -> dict[str, list[str]]:
    from draftgen.audit.engine import problems_of

    out: dict[str, list[str]] = {}
    for name, d in report.datasets.items():
        with open(root / name / "responses.jsonl", "rb") as f:
            for start, end, mask in zip(d.failing.starts, d.failing.ends, d.failing.masks,
                                        strict=True):
                f.seek(start)
                rec = orjson.loads(f.read(end - start))
                if isinstance(rec, dict):
                    out.setdefault(rec["id"], []).extend(problems_of(mask))
    return out


def test_export_uses_the_audit_stop_token_checks() -> None:
    spec = TokenSpec.of_stop([IM_END])
    rec = LooseRecord({"output_ids": [1, IM_END, 2], "finish_reason": "stop",
                       "flags": ["special_token_in_reasoning"]})
    assert audit_problems(rec, IM_END) == audit_problems(rec, spec) == [
        "special_token_in_reasoning", "stop_token_missing", "stop_token_inside_answer"]
    assert audit_problems(LooseRecord({"output_ids": [1, IM_END], "finish_reason": "length"}),
                          IM_END) == ["stop_token_on_cut_off_answer"]
    assert audit_problems(LooseRecord({"output_ids": [1], "finish_reason": "stop"}), None) == []


# ---- other families ----------------------------------------------------------------------------


def test_token_specs_of_other_families() -> None:
    kimi = spec_for(get_format("kimi-k2-thinking", family_tokenizer("kimi")))
    assert kimi.end_think_id == 163607 and kimi.stop_ids == {163586}
    assert set(kimi.tool_pairs) == {(163595, 163596), (163597, 163599)}
    harmony = spec_for(get_format("gpt-oss", family_tokenizer("gpt-oss"),
                                  {"current_date": "2025-01-01"}))
    assert harmony.stop_ids == {200002, 200012} and not harmony.end_think_once
    assert tool_token_pairs(["<tool_call>", "</tool_call>", "<x>"]) == [
        ("<tool_call>", "</tool_call>")]


def test_parallel_harmony_calls_are_one_answer() -> None:
    """gpt-oss's parallel calls each end with `<|call|>`, the next opening with `<|start|>`:
    not a stop token inside the answer (audit and export agree); `<|return|>` there is."""
    tok = family_tokenizer("gpt-oss")
    fmt = get_format("gpt-oss", tok, {"current_date": "2025-01-01"})
    spec = spec_for(fmt)
    calls = [{"function": {"name": n, "arguments": "{}"}} for n in ("a", "b")]
    ids = tok.encode(fmt.answer_text("R", None, calls, finished=True).text)
    fields = {"output_ids": ids, "finish_reason": "tool_calls", "tools": [{}]}
    record = LooseRecord(fields)
    assert ids.count(200012) == 2
    assert token_problems(record, spec) == []
    assert audit_problems(record, spec) == []
    bad = LooseRecord({**fields, "output_ids": [*ids[:-1], 200002, 200006, *ids[-1:]]})
    assert "stop_token_inside_answer" in token_problems(bad, spec)
    assert "stop_token_inside_answer" in audit_problems(bad, spec)


def _kimi_record(fmt: Any, tok: Tokenizer, answer: str) -> Record:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    parsed = fmt.parse_answer_text(answer)
    return Record(id="k/1", dataset="k", messages=messages, tools=tools,
                  input_ids=fmt.render_prompt(messages, tools), output_ids=tok.encode(answer),
                  token_source="native", token_check="exact", flags=[],
                  reasoning=parsed.reasoning, content=parsed.content,
                  tool_calls=parsed.tool_calls, finish_reason="tool_calls", backend="local")


def test_kimi_tool_section_ends_reasoning_without_end_think() -> None:
    tok = family_tokenizer("kimi")
    fmt = get_format("kimi-k2.5", tok)  # the prompt opens <think>: the answer starts reasoning
    auditor = Auditor(tok, fmt, "kimi-k2.5", {}, Routing())
    section = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
               "<|tool_calls_section_end|><|im_end|>")
    implicit = _kimi_record(fmt, tok, "Let me look it up." + section)
    explicit = _kimi_record(fmt, tok, "Let me look it up.</think>" + section)
    missing = _kimi_record(fmt, tok, "Let me look it up. It is sunny.<|im_end|>")
    missing.reasoning, missing.content = "Let me look it up.", "It is sunny."
    assert implicit.reasoning == "Let me look it up." and implicit.tool_calls
    assert auditor.check([implicit, explicit]) == [[], []]
    assert "end_think_missing" in auditor.check([missing])[0]
    spec = spec_for(fmt)
    assert end_think_problems([1, 2], spec, finished=True, has_reasoning=True,
                              tool_section_ends_reasoning=True) == []


# ---- quarantine ----------------------------------------------------------------------------------


def _corrupt(run_dir: Path, ids: set[str]) -> None:
    """Drop the stop token of these answers, in place, as a bug in a writer would."""
    path = run_dir / "d" / "responses.jsonl"
    out = []
    for line in path.read_bytes().splitlines():
        rec = orjson.loads(line)
        if rec["id"] in ids:
            rec["output_ids"] = rec["output_ids"][:-1]
        out.append(orjson.dumps(rec) + b"\n")
    path.write_bytes(b"".join(out))
    for name in ("index.jsonl", "index.v1.bin"):
        (run_dir / "d" / name).unlink()
    read_index(run_dir / "d" / "index.jsonl", path, repair=True)


def _finished_ids(run_dir: Path, k: int) -> set[str]:
    ids = sorted(r["id"] for r in read_records(run_dir, "d") if r["finish_reason"] == "stop")
    return set(ids[:k])


def test_quarantine_then_resume_regenerates_exactly_those(tmp_path: Path,
                                                          qwen3_dir: Path) -> None:
    run_dir = _make_run(tmp_path, qwen3_dir, 30)
    bad = _finished_ids(run_dir, 3)
    _corrupt(run_dir, bad)
    report = audit_run(run_dir, workers=1)
    assert report.failing == 3
    moved = quarantine(report)
    assert moved.moved == {"d": 3}
    kept = read_records(run_dir, "d")
    held = [orjson.loads(x) for x in (run_dir / "d" / "quarantine.jsonl").read_bytes()
            .splitlines()]
    assert {r["id"] for r in held} == bad and not bad & {r["id"] for r in kept}
    assert all(r["quarantine"]["problems"] == ["stop_token_missing"] for r in held)
    entries, _ = read_index(run_dir / "d" / "index.jsonl", run_dir / "d" / "responses.jsonl",
                            repair=False)
    assert [e.id for e in entries] == [r["id"] for r in kept]
    st = collect_status(run_dir).datasets["d"]
    assert (st.sums.answers, st.quarantined, st.pending) == (27, 3, 3)
    assert audit_run(run_dir, workers=1).ok
    # the next run sends exactly the quarantined prompts again
    before = {r["id"] for r in kept}
    with TestServer() as local:
        cfg = write_config(tmp_path, qwen3_dir, backends=[
            fast_backend("local", "sglang", local.url, concurrency=4)],
            datasets=[{"name": "d", "path": str(tmp_path / "d.jsonl")}],
            sampling={"temperature": 0.6, "top_p": 0.95, "max_tokens": 4096})  # the run's
        outcome = run_config(cfg)
        sent = sum(local.stats["requests"].values())
    assert outcome.status == "completed" and sent == 3
    after = read_records(run_dir, "d")
    assert {r["id"] for r in after} - before == bad and len(after) == 30
    assert audit_run(run_dir, workers=1).ok


def test_quarantine_interrupted_before_the_rename_loses_nothing(
    base_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = read_records(base_run, "d")
    defects = _craft(tmp_path / "run", base_run, records)
    run_dir = tmp_path / "run"
    all_lines = (run_dir / "d" / "responses.jsonl").read_bytes()
    report = audit_run(run_dir, workers=1)

    def killed(*_: Any) -> None:
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr("draftgen.store.quarantine_move.os.replace", killed)
    with pytest.raises(KeyboardInterrupt):
        quarantine(report)
    monkeypatch.undo()
    assert (run_dir / "d" / "responses.jsonl").read_bytes() == all_lines
    held = (run_dir / "d" / "quarantine.jsonl").read_bytes().count(b"\n")
    assert held == len(report.datasets["d"].failing)
    assert collect_status(run_dir).datasets["d"].sums.answers == len(records) + len(defects)
    # again, from the start: nothing copied twice, everything in exactly one file
    again = quarantine(audit_run(run_dir, workers=1))
    assert again.already["d"] == again.moved["d"] == held
    quarantined = [orjson.loads(x) for x in (run_dir / "d" / "quarantine.jsonl").read_bytes()
                   .splitlines()]
    assert len(quarantined) == held
    kept = {r["id"] for r in read_records(run_dir, "d")}
    held_ids = {r["id"] for r in quarantined if r["id"]}
    assert not kept & held_ids
    assert kept | held_ids == {r["id"] for r in records} | {r["id"] for r, _ in defects.values()}


def _hold_lock(path: str, ready: Any) -> None:
    RunLock(Path(path)).acquire()
    ready.set()
    time.sleep(60)


@pytest.mark.slow
def test_quarantine_is_refused_while_a_run_is_live(base_run: Path, tmp_path: Path) -> None:
    records = read_records(base_run, "d")
    _craft(tmp_path / "run", base_run, records)
    report = audit_run(tmp_path / "run", workers=1)
    ready = multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold_lock,
                                     args=(str(RunLayout(tmp_path / "run").lock), ready))
    holder.start()
    try:
        assert ready.wait(10)
        with pytest.raises(QuarantineError, match=f"pid {holder.pid}"):
            quarantine(report)
        proc = subprocess.run([sys.executable, "-m", "draftgen", "audit", str(tmp_path / "run"),
                               "--quarantine"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "live" in proc.stderr
    finally:
        holder.kill()
        holder.join()
    assert not (tmp_path / "run" / "d" / "quarantine.jsonl").exists()
