"""File formats → a stream of rows, each tagged with where it came from.

`open_rows` works out what `path` is (a file, a folder, a hub name) eagerly, so a missing path
or an unknown format fails at once with a `DatasetError`; the rows themselves are read lazily,
one at a time. A row that cannot be parsed comes out as a `BadRow`, never as an exception.
"""

from __future__ import annotations

import gzip
import os
import queue
import re
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from draftgen.datasets.errors import BadRow, DatasetError, clip, type_name

MAX_LINE_BYTES = 512 * 1024 * 1024
"""A JSONL line longer than this is skipped (reported as a bad row) without being held whole."""

ARROW_ROWS_PER_CHUNK = 64
"""Rows turned into Python objects at a time from an Arrow/Parquet record batch."""

PARQUET_BATCH_ROWS = 1024

JSON_ROW_LIST_KEYS = ("data", "rows", "train")
PLAIN_JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSONL_SUFFIXES = (*PLAIN_JSONL_SUFFIXES, ".jsonl.gz", ".ndjson.gz")
FOLDER_DATA_SUFFIXES = (*JSONL_SUFFIXES, ".parquet")
LOCAL_FILE_SUFFIXES = (*FOLDER_DATA_SUFFIXES, ".json", ".json.gz", ".arrow", ".csv", ".tsv",
                       ".txt", ".gz")
"""Names that are files: a path ending so that does not exist is a typo, never a hub name."""
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
UTF8_BOM = b"\xef\xbb\xbf"
_SKIP_CHUNK_BYTES = 16 * 1024 * 1024
HUB_TIMEOUT_S = 60.0
"""The longest wait for the hub to send the next thing, when a caller gives none (the config's
is `datasets[].hub_timeout_s`)."""
_HUB_QUEUE_ROWS = 1024


@dataclass(slots=True)
class Row:
    """One parsed row (not yet checked to be an object) and where it came from."""

    source: str
    data: Any
    at: RowAt | None = None
    """Where the row's bytes are, for sources that can be re-read one row at a time."""


@dataclass(frozen=True, slots=True)
class RowAt:
    """A JSONL row's place in its (uncompressed) file: `length` bytes from `offset`, on
    1-based `line` (a leading UTF-8 BOM is not part of the row)."""

    path: str
    offset: int
    length: int
    line: int


RowStream = Generator["Row | BadRow", None, None]


def open_rows(path: str, split: str = "train", subset: str | None = None,
              hub_timeout_s: float = HUB_TIMEOUT_S) -> RowStream:
    """The rows of a local file or folder, or of a hub dataset when `path` is `org/name` and no
    such local path exists (`DatasetError` when the hub sends nothing for `hub_timeout_s`)."""
    local = Path(path).expanduser()
    if local.is_dir():
        return _open_folder(local, split)
    if local.is_file():
        return _open_file(local)
    if not local.exists() and HUB_NAME.match(path) and not _looks_local(local):
        return _open_hub(path, split, subset, hub_timeout_s)
    raise DatasetError(f"{path}: no such file or folder")


def _looks_local(path: Path) -> bool:
    """Whether an `org/name` that is not on disk is still meant as a local path (a typo, not a
    hub dataset): its first part is a local folder (`data/chta.jsonl`), or its name ends with
    a data file's suffix, which hub dataset names do not have."""
    return Path(path.parts[0]).is_dir() or path.name.lower().endswith(LOCAL_FILE_SUFFIXES)


def plain_jsonl_files(path: str, split: str = "train") -> list[Path] | None:
    """The files of a dataset made only of uncompressed JSONL (one file, or a folder of data
    files), whose rows can be re-read one at a time by offset; None for any other source."""
    local = Path(path).expanduser()
    if local.is_file():
        files = [local]
    elif local.is_dir() and not (local / "dataset_dict.json").is_file() \
            and not _is_save_to_disk_folder(local):
        files = _data_files(local, split)
    else:
        return None
    plain = all(f.name.lower().endswith(PLAIN_JSONL_SUFFIXES) for f in files)
    return files if plain else None


def located_jsonl_rows(files: list[Path]) -> RowStream:
    """The rows of plain JSONL files, each with its `RowAt`: the same rows, sources and bad
    rows as `open_rows` gives for them."""
    for path in files:
        with _open_binary(path) as stream:
            try:
                yield from _parse_jsonl_lines(str(path), stream, locate=True)
            except OSError as e:
                raise DatasetError(f"{path}: cannot read: {e}") from None


def rows_at(places: list[RowAt]) -> list[Row | BadRow]:
    """The rows at `places` (each file opened once), in the order given. Rows close together
    in a file are read with one `pread` for the span that holds them: a batch of consecutive
    rows is one system call, not one per row (each call releases the GIL, and a reader thread
    then waits for a busy event loop to hand it back, up to 5 ms, once per call)."""
    out: list[Row | BadRow | None] = [None] * len(places)
    handles: dict[str, int] = {}
    at: RowAt | None = None
    try:
        for span in _spans(places):
            at = places[span[0]]
            fd = handles.get(at.path)
            if fd is None:
                fd = handles[at.path] = _open_fd(at.path)
            start = at.offset
            last = places[span[-1]]
            data = os.pread(fd, last.offset + last.length - start, start)
            for i in span:
                at = places[i]
                line = data[at.offset - start:at.offset - start + at.length]
                row = _parse_json_line(f"{at.path}:{at.line}", line)
                if isinstance(row, Row):
                    row.at = at
                out[i] = row
    except OSError as e:
        assert at is not None
        raise DatasetError(f"{at.path}: cannot read line {at.line}: {e}") from None
    finally:
        for fd in handles.values():
            os.close(fd)
    return out  # type: ignore[return-value]  # every place was read above


SPAN_GAP = 64 * 1024
"""Rows at most this far apart are read in one span."""
SPAN_MAX = 8 * 1024 * 1024
"""The most bytes one span reads."""


def _spans(places: list[RowAt]) -> Iterator[list[int]]:
    """Indexes of `places` in spans: same file, by offset, no gap over SPAN_GAP, at most
    SPAN_MAX bytes from the first row's start to the last row's end."""
    order = sorted(range(len(places)), key=lambda i: (places[i].path, places[i].offset))
    span: list[int] = []
    for i in order:
        at = places[i]
        if span:
            first, prev = places[span[0]], places[span[-1]]
            if (at.path != first.path or at.offset - (prev.offset + prev.length) > SPAN_GAP
                    or at.offset + at.length - first.offset > SPAN_MAX):
                yield span
                span = []
        span.append(i)
    if span:
        yield span


def _open_fd(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as e:
        raise DatasetError(f"{path}: cannot open: {e}") from None


# ---------------------------------------------------------------------------------------------
# Single files


def _open_file(path: Path) -> RowStream:
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return _jsonl_rows(path)
    if name.endswith(".json"):
        return _json_rows(path)
    if name.endswith(".parquet"):
        return _parquet_rows(path)
    if name.endswith(".arrow"):
        return _arrow_rows([path])
    raise DatasetError(
        f"{path}: unknown dataset format (expected .jsonl, .jsonl.gz, .json, .parquet, .arrow, "
        "a save_to_disk folder or a folder of .jsonl/.parquet files)"
    )


def _open_binary(path: Path) -> IO[bytes]:
    try:
        if path.name.lower().endswith(".gz"):
            return cast(IO[bytes], gzip.open(path, "rb"))
        return path.open("rb")
    except OSError as e:
        raise DatasetError(f"{path}: cannot open: {e}") from None


def _jsonl_rows(path: Path) -> RowStream:
    with _open_binary(path) as stream:
        try:
            yield from _parse_jsonl_lines(str(path), stream)
        except (OSError, EOFError) as e:
            raise DatasetError(f"{path}: cannot read: {e}") from None


def _parse_jsonl_lines(where: str, stream: IO[bytes], *, locate: bool = False) -> RowStream:
    """The rows of JSON lines; with `locate`, each row says where its bytes are (`RowAt`)."""
    line_number = 0
    offset = 0
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        line_number += 1
        start, offset = offset, offset + len(line)
        source = f"{where}:{line_number}"
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            offset += _skip_rest_of_line(stream)
            yield BadRow(source, f"line longer than {MAX_LINE_BYTES} bytes, skipped")
            continue
        if line_number == 1 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM) :]
            start += len(UTF8_BOM)
        if not line.strip():
            continue
        row = _parse_json_line(source, line)
        if locate and isinstance(row, Row):
            row.at = RowAt(where, start, len(line), line_number)
        yield row


def _skip_rest_of_line(stream: IO[bytes]) -> int:
    """Read past the end of the current line; the number of bytes skipped."""
    skipped = 0
    while True:
        chunk = stream.readline(_SKIP_CHUNK_BYTES)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped


def _parse_json_line(source: str, line: bytes) -> Row | BadRow:
    try:
        return Row(source, orjson.loads(line))
    except orjson.JSONDecodeError as e:
        return BadRow(source, _json_error_reason(line, e))


def _json_error_reason(data: bytes, error: orjson.JSONDecodeError) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as u:
        bad_bytes = data[u.start : min(u.end, u.start + 8)]
        return f"not UTF-8 at byte {u.start} of the line ({bad_bytes!r})"
    return f"not valid JSON: {clip(str(error))}"


def _json_rows(path: Path) -> RowStream:
    """A .json file: a list of rows, or an object holding one under "data"/"rows"/"train".
    A single JSON document cannot be streamed, so the file is read whole; a .json file that
    holds JSON lines is read as JSONL."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read: {e}") from None
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        if _looks_like_json_lines(data):
            del data
            yield from _jsonl_rows(path)
            return
        raise DatasetError(f"{path}: {_json_error_reason(data, e)}") from None
    del data
    rows = _row_list_of(path, document)
    for index, row in enumerate(rows):
        yield Row(f"{path}[row {index}]", row)


def _looks_like_json_lines(data: bytes) -> bool:
    first_line = data.lstrip(UTF8_BOM + b" \t\r\n").split(b"\n", 1)[0]
    try:
        return isinstance(orjson.loads(first_line), dict)
    except orjson.JSONDecodeError:
        return False


def _row_list_of(path: Path, document: Any) -> list[Any]:
    if isinstance(document, list):
        return document
    if isinstance(document, dict):
        for key in JSON_ROW_LIST_KEYS:
            rows = document.get(key)
            if isinstance(rows, list):
                return rows
    raise DatasetError(
        f"{path}: expected a JSON list of rows or an object with a list under "
        f"{', '.join(repr(k) for k in JSON_ROW_LIST_KEYS)}; got {type_name(document)}"
        + (f" with keys {sorted(document)[:20]}" if isinstance(document, dict) else "")
    )


def _parquet_rows(path: Path) -> RowStream:
    try:
        parquet = pq.ParquetFile(path)
        batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        yield from _rows_of_batches(str(path), batches)
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{path}: cannot read Parquet: {e}") from None


def _arrow_rows(files: list[Path]) -> RowStream:
    """Arrow IPC files as `datasets.save_to_disk` writes them (stream format; the random-access
    file format is read too). Memory-mapped, so only the rows being converted are resident."""
    for path in files:
        try:
            with pa.memory_map(str(path)) as mapped:
                yield from _rows_of_batches(str(path), _arrow_batches(mapped))
        except (OSError, pa.ArrowException) as e:
            raise DatasetError(f"{path}: cannot read Arrow data: {e}") from None


def _arrow_batches(mapped: pa.MemoryMappedFile) -> Iterator[pa.RecordBatch]:
    try:
        yield from pa.ipc.open_stream(mapped)
        return
    except pa.ArrowInvalid:
        mapped.seek(0)
    reader = pa.ipc.open_file(mapped)
    for index in range(reader.num_record_batches):
        yield reader.get_batch(index)


def _rows_of_batches(where: str, batches: Iterable[pa.RecordBatch]) -> RowStream:
    index = 0
    for batch in batches:
        for start in range(0, batch.num_rows, ARROW_ROWS_PER_CHUNK):
            for row in batch.slice(start, ARROW_ROWS_PER_CHUNK).to_pylist():
                yield Row(f"{where}[row {index}]", row)
                index += 1


# ---------------------------------------------------------------------------------------------
# Folders


def _open_folder(folder: Path, split: str) -> RowStream:
    if (folder / "dataset_dict.json").is_file():
        return _open_folder(_split_folder(folder, split), split)
    if _is_save_to_disk_folder(folder):
        return _arrow_rows(_save_to_disk_files(folder))
    return _files_rows(_data_files(folder, split))


def _is_save_to_disk_folder(folder: Path) -> bool:
    if (folder / "state.json").is_file():
        return True
    return (folder / "dataset_info.json").is_file() and any(folder.glob("*.arrow"))


def _split_folder(folder: Path, split: str) -> Path:
    """The split's subfolder of a `DatasetDict.save_to_disk` folder."""
    info_path = folder / "dataset_dict.json"
    splits = _read_json_object(info_path).get("splits")
    if not isinstance(splits, list):
        splits = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if split not in splits or not (folder / split).is_dir():
        raise DatasetError(f"{folder}: no split {split!r} in this DatasetDict (splits: {splits})")
    return folder / split


def _save_to_disk_files(folder: Path) -> list[Path]:
    state_path = folder / "state.json"
    if state_path.is_file():
        entries = _read_json_object(state_path).get("_data_files")
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("filename"), str) for e in entries
        ):
            raise DatasetError(f"{state_path}: '_data_files' must be a list of {{'filename': ...}}")
        files = [folder / e["filename"] for e in entries]
    else:
        files = sorted(folder.glob("*.arrow"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise DatasetError(f"{folder}: data files listed in state.json are missing: {missing}")
    if not files:
        raise DatasetError(f"{folder}: no .arrow data files in this save_to_disk folder")
    return files


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise DatasetError(f"{path}: cannot read: {e}") from None
    if not isinstance(value, dict):
        raise DatasetError(f"{path}: expected a JSON object, got {type_name(value)}")
    return value


def _data_files(folder: Path, split: str) -> list[Path]:
    """The .jsonl/.parquet files under `folder` (hidden folders skipped), in path order. When
    some of them are marked as `split` (a folder named so, or a name starting `split-`/`split_`/
    `split.`), only those are used, so a hub clone's test files stay out of the train split."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.name.lower().endswith(FOLDER_DATA_SUFFIXES)
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not files:
        raise DatasetError(
            f"{folder}: no data files (.jsonl, .jsonl.gz, .parquet) and not a save_to_disk folder"
        )
    in_split = [p for p in files if _marked_as_split(p.relative_to(folder), split)]
    return in_split or files


def _marked_as_split(relative: Path, split: str) -> bool:
    if split in relative.parts[:-1]:
        return True
    return any(relative.name.startswith(split + sep) for sep in "-_.")


def _files_rows(files: list[Path]) -> RowStream:
    for path in files:
        yield from _open_file(path)


# ---------------------------------------------------------------------------------------------
# Hugging Face hub


def _open_hub(name: str, split: str, subset: str | None, timeout_s: float) -> RowStream:
    load_dataset = _hub_loader(name)

    def rows() -> Iterable[Any]:
        return load_dataset(name, subset, split=split, streaming=True)
    return _hub_rows(name, _within(rows, name, timeout_s))


def _within(rows: Callable[[], Iterable[Any]], name: str, timeout_s: float) -> Iterator[Any]:
    """The rows of `rows()`, read in a thread of their own, each waited for `timeout_s` at
    most; the first waited for now, so that a hub that cannot be read fails at once. The hub
    libraries retry a server that accepts and never answers for minutes a try: a deadline over
    everything they do is the one bound that holds whatever they do inside. The thread is a
    daemon, and stops once the rows are no longer wanted."""
    reader = _RowThread(rows, name, timeout_s)
    first = reader.next()
    return reader.rest(first)


class _RowThread:
    """A thread reading an iterable into a bounded queue, and its reader's side."""

    _END = object()

    def __init__(self, rows: Callable[[], Iterable[Any]], name: str, timeout_s: float) -> None:
        self.name, self.timeout_s, self.count = name, timeout_s, 0
        self.out: queue.Queue[tuple[bool, Any]] = queue.Queue(_HUB_QUEUE_ROWS)
        self.unwanted = threading.Event()
        threading.Thread(target=self._read, args=(rows,), name=f"hub {name}",
                         daemon=True).start()

    def _put(self, ok: bool, item: Any) -> bool:
        while not self.unwanted.is_set():
            try:
                self.out.put((ok, item), timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _read(self, rows: Callable[[], Iterable[Any]]) -> None:
        try:
            for row in rows():
                if not self._put(True, row):
                    return
            self._put(True, self._END)
        except BaseException as e:  # handed to the reader, raised there
            self._put(False, e)

    def next(self) -> Any:
        """The next row, or _END; DatasetError when the read failed or sent nothing in time."""
        try:
            ok, item = self.out.get(timeout=self.timeout_s)
        except queue.Empty:
            self.unwanted.set()
            raise DatasetError(_hub_silent(self.name, self.count, self.timeout_s)) from None
        if not ok:
            self.unwanted.set()
            raise _hub_failed(self.name, self.count, item) from item
        return item

    def rest(self, first: Any) -> Iterator[Any]:
        try:
            item = first
            while item is not self._END:
                yield item
                self.count += 1
                item = self.next()
        finally:
            self.unwanted.set()


def _hub_silent(name: str, count: int, timeout_s: float) -> str:
    import huggingface_hub  # imported by `datasets` already

    where = f"after {count} rows" if count else "before the first row"
    return (f"{name}: the Hugging Face hub ({huggingface_hub.constants.ENDPOINT}) sent nothing "
            f"for {timeout_s:g} s {where} (datasets[].hub_timeout_s); is it reachable? Or "
            "download the set and give its local path")


def _hub_failed(name: str, count: int, e: BaseException) -> DatasetError:
    """The error of a hub read that raised (the hub raises many kinds: connection, HTTP, a
    missing config...)."""
    detail = f"{type(e).__name__}: {clip(str(e), 500)}"
    if count:
        return DatasetError(f"{name}: reading from the Hugging Face hub failed after {count} "
                            f"rows: {detail}")
    return DatasetError(
        f"{name}: not a local file or folder, and loading it from the Hugging Face hub "
        f"failed (is the hub reachable and the name, subset and split right?): {detail}")


def _hub_loader(name: str) -> Callable[..., Iterable[Any]]:
    try:
        import datasets  # optional and heavy: imported only for hub names
    except ImportError:
        raise DatasetError(
            f"{name}: not a local file or folder, and reading it from the Hugging Face hub needs "
            "the 'datasets' package, which is not installed (pip install 'draftgen[hub]')"
        ) from None
    load_dataset: Callable[..., Iterable[Any]] = datasets.load_dataset
    return load_dataset


def _hub_rows(name: str, rows: Iterator[Any]) -> RowStream:
    for index, row in enumerate(rows):
        yield Row(f"{name}[row {index}]", row)
