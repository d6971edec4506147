"""The one way the store opens a file it writes in a run folder: never through a symbolic link.

A file of the run folder (responses, index, journal, run.json and its temp files, the lock...)
or a folder of its own (a dataset's folder, `.rescue`, `shards/I-of-N`) replaced by a link to
somewhere else would have the run append to, truncate or rewrite a file outside output_dir.
The file is opened with O_NOFOLLOW and the folders between the run folder and it are checked,
so such a link is refused as one line naming it (`LinkRefused`). output_dir itself may be a
link: what it points to is the run folder. Reading through a link is left to the readers.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from draftgen.errors import DraftgenError


class StoreError(DraftgenError):
    """The run folder cannot be written (disk full, permissions). Nothing written is lost."""


class LinkRefused(StoreError):
    """A file or folder the store would write in a run folder is a symbolic link."""


_FLAGS = {
    "rb": os.O_RDONLY,
    "rb+": os.O_RDWR,
    "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
}


def dataset_run(path: Path) -> Path:
    """The run folder of a dataset's file RUN/DATASET/FILE (whose folder must not be a link)."""
    return path.parent.parent


def refused(path: Path) -> LinkRefused:
    try:
        target = f" to {os.readlink(path)}"
    except OSError:
        target = ""
    return LinkRefused(
        f"{path}: a symbolic link{target}; draftgen never writes through a link (it would write "
        "outside output_dir): put the file or folder itself there, or remove the link, and "
        "run again")


def refuse_link(path: Path) -> None:
    """LinkRefused when `path` itself is a symbolic link."""
    if path.is_symlink():
        raise refused(path)


def refuse_linked_folders(folder: Path, root: Path | None) -> None:
    """LinkRefused naming the first folder from below `root` down to `folder` (itself
    included) that is a symbolic link; None, or a folder not below it: none is the run's own."""
    if root is None or folder == root or not folder.is_relative_to(root):
        return
    rel = folder.relative_to(root)
    for part in [*reversed(rel.parents), rel][1:]:  # the first is "." (root itself)
        refuse_link(root / part)


def make_folders(folder: Path, root: Path | None = None) -> None:
    """`folder` and its parents made where missing; those below `root` may not be links."""
    refuse_linked_folders(folder, root)
    folder.mkdir(parents=True, exist_ok=True)


def open_fd(path: Path, flags: int, *, root: Path | None = None, mode: int = 0o644) -> int:
    """os.open of a file in a run folder, the file not followed where it is a link and the
    folders below `root` checked (`root` None: the file's own folder is not checked).
    LinkRefused for a link; any other OSError as raised."""
    refuse_linked_folders(path.parent, root)
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP and path.is_symlink():
            raise refused(path) from None
        raise


def truncate(path: Path, size: int, *, root: Path | None = None) -> None:
    """`os.truncate` of a file in a run folder, through `open_fd`."""
    fd = open_fd(path, os.O_WRONLY, root=root)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def open_file(path: Path, how: str, *, root: Path | None = None) -> BinaryIO:
    """`open(path, how)` for how in rb, rb+, wb, ab, through `open_fd`."""
    fd = open_fd(path, _FLAGS[how], root=root)
    try:
        return os.fdopen(fd, how)
    except BaseException:
        os.close(fd)
        raise
