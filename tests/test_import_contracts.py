"""The import rules of docs/architecture.md, checked by import-linter (`lint-imports`, the
contracts in pyproject.toml): kept by the tree, and each one broken by an import that breaks
its rule, added to a copy of the tree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

CONFIG: list[dict] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
CONTRACTS: dict[str, str] = {c["id"]: c["name"] for c in CONFIG}

BREACHES: dict[str, tuple[str, str]] = {
    # contract id: (module file under src/draftgen, the import added to it)
    "write-path-no-reader": ("run/__init__.py", "import draftgen.status"),
    "no-circles": ("formats/base.py", "import draftgen.formats.qwen3"),
    "backends-no-formats": ("backends/__init__.py", "import draftgen.formats"),
    "formats-no-wire": ("formats/__init__.py", "import aiohttp"),
    "scheduler-no-body": ("scheduler.py", "import orjson"),
    "store-writes": ("export/__init__.py", "from draftgen.store.writer import Store"),
    "ray-one-module": ("config/__init__.py", "import ray"),
    "base-below-everything": ("tally.py", "import draftgen.config"),
}
"""One import per contract that its rule forbids."""

MORE_BREACHES: list[tuple[str, str, str]] = [
    # What run/ calls is the write path too: datasets/ is imported by run/.
    ("write-path-no-reader", "datasets/__init__.py", "import draftgen.export"),
    # A module of the audit other than its quarantine.
    ("store-writes", "audit/__init__.py", "import draftgen.store.atomic"),
    # The store's face hands out `Store` too.
    ("store-writes", "report/page.py", "from draftgen.store import Store"),
]


def lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts on the package `draftgen` found in `src`."""
    env = {**os.environ, "PYTHONPATH": str(src), "COLUMNS": "250"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(PYPROJECT), "--no-cache", "--no-logo"],
        cwd=src, env=env, capture_output=True, text=True, timeout=60, check=False)


def verdicts(output: str) -> dict[str, str]:
    """Each contract's name to KEPT or BROKEN, as lint-imports lists them."""
    found = {}
    for line in output.splitlines():
        m = re.fullmatch(r"(.+?) (KEPT|BROKEN)( \(\d+ ignored imports?\))?", line.strip())
        if m:
            found[m[1]] = m[2]
    return found


def breached_copy(tmp_path: Path, module: str, statement: str) -> Path:
    """A copy of src/draftgen with `statement` appended to `module`."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "draftgen", src / "draftgen",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = src / "draftgen" / module
    path.write_text(path.read_text() + f"\n{statement}  # the breach under test\n")
    return src


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdicts(result.stdout) == dict.fromkeys(CONTRACTS.values(), "KEPT")


def test_every_contract_has_a_breach() -> None:
    assert set(BREACHES) == set(CONTRACTS)


def test_below_everything_forbids_every_other_module() -> None:
    """A module added to draftgen is above the bottom modules until the contract says not."""
    (below,) = (c for c in CONFIG if c["id"] == "base-below-everything")
    package = ROOT / "src" / "draftgen"
    top = {f"draftgen.{p.stem}" for p in package.glob("*.py") if p.name != "__init__.py"}
    top |= {f"draftgen.{p.parent.name}" for p in package.glob("*/__init__.py")}
    assert top - set(below["source_modules"]) == set(below["forbidden_modules"])


@pytest.mark.parametrize(("contract", "module", "statement"), [
    *((c, m, s) for c, (m, s) in BREACHES.items()),
    *MORE_BREACHES,
])
def test_a_breach_breaks_its_contract(tmp_path: Path, contract: str, module: str,
                                      statement: str) -> None:
    result = lint_imports(breached_copy(tmp_path, module, statement))
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdicts(result.stdout).get(CONTRACTS[contract]) == "BROKEN", result.stdout
