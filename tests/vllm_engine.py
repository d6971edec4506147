"""A real vLLM (CPU, SmolLM2-135M-Instruct) for the tests that need one: built by
scripts/build_vllm.sh, started and stopped by `draftgen.testing.vllm_server.VLLMServer`.

Without the build the tests are skipped with the reason, unless DRAFTGEN_REQUIRE_VLLM=1 (set by
.ci/run), where a missing build is a failure: CI must not pass by skipping them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftgen.assets import vllm_missing
from draftgen.testing.vllm_server import VLLMServer

REQUIRE_VLLM_ENV = "DRAFTGEN_REQUIRE_VLLM"


def require_vllm() -> None:
    """Skip the calling test when vLLM is not built (fail when it is required)."""
    missing = vllm_missing()
    if missing is None:
        return
    if os.environ.get(REQUIRE_VLLM_ENV) == "1":
        pytest.fail(f"{REQUIRE_VLLM_ENV}=1 and vLLM is missing: {missing}", pytrace=False)
    pytest.skip(f"vLLM missing: {missing}")


def vllm_server(log_dir: Path, **kw: object) -> Iterator[VLLMServer]:
    """The body of a fixture: a started server, stopped after the last test that uses it."""
    require_vllm()
    server = VLLMServer(log_dir / "vllm.log", **kw)  # type: ignore[arg-type]
    with server:
        yield server


def run_small(script: Path, work: Path) -> str:
    """`python SCRIPT --small --work WORK` (vLLM on core 1: tests/test_vllm_real.py's server,
    which may run beside it, is on core 0); its stdout, or the test fails with its output."""
    require_vllm()
    done = subprocess.run([sys.executable, str(script), "--small", "--work", str(work)],
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "DRAFTGEN_VLLM_CPU": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout
