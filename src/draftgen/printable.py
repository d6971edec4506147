"""Text a server supplied (provider names, quantizations, messages), made safe to print: a
hostile or broken endpoint must not move the cursor, recolour or clear the terminal, or forge
lines of output. Every command that prints such text (audit, status, report, probe) goes
through `printable`, and through `for_console` where rich would read it as markup."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_ESCAPES = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, clearing
    r"|\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks
    r"|[@-Z\\-_])"  # other two-byte escapes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # the one-byte CSI
)
REPLACEMENT = "?"


def printable(text: object) -> str:
    """`text` without terminal escape sequences, its other unprintable characters (controls,
    newlines, bidi overrides) shown as "?"."""
    cleaned = _ESCAPES.sub("", str(text))
    if cleaned.isprintable():
        return cleaned
    return "".join(ch if ch.isprintable() else REPLACEMENT for ch in cleaned)


def for_console(text: object) -> str:
    """`printable(text)` with rich markup escaped, for a rich table cell or print."""
    from rich.markup import escape

    return escape(printable(text))


def message_console(**options: Any) -> Console:
    """A rich console for messages: on a terminal a line longer than it wraps at its spaces
    (rich's wrap; the terminal's own would cut a word in two), piped each message stays one
    line (a log is read with grep)."""
    from rich.console import Console

    console = Console(**options)
    console.soft_wrap = not console.is_terminal
    return console


UNBOUNDED = 10_000
"""The width renderables are measured in for `widen_to_fit`: as wide as their cells."""


def widen_to_fit(console: Console, renderables: Iterable[Any]) -> None:
    """Widen the console to what the renderables (tables) need with no cell wrapped or cut: a
    `--wide` view, that a narrower terminal wraps line by line rather than rich cutting each
    cell to "…"."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(UNBOUNDED)
    needed = max((Measurement.get(console, unbounded, r).maximum for r in renderables),
                 default=0)
    console.width = max(console.width, needed)
