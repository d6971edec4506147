"""`draftgen export`: a run folder's answers as trainer-ready files (exact token IDs, checked
loss masks). See `pipeline` for the flow and `writers` for the file layout of each format."""

from draftgen.export.checks import BrokenRow
from draftgen.export.options import ExportError, ExportFormat, ExportOptions, MinCheck, Overlong
from draftgen.export.pipeline import MANIFEST, ExportSummary, export_run

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
