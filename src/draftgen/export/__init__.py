"""`draftgen export`: a run folder's answers as trainer-ready files (exact token IDs, checked
loss masks). See `pipeline` for the flow and `writers` for the file layout of each format."""

from typing import TYPE_CHECKING

from draftgen.export.options import ExportError, ExportFormat, ExportOptions, MinCheck, Overlong
from draftgen.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from draftgen.export.checks import BrokenRow
    from draftgen.export.pipeline import MANIFEST, ExportSummary, export_run

# Imported on first use: they import pyarrow and numpy, which the command-line tool's option
# types (`draftgen.export.options`) do not need.
__getattr__ = lazy_exports(__name__, {
    "draftgen.export.checks": ("BrokenRow",),
    "draftgen.export.pipeline": ("MANIFEST", "ExportSummary", "export_run"),
})

__all__ = [
    "MANIFEST",
    "BrokenRow",
    "ExportError",
    "ExportFormat",
    "ExportOptions",
    "ExportSummary",
    "MinCheck",
    "Overlong",
    "export_run",
]
