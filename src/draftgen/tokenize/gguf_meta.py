"""Read the metadata (key/value) section of a GGUF file: tokenizer vocabulary, merges, chat
template, context length. Tensors are never read.

A small reader of our own rather than the `gguf` package: the metadata layout is simple and
stable (GGUF v2/v3), and this keeps numpy and the rest of `gguf`'s dependencies out.
Layout: magic "GGUF", u32 version, u64 tensor count, u64 key count, then per key a string
(u64 length + UTF-8 bytes), a u32 value type and the value; arrays are a u32 item type, a u64
count and the items. Little-endian (a big-endian file is detected by its version field).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from draftgen.errors import DraftgenError

_SCALARS: dict[int, str] = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}
_STRING = 8
_ARRAY = 9


class GGUFError(DraftgenError):
    """Not a GGUF file, or one this reader cannot parse."""


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, endian: str) -> None:
        self.buf = buf
        self.pos = 0
        self.endian = endian

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(self.endian + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        raw = self.buf[self.pos : self.pos + n]
        if len(raw) != n:
            raise GGUFError("file ends inside a string")
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype = self.scalar("I")
            count = self.scalar("Q")
            if itype == _STRING:
                return [self.string() for _ in range(count)]
            if itype in _SCALARS:
                fmt = _SCALARS[itype]
                size = struct.calcsize(fmt)
                out = list(struct.unpack_from(f"{self.endian}{count}{fmt}", self.buf, self.pos))
                self.pos += size * count
                return out
            return [self.value(itype) for _ in range(count)]
        raise GGUFError(f"unknown GGUF value type {vtype} at byte {self.pos}")

    def skip(self, vtype: int) -> None:
        if vtype in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[vtype])
        elif vtype == _STRING:
            n = self.scalar("Q")  # (not `self.pos += self.scalar(...)`: pos is read first)
            self.pos += n
        elif vtype == _ARRAY:
            itype = self.scalar("I")
            count = self.scalar("Q")
            if itype in _SCALARS:
                self.pos += struct.calcsize(_SCALARS[itype]) * count
            else:
                for _ in range(count):
                    self.skip(itype)
        else:
            raise GGUFError(f"unknown GGUF value type {vtype} at byte {self.pos}")


def read_gguf_metadata(path: str | Path, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """The metadata of a GGUF file as a dict; with `keys`, only those (others are skipped
    without being decoded, which is much faster for the big vocabulary arrays)."""
    wanted = set(keys) if keys is not None else None
    path = Path(path)
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, wanted, path)
    except (OSError, ValueError) as e:
        raise GGUFError(f"{path}: cannot read: {e}") from None
    except struct.error:
        raise GGUFError(f"{path}: truncated GGUF metadata") from None


def _parse(buf: mmap.mmap, wanted: set[str] | None, path: Path) -> dict[str, Any]:
    if buf[:4] != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
    endian = "<"
    (version,) = struct.unpack_from("<I", buf, 4)
    if version > 0xFFFF:
        endian = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version < 2:
        raise GGUFError(f"{path}: GGUF version {version} is not supported (need 2 or later)")
    cur = _Cursor(buf, endian)
    cur.pos = 8
    cur.scalar("Q")  # tensor count
    n_kv = cur.scalar("Q")
    out: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.scalar("I")
        if wanted is None or key in wanted:
            out[key] = cur.value(vtype)
            if wanted is not None and len(out) == len(wanted):
                break
        else:
            cur.skip(vtype)
    return out
