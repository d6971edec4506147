"""The prompt-row cache: a dataset's `PromptIndex` and `LoadStats`, kept in the run folder so
that a second load of the same files with the same options skips the parse.

One uncompressed `.npz` file per dataset (numpy arrays in a zip: every member has a CRC32,
so a torn or damaged file fails to load). Its `key` is a digest of the cache format version,
the dataset options that decide which prompts come out and their IDs, and each source file's
path, size and mtime; a file whose key differs is stale. Anything wrong with the file (missing,
stale, torn, corrupted, foreign) means "no cache": the dataset is read in full and the file
written again. Writes are atomic (a temporary file renamed over the old one).
"""

from __future__ import annotations

import hashlib
import logging
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from draftgen.config import DatasetConfig
from draftgen.datasets.admission import LoadStats
from draftgen.datasets.errors import BadRow
from draftgen.datasets.rowindex import PromptIndex, RowPlaces
from draftgen.store.nofollow import StoreError, dataset_run, make_folders, open_file

log = logging.getLogger("draftgen.datasets")

CACHE_FORMAT = 1
"""Bump when the file's layout, or how prompts and IDs are made from rows, changes."""
NOT_PROMPT_OPTIONS = frozenset({"max_output_tokens", "max_prompts", "sampling_mix", "preset",
                                "preset_mix", "hub_timeout_s"})
"""Dataset options that only limit or shape what is sent: changing them keeps the cache (and
a config without `sampling_mix` keeps the key it had before the option existed)."""
_ARRAYS = ("id_ends", "id_hashes", "tools", "file_no", "offset", "length", "line")


def cache_key(cfg: DatasetConfig, files: list[Path]) -> str:
    """The digest that a cache file must carry to be used for `cfg` reading `files`."""
    unset_since_added = {"rows"} if cfg.rows is None else set()  # keys stay as they were
    options = cfg.model_dump(exclude=set(NOT_PROMPT_OPTIONS) | unset_since_added)
    sources = []
    for f in files:
        st = f.stat()
        sources.append([str(f), str(f.resolve()), st.st_size, st.st_mtime_ns])
    blob = orjson.dumps({"format": CACHE_FORMAT, "options": options, "files": sources},
                        option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def write_cache(path: Path, key: str, index: PromptIndex, stats: LoadStats) -> None:
    """Write the cache file atomically. A failure to write is logged, never raised: the
    cache only saves time."""
    assert index.places is not None
    places = index.places
    meta = {"key": key, "count": len(index), "files": places.files, "stats": _stats_json(stats)}
    arrays = {"meta": np.frombuffer(orjson.dumps(meta), dtype=np.uint8),
              "id_blob": np.frombuffer(index.id_blob, dtype=np.uint8),
              "id_ends": index.id_ends, "id_hashes": index.id_hashes, "tools": index.tools,
              "file_no": places.file_no, "offset": places.offset, "length": places.length,
              "line": places.line}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    root = dataset_run(path)  # RUN/.cache/FILE: neither the file nor its folder a link
    try:
        make_folders(path.parent, root)
        with open_file(tmp, "wb", root=root) as f:
            np.savez(f, allow_pickle=False, **arrays)
        os.replace(tmp, path)
    except (OSError, StoreError) as e:
        log.warning("%s: cannot write the prompt cache (%s); the next run reads the dataset "
                    "in full again", path, e)
        tmp.unlink(missing_ok=True)


def discard_cache(path: Path) -> None:
    """Remove a cache file found stale (it is draftgen's own, derived from the dataset)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.warning("%s: cannot remove the stale prompt cache (%s); remove it by hand", path, e)


def read_cache(path: Path, key: str) -> tuple[PromptIndex, LoadStats] | None:
    """The cached index and stats when the file is whole and carries `key`; else None."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = orjson.loads(npz["meta"].tobytes())
            if not isinstance(meta, dict) or meta.get("key") != key:
                log.debug("%s: prompt cache is stale; rebuilding it", path)
                return None
            arrays = {name: npz[name] for name in _ARRAYS}
            blob = npz["id_blob"].tobytes()
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile,
            orjson.JSONDecodeError) as e:
        log.debug("%s: prompt cache unreadable (%s: %s); rebuilding it", path,
                  type(e).__name__, e)
        return None
    return _checked(path, meta, arrays, blob)


def _checked(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray], blob: bytes
             ) -> tuple[PromptIndex, LoadStats] | None:
    try:
        places = RowPlaces(files=[str(f) for f in meta["files"]], file_no=arrays["file_no"],
                           offset=arrays["offset"], length=arrays["length"], line=arrays["line"])
        index = PromptIndex(id_blob=blob, id_ends=arrays["id_ends"],
                            id_hashes=arrays["id_hashes"], tools=arrays["tools"], places=places)
        stats = _stats_from_json(meta["stats"])
        whole = len(index) == meta["count"] == stats.prompts and index.is_consistent()
    except (KeyError, TypeError, ValueError) as e:
        log.debug("%s: prompt cache malformed (%s); rebuilding it", path, e)
        return None
    if not whole:
        log.debug("%s: prompt cache inconsistent; rebuilding it", path)
        return None
    return index, stats


def _stats_json(stats: LoadStats) -> dict[str, Any]:
    return {"rows": stats.rows, "prompts": stats.prompts, "bad_rows": stats.bad_rows,
            "duplicates": stats.duplicates, "id_collisions": stats.id_collisions,
            "limited": stats.limited, "dropped": stats.dropped,
            "examples": [[b.source, b.reason] for b in stats.examples]}


def _stats_from_json(data: dict[str, Any]) -> LoadStats:
    counts = {k: int(data[k]) for k in ("rows", "prompts", "bad_rows", "duplicates",
                                        "id_collisions")}
    return LoadStats(**counts, limited=bool(data["limited"]), dropped=int(data.get("dropped", 0)),
                     examples=[BadRow(str(s), str(r)) for s, r in data["examples"]])
