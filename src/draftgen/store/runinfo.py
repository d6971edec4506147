"""run.json: the config (secrets removed), tokenizer hash, versions, and one entry per session."""

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

import orjson

from draftgen.store.appender import StoreError
from draftgen.store.atomic import replace_file
from draftgen.store.journal import as_usd, read_journal
from draftgen.store.layout import JOURNAL

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


class RunJsonDamaged(StoreError):
    """run.json is there but is not a JSON object (truncated, empty, garbage)."""

    def __init__(self, path: Path, why: str) -> None:
        self.path, self.why = path, why
        super().__init__(f"{path}: damaged, {why}; `draftgen run` with the run's config "
                         "rebuilds it from the journal and the answers (keeping the damaged "
                         "file beside it)")


def read_run_json(path: Path) -> dict[str, Any]:
    """run.json as a dict ({} when there is none); RunJsonDamaged, saying how to recover, when
    it cannot be parsed."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except orjson.JSONDecodeError as e:
        raise RunJsonDamaged(path, f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RunJsonDamaged(path, f"not a JSON object (a {type(data).__name__})")
    return data


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
            os.link(path, aside)  # fails where the name is taken, unlike a rename
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
TOKENIZERS = ".tokenizers"
"""RUN/.tokenizers/<sha256>/ (hidden: no dataset can be named so): a copy of each tokenizer a
session of the run used (its tokenizer.json and the files beside it a format reads, such as
tokenizer_config.json), so that audit and export decode every session's IDs with that
session's tokenizer even after the file at its path changed."""
KEPT_BESIDE = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
               "chat_template.json", "generation_config.json")
KEEP_AT_MOST = 256 << 20
"""A tokenizer file larger than this (a GGUF model file holds its vocabulary) is not copied."""


def kept_tokenizer(root: Path, sha256: Any) -> Path | None:
    """The run folder's copy of the tokenizer.json whose hash is `sha256`, if it keeps one."""
    if not isinstance(sha256, str) or not sha256.isalnum():
        return None
    path = root / TOKENIZERS / sha256 / "tokenizer.json"
    return path if path.is_file() else None


def tokenizer_source(root: Path, sha256: Any, path: Any) -> str | None:
    """Where the tokenizer with hash `sha256` that a session of the run folder `root` used can
    be loaded: the folder's copy, else the path it was at (which may hold another file now:
    the caller compares hashes)."""
    kept = kept_tokenizer(root, sha256)
    return str(kept) if kept else (path if isinstance(path, str) and path else None)


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
        return _write_kept(root / TOKENIZERS, sha, data, src.parent)
    except OSError as e:
        log.warning("%s: cannot keep a copy of the tokenizer in the run folder (%s); audit and "
                    "export need the file unchanged at its path", src, e.strerror or e)
        return None


def _write_kept(folder: Path, sha: str, data: bytes, beside: Path) -> Path:
    """Write the copy in a folder of its own, renamed into place whole."""
    partial = folder / f".{sha}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        (partial / "tokenizer.json").write_bytes(data)
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

SETTINGS = "settings"
"""A session's key in run.json holding its `data_settings`."""


def data_settings(config: dict[str, Any], tokenizer: dict[str, Any]) -> dict[str, Any]:
    """What defines the answers a session writes, as flat dotted keys: the model, its format
    and the format's (chat template's) options, the tokenizer's hash and path, the sampling.
    Concurrency, backends' URLs, budgets and the like do not change an answer's meaning."""
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    flat: dict[str, Any] = {"model.name": model.get("name"), "model.format": model.get("format")}
    _flatten("model.format_options", model.get("format_options"), flat)
    flat["tokenizer.sha256"] = tokenizer.get("sha256")
    flat["tokenizer.path"] = tokenizer.get("path")
    _flatten("sampling", config.get("sampling"), flat)
    return flat


NOT_DATA = frozenset({"tokenizer.path"})
"""Kept with a session's settings (where its tokenizer was) but free to change: the same file
moved is the same tokenizer (its hash says so)."""


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def session_settings(data: dict[str, Any], index: int | None = None) -> dict[str, Any] | None:
    """The settings of session `index` of a run.json (default: the latest), or, for a run.json
    written before sessions recorded them, the settings of its stored config; None for a
    run.json that holds neither."""
    sessions = [s for s in data.get("sessions") or [] if isinstance(s, dict)]
    if index is None and sessions:
        index = len(sessions) - 1
    if index is not None and 0 <= index < len(sessions):
        recorded = sessions[index].get(SETTINGS)
        if isinstance(recorded, dict):
            return recorded
    config, tokenizer = data.get("config"), data.get("tokenizer")
    if not isinstance(config, dict):
        return None
    return data_settings(config, tokenizer if isinstance(tokenizer, dict) else {})


def changed_settings(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each data-defining key whose value differs, as "key: old → new"."""
    keys = [k for k in dict.fromkeys([*before, *now]) if k not in NOT_DATA]
    return [f"{k}: {_shown(k, before.get(k))} → {_shown(k, now.get(k))}"
            for k in keys if before.get(k) != now.get(k)]


def _shown(key: str, value: Any) -> str:
    if key == "tokenizer.sha256" and isinstance(value, str):
        return value[:12] + "…"
    return orjson.dumps(value).decode() if value is not None else "(unset)"


def _backfill_settings(data: dict[str, Any]) -> None:
    """Sessions from before settings were recorded ran with the config run.json holds now:
    give them its settings before a new session replaces that config."""
    legacy = session_settings({"config": data.get("config"), "tokenizer": data.get("tokenizer")})
    if legacy is None:
        return
    for session in data.get("sessions") or []:
        if isinstance(session, dict) and not isinstance(session.get(SETTINGS), dict):
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


def session_unsettled_usd(session: Any) -> float:
    """What a session's paid requests with no answer on disk may have cost: recorded at its
    end (`summary.unsettled_usd`: aborted requests at their worst case, answers no disk would
    take at their bill), or by the next session's start for a killed one (`unsettled_usd`)."""
    if not isinstance(session, dict):
        return 0.0
    summary = session.get("summary")
    return as_usd(session.get("unsettled_usd")) or as_usd(
        summary.get("unsettled_usd") if isinstance(summary, dict) else None)


def session_probe_usd(session: Any) -> float:
    """What a session's probe requests counted for (recorded as soon as it probed)."""
    return as_usd(session.get("probe_usd")) if isinstance(session, dict) else 0.0


def record_datasets(path: Path, datasets: dict[str, dict[str, Any]]) -> None:
    """Per-dataset totals of the latest session (prompts, bad rows, skipped by budget...), so
    that status can show totals without re-reading the datasets."""
    data = read_run_json(path)
    data["datasets"] = datasets
    write_atomic(path, data)


def read_probe(path: Path) -> dict[str, Any]:
    """run.json's `probe` entry: {"backends": {NAME: result}, "updated_at", "last_gate"}."""
    try:
        probe = read_run_json(path).get("probe")
    except RunJsonDamaged:  # a cache: probed again, and stored in the rebuilt run.json
        return {}
    return probe if isinstance(probe, dict) else {}


def record_probe(path: Path, results: dict[str, dict[str, Any]],
                 gate: dict[str, Any] | None = None) -> None:
    """Store probe results (one per backend, replacing that backend's older one) and, for a
    run, what it decided (`gate`: backends kept, dropped and why, spend)."""
    data = _read_or_rebuild(path)
    probe = data.get("probe") if isinstance(data.get("probe"), dict) else {}
    backends = probe.get("backends") if isinstance(probe.get("backends"), dict) else {}
    backends.update(results)
    probe["backends"] = backends
    probe["updated_at"] = time.time()
    if gate is not None:
        probe["last_gate"] = gate
    data["probe"] = probe
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
