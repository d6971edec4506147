"""The files each export format writes, streamed batch by batch.

Layout of `--out OUT` (SPLIT is "train", plus "validation" with --val-fraction):

* speculators: OUT is a `save_to_disk` folder of what speculators' `prepare_data` writes and
  its trainer's `ArrowDataset` reads (int64 `input_ids`/`loss_mask`, `seq_len`, torch format)
  plus `token_freq.pt` (answer-token counts, for its draft vocabulary). With a split, each split
  is such a folder (OUT/train/, OUT/validation/; OUT/dataset_dict.json lets `datasets` read
  both at once). `--jsonl` adds OUT/jsonl/SPLIT.jsonl (`prepare_data --data` pass-through).
* specforge: OUT/pretokenized.jsonl, OUT/conversations.jsonl and (with the run's tokenizer)
  OUT/text.jsonl and OUT/round_trip.jsonl, or OUT/SPLIT/… with a split.
* trajectories: OUT/trajectories.jsonl, or OUT/SPLIT/trajectories.jsonl with a split:
  speculators' trajectory JSONL, one line per sequence (branch) of a trajectory
  (`rows.trajectory_row`), read by `prepare_data --data` (pass-through of input_ids and
  loss_mask).
* parquet: OUT/data.parquet, or OUT/train.parquet and OUT/validation.parquet with a split: a
  flat table for analysis (pandas, pyarrow, `datasets.load_dataset("parquet")`); neither
  trainer reads it (SpecForge reads JSON/JSONL, speculators a save_to_disk folder).
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable
from itertools import compress
from pathlib import Path
from typing import IO, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from draftgen.export.hfdisk import HFDiskWriter, write_dataset_dict
from draftgen.export.rows import (
    TrainRow,
    conversation_row,
    flat_row,
    pretokenized_row,
    speculators_row,
    trajectory_row,
)
from draftgen.export.specforge import round_trip, template_for
from draftgen.export.torchfile import save_int_dict
from draftgen.formats import Format
from draftgen.tokenize import Tokenizer

IDS = pa.list_(pa.int32())
USAGE = pa.struct([
    ("prompt_tokens", pa.int64()),
    ("completion_tokens", pa.int64()),
    ("reasoning_tokens", pa.int64()),
    ("cached_tokens", pa.int64()),
    ("cost", pa.float64()),
])
SAMPLING = pa.struct([
    ("temperature", pa.float64()),
    ("top_p", pa.float64()),
    ("top_k", pa.int64()),
    ("max_tokens", pa.int64()),
    ("seed", pa.int64()),
    ("extra", pa.string()),
])
METADATA = pa.struct([
    ("id", pa.string()),
    ("dataset", pa.string()),
    ("finish_reason", pa.string()),
    ("usage", USAGE),
    ("cost_usd", pa.float64()),
    ("backend", pa.string()),
    ("provider", pa.string()),
    ("quantization", pa.string()),
    ("model", pa.string()),
    ("sampling", SAMPLING),
    ("token_source", pa.string()),
    ("token_check", pa.string()),
])


LONG_IDS = pa.list_(pa.int64())
SPECULATORS_TENSORS = ["input_ids", "loss_mask", "seq_len"]
"""What speculators' `prepare_data` writes, as it writes them (torch.long), in torch format."""
TOKEN_FREQ = "token_freq.pt"
"""speculators' trainer reads DATA_PATH/token_freq.pt to build the draft vocabulary mapping."""


def speculators_schema(with_text: bool) -> pa.Schema:
    fields = [pa.field("input_ids", LONG_IDS), pa.field("loss_mask", LONG_IDS),
              pa.field("seq_len", pa.int64())]
    if with_text:
        fields.append(pa.field("text", pa.string()))
    fields.append(pa.field("metadata", METADATA))
    return pa.schema(fields)


FLAT_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("dataset", pa.string()),
    ("split", pa.string()),
    ("input_ids", IDS),
    ("loss_mask", IDS),
    ("prompt_len", pa.int32()),
    ("answer_len", pa.int32()),
    ("cut_to_max_len", pa.bool_()),
    ("finish_reason", pa.string()),
    ("token_source", pa.string()),
    ("token_check", pa.string()),
    ("flags", pa.list_(pa.string())),
    ("backend", pa.string()),
    ("provider", pa.string()),
    ("quantization", pa.string()),
    ("model", pa.string()),
    ("usage_prompt_tokens", pa.int64()),
    ("usage_completion_tokens", pa.int64()),
    ("usage_reasoning_tokens", pa.int64()),
    ("usage_cached_tokens", pa.int64()),
    ("usage_cost", pa.float64()),
    ("cost_usd", pa.float64()),
    ("latency_s", pa.float64()),
    ("retries", pa.int32()),
    ("created_at", pa.timestamp("ms", tz="UTC")),
])


class Sink(ABC):
    """Receives finished rows of one split at a time; `close` returns the files written."""

    def __init__(self, out: Path, splits: list[str]) -> None:
        self.out = out
        self.splits = splits
        out.mkdir(parents=True, exist_ok=True)

    @property
    def has_split(self) -> bool:
        return len(self.splits) > 1

    @abstractmethod
    def write(self, split: str, rows: list[TrainRow]) -> None: ...

    @abstractmethod
    def close(self) -> list[Path]: ...

    def notes(self) -> list[str]:
        """What the manifest should say about the rows written (after close)."""
        return []

    def abort(self) -> None:
        """Close what is open after a write failed (a full disk), each error ignored: the
        staging folder is removed next, and a file left to the garbage collector would print
        its own error on the way out."""
        for f in self._files():
            with contextlib.suppress(Exception):
                f.abort()

    def _files(self) -> Iterable[JsonlFile | HFDiskWriter]:
        return ()


class JsonlFile:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f: IO[bytes] = open(path, "wb")  # noqa: SIM115 (closed in close())

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._f.write(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows))

    def close(self) -> Path:
        self._f.close()
        return self.path

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()
        if not self._f.closed:  # the flush failed: drop the buffer, close the descriptor
            with contextlib.suppress(OSError):
                os.close(self._f.fileno())


class SpeculatorsSink(Sink):
    def __init__(self, out: Path, splits: list[str], sampling: dict[str, Any],
                 tokenizer: Tokenizer | None, jsonl: bool, fingerprint_seed: str) -> None:
        super().__init__(out, splits)
        self.sampling = sampling
        self.tokenizer = tokenizer
        schema = speculators_schema(tokenizer is not None)
        self.arrow = {
            s: HFDiskWriter(out / s if self.has_split else out, schema,
                            s if self.has_split else None, fingerprint_seed=fingerprint_seed,
                            torch_columns=SPECULATORS_TENSORS)
            for s in splits
        }
        self.answer_tokens: dict[str, Counter[int]] = {s: Counter() for s in splits}
        self.jsonl = {s: JsonlFile(out / "jsonl" / f"{s}.jsonl") for s in splits} if jsonl else {}

    def _text(self, row: TrainRow) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(row.input_ids)

    def write(self, split: str, rows: list[TrainRow]) -> None:
        with_text = self.tokenizer is not None
        out = [speculators_row(r, self.sampling, self._text(r), with_text) for r in rows]
        self.arrow[split].write(out)
        if split in self.jsonl:
            self.jsonl[split].write(out)
        counts = self.answer_tokens[split]
        for r in rows:
            counts.update(compress(r.input_ids, r.loss_mask))

    def _write_token_freq(self, split: str) -> Path:
        """Counts of the answer tokens (loss_mask 1), as speculators'
        `save_token_frequency_distribution` counts them."""
        path = self.arrow[split].folder / TOKEN_FREQ
        save_int_dict(path, dict(self.answer_tokens[split]))
        return path

    def close(self) -> list[Path]:
        files = [p for w in self.arrow.values() for p in w.close()]
        files += [self._write_token_freq(s) for s in self.splits]
        files += [f.close() for f in self.jsonl.values()]
        if self.has_split:
            write_dataset_dict(self.out, self.splits)
        return files

    def _files(self) -> Iterable[JsonlFile | HFDiskWriter]:
        return [*self.arrow.values(), *self.jsonl.values()]


class SpecForgeSink(Sink):
    """pretokenized.jsonl (online `prompts_path`), conversations.jsonl (`train_data_path`,
    offline `prepare_hidden_states.py`) and, with the run's tokenizer, text.jsonl (online
    `train_data_path` + `is_preformatted`) and round_trip.jsonl: per row, whether the two text
    routes give SpecForge the same IDs."""

    def __init__(self, out: Path, splits: list[str], tokenizer: Tokenizer | None,
                 fmt: Format | None) -> None:
        super().__init__(out, splits)
        self.tokenizer = tokenizer
        self.fmt = fmt
        folder = {s: out / s if self.has_split else out for s in splits}
        self.pretok = {s: JsonlFile(folder[s] / "pretokenized.jsonl") for s in splits}
        self.convs = {s: JsonlFile(folder[s] / "conversations.jsonl") for s in splits}
        self.text: dict[str, JsonlFile] = {}
        self.checks: dict[str, JsonlFile] = {}
        if tokenizer is not None:
            self.text = {s: JsonlFile(folder[s] / "text.jsonl") for s in splits}
            self.checks = {s: JsonlFile(folder[s] / "round_trip.jsonl") for s in splits}
        self.rows = 0
        self.text_exact = 0
        self.conversation_exact = 0

    def write(self, split: str, rows: list[TrainRow]) -> None:
        self.pretok[split].write([pretokenized_row(r) for r in rows])
        self.convs[split].write([conversation_row(r) for r in rows])
        if self.tokenizer is not None:
            self._write_text(split, rows, self.tokenizer)

    def _write_text(self, split: str, rows: list[TrainRow], tokenizer: Tokenizer) -> None:
        texts, checks = [], []
        for r in rows:
            text = tokenizer.decode(r.input_ids)
            trip = round_trip(tokenizer, self.fmt, r.record, r.input_ids, text, r.cut)
            texts.append({"id": r.id, "text": text})
            checks.append({"id": r.id, "text": trip.text, "conversation": trip.conversation})
            self.text_exact += trip.text
            self.conversation_exact += trip.conversation
        self.rows += len(rows)
        self.text[split].write(texts)
        self.checks[split].write(checks)

    def notes(self) -> list[str]:
        if self.tokenizer is None:
            return ["text.jsonl and round_trip.jsonl left out: the run's tokenizer is "
                    "unavailable; pass --tokenizer PATH to write them"]
        template = template_for(self.fmt.name if self.fmt else None)
        if template is None:
            names = "no SpecForge chat template is known for this run's format"
        else:
            names = (f"chat templates: text.jsonl {template.stock_text} (stock), "
                     f"conversations.jsonl {template.name} "
                     f"(python -m draftgen.export.specforge registers it)")
        return [f"specforge: {self.text_exact}/{self.rows} rows keep their IDs through "
                f"text.jsonl, {self.conversation_exact}/{self.rows} through conversations.jsonl "
                f"(round_trip.jsonl says which); pretokenized.jsonl keeps all; {names}"]

    def close(self) -> list[Path]:
        return [f.close() for f in self._files()]

    def _files(self) -> list[JsonlFile]:
        groups = (self.pretok, self.convs, self.text, self.checks)
        return [f for files in groups for f in files.values()]


class TrajectorySink(Sink):
    def __init__(self, out: Path, splits: list[str], run_sampling: dict[str, Any]) -> None:
        super().__init__(out, splits)
        self.run_sampling = run_sampling
        self.files = {s: JsonlFile((out / s if self.has_split else out) / "trajectories.jsonl")
                      for s in splits}

    def write(self, split: str, rows: list[TrainRow]) -> None:
        self.files[split].write([trajectory_row(r, self.run_sampling) for r in rows])

    def close(self) -> list[Path]:
        return [f.close() for f in self._files()]

    def _files(self) -> list[JsonlFile]:
        return list(self.files.values())


class ParquetSink(Sink):
    def __init__(self, out: Path, splits: list[str]) -> None:
        super().__init__(out, splits)
        self.paths = {s: out / (f"{s}.parquet" if self.has_split else "data.parquet")
                      for s in splits}
        self.writers = {s: pq.ParquetWriter(str(p), FLAT_SCHEMA, compression="zstd")
                        for s, p in self.paths.items()}

    def write(self, split: str, rows: list[TrainRow]) -> None:
        table = pa.Table.from_pylist([flat_row(r) for r in rows], schema=FLAT_SCHEMA)
        self.writers[split].write_table(table)

    def close(self) -> list[Path]:
        for w in self.writers.values():
            w.close()
        return list(self.paths.values())

    def abort(self) -> None:
        for w in self.writers.values():
            with contextlib.suppress(Exception):
                w.close()
