"""The root of every error draftgen raises on purpose.

`draftgen` commands report a `DraftgenError` as one line (its message names the file, row or
key at fault) and exit 2; anything else is a bug and keeps its traceback. A new error subclasses
this root, or the subclass that says where it comes from (`ConfigError`, `StoreError`, ...)."""

from __future__ import annotations


class DraftgenError(Exception):
    """An error draftgen raised on purpose: bad input, a refused action, a failed request."""
