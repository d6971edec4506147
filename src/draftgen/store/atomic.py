"""Replacing a small file whole: run.json, the budget pool, a rescue file."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from draftgen.store.nofollow import open_file, refuse_link


def replace_file(path: Path, data: bytes, *, durable: bool = False,
                 root: Path | None = None) -> None:
    """Replace `path` with `data` whole: written beside it, then renamed over it, so that no
    reader and no kill ever sees half a file. `durable`: synced to disk before the rename.
    On failure the old file is left as it was, the partial one removed, and the OSError
    raised. `path` or its partial file a link, or a folder below `root` one: LinkRefused
    (`store.nofollow`), nothing written."""
    refuse_link(path)
    partial = path.with_name(path.name + ".partial")
    try:
        with open_file(partial, "wb", root=root) as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
