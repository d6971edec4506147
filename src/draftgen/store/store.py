"""The writer side of a run folder: one appender per dataset file, opened on first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftgen.store.appender import JsonlAppender
from draftgen.store.index import entry_for
from draftgen.store.layout import RunLayout


class Store:
    def __init__(self, root: Path, fsync_interval_s: float = 1.0) -> None:
        self.layout = RunLayout(root)
        self._fsync_interval = fsync_interval_s
        self._appenders: dict[Path, JsonlAppender] = {}

    def _appender(self, path: Path) -> JsonlAppender:
        appender = self._appenders.get(path)
        if appender is None:
            appender = JsonlAppender(path, self._fsync_interval)
            self._appenders[path] = appender
        return appender

    def append_record(self, dataset: str, record: dict[str, Any]) -> None:
        """Append the record, then its index entry (a kill between the two is repaired from
        the data on the next scan)."""
        data = self._appender(self.layout.responses(dataset))
        data.append(record)
        entry = entry_for(record, data.size)
        self._appender(self.layout.index(dataset)).append_bytes(entry.to_json())

    def journal(self, event: dict[str, Any]) -> None:
        """One line of RUN/journal.jsonl: sent / answered / failed / dropped requests."""
        self._appender(self.layout.journal).append(event)

    def append_failure(self, dataset: str, failure: dict[str, Any]) -> None:
        self._appender(self.layout.failures(dataset)).append(failure)

    def sync(self) -> None:
        for appender in self._appenders.values():
            appender.sync()

    def close(self) -> None:
        for appender in self._appenders.values():
            appender.close()
        self._appenders.clear()
