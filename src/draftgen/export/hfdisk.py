"""HF `datasets` `save_to_disk` folders, written with pyarrow alone (no `datasets` import).

The layout `datasets.load_from_disk` reads:

    FOLDER/data-00000-of-0000N.arrow   Arrow IPC *stream* files, one schema
    FOLDER/dataset_info.json           {"features": …} matching the schema exactly
    FOLDER/state.json                  {"_data_files": [{"filename": …}], "_split": …, …}

and for a DatasetDict, `FOLDER/dataset_dict.json` = {"splits": [...]} with one such folder per
split. Features are written with the "Sequence" type for lists, which every `datasets` release
reads (2.x and 3.x natively, 4.x+ as `List`). A folder may name an output format in
state.json (`torch_columns`): `load_from_disk` then returns those columns as torch tensors, the
way speculators' `prepare_data` leaves its folders (loading it then needs torch installed).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

_DTYPES: dict[pa.DataType, str] = {
    pa.int8(): "int8",
    pa.int16(): "int16",
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.float32(): "float32",
    pa.float64(): "float64",
    pa.string(): "string",
    pa.bool_(): "bool",
}

DEFAULT_SHARD_BYTES = 500 << 20
"""`datasets`' default max_shard_size."""


def feature(dtype: pa.DataType) -> Any:
    """The `datasets` feature dict for an Arrow type (the subset this project writes)."""
    if dtype in _DTYPES:
        return {"dtype": _DTYPES[dtype], "_type": "Value"}
    if pa.types.is_list(dtype):
        item = dtype.value_type
        if pa.types.is_struct(item):
            raise TypeError("lists of structs are not supported (Sequence turns them inside out)")
        return {"feature": feature(item), "_type": "Sequence"}
    if pa.types.is_struct(dtype):
        return {dtype.field(i).name: feature(dtype.field(i).type) for i in range(dtype.num_fields)}
    raise TypeError(f"no datasets feature for Arrow type {dtype}")


def features(schema: pa.Schema) -> dict[str, Any]:
    return {f.name: feature(f.type) for f in schema}


def with_hf_metadata(schema: pa.Schema) -> pa.Schema:
    """The schema with the `huggingface` metadata `datasets` writes into its Arrow files."""
    info = {"info": {"features": features(schema)}}
    return schema.with_metadata({b"huggingface": orjson.dumps(info)})


class HFDiskWriter:
    """Streams record batches into one save_to_disk folder, starting a new shard past
    `shard_bytes`. Shard names carry the total count, so they are renamed at close."""

    def __init__(self, folder: Path, schema: pa.Schema, split: str | None,
                 shard_bytes: int = DEFAULT_SHARD_BYTES, fingerprint_seed: str = "",
                 torch_columns: list[str] | None = None) -> None:
        self.folder = folder
        self.torch_columns = torch_columns
        self.schema = with_hf_metadata(schema)
        self.split = split
        self.shard_bytes = shard_bytes
        self.rows = 0
        self._parts: list[Path] = []
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._fingerprint_seed = fingerprint_seed
        folder.mkdir(parents=True, exist_ok=True)

    def _open_shard(self) -> None:
        part = self.folder / f"data-{len(self._parts):05d}.arrow.part"
        self._parts.append(part)
        self._sink = pa.OSFile(str(part), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)

    def _close_shard(self) -> None:
        if self._writer is not None and self._sink is not None:
            self._writer.close()
            self._sink.close()
        self._writer = self._sink = None

    def abort(self) -> None:
        """The open shard closed, errors ignored (`Sink.abort`)."""
        for f in (self._writer, self._sink):
            if f is not None:
                with contextlib.suppress(Exception):
                    f.close()
        self._writer = self._sink = None

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        table = pa.Table.from_pylist(rows, schema=self.schema)
        if self._writer is None:
            self._open_shard()
        assert self._writer is not None and self._sink is not None
        self._writer.write_table(table)
        self.rows += len(rows)
        if self._sink.tell() >= self.shard_bytes:
            self._close_shard()

    def close(self) -> list[Path]:
        """Finish the shards, write dataset_info.json and state.json; returns the shards."""
        if not self._parts:
            self._open_shard()  # an empty dataset still has one (empty) shard
        self._close_shard()
        total = len(self._parts)
        shards = []
        for i, part in enumerate(self._parts):
            final = self.folder / f"data-{i:05d}-of-{total:05d}.arrow"
            os.replace(part, final)
            shards.append(final)
        self._write_json("dataset_info.json", {
            "citation": "", "description": "", "features": features(self.schema),
            "homepage": "", "license": "",
        })
        self._write_json("state.json", {
            "_data_files": [{"filename": s.name} for s in shards],
            "_fingerprint": self._fingerprint(),
            "_format_columns": self.torch_columns,
            "_format_kwargs": {},
            "_format_type": "torch" if self.torch_columns else None,
            "_output_all_columns": bool(self.torch_columns),
            "_split": self.split,
        })
        return shards

    def _fingerprint(self) -> str:
        """Stable for the same export (what `datasets` uses to name its caches)."""
        msg = f"{self._fingerprint_seed}\x00{self.split}\x00{self.rows}".encode()
        return hashlib.blake2b(msg, digest_size=8).hexdigest()

    def _write_json(self, name: str, data: dict[str, Any]) -> None:
        (self.folder / name).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))


def write_dataset_dict(folder: Path, splits: list[str]) -> None:
    (folder / "dataset_dict.json").write_bytes(orjson.dumps({"splits": splits}))
