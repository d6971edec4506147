"""What is known of each kept prompt of a dataset without holding the prompt: its ID (and the
ID's `store.columns.id_hash`), whether it has tools, and, for plain JSONL, where its row is.

Column arrays, one entry per prompt in dataset order, so that a million prompts cost a few
tens of MB and load in milliseconds. IDs are one UTF-8 blob cut by an array of end offsets.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from draftgen.datasets.readers import Row, RowAt
from draftgen.store.columns import id_hash
from draftgen.types import Prompt

ID_ENCODING = ("utf-8", "surrogatepass")


@dataclass(frozen=True)
class RowPlaces:
    """Where each prompt's row is: `files[file_no[i]]`, `length[i]` bytes from `offset[i]`,
    on line `line[i]`."""

    files: list[str]
    file_no: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    line: np.ndarray

    def at(self, position: int) -> RowAt:
        return RowAt(self.files[int(self.file_no[position])], int(self.offset[position]),
                     int(self.length[position]), int(self.line[position]))


@dataclass(frozen=True)
class PromptIndex:
    id_blob: bytes
    id_ends: np.ndarray
    """int64: where each ID ends in `id_blob`."""
    id_hashes: np.ndarray
    """uint64: `store.columns.id_hash` of each ID."""
    tools: np.ndarray
    """bool: the prompt has tools."""
    places: RowPlaces | None = None
    """None when the source cannot be re-read one row at a time."""

    def __len__(self) -> int:
        return len(self.id_ends)

    def id_at(self, position: int) -> str:
        start = int(self.id_ends[position - 1]) if position else 0
        return self.id_blob[start:int(self.id_ends[position])].decode(*ID_ENCODING)

    def is_consistent(self) -> bool:
        """Whether the arrays agree with each other (a cache file read back is checked so)."""
        n = len(self.id_ends)
        sizes_ok = len(self.id_hashes) == n and len(self.tools) == n
        ends_ok = n == 0 or (int(self.id_ends[-1]) == len(self.id_blob)
                             and bool(np.all(np.diff(self.id_ends, prepend=0) >= 0)))
        places = self.places
        places_ok = places is None or (
            all(len(a) == n for a in (places.file_no, places.offset, places.length, places.line))
            and (n == 0 or 0 <= int(places.file_no.min()) <= int(places.file_no.max())
                 < len(places.files)))
        return sizes_ok and ends_ok and places_ok


@dataclass
class PromptIndexBuilder:
    """Collects the index of the prompts of one read, prompt by prompt."""

    locate: bool
    """Keep each row's place (its `Row.at` must be set)."""
    _ids: list[bytes] = field(default_factory=list)
    _hashes: list[int] = field(default_factory=list)
    _tools: list[bool] = field(default_factory=list)
    _files: dict[str, int] = field(default_factory=dict)
    _places: tuple[array[int], ...] = field(
        default_factory=lambda: tuple(array("q") for _ in range(4)))
    """file number, offset, length, line of each row."""

    def add(self, prompt: Prompt, row: Row | None) -> None:
        self._ids.append(prompt.id.encode(*ID_ENCODING))
        self._hashes.append(id_hash(prompt.id))
        self._tools.append(bool(prompt.tools))
        if self.locate:
            assert row is not None and row.at is not None
            at = row.at
            file_no = self._files.setdefault(at.path, len(self._files))
            for column, value in zip(self._places, (file_no, at.offset, at.length, at.line),
                                     strict=True):
                column.append(value)

    def build(self) -> PromptIndex:
        ends = np.cumsum(np.fromiter(map(len, self._ids), dtype=np.int64, count=len(self._ids)))
        return PromptIndex(
            id_blob=b"".join(self._ids), id_ends=ends,
            id_hashes=np.array(self._hashes, dtype=np.uint64),
            tools=np.array(self._tools, dtype=np.bool_),
            places=self._built_places() if self.locate else None)

    def _built_places(self) -> RowPlaces:
        file_no, offset, length, line = (np.frombuffer(c, dtype=np.int64) for c in self._places)
        return RowPlaces(files=list(self._files), file_no=file_no.astype(np.int32),
                         offset=offset.copy(), length=length.copy(), line=line.copy())


def index_of(prompts: Sequence[Prompt]) -> PromptIndex:
    """The index of prompts held in memory (no places)."""
    builder = PromptIndexBuilder(locate=False)
    for prompt in prompts:
        builder.add(prompt, None)
    return builder.build()
