"""The command-line tool starts fast: `import draftgen.cli` (all `draftgen --help` needs) imports
none of the heavy libraries, and `draftgen status` imports only what status reads with (numpy),
not the backends' aiohttp, pyarrow or the tokenizers. Each check runs in a fresh interpreter,
as a person runs the command. No timings: what is imported is what costs the time."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftgen.store import Store

HEAVY = ("aiohttp", "pyarrow", "tokenizers", "numpy", "ray", "datasets", "transformers",
         "matplotlib")
NOT_FOR_STATUS = ("aiohttp", "pyarrow", "tokenizers", "ray", "datasets", "transformers",
                  "matplotlib")

_REPORT_IMPORTED = """
import json, sys
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))))
"""


def _heavy_imported(code: str, watched: tuple[str, ...]) -> list[str]:
    """Which of the `watched` top-level packages a fresh interpreter has imported after running
    `code` (which must print nothing on stdout)."""
    done = subprocess.run([sys.executable, "-c", code + _REPORT_IMPORTED, *watched],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported: list[str] = json.loads(done.stdout.splitlines()[-1])
    return imported


def _small_run(root: Path) -> Path:
    store = Store(root, fsync_interval_s=0)
    for i in range(5):
        store.append_record("ds", {
            "id": f"ds/{i}", "dataset": "ds", "output_ids": [1, 2, 3], "finish_reason": "stop",
            "token_source": "native", "token_check": "exact", "backend": "local",
            "usage": {}, "cost_usd": 0.0, "latency_s": 0.5, "created_at": 1000.0 + i})
    store.close()
    return root


@pytest.mark.slow
def test_importing_the_cli_imports_no_heavy_library() -> None:
    assert _heavy_imported("import draftgen.cli", HEAVY) == []


@pytest.mark.slow
def test_help_imports_no_heavy_library() -> None:
    code = """
from typer.testing import CliRunner
from draftgen.cli import app
result = CliRunner().invoke(app, ["--help"])
assert result.exit_code == 0 and "status" in result.output, result.output
"""
    assert _heavy_imported(code, HEAVY) == []


@pytest.mark.slow
def test_status_imports_neither_backends_nor_pyarrow_nor_tokenizers(tmp_path: Path) -> None:
    run = _small_run(tmp_path / "run")
    code = f"""
from typer.testing import CliRunner
from draftgen.cli import app
result = CliRunner().invoke(app, ["status", {str(run)!r}, "--json"])
assert result.exit_code == 0, result.output
assert __import__("json").loads(result.stdout)["datasets"]["ds"]["done"] == 5, result.stdout
"""
    assert _heavy_imported(code, NOT_FOR_STATUS) == []


@pytest.mark.parametrize("package", ["draftgen.export", "draftgen.probe", "draftgen.store",
                                     "draftgen.tokenize"])
def test_every_name_a_lazy_package_exports_resolves(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = module.no_such_name
