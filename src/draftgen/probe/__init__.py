"""`draftgen probe`: what each backend does with reasoning, whitespace, tool calls, token counts
and logprobs, found with a few small requests before a paid run, and a verdict per backend:
`exact`, `reconstructable`, or `unsafe` with the reasons (see `verdict`).

- `exchange`: the requests and how they are sent;
- `analyze`: what one answer shows;
- `verdict`: the rules;
- `core`: probing started backends; `ProbeOptions`; the cache key;
- `gate`: `draftgen run`'s use (drop unsafe backends, refuse when none is left, run.json);
- `command`: the stand-alone command; `show`: table and JSON.
"""

from typing import TYPE_CHECKING

from draftgen.lazy_exports import lazy_exports
from draftgen.probe.model import AnswerReport, BackendProbe, Problem
from draftgen.probe.options import DEFAULT_MAX_TOKENS, ProbeOptions

if TYPE_CHECKING:
    from draftgen.probe.core import backend_key, probe_all
    from draftgen.probe.gate import Gate, backends_to_probe, gate_backends

# Imported on first use: they import the backends (aiohttp), which the options do not need.
__getattr__ = lazy_exports(__name__, {
    "draftgen.probe.core": ("backend_key", "probe_all"),
    "draftgen.probe.gate": ("Gate", "backends_to_probe", "gate_backends"),
})

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "AnswerReport",
    "BackendProbe",
    "Gate",
    "ProbeOptions",
    "Problem",
    "backend_key",
    "backends_to_probe",
    "gate_backends",
    "probe_all",
]
