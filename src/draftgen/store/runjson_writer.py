"""Writing run.json: the config (secrets removed), tokenizer hash, versions, and one entry per
session. The file is kept a dict here, key by key, so that keys this version does not know
survive; its type, and what the readers make of it, is `store.runjson.RunInfo`."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import socket
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec
import orjson

from draftgen.store.atomic import replace_file
from draftgen.store.journal import as_usd, read_journal
from draftgen.store.layout import JOURNAL
from draftgen.store.nofollow import StoreError, make_folders, open_file
from draftgen.store.runjson import (
    SETTINGS,
    TOKENIZERS,
    RunInfo,
    RunJsonDamaged,
    StoredConfig,
    StoredProbe,
    StoredTokenizer,
    flat_settings,
    kept_tokenizer,
    load_run_json,
    read_run_info,
)

log = logging.getLogger("draftgen.store")
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
    """run.json as a dict to update ({} when there is none); RunJsonDamaged, saying how to
    recover, when it is not a run.json (`store.runjson.load_run_json`)."""
    return load_run_json(path)[0]


def _read_or_rebuild(path: Path) -> dict[str, Any]:
    """run.json for the writer (who holds the run's lock): a damaged one is renamed aside,
    never deleted, and rebuilt with one placeholder per session the journal knows of, so that
    session numbers go on rising and the last session's requests in flight are still counted
    against the budget. The config, tokenizer and dataset totals are written by this session."""
    try:
        return read_run_json(path)
    except RunJsonDamaged as e:
        try:
            damaged = _set_aside(path)
        except OSError as err:
            raise StoreError(f"{e}; cannot set it aside: {err.strerror}") from None
        last = read_journal(path.with_name(JOURNAL)).session
        sessions = [{"started_at": None, "stopped_at": None, "outcome": None, "rebuilt": True}
                    for _ in range(0 if last is None else last + 1)]
        log.warning("%s: damaged, %s; moved to %s and rebuilt (%d earlier sessions known "
                    "from the journal; what they recorded there, such as the spend of requests "
                    "aborted in sessions before the last, is only in the damaged file)",
                    path, e.why, damaged.name, len(sessions))
        return {"rebuilt_from": damaged.name, "sessions": sessions}


def recover_run_json(path: Path) -> None:
    """For the writer, holding the run's lock, before anything reads run.json: a damaged one is
    set aside and rebuilt now (`_read_or_rebuild`), so that every later read sees the rebuilt
    file."""
    try:
        read_run_json(path)
    except RunJsonDamaged:
        write_atomic(path, _read_or_rebuild(path))


def _set_aside(path: Path) -> Path:
    """Rename `path` to PATH.damaged-TIME (-2, -3... where taken: nothing is replaced)."""
    stem = f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
    for n in range(1, 1000):
        aside = path.with_name(stem if n == 1 else f"{stem}-{n}")
        try:
            # fails where the name is taken, unlike a rename; a link is set aside as a link
            os.link(path, aside, follow_symlinks=False)
        except FileExistsError:
            continue
        path.unlink()
        return aside
    raise FileExistsError(f"{path.name}.damaged-*: too many")


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace the file whole (a reader never sees half of it); a full or read-only disk is a
    StoreError, and the old file stays as it was."""
    try:
        replace_file(path, orjson.dumps(data, option=orjson.OPT_INDENT_2))
    except OSError as e:
        raise StoreError(f"{path}: cannot write: {e.strerror}") from None


def start_session(path: Path, config: dict[str, Any], tokenizer: dict[str, Any],
                  accepted_changes: list[str] | None = None) -> int:
    """Record a new session in run.json (rebuilt first where it is damaged), with the settings
    that define its data (and the changes to them it was allowed to make); returns its index."""
    data = _read_or_rebuild(path)
    data.setdefault("created_at", time.time())
    _backfill_settings(data)
    data["config"] = config
    data["tokenizer"] = tokenizer
    data["versions"] = package_versions()
    sessions = data.setdefault("sessions", [])
    session: dict[str, Any] = {
        "started_at": time.time(),
        "stopped_at": None,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "argv": sys.argv[1:],
        "outcome": None,
        SETTINGS: data_settings(config, tokenizer),
    }
    if accepted_changes:
        session["accepted_changes"] = accepted_changes
    sessions.append(session)
    write_atomic(path, data)
    keep_tokenizer(path.parent, tokenizer)
    return len(sessions) - 1


# ---- each session's tokenizer, kept in the run folder ---------------------------------------

KEEP_HEADROOM = 256 << 20
"""Free space the run folder keeps beyond a tokenizer's copy (the default `min_free_mb`): the
answers come first."""
KEPT_BESIDE = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
               "chat_template.json", "generation_config.json")
KEEP_AT_MOST = 256 << 20
"""A tokenizer file larger than this (a GGUF model file holds its vocabulary) is not copied."""


def keep_tokenizer(root: Path, tokenizer: dict[str, Any]) -> Path | None:
    """Copy a session's tokenizer.json (`tokenizer`: its path and sha256) and the format files
    beside it into RUN/.tokenizers/<sha256>/, once: an existing copy is never replaced. Not
    kept (logged): a tokenizer that is not a single JSON file (a GGUF model, a transformers
    folder without tokenizer.json) or whose file no longer has the hash."""
    sha, source = tokenizer.get("sha256"), tokenizer.get("path")
    if not isinstance(sha, str) or not isinstance(source, str):
        return None
    kept = kept_tokenizer(root, sha)
    if kept is not None:
        return kept
    src = Path(source)
    try:
        if not src.is_file() or src.suffix != ".json" or src.stat().st_size > KEEP_AT_MOST:
            log.info("%s: not a tokenizer.json file: no copy kept in the run folder (audit and "
                     "export read it where it is)", src)
            return None
        if shutil.disk_usage(root).free < src.stat().st_size + KEEP_HEADROOM:
            log.warning("%s: too little free space in the run folder to keep a copy of the "
                        "tokenizer; audit and export need the file unchanged at its path", src)
            return None
        data = src.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            log.warning("%s: changed while the run started: no copy kept", src)
            return None
        return _write_kept(root, sha, data, src.parent)
    except OSError as e:
        log.warning("%s: cannot keep a copy of the tokenizer in the run folder (%s); audit and "
                    "export need the file unchanged at its path", src, e.strerror or e)
        return None


def _write_kept(root: Path, sha: str, data: bytes, beside: Path) -> Path:
    """Write the copy in a folder of its own in RUN/TOKENIZERS, renamed into place whole."""
    folder = root / TOKENIZERS
    make_folders(folder, root)
    partial = folder / f".{sha}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        with open_file(partial / "tokenizer.json", "wb", root=root) as f:
            f.write(data)
        for name in KEPT_BESIDE:
            if (beside / name).is_file():
                shutil.copyfile(beside / name, partial / name)
        os.rename(partial, folder / sha)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if (folder / sha / "tokenizer.json").is_file():  # kept meanwhile
            return folder / sha / "tokenizer.json"
        raise
    return folder / sha / "tokenizer.json"


# ---- the settings that define the data ------------------------------------------------------

def data_settings(config: dict[str, Any], tokenizer: dict[str, Any]) -> dict[str, Any]:
    """The settings a session with this config and tokenizer records (`runjson.flat_settings`):
    what defines the answers it writes."""
    return flat_settings(msgspec.convert(config, StoredConfig),
                         msgspec.convert(tokenizer, StoredTokenizer))


def session_settings(data: dict[str, Any], index: int | None = None) -> dict[str, Any] | None:
    """`RunInfo.settings_of` for a run.json as a dict."""
    return msgspec.convert(data, RunInfo).settings_of(index)


def _backfill_settings(data: dict[str, Any]) -> None:
    """Sessions from before settings were recorded ran with the config run.json holds now:
    give them its settings before a new session replaces that config."""
    info = msgspec.convert(data, RunInfo)
    if info.config is None:
        return
    legacy = flat_settings(info.config, info.tokenizer)
    for session, typed in zip(data.get("sessions") or [], info.sessions, strict=True):
        if typed.settings is None:
            session[SETTINGS] = legacy


def end_session(path: Path, index: int, outcome: str, summary: dict[str, Any]) -> None:
    record_session(path, index, stopped_at=time.time(), outcome=outcome, summary=summary)


def record_session(path: Path, index: int, **fields: Any) -> None:
    """Add fields to session `index` (at its end, or, for a killed one, at the next start)."""
    data = read_run_json(path)
    sessions = data.get("sessions") or []
    if index < len(sessions):
        sessions[index].update(fields)
        write_atomic(path, data)


def record_datasets(path: Path, datasets: dict[str, dict[str, Any]]) -> None:
    """Per-dataset totals of the latest session (prompts, bad rows, skipped by budget...), so
    that status can show totals without re-reading the datasets."""
    data = read_run_json(path)
    data["datasets"] = datasets
    write_atomic(path, data)


def read_probe(path: Path) -> StoredProbe:
    """run.json's `probe` entry (an empty one where it has none)."""
    try:
        probe = read_run_info(path).probe
    except RunJsonDamaged:  # a cache: probed again, and stored in the rebuilt run.json
        return StoredProbe()
    return probe if probe is not None else StoredProbe()


def record_probe(path: Path, results: dict[str, dict[str, Any]],
                 gate: dict[str, Any] | None = None, command_usd: float = 0.0) -> None:
    """Store probe results (one per backend, replacing that backend's older one) and, for a
    run, what it decided (`gate`: backends kept, dropped and why, spend). `command_usd`: what
    a `draftgen probe` command spent, added to what such commands spent before (every later
    session counts it against budget.usd)."""
    data = _read_or_rebuild(path)
    probe = data.get("probe") if isinstance(data.get("probe"), dict) else {}
    backends = probe.get("backends") if isinstance(probe.get("backends"), dict) else {}
    backends.update(results)
    probe["backends"] = backends
    probe["updated_at"] = time.time()
    if gate is not None:
        probe["last_gate"] = gate
    if command_usd:
        probe["commands_usd"] = round(as_usd(probe.get("commands_usd")) + command_usd, 8)
    data["probe"] = probe
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
