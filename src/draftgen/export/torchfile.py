"""A `{int: int}` dict in the file format of `torch.save`, written without torch.

speculators' trainer reads its vocabulary counts with `torch.load(path, weights_only=True)`:
a zip archive (stored, not deflated) whose `ARCHIVE/data.pkl` is a protocol-2 pickle, with the
`byteorder` and `version` records torch checks. A dict of plain ints holds no tensors, so the
archive needs no storage records.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

_FORMAT_VERSION = b"1"
_SERIALIZATION_VERSION = b"3\n"


def save_int_dict(path: Path, data: dict[int, int]) -> None:
    archive = path.stem or "archive"
    records = {
        "data.pkl": pickle.dumps({int(k): int(v) for k, v in data.items()}, protocol=2),
        ".format_version": _FORMAT_VERSION,
        ".storage_alignment": b"64",
        "byteorder": b"little",
        "version": _SERIALIZATION_VERSION,
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, payload in records.items():
            z.writestr(f"{archive}/{name}", payload)
