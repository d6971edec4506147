"""The `draftgen` command."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from draftgen.config import ConfigError, RunConfig, load_config
from draftgen.datasets import DatasetError
from draftgen.formats import FormatError
from draftgen.runner import Plan, Runner, prepare
from draftgen.store import RunLayout, RunLocked, StoreError, lock_holder
from draftgen.tokenize import TokenizerError, chunked

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Token-exact training data for speculative-decoding draft models.")
console = Console(stderr=True)
log = logging.getLogger("draftgen")

_USER_ERRORS = (ConfigError, DatasetError, FormatError, TokenizerError, RunLocked, StoreError)


def _setup_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    if sys.stderr.isatty():
        handler: logging.Handler = RichHandler(console=console, show_path=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                               "%H:%M:%S"))
    root = logging.getLogger("draftgen")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _check_backend_keys(cfg: RunConfig) -> None:
    for backend in cfg.backends:
        backend.api_key()  # raises ConfigError naming the variable, never showing a value


def _print_plan(plan: Plan) -> None:
    out = Console()
    out.print(f"model: {plan.cfg.model.name} · format {plan.fmt.name} · tokenizer "
              f"{plan.tokenizer.path} (sha256 {plan.tokenizer.sha256[:12]}…)", highlight=False)
    specials = ", ".join(f"{k}={v}" for k, v in plan.fmt.special_tokens().items())
    out.print(f"tokenizer self-check passed: {specials}", highlight=False)
    table = Table(title="datasets", header_style="bold")
    for col in ("dataset", "rows", "prompts", "bad rows", "duplicates", "prompt tokens",
                "max prompt"):
        table.add_column(col, justify="left" if col == "dataset" else "right")
    for ds in plan.datasets:
        lengths = [len(ids) for batch in chunked(ds.prompts, 512)
                   for ids in plan.fmt.render_prompts(batch)]
        table.add_row(ds.name, f"{ds.load.rows:,}", f"{ds.load.prompts:,}",
                      f"{ds.load.bad_rows:,}", f"{ds.load.duplicates:,}",
                      f"{sum(lengths):,}", f"{max(lengths, default=0):,}")
    out.print(table)
    for ds in plan.datasets:
        for bad in ds.load.examples[:10]:
            out.print(f"  bad row {bad.source}: {bad.reason}", highlight=False, markup=False)
        if ds.load.bad_rows > 10:
            out.print(f"  … and {ds.load.bad_rows - 10:,} more bad rows in {ds.name}")
    for b in plan.cfg.backends:
        out.print(f"backend {b.name}: {b.type} {b.url} · concurrency {b.concurrency} · "
                  f"priority {b.priority}", highlight=False)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="run.yaml")],
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Validate the config, read every dataset, load the tokenizer, "
        "print counts and bad rows; send nothing.")] = False,
    no_live: Annotated[bool, typer.Option(
        "--no-live", help="Plain periodic log lines instead of the live table.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Generate answers. Re-running the same command on the same output_dir resumes."""
    _setup_logging(verbose)
    try:
        cfg = load_config(config)
        _check_backend_keys(cfg)
        plan = prepare(cfg)
        if dry_run:
            _print_plan(plan)
            return
        outcome = asyncio.run(Runner(plan, live_display=False if no_live else None).execute())
    except _USER_ERRORS as e:
        raise _fail(str(e)) from None
    counters = outcome.counters
    if counters is not None:
        t = counters.total()
        console.print(
            f"{outcome.status}: {t.done_before + t.done:,}/{t.total:,} answered "
            f"({t.done:,} this session), {t.failed:,} failed, {t.exhausted:,} out of attempts, "
            f"{t.pending:,} pending, {t.output_tokens:,} output tokens, ${t.cost:.4f} "
            f"→ {cfg.output_dir}", highlight=False)
    if outcome.message:
        console.print(outcome.message, highlight=False)
    raise typer.Exit(outcome.exit_code)


@app.command()
def stop(
    run_dir: Annotated[Path, typer.Argument(help="The run's output_dir")],
    now: Annotated[bool, typer.Option(
        "--now", help="Abort requests in flight instead of waiting for them.")] = False,
) -> None:
    """Ask a running `draftgen run` on RUN_DIR to stop (graceful unless --now)."""
    holder = lock_holder(RunLayout(run_dir).lock)
    if not holder or not holder.get("pid"):
        raise _fail(f"{run_dir}: no draftgen run is live on this folder", code=1)
    pid = int(holder["pid"])
    os.kill(pid, signal.SIGUSR1 if now else signal.SIGTERM)
    console.print(f"asked pid {pid} to stop {'now' if now else 'gracefully'}")


def main() -> None:  # pragma: no cover - console entry point convenience
    app()
