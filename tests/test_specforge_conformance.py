"""`--format specforge` read by SpecForge's own data code (specforge==0.2.0 from PyPI), on real
runs against the loopback test server with the genuine Qwen3 tokenizer and chat template.

Each SpecForge data path is driven through the library functions its entry points call:

* online `data.prompts_path`: `prompt_builder.prepare_prompt_tasks` (what `specforge train`
  calls) on pretokenized.jsonl: every row's IDs and loss mask equal the records';
* online `data.train_data_path` + `is_preformatted`: the same function on text.jsonl with the
  stock template draftgen names: equal on every row round_trip.jsonl marks `text`, different
  on every other;
* online `data.train_data_path` on conversations.jsonl (`build_eagle3_dataset`, the target's
  real chat template, the `draftgen-*` template registered): equal (plus the template's tail
  after the stop token, unmasked) on every row marked `conversation`, different on the others;
* offline `scripts/prepare_hidden_states.py` (not in the wheel): its dataset building, i.e.
  `Dataset.from_generator(safe_conversations_generator)` then `build_eagle3_dataset`, then
  `OfflineEagle3Dataset.process_data` on the features as its generator saves them (hidden
  states zero: there is no target model here). The capture itself needs SGLang and a GPU.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from draftgen.export import ExportFormat, ExportOptions, export_run
from draftgen.export.specforge import TEMPLATES, register_templates
from draftgen.testing.fake_engine import TestServer
from tests.e2e_helpers import (
    WEATHER_TOOL,
    fast_backend,
    mixed_rows,
    read_records,
    run_config,
    write_config,
    write_jsonl,
)


def _trainer_module(name: str) -> Any:
    """The trainer's module; a missing package skips, unless CI requires the trainers."""
    if os.environ.get("DRAFTGEN_REQUIRE_TRAINERS"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


_trainer_module("specforge")
from datasets import Dataset  # noqa: E402
from specforge.data.preprocessing import OfflineEagle3Dataset, build_eagle3_dataset  # noqa: E402
from specforge.data.prompt_builder import prepare_prompt_tasks  # noqa: E402
from specforge.utils import load_tokenizer, safe_conversations_generator  # noqa: E402

MAX_LENGTH = 32768
SHUFFLE_SEED = 42
"""build_eagle3_dataset's default shuffle: rows come back in this permutation."""

Rows = list[tuple[list[int], list[int]]]


def _multi_turn_rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"m{i}", "messages": [
        {"role": "user", "content": f"First question {i}?"},
        {"role": "assistant", "content": f"An earlier answer {i}."},
        {"role": "user", "content": f"A follow-up {i}, with the weather?"},
        {"role": "assistant", "content": "the dataset's answer, regenerated"},
    ], **({"tools": [WEATHER_TOOL]} if i % 3 == 0 else {})} for i in range(n)]


def _run(root: Path, qwen3_dir: Path, rows: list[dict[str, Any]], backend: str,
         dataset: dict[str, Any] | None = None, fmt: str = "qwen3",
         **server: Any) -> Path:
    data = write_jsonl(root / "d.jsonl", rows)
    with TestServer(**server) as srv:
        extra = {"logprobs": False} if backend == "openrouter" else {}
        cfg = write_config(root, qwen3_dir, backends=[fast_backend("b", backend, srv.url, **extra)],
                           datasets=[{"name": "d", "path": str(data), **(dataset or {})}],
                           model={"name": "test/qwen3", "format": fmt, "tokenizer": str(qwen3_dir)})
        assert run_config(cfg).status == "completed"
    return root / "run"


RUNS = {
    # SGLang /generate: the engine's own IDs, a third of them a non-canonical split.
    "engine": lambda root, q: _run(root, q, mixed_rows(40), "sglang", noncanonical_rate=0.3),
    # OpenRouter, no logprobs: IDs rebuilt from text, whitespace-stripped fields.
    "rebuilt": lambda root, q: _run(root, q, mixed_rows(25), "openrouter", mode="openrouter",
                                    strip_whitespace=True),
    # The last assistant turn regenerated, earlier turns kept as history; some with tools.
    "multiturn": lambda root, q: _run(root, q, _multi_turn_rows(12), "sglang",
                                      dataset={"turns": "last"}),
    # A 2507 Thinking layout: the prompt ends with `<think>\n`.
    "thinking": lambda root, q: _run(root, q, mixed_rows(10), "sglang", fmt="qwen3-thinking",
                                     layout="qwen3-thinking"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> dict[str, Path]:
    return {name: make(tmp_path_factory.mktemp(name), qwen3_dir) for name, make in RUNS.items()}


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3_dir: Path) -> Any:
    register_templates()
    return load_tokenizer(str(qwen3_dir))


def _export(run: Path, out: Path, **kw: Any) -> Path:
    export_run(run, ExportOptions(format=ExportFormat.specforge, out=out, **kw))
    return out


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _records_rows(run: Path, ids: list[str]) -> Rows:
    by_id = {r["id"]: r for r in read_records(run, "d")}
    return [(by_id[i]["input_ids"] + by_id[i]["output_ids"],
             [0] * len(by_id[i]["input_ids"]) + [1] * len(by_id[i]["output_ids"])) for i in ids]


def _flat(value: Any) -> list[int]:
    """A row as SpecForge returns it (list, tensor, or a batch of one) as a flat list."""
    value = value.tolist() if hasattr(value, "tolist") else list(value)
    return value[0] if value and isinstance(value[0], list) else value


def _payload_rows(tasks: Any) -> Rows:
    return [(_flat(t["payload"]["input_ids"]), _flat(t["payload"]["loss_mask"])) for t in tasks]


def _unshuffle(rows: Rows) -> Rows:
    """build_eagle3_dataset returns rows in its seeded shuffle; put them back in file order."""
    order = Dataset.from_dict({"i": list(range(len(rows)))}).shuffle(seed=SHUFFLE_SEED)["i"]
    out: Rows = [([], [])] * len(rows)
    for position, index in enumerate(order):
        out[index] = rows[position]
    return out


def _compare(got: Rows, want: Rows, marked: list[bool], tail: list[int]) -> tuple[int, int]:
    """Every marked row equals `want` followed by `tail` (loss 0); every unmarked row differs.
    Returns (marked, unmarked) counts."""
    assert len(got) == len(want) == len(marked)
    for (ids, mask), (want_ids, want_mask), exact in zip(got, want, marked, strict=True):
        if exact:
            assert ids == want_ids + tail
            assert mask == want_mask + [0] * len(tail)
        else:
            assert ids[: len(want_ids)] != want_ids or len(ids) != len(want_ids) + len(tail)
    return sum(marked), len(marked) - sum(marked)


def _folders(out: Path) -> Iterator[Path]:
    splits = [out / s for s in ("train", "validation") if (out / s).is_dir()]
    yield from splits or [out]


def _tail_ids(hf_tokenizer: Any, fmt: str) -> list[int]:
    return hf_tokenizer.encode(TEMPLATES[fmt].after_answer, add_special_tokens=False)


RUN_FORMATS = {"engine": "qwen3", "rebuilt": "qwen3", "multiturn": "qwen3",
               "thinking": "qwen3-thinking"}


@pytest.mark.parametrize("name", RUNS)
def test_prompts_path_reads_every_row_exactly(runs: dict[str, Path], tmp_path: Path,
                                              name: str) -> None:
    out = _export(runs[name], tmp_path / "out", val_fraction=0.3 if name == "engine" else 0.0)
    seen = 0
    for folder in _folders(out):
        ids = [c["id"] for c in _jsonl(folder / "conversations.jsonl")]
        tasks = prepare_prompt_tasks(
            folder / "pretokenized.jsonl", None, chat_template=None, max_length=MAX_LENGTH,
            is_preformatted=False, train_only_last_turn=False, cache_dir=None, cache_key=None,
            num_proc=None)
        assert _payload_rows(tasks) == _records_rows(runs[name], ids)
        seen += len(ids)
    assert seen == len(read_records(runs[name], "d"))
    if name == "engine":
        assert [f.name for f in _folders(out)] == ["train", "validation"]


@pytest.mark.parametrize("name", RUNS)
def test_preformatted_text_is_exact_where_marked(runs: dict[str, Path], tmp_path: Path,
                                                 hf_tokenizer: Any, name: str) -> None:
    out = _export(runs[name], tmp_path / "out")
    texts = _jsonl(out / "text.jsonl")
    marks = [m["text"] for m in _jsonl(out / "round_trip.jsonl")]
    tasks = prepare_prompt_tasks(
        out / "text.jsonl", hf_tokenizer, chat_template=TEMPLATES[RUN_FORMATS[name]].stock_text,
        max_length=MAX_LENGTH, is_preformatted=True, train_only_last_turn=True, cache_dir=None,
        cache_key=None, num_proc=1)
    want = _records_rows(runs[name], [t["id"] for t in texts])
    exact, other = _compare(_unshuffle(_payload_rows(tasks)), want, marks, [])
    assert exact > 0
    if name == "engine":
        assert other > 0  # sampled non-canonical splits do not survive text
    if name == "rebuilt":
        assert other == 0  # IDs rebuilt from text are the canonical encoding


def _conversation_marks(out: Path) -> list[bool]:
    return [m["conversation"] for m in _jsonl(out / "round_trip.jsonl")]


@pytest.mark.parametrize("name", RUNS)
def test_train_data_path_conversations_exact_where_marked(
        runs: dict[str, Path], tmp_path: Path, hf_tokenizer: Any, name: str) -> None:
    out = _export(runs[name], tmp_path / "out")
    convs = _jsonl(out / "conversations.jsonl")
    assert all(isinstance(c["tools"], list) for c in convs)
    template = TEMPLATES[RUN_FORMATS[name]]
    names = [template.name] + ([template.stock_conversations]
                               if template.stock_conversations else [])
    want = _records_rows(runs[name], [c["id"] for c in convs])
    for chat_template in names:
        tasks = prepare_prompt_tasks(
            out / "conversations.jsonl", hf_tokenizer, chat_template=chat_template,
            max_length=MAX_LENGTH, is_preformatted=False, train_only_last_turn=True,
            cache_dir=None, cache_key=None, num_proc=1)
        got = _unshuffle(_payload_rows(tasks))
        if chat_template == template.name:
            exact, _ = _compare(got, want, _conversation_marks(out),
                                _tail_ids(hf_tokenizer, RUN_FORMATS[name]))
            assert exact > 0
        else:  # the stock template: same IDs, its span includes the tail after the stop token
            marks = _conversation_marks(out)
            tail = _tail_ids(hf_tokenizer, RUN_FORMATS[name])
            assert all(ids == w[0] + tail for (ids, _), w, m in zip(got, want, marks, strict=True)
                       if m)


def test_offline_dataset_building_keeps_tools_and_ids(runs: dict[str, Path], tmp_path: Path,
                                                      hf_tokenizer: Any) -> None:
    """prepare_hidden_states.py's data steps on conversations.jsonl, then the offline dataset's
    own processing of one saved feature file per row."""
    run = runs["engine"]
    out = _export(run, tmp_path / "out")
    convs = _jsonl(out / "conversations.jsonl")
    raw = Dataset.from_generator(safe_conversations_generator,
                                 gen_kwargs={"file_path": str(out / "conversations.jsonl")},
                                 cache_dir=str(tmp_path / "hf_cache"))
    assert raw.column_names == ["conversations", "tools"]
    assert [bool(orjson.loads(t)) for t in raw["tools"]] == [bool(c["tools"]) for c in convs]
    built = build_eagle3_dataset(raw, hf_tokenizer, chat_template=TEMPLATES["qwen3"].name,
                                 max_length=MAX_LENGTH, num_proc=1, train_only_last_turn=True)
    got = _unshuffle([(_flat(r["input_ids"]), _flat(r["loss_mask"])) for r in built])
    want = _records_rows(run, [c["id"] for c in convs])
    marks = _conversation_marks(out)
    exact, other = _compare(got, want, marks, _tail_ids(hf_tokenizer, "qwen3"))
    assert exact > 0 and other > 0
    assert any(c["tools"] for c, m in zip(convs, marks, strict=True) if m)
    torch = _trainer_module("torch")
    for (ids, mask), (want_ids, want_mask), m in zip(got, want, marks, strict=True):
        if not m:
            continue
        length = len(ids)
        saved = {"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask),
                 "hidden_state": torch.zeros(1, length, 4),
                 "aux_hidden_state": torch.zeros(1, length, 12)}
        item = OfflineEagle3Dataset.process_data(saved, MAX_LENGTH)
        assert item["input_ids"][0].tolist()[: len(want_ids)] == want_ids
        assert item["loss_mask"][0].tolist() == want_mask + [0] * (length - len(want_ids))


def test_launcher_registers_the_templates_for_a_script(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        "import sys\n"
        "from specforge.data.template import TEMPLATE_REGISTRY\n"
        "names = TEMPLATE_REGISTRY.get_all_template_names()\n"
        "print(sys.argv[1:], [n for n in names if n.startswith('draftgen-')])\n")
    proc = subprocess.run(
        [sys.executable, "-m", "draftgen.export.specforge", str(script), "--chat-template",
         "draftgen-qwen3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("['--chat-template', 'draftgen-qwen3'] "
                                   "['draftgen-qwen3', 'draftgen-qwen3-thinking']")


PREPARE_DATA_STEPS = """
import argparse, json
from datasets import Dataset
from specforge.data.preprocessing import build_eagle3_dataset
from specforge.utils import load_tokenizer, safe_conversations_generator

# prepare_hidden_states.py's arguments and data steps (its capture needs SGLang and a GPU)
parser = argparse.ArgumentParser()
for name in ("--data-path", "--chat-template", "--target-model-path", "--cache-dir",
             "--output-path"):
    parser.add_argument(name)
args = parser.parse_args()
dataset = Dataset.from_generator(safe_conversations_generator,
                                 gen_kwargs={"file_path": args.data_path},
                                 cache_dir=args.cache_dir)
built = build_eagle3_dataset(dataset=dataset, tokenizer=load_tokenizer(args.target_model_path),
                             chat_template=args.chat_template, max_length=4096, num_proc=1,
                             loss_mask_filter=None)
rows = [{"input_ids": r["input_ids"].tolist(), "loss_mask": r["loss_mask"].tolist(),
         "attention_mask": r["attention_mask"].tolist()} for r in built]
json.dump(rows, open(args.output_path, "w"))
"""


def _launch(tmp_path: Path, pretokenized: Path, data: Path, qwen3_dir: Path, result: Path
            ) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prepare_data_steps.py"
    script.write_text(PREPARE_DATA_STEPS)
    return subprocess.run(
        [sys.executable, "-m", "draftgen.export.specforge", "--pretokenized", str(pretokenized),
         str(script), "--data-path", str(data), "--chat-template", "draftgen-qwen3",
         "--target-model-path", str(qwen3_dir), "--cache-dir", str(tmp_path / "cache"),
         "--output-path", str(result)], capture_output=True, text=True, timeout=600)


def test_offline_capture_gets_exact_ids_from_pretokenized(runs: dict[str, Path], tmp_path: Path,
                                                          qwen3_dir: Path) -> None:
    """With --pretokenized, the offline script's dataset holds every recorded row exactly,
    the sampled non-canonical ones too, shaped as SpecForge's own."""
    run = runs["engine"]
    out = _export(run, tmp_path / "out")
    result = tmp_path / "rows.json"
    proc = _launch(tmp_path, out / "pretokenized.jsonl", out / "conversations.jsonl",
                   qwen3_dir, result)
    assert proc.returncode == 0, proc.stderr
    rows = orjson.loads(result.read_bytes())
    got = _unshuffle([(r["input_ids"][0], r["loss_mask"][0]) for r in rows])
    want = _records_rows(run, [c["id"] for c in _jsonl(out / "conversations.jsonl")])
    assert got == want
    assert not all(_conversation_marks(out))  # rows the conversations route cannot keep
    assert all(r["attention_mask"] == [[1] * len(r["input_ids"][0])] for r in rows)


def test_pretokenized_file_of_another_export_is_refused(runs: dict[str, Path],
                                                        tmp_path: Path, qwen3_dir: Path) -> None:
    small = _export(runs["thinking"], tmp_path / "small")
    big = _export(runs["engine"], tmp_path / "big")
    proc = _launch(tmp_path, small / "pretokenized.jsonl", big / "conversations.jsonl",
                   qwen3_dir, tmp_path / "r.json")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"error: --pretokenized {small / 'pretokenized.jsonl'}: 10 rows, but --data-path "
        f"{big / 'conversations.jsonl'} has 40: pass the pretokenized.jsonl exported with "
        "that file")
    assert not (tmp_path / "r.json").exists()


# ---- turns: all trajectories (tests/trajectory_runs.py writes the run) -----------------------


def test_trajectory_pretokenized_rows_load_exactly(tmp_path: Path, qwen3_dir: Path) -> None:
    """A trajectory's branches in pretokenized.jsonl, read by `prepare_prompt_tasks`: each
    row its last turn's prompt and answer, the mask on every answer of the branch."""
    from draftgen.tokenize import load_tokenizer as load_draftgen_tokenizer
    from tests.test_export_trajectories import assert_exact, expected_row, turn_records
    from tests.trajectory_runs import read_lines, write_trajectory_run

    run = write_trajectory_run(tmp_path / "run",
                               load_draftgen_tokenizer(str(qwen3_dir / "tokenizer.json")))
    out = _export(run, tmp_path / "out", shuffle=False)
    tasks = prepare_prompt_tasks(
        out / "pretokenized.jsonl", None, chat_template=None, max_length=MAX_LENGTH,
        is_preformatted=False, train_only_last_turn=False, cache_dir=None, cache_key=None,
        num_proc=None)
    ids = [r["id"] for r in read_lines(out / "conversations.jsonl")]
    rows = _payload_rows(tasks)
    assert len(rows) == len(ids) == 6
    turns = turn_records(run)
    branch_turns = {"agent/loop:branch-0": [0, 1, 2], "agent/chat:branch-0": [0],
                    "agent/chat:branch-1": [1], "agent/chat:branch-2": [2],
                    "agent/cut:branch-0": [0], "agent/pending:branch-0": [0]}
    for rid, (row_ids, row_mask) in zip(ids, rows, strict=True):
        assert_exact(row_ids, row_mask,
                     expected_row(turns, rid.split(":")[0], branch_turns[rid]))
