"""`--help` that reads at 80 columns: each panel a two-column table whose left column holds
every option name whole (a `--flag / --no-flag` pair on two lines) and never shrinks, so the
description column takes the rest of the width; options in named panels (`rich_help_panel`);
the command's `epilog` printed as written, for its examples.

Typer's own layout gives names, negations, types and help one column each and cuts the names
first when the width runs short (`--exclude-trun…` at 80 columns). Rich is imported only when
help is printed: `draftgen status` never pays for it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

OPTIONS_PANEL = "Options"
ARGUMENTS_PANEL = "Arguments"
COMMANDS_PANEL = "Commands"
NAMES_MAX = 30
"""The widest the names column gets from a metavar; longer metavars start the help text."""


class HelpCommand(TyperCommand):
    """A command whose `--help` is printed by `print_command_help`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_command_help(self, ctx)


class HelpGroup(TyperGroup):
    """A group whose `--help` is printed by `print_group_help`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_group_help(self, ctx)


def print_command_help(command: Any, ctx: Any) -> None:
    console = _console()
    _print_head(console, command, ctx)
    panels: dict[str, list[tuple[str, str]]] = defaultdict(list)
    panels[ARGUMENTS_PANEL] = []
    for param in command.get_params(ctx):
        record = _help_record(param, ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":
            panels[ARGUMENTS_PANEL].append(record)
        else:
            panels[getattr(param, "rich_help_panel", None) or OPTIONS_PANEL].append(record)
    # the named panels in the order their first option comes, then the rest (--help)
    panels[OPTIONS_PANEL] = panels.pop(OPTIONS_PANEL, [])
    for title, rows in panels.items():
        if rows:
            console.print(_panel(title, rows))
    _print_epilog(console, command)


def print_group_help(group: Any, ctx: Any) -> None:
    console = _console()
    _print_head(console, group, ctx)
    options = [r for p in group.get_params(ctx) if (r := _help_record(p, ctx)) is not None]
    if options:
        console.print(_panel(OPTIONS_PANEL, options))
    panels: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        panel = getattr(command, "rich_help_panel", None) or COMMANDS_PANEL
        panels[panel].append((name, command.get_short_help_str(limit=300)))
    for title, rows in panels.items():
        console.print(_panel(title, rows))
    _print_epilog(console, group)


def _help_record(param: Any, ctx: Any) -> tuple[str, str] | None:
    """(names, help) of a parameter from its plain help record (the names with their
    metavar; the help with its default and whether it is required); None for a hidden one.
    A `--flag / --no-flag` pair is put on two lines, and a metavar that would make the names
    wider than NAMES_MAX starts the help instead."""
    if getattr(param, "hidden", False):
        return None
    record = param.get_help_record(ctx)
    if record is None:  # an argument without help
        return param.human_readable_name, ""
    names, help_text = record
    names = names.replace(" / ", " /\n")
    if max(len(line) for line in names.splitlines()) > NAMES_MAX:
        opts = [*param.opts, *param.secondary_opts]
        end = max(names.rfind(o) + len(o) for o in opts)
        if 0 < end < len(names):
            metavar = names[end:].strip()
            names = names[:end]
            help_text = f"{metavar}: {help_text}" if help_text else metavar
    return names, help_text


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def _print_head(console: Console, command: Any, ctx: Any) -> None:
    from rich.padding import Padding
    from rich.text import Text

    usage = " ".join(["Usage:", ctx.command_path, *_usage_pieces(command, ctx)])
    console.print(Padding(Text(usage, style="bold"), (1, 1, 1, 1)))
    for paragraph in (command.help or "").split("\n\n"):
        text = " ".join(paragraph.split())
        if text:
            console.print(Padding(Text(text), (0, 1, 1, 1)))


def _usage_pieces(command: Any, ctx: Any) -> list[str]:
    """[OPTIONS] and the arguments by name (CONFIG, [NAME]); a group's own pieces."""
    if hasattr(command, "list_commands"):
        return list(command.collect_usage_pieces(ctx))
    pieces = ["[OPTIONS]"]
    for param in command.get_params(ctx):
        if param.param_type_name != "argument":
            continue
        name = (param.metavar or (param.name or "").upper()) + ("..." if param.nargs != 1 else "")
        pieces.append(name if param.required else f"[{name}]")
    return pieces


def _panel(title: str, rows: list[tuple[str, str]]) -> RenderableType:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False, expand=True)
    widest = max(len(line) for name, _ in rows for line in name.splitlines())
    table.add_column(no_wrap=True, min_width=widest, style="bold cyan")
    table.add_column(ratio=1, overflow="fold")
    for name, help_text in rows:
        table.add_row(Text(name), Text(help_text))
    return Panel(table, title=title, title_align="left", border_style="dim")


def _print_epilog(console: Console, command: Any) -> None:
    """The epilog as written: its lines (the examples) are not joined or rewrapped."""
    from rich.padding import Padding
    from rich.text import Text

    if command.epilog:
        console.print(Padding(Text(command.epilog.strip("\n")), (1, 1, 0, 1)))

