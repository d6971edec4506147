"""run.json: the config (secrets removed), tokenizer hash, versions, and one entry per session."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

_PACKAGES = ("draftgen", "aiohttp", "tokenizers", "orjson", "pydantic", "pyarrow", "transformers")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def read_run_json(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)


def start_session(path: Path, config: dict[str, Any], tokenizer: dict[str, Any]) -> int:
    """Record a new session in run.json; returns its index."""
    data = read_run_json(path)
    data.setdefault("created_at", time.time())
    data["config"] = config
    data["tokenizer"] = tokenizer
    data["versions"] = package_versions()
    sessions = data.setdefault("sessions", [])
    sessions.append({
        "started_at": time.time(),
        "stopped_at": None,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "argv": sys.argv[1:],
        "outcome": None,
    })
    write_atomic(path, data)
    return len(sessions) - 1


def end_session(path: Path, index: int, outcome: str, summary: dict[str, Any]) -> None:
    data = read_run_json(path)
    sessions = data.get("sessions") or []
    if index < len(sessions):
        sessions[index].update(stopped_at=time.time(), outcome=outcome, summary=summary)
        write_atomic(path, data)


def record_datasets(path: Path, datasets: dict[str, dict[str, Any]]) -> None:
    """Per-dataset totals of the latest session (prompts, bad rows, skipped by budget...), so
    that status can show totals without re-reading the datasets."""
    data = read_run_json(path)
    data["datasets"] = datasets
    write_atomic(path, data)
