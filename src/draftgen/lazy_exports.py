"""A package's re-exports imported on first use (PEP 562 module `__getattr__`), so that
importing one light module of the package does not import its heavy siblings: the command-line
tool needs `draftgen.export.options` (the option types) without pyarrow, and
`draftgen.probe.options` without the backends."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports each name of `exports` (module path →
    the names it defines) from its module when first asked for, then keeps it on the package."""
    home = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
