"""The cache key of a build (scripts/build_vllm.sh, scripts/build_llama_server.sh): a hash of the
code of every file the build reads and of the pins it is given, so that a change to any of them
makes a new cache entry (and CI, which keeps ~/.cache/draftgen, rebuilds it).

    python3 scripts/cache_key.py FILE... [--also TEXT...]   the key (12 hex digits)
    python3 scripts/cache_key.py --list FILE...             the files it covers, one a line

The files covered: each FILE, and for a Python file every module of this checkout's src/ that
it imports, followed to the modules those import (their packages' __init__ files too). The
imports are read from the source, not run, so any Python 3.10+ computes the key without the
build's packages (one Python version, one key). Every import statement counts, one inside a
function too (imported on first use: the build may call it), but those under
`if TYPE_CHECKING:`, which never run.

What is hashed of a file is its code: a Python file as `ast.unparse` writes it without
docstrings (comments and layout are gone), any other file (a shell script) without its blank
and comment-only lines. Editing documentation leaves the key as it is; any other edit, a pin
in a script included, changes it. Only the standard library is used.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def module_file(name: str) -> Path | None:
    """The file of module `name` under src/ (a package's __init__.py), or None."""
    base = SRC.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _module_name(file: Path) -> str | None:
    """The dotted name of a file under src/, or None for a file elsewhere (a script)."""
    try:
        parts = list(file.resolve().relative_to(SRC).with_suffix("").parts)
    except ValueError:
        return None
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in `tree`, but for the body of an `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _imported_names(file: Path, tree: ast.AST) -> Iterator[str]:
    """The dotted names `file` may import: `import a.b` → a.b; `from a.b import c` → a.b and
    a.b.c (c may be a module); relative imports resolved against `file`'s package."""
    own = _module_name(file)
    is_package = file.name == "__init__.py"
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            if own is None:
                continue  # a relative import in a script: not a module of src/
            package = own.split(".") if is_package else own.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        yield base
        yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def _with_parents(name: str) -> Iterator[str]:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def covered_files(files: Iterable[Path]) -> list[Path]:
    """`files` and, for the Python ones, every module of src/ they import (see the doc)."""
    seen: dict[Path, None] = {}
    todo = [Path(f).resolve() for f in files]
    while todo:
        file = todo.pop()
        if file in seen:
            continue
        seen[file] = None
        if file.suffix != ".py":
            continue
        tree = ast.parse(file.read_bytes(), str(file))
        for name in _imported_names(file, tree):
            for part in _with_parents(name):
                found = module_file(part)
                if found is not None and found.resolve() not in seen:
                    todo.append(found.resolve())
    return sorted(seen)


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_of(file: Path) -> str:
    """What of `file` the key covers: its code, without documentation (see the doc)."""
    text = file.read_text(encoding="utf-8")
    if file.suffix == ".py":
        return ast.unparse(_without_docstrings(ast.parse(text, str(file))))
    return "\n".join(line for line in text.splitlines()
                     if line.strip() and not line.lstrip().startswith("#"))


def _shown(file: Path) -> str:
    try:
        return file.relative_to(ROOT).as_posix()
    except ValueError:
        return file.as_posix()


def cache_key(files: Iterable[Path], also: Iterable[str] = ()) -> str:
    digest = hashlib.sha256()
    for file in covered_files(files):
        digest.update(f"{_shown(file)}\0{code_of(file)}\0".encode())
    for text in also:
        digest.update(f"also\0{text}\0".encode())
    return digest.hexdigest()[:12]


def main(argv: list[str]) -> None:
    # By hand, not argparse: the texts after --also may start with "-" (cmake's -D flags).
    if not argv or argv[0] in ("-h", "--help"):
        sys.exit(__doc__)
    listing = argv[0] == "--list"
    args = argv[1:] if listing else argv
    files, also = (args[:args.index("--also")], args[args.index("--also") + 1:]) \
        if "--also" in args else (args, [])
    paths = [Path(f) for f in files]
    missing = [f for f in files if not Path(f).is_file()]
    if not paths or missing or (listing and also):
        sys.exit(f"cache_key: no such file: {', '.join(missing)}" if missing else __doc__)
    if listing:
        print("\n".join(_shown(f) for f in covered_files(paths)))
    else:
        print(cache_key(paths, also))


if __name__ == "__main__":
    main(sys.argv[1:])
