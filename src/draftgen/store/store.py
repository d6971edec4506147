"""The writer side of a run folder: one appender per dataset file, opened on first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from draftgen.store.appender import JsonlAppender
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
        """`record` must have "id" as its first key (the resume scan reads it from the prefix)."""
        self._appender(self.layout.responses(dataset)).append(record)

    def append_failure(self, dataset: str, failure: dict[str, Any]) -> None:
        self._appender(self.layout.failures(dataset)).append(failure)

    def sync(self) -> None:
        for appender in self._appenders.values():
            appender.sync()

    def close(self) -> None:
        for appender in self._appenders.values():
            appender.close()
        self._appenders.clear()
