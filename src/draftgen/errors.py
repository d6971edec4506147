"""The root of every error draftgen raises on purpose.

`draftgen` commands report a `DraftgenError` as one line (its message names the file, row or
key at fault) and exit with its class's `exit_code` (2 unless the class says otherwise);
anything else is a bug and keeps its traceback. A new error subclasses this root, or the
subclass that says where it comes from (`ConfigError`, `StoreError`, ...)."""

from __future__ import annotations

import errno
import os
from typing import ClassVar


class DraftgenError(Exception):
    """An error draftgen raised on purpose: bad input, a refused action, a failed request."""

    exit_code: ClassVar[int] = 2
    """The exit status of a `draftgen` command that stops on this error."""


NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""A full disk, a quota, a file-size limit: what freeing space (or another disk) mends."""


def os_reason(e: OSError) -> str:
    """An OSError in the system's words ("No space left on device"), also where a library
    (pyarrow) wraps them in its own."""
    return os.strerror(e.errno) if e.errno else (e.strerror or str(e))
