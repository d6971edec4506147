"""Whether the real engine (llama-server + the bundled SmolLM2) is here, for the tests that
need it. Without it they are skipped with the reason, unless DRAFTGEN_REQUIRE_ENGINE=1 (set by
.ci/run): CI must not pass by skipping them."""

from __future__ import annotations

import os

import pytest

from draftgen.assets import llama_server_binary, smollm2_gguf

REQUIRE_ENGINE_ENV = "DRAFTGEN_REQUIRE_ENGINE"


def engine_missing() -> str | None:
    """Why the engine cannot be used, or None when it can."""
    try:
        llama_server_binary()
        smollm2_gguf()
    except FileNotFoundError as e:
        return str(e)
    return None


def engine_required() -> bool:
    return os.environ.get(REQUIRE_ENGINE_ENV) == "1"


def require_engine() -> None:
    """Skip the calling test when the engine is missing (fail when it is required)."""
    missing = engine_missing()
    if missing is None:
        return
    if engine_required():
        pytest.fail(f"{REQUIRE_ENGINE_ENV}=1 and the engine is missing: {missing}",
                    pytrace=False)
    pytest.skip(f"real engine missing: {missing}")
