"""The writer of a run folder (`Store`; its reader is `store.reader.Run`): one appender per
dataset file, opened on first use."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from draftgen.store.appender import JsonlAppender, StoreError
from draftgen.store.columns import row_bytes
from draftgen.store.index import entry_for, sync_from_index
from draftgen.store.journal import OpenTracker
from draftgen.store.layout import TORN, RunLayout
from draftgen.store.nofollow import refuse_link, refuse_linked_folders
from draftgen.store.prompt_refs import PromptRefs
from draftgen.store.record import Record
from draftgen.store.scan import cut_torn_tail


class Store:
    def __init__(self, root: Path, fsync_interval_s: float = 1.0) -> None:
        self.layout = RunLayout(root)
        self._fsync_interval = fsync_interval_s
        self._appenders: dict[Path, JsonlAppender] = {}
        self._named: dict[tuple[str, str], JsonlAppender] = {}
        """(RunLayout method, dataset) -> appender: building and hashing a Path for each
        write cost as much as the write itself (bench/client_throughput.py)."""
        self._open_requests = OpenTracker()
        self._prompt_refs = PromptRefs()
        """The turns a `turns: all` turn's prompt may be written as extending
        (`store.prompt_refs`)."""
        """Requests journaled as sent and not yet ended; written out now and then (see
        `store.journal`) so that readers need not parse the whole journal."""

    def refuse_links(self, datasets: Iterable[str]) -> None:
        """LinkRefused naming the first file or folder of the run folder the store writes for
        these datasets that is a symbolic link, before a session sends anything: each write
        refuses one anyway (`store.nofollow`), but an answer paid for and then refused waits
        in a rescue file."""
        layout = self.layout
        files = [layout.run_json, layout.lock, layout.journal, layout.root / TORN]
        for dataset in datasets:
            refuse_linked_folders(layout.dataset_dir(dataset), layout.root)
            files += [layout.responses(dataset), layout.failures(dataset), layout.index(dataset),
                      layout.columns(dataset), layout.torn(dataset)]
        for path in files:
            refuse_link(path)

    def _appender(self, path: Path) -> JsonlAppender:
        appender = self._appenders.get(path)
        if appender is None:
            appender = JsonlAppender(path, self._fsync_interval, root=self.layout.root)
            self._appenders[path] = appender
        return appender

    def _file(self, kind: str, dataset: str) -> JsonlAppender:
        """The appender of a dataset's file `getattr(self.layout, kind)(dataset)`."""
        appender = self._named.get((kind, dataset))
        if appender is None:
            appender = self._appender(getattr(self.layout, kind)(dataset))
            self._named[kind, dataset] = appender
        return appender

    def _columns(self, dataset: str) -> JsonlAppender:
        """The binary index copy's appender, brought in step with the JSON index first."""
        appender = self._named.get(("columns", dataset))
        if appender is not None:
            return appender
        path = self.layout.columns(dataset)
        if path not in self._appenders:
            sync_from_index(self.layout.index(dataset))
        return self._file("columns", dataset)

    def append_record(self, dataset: str, record: Record | dict[str, Any]) -> None:
        """Append the record, then its index entry, then the entry's binary row (a kill
        between these is repaired from the data on the next scan). The run writes `Record`s
        (a turn of a conversation as the turn it extends where it can: `store.prompt_refs`);
        a dict is a line written as given (tests, lines of older schemas)."""
        columns = self._columns(dataset)
        data = self._file("responses", dataset)
        if isinstance(record, Record):
            prepared = self._prompt_refs.prepare(dataset, record, data.durable_size)
            start = data.size
            data.append_bytes(prepared.line)
            self._prompt_refs.written(prepared, start, data.size)
            if prepared.turn is not None:
                data.sync_soon()  # so that the next turn finds this one durable
        else:
            data.append(record)
        entry = entry_for(record, data.size)
        index = self._file("index", dataset)
        index.append_bytes(entry.to_json())
        columns.append_bytes(row_bytes(entry, index.size))

    def continue_turn(self, dataset: str, record: Record, at: int, end: int) -> None:
        """A resumed conversation's last turn, written by an earlier session at bytes `at` to
        `end` of the dataset's responses file: its next turn may be written as extending it
        once the file is synced (here, once per file: a kill -9 may have left the earlier
        session's lines in the page cache only)."""
        data = self._file("responses", dataset)
        data.sync()
        self._prompt_refs.continue_turn(dataset, record, at, end)

    def journal(self, event: dict[str, Any]) -> None:
        """One line of RUN/journal.jsonl: sent / answered / failed / dropped requests. Before
        the first one, a torn last line left by a kill is cut (kept in RUN/torn_tail.bin), so
        that no line is glued onto it."""
        appender = self._named.get(("journal", ""))
        if appender is None:
            path = self.layout.journal
            if path not in self._appenders:
                try:
                    cut_torn_tail(path, self.layout.root / TORN, self.layout.root)
                except OSError as e:
                    raise StoreError(f"{path}: cannot repair: {e.strerror}") from None
            appender = self._named["journal", ""] = self._appender(path)
        appender.append(event)
        checkpoint = self._open_requests.note(event)
        if checkpoint is not None:
            appender.append(checkpoint)

    def append_failure(self, dataset: str, failure: dict[str, Any]) -> None:
        self._appender(self.layout.failures(dataset)).append(failure)

    def sync(self) -> None:
        for appender in self._appenders.values():
            appender.sync()

    def close(self) -> None:
        """Close every file, even when one cannot be synced (full disk); then raise the first
        StoreError."""
        first: StoreError | None = None
        for appender in self._appenders.values():
            try:
                appender.close()
            except StoreError as e:
                first = first or e
        self._appenders.clear()
        self._named.clear()
        if first is not None:
            raise first
