"""The `draftgen` command.

Each command imports what it needs inside its function: `draftgen status` right after a kill
must not wait for the runner, the backends (aiohttp), pyarrow or the tokenizers to import. At
module level only what Typer needs to build the commands (the option types, from light modules);
tests/test_cli_imports.py guards it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import orjson
import typer

from draftgen.cli_help import HelpCommand, HelpGroup
from draftgen.errors import DraftgenError
from draftgen.export.options import ExportFormat, MinCheck, Overlong
from draftgen.probe.options import DEFAULT_MAX_TOKENS, ProbeOptions
from draftgen.redact import RedactingFilter, redact

if TYPE_CHECKING:
    from rich.console import Console

    from draftgen.config import RunConfig
    from draftgen.run.plan import Plan
    from draftgen.store.shards import ShardSpec


class _Commands(HelpGroup):
    """The commands, each of which reports a `DraftgenError` it stops on as one line and exits
    with the error's `exit_code`; any other exception is a bug and keeps its traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DraftgenError as e:
            raise _fail(str(e), e.exit_code) from None


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True,
                  context_settings={"help_option_names": ["-h", "--help"]})
log = logging.getLogger("draftgen")

GENERATE, INSPECT, WRITE_OUT = "Generate", "Inspect a run", "Write out"
"""The panels of `draftgen --help`."""
SCALE_OUT, PROBING = "Scale out", "Probe"
"""Panels of `draftgen run --help`."""
WHAT_TO_WRITE, LEAVE_OUT, MIX_SPLIT = "What to write", "What to leave out", "How to mix and split"
"""Panels of `draftgen export --help`."""
VERBOSE = "Log debug messages too."


def _examples(*lines: str) -> str:
    """A command's epilog: its examples, one command line each."""
    return "Examples:\n" + "\n".join(f"  {line}" for line in lines)


def _console(**options: Any) -> Console:
    """A rich console (on stdout unless stderr=True); rich is imported on first use, as
    `status --json` never needs it."""
    from rich.console import Console

    return Console(**options)


@cache
def _stderr() -> Console:
    """The console of progress, messages and errors (`printable.message_console`)."""
    from draftgen.printable import message_console

    return message_console(stderr=True)


def _setup_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=_stderr(), show_path=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                               "%H:%M:%S"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger("draftgen")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _fail(message: str, code: int = 2) -> typer.Exit:
    from rich.markup import escape

    # plain text: a path, a row or a server's words in it are never read as rich markup
    _stderr().print(f"[bold red]error:[/] {escape(redact(message))}", highlight=False)
    return typer.Exit(code)


def _run_folder(path: Path) -> Path:
    """RUN_DIR as given, or the `output_dir` of the run config given in its place (the file
    `draftgen run` takes; an invalid one is refused as `run` refuses it)."""
    if not path.is_file():
        return path
    from draftgen.config import load_config

    return Path(load_config(path).output_dir)


RunDir = Annotated[Path, typer.Argument(
    metavar="RUN_DIR", callback=_run_folder,
    help="The run's output_dir, or the run.yaml that names it.")]
"""The run folder argument of the commands that read or stop a run."""


def _check_backend_keys(cfg: RunConfig) -> None:
    for backend in cfg.backends:
        backend.api_key()  # raises ConfigError naming the variable, never showing a value


def _print_plan(plan: Plan, probe: ProbeOptions | None) -> None:
    from rich.table import Table

    from draftgen.backends.llamacpp import LlamaCppConfig
    from draftgen.formats import FormatError
    from draftgen.run.projection import dataset_work, print_projection
    from draftgen.run.render import render_each
    from draftgen.tokenize import chunked

    out = _console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    out.print(f"model: {plan.cfg.model.name} · format {plan.fmt.name} · tokenizer "
              f"{plan.tokenizer.path} (sha256 {plan.tokenizer.sha256[:12]}…)", highlight=False)
    specials = ", ".join(f"{k}={v}" for k, v in plan.fmt.special_tokens().items())
    out.print(f"tokenizer self-check passed: {specials}", highlight=False)
    table = Table(title="datasets", header_style="bold")
    for col in ("dataset", "rows", "prompts", "bad rows", "duplicates", "prompt tokens",
                "max prompt"):
        table.add_column(col, justify="left" if col == "dataset" else "right")
    work = []
    for ds in plan.datasets:
        rendered = [ids for batch in chunked(ds.prompts, 512)
                    for ids in render_each(plan.fmt, batch)]
        refused = [r for r in rendered if isinstance(r, FormatError)]
        lengths = [len(r) for r in rendered if not isinstance(r, FormatError)]
        for err in refused[:10]:
            out.print(f"  cannot render: {err}", highlight=False, markup=False)
        table.add_row(ds.name, f"{ds.load.rows:,}", f"{ds.load.prompts:,}",
                      f"{ds.load.bad_rows + len(refused):,}", f"{ds.load.duplicates:,}",
                      f"{sum(lengths):,}", f"{max(lengths, default=0):,}")
        work.append(dataset_work(plan, ds, rendered))
    out.print(table)
    print_projection(out, plan, work, probe)
    for ds in plan.datasets:
        for bad in ds.load.examples[:10]:
            out.print(f"  bad row {bad.source}: {bad.reason}", highlight=False, markup=False)
        if ds.load.bad_rows > 10:
            out.print(f"  … and {ds.load.bad_rows - 10:,} more bad rows in {ds.name}")
    for b in plan.cfg.backends:
        where = (f"managed llama-server for {b.model}" if isinstance(b, LlamaCppConfig)
                 and b.starts_own_server else redact(b.url or ""))
        out.print(f"backend {b.name}: {b.type} {where} · concurrency {b.concurrency} · "
                  f"priority {b.priority}", highlight=False)


def _warn_if_template_disagrees(fmt: Any) -> None:
    """A warning on stderr when the format and the model's own chat template render the
    sample conversations differently (see `draftgen check-format`)."""
    from draftgen.formats.check import disagreement_warning

    warning = disagreement_warning(fmt)
    if warning:
        _stderr().print(f"[bold yellow]warning:[/] {warning}", highlight=False)


def _print_version(asked: bool) -> None:
    if asked:
        from draftgen import __version__

        typer.echo(f"draftgen {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print draftgen's version and exit.")] = False,
) -> None:
    """Token-exact training data for speculative-decoding draft models."""


@app.command(cls=HelpCommand, rich_help_panel=GENERATE,
             short_help="Generate answers; re-running the same command resumes.",
             epilog=_examples("draftgen run run.yaml --dry-run    # read everything, send nothing",
                              "draftgen run run.yaml              # run, or resume",
                              "draftgen run run.yaml --procs 4    # 4 shard processes",
                              "draftgen run run.yaml --shard 0/2  # this machine's half"))
def run(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="run.yaml")],
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Validate the config, read every dataset, load the tokenizer, "
        "print counts and bad rows, what the run will cost and which limit stops it first; "
        "send no prompt (a paid API's price listing is read: it is free).")] = False,
    no_live: Annotated[bool, typer.Option(
        "--no-live", help="Plain periodic log lines instead of the live table.")] = False,
    no_probe: Annotated[bool, typer.Option(
        "--no-probe", rich_help_panel=PROBING, help="Skip the probe: send to every backend "
        "without checking first what it does with reasoning, whitespace, tool calls and token "
        "counts.")] = False,
    force_probe: Annotated[bool, typer.Option(
        "--probe", rich_help_panel=PROBING, help="Probe again even where run.json holds a "
        "probe result for this "
        "config (by default a resumed run reuses it).")] = False,
    shard: Annotated[str | None, typer.Option(
        "--shard", metavar="I/N", rich_help_panel=SCALE_OUT,
        help="Answer only shard I of N (0-based): the prompts whose "
        "stable ID hashes to I, written to OUTPUT_DIR/shards/I-of-N/, which resumes on its "
        "own. status, audit, export and report of OUTPUT_DIR read every shard as one run.")
        ] = None,
    procs: Annotated[int | None, typer.Option(
        "--procs", metavar="N", min=1, rich_help_panel=SCALE_OUT,
        help="Run the config as N shard processes on this "
        "machine (one client process is bound by one core), sharing the backends' "
        "concurrency and the budgets; written as --shard runs are.")] = None,
    ray: Annotated[int | None, typer.Option(
        "--ray", metavar="N", min=1, rich_help_panel=SCALE_OUT,
        help="Run the config as N shards on a Ray cluster "
        "(needs ray installed).")] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", metavar="ADDR", rich_help_panel=SCALE_OUT,
        help="The Ray cluster to join with --ray (default: "
        "a local one).")] = None,
    accept_changed_settings: Annotated[bool, typer.Option(
        "--accept-changed-settings", help="Resume although the model, format, tokenizer or "
        "sampling changed since the run's last session (refused otherwise): the change is "
        "recorded in run.json and each answer names its session.")] = False,
    reask_changed: Annotated[bool, typer.Option(
        "--reask-changed", help="Ask again the answered prompts whose dataset row changed "
        "under the same ID (their old answers are moved to quarantine.jsonl).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE)] = False,
) -> None:
    """Generate answers; re-running the same command resumes. The backends are probed first (see
    `draftgen probe`): a backend the probe finds unsafe for this run's prompts is left out; with
    none left, nothing is sent."""
    from draftgen import perf
    from draftgen.config import load_config
    from draftgen.progress import closing_line
    from draftgen.run import Runner, prepare

    _setup_logging(verbose)
    if no_probe and force_probe:
        raise _fail("--probe and --no-probe contradict each other")
    probe = None if no_probe else ProbeOptions(force=force_probe)
    spec = _shard_spec(shard, ray, ray_address, dry_run)
    if procs is not None:
        _check_procs_options(spec, ray, dry_run)
    if accept_changed_settings and ((procs or 1) > 1 or ray is not None):
        raise _fail("--accept-changed-settings: resume each shard with --shard I/N instead of "
                    "--procs or --ray")
    if procs is not None and procs > 1:
        raise typer.Exit(_run_local(config, procs, probe=probe, verbose=verbose))
    if ray is not None:
        raise typer.Exit(_run_on_ray(config, ray, ray_address,
                                     live=False if no_live else None, probe=probe))
    cfg = load_config(config)
    _check_backend_keys(cfg)
    plan = prepare(cfg, shard=spec)
    if dry_run:
        _print_plan(plan, probe)
        _warn_if_template_disagrees(plan.fmt)
        if spec is not None:
            _print_shard(plan, spec)
        return
    # asyncio's event loop, or uvloop's with DRAFTGEN_UVLOOP=1: see draftgen.perf.run
    outcome = perf.run(Runner(plan, live_display=False if no_live else None, probe=probe,
                              accept_changed_settings=accept_changed_settings,
                              reask_changed=reask_changed).execute())
    counters = outcome.counters
    if counters is not None:
        t = counters.total()
        where = (f"shard {spec} → {spec.folder(Path(cfg.output_dir))}" if spec
                 else f"→ {cfg.output_dir}")
        _stderr().print(closing_line(outcome.status, t, where), highlight=False, markup=False)
    if outcome.message:
        _stderr().print(redact(outcome.message), highlight=False, markup=False)
    raise typer.Exit(outcome.exit_code)


def _shard_spec(shard: str | None, ray: int | None, ray_address: str | None,
                dry_run: bool) -> ShardSpec | None:
    """--shard parsed; --ray and --ray-address checked against the other options."""
    from draftgen.store.shards import ShardSpec

    if ray is not None and shard is not None:
        raise _fail("--ray runs every shard itself: drop --shard")
    if ray is not None and dry_run:
        raise _fail("--dry-run sends nothing: drop --ray (or run --dry-run --shard I/N)")
    if ray_address is not None and ray is None:
        raise _fail("--ray-address needs --ray N")
    return ShardSpec.parse(shard) if shard is not None else None


def _check_procs_options(spec: ShardSpec | None, ray: int | None, dry_run: bool) -> None:
    if spec is not None or ray is not None:
        raise _fail("--procs runs every shard itself: drop --shard and --ray")
    if dry_run:
        raise _fail("--dry-run sends nothing: drop --procs (or run --dry-run --shard I/N)")


def _run_local(config: Path, procs: int, *, probe: ProbeOptions | None, verbose: bool) -> int:
    """`run --procs N`: the exit status of the N shard processes."""
    from draftgen.scale.local import run_local

    return run_local(config, procs=procs, probe=probe, verbose=verbose)


def _run_on_ray(config: Path, shards: int, address: str | None, *, live: bool | None,
                probe: ProbeOptions | None) -> int:
    """`run --ray N`: the exit status of the N shards run as Ray tasks."""
    # Imported here: ray is optional and heavy, and a run on one machine never needs it.
    try:
        from draftgen.scale.ray_run import run_on_ray
    except ImportError as e:
        raise _fail(f"--ray needs Ray: {e}") from None
    return run_on_ray(config, shards=shards, address=address, live=live, probe=probe)


def _print_shard(plan: Plan, spec: ShardSpec) -> None:
    counts = ", ".join(f"{ds.name} {len(ds.prompts):,} of {ds.load.prompts:,}"
                       for ds in plan.datasets)
    _console(soft_wrap=True).print(f"shard {spec}: prompts {counts} → "
                                   f"{spec.folder(Path(plan.cfg.output_dir))}", highlight=False)


@app.command(cls=HelpCommand, rich_help_panel=GENERATE,
             short_help="Check what each backend does, before a paid run.",
             epilog=_examples("draftgen probe run.yaml",
                              "draftgen probe run.yaml -b openrouter --json --no-save"))
def probe(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="run.yaml")],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the results as JSON on stdout instead of a table.")] = False,
    wide: Annotated[bool, typer.Option(
        "--wide", help="One column per check (about 120 columns) instead of each backend's "
        "checks wrapped in one.")] = False,
    backend: Annotated[list[str] | None, typer.Option(
        "--backend", "-b", metavar="NAME",
        help="Probe only this backend (repeatable; default: all).")] = None,
    max_tokens: Annotated[int, typer.Option(
        "--max-tokens", min=16, help="max_tokens of each probe request (they cost money on "
        "paid backends).")] = DEFAULT_MAX_TOKENS,
    save: Annotated[bool, typer.Option(
        "--save/--no-save", help="Record the results in the output_dir's run.json, where "
        "`draftgen run` reuses them instead of probing again.")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE)] = False,
) -> None:
    """Check what each backend does, before a paid run. A few small requests (plain, reasoning, a
    tool call), then per backend where reasoning arrives, whether whitespace is kept, how tool calls
    arrive, whether usage.completion_tokens matches the rebuilt IDs, whether logprobs cover every
    token, who served it and what it cost; and a verdict: exact, reconstructable or unsafe. Exits 1
    when a backend is unsafe."""
    import asyncio

    from draftgen.config import load_config
    from draftgen.probe.command import (
        load_format,
        probe_until_stopped,
        save_results,
        select_backends,
    )
    from draftgen.probe.show import print_results, to_json

    _setup_logging(verbose)
    cfg = select_backends(load_config(config), backend)
    _check_backend_keys(cfg)
    fmt = load_format(cfg)
    _warn_if_template_disagrees(fmt)
    results = asyncio.run(probe_until_stopped(cfg, fmt,
                                              ProbeOptions(max_tokens=max_tokens)))
    note = save_results(cfg, results, keep=save)
    if as_json:
        sys.stdout.write(orjson.dumps(to_json(results), option=orjson.OPT_INDENT_2).decode()
                         + "\n")
    else:
        print_results(results, _console(), wide=wide)
    if note:
        _stderr().print(note, highlight=False)
    elif save and not as_json:
        _stderr().print(f"the whole run's cost at these prices and answers: draftgen run "
                        f"{config} --dry-run", highlight=False, markup=False)
    if any(r.verdict == "unsafe" for r in results):
        raise typer.Exit(1)


@app.command("check-format", cls=HelpCommand, rich_help_panel=GENERATE,
             short_help="Compare draftgen's prompts with the model's chat template.",
             epilog=_examples("draftgen check-format run.yaml",
                              "draftgen check-format run.yaml --rows 50"))
def check_format(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="run.yaml")],
    rows: Annotated[int, typer.Option(
        "--rows", min=0, help="Compare the first N rows of each dataset too.")] = 5,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE)] = False,
) -> None:
    """Render sample conversations and the first rows of each dataset (tools included) with
    draftgen's model format and with the model's own chat template (the folder
    `model.tokenizer` points to), and compare the tokens. Shows each difference at its first
    token, as IDs and text. Exits 1 when any conversation differs. Sends nothing."""
    from draftgen.config import load_config
    from draftgen.datasets.prompts import iter_prompts
    from draftgen.formats import check
    from draftgen.formats.chat_template import tokenizer_folder
    from draftgen.probe.command import load_format

    _setup_logging(verbose)
    cfg = load_config(config)
    fmt = load_format(cfg)
    template = check.model_template(fmt)
    if template is None:
        raise _fail(f"{tokenizer_folder(fmt.tokenizer)} has no chat template "
                    "(chat_template.jinja or tokenizer_config.json's chat_template)")
    conversations = check.sample_conversations()
    for ds in cfg.datasets:
        conversations += check.prompt_conversations(check.first_rows(iter_prompts(ds), rows))
    results = check.compare_all(fmt, template, conversations)
    out = _console(soft_wrap=True)
    out.print(f"format {fmt.name} vs the chat template in {tokenizer_folder(fmt.tokenizer)}",
              highlight=False, markup=False)
    for result in results:
        for line in check.describe(result):
            out.print(line, highlight=False, markup=False)
    differing = sum(not r.identical for r in results)
    out.print(f"{len(results) - differing} identical, {differing} differing", highlight=False)
    if differing:
        matches = check.matching_formats(fmt, template, conversations)
        out.print(check.matches_line(fmt, matches), highlight=False, markup=False)
        raise typer.Exit(1)


@app.command(cls=HelpCommand, rich_help_panel=GENERATE,
             short_help="Stop a running `draftgen run` (graceful unless --now).",
             epilog=_examples("draftgen stop runs/qwen3", "draftgen stop runs/qwen3 --now"))
def stop(
    run_dir: RunDir,
    now: Annotated[bool, typer.Option(
        "--now", help="Abort requests in flight instead of waiting for them.")] = False,
) -> None:
    """Stop a running `draftgen run` on RUN_DIR (graceful unless --now). On a sharded run, every
    live shard on this machine (shards live on other machines are named)."""
    from draftgen.store.shards import live_parts, run_parts

    if run_dir.exists() and not run_dir.is_dir():
        raise _fail(f"{run_dir}: not a folder; give the run's output_dir")
    live = [(part, holder) for part, holder in live_parts(run_parts(run_dir))
            if holder.get("pid")]
    if not live:
        raise _fail(f"{run_dir}: no draftgen run is live on this folder", code=1)
    here = socket.gethostname()
    asked = 0
    for part, holder in live:
        pid, host = int(holder["pid"]), holder.get("host")
        which = f" (shard {part.label})" if part.shard else ""
        if host not in (None, here):
            _stderr().print(f"pid {pid} on {host} holds {part.folder}{which}: run draftgen stop "
                            "there", highlight=False)
            continue
        try:
            os.kill(pid, signal.SIGUSR1 if now else signal.SIGTERM)
        except ProcessLookupError:
            _stderr().print(f"pid {pid}{which} has already exited", highlight=False)
            continue
        asked += 1
        _stderr().print(f"asked pid {pid} to stop {'now' if now else 'gracefully'}{which}",
                        highlight=False)
    if not asked:
        raise typer.Exit(1)


@app.command(cls=HelpCommand, rich_help_panel=WRITE_OUT, epilog=_examples(
    "draftgen export runs/qwen3 -f speculators -o out/qwen3",
    "draftgen export runs/qwen3 -f specforge -o out/sf --max-len 8192 \\",
    "    --overlong truncate --val-fraction 0.02",
    "draftgen export runs/qwen3 -f parquet -o out/pq --no-checks --min-check any"))
def export(
    run_dir: RunDir,
    fmt: Annotated[ExportFormat, typer.Option(
        "--format", "-f", rich_help_panel=WHAT_TO_WRITE,
        help="speculators (HF save_to_disk Arrow), specforge (pre-tokenized, "
        "text and conversations JSONL), trajectories (speculators' trajectory JSONL: one line "
        "per branch of a turns: all conversation) or parquet (one flat table for analysis; no "
        "trainer reads it).")],
    out: Annotated[Path, typer.Option("--out", "-o", rich_help_panel=WHAT_TO_WRITE,
                                      help="Output folder (created).")],
    dataset: Annotated[list[str] | None, typer.Option(
        "--dataset", "-d", metavar="NAME", rich_help_panel=WHAT_TO_WRITE,
        help="Export only this dataset (repeatable; default: all).")] = None,
    cap: Annotated[list[str] | None, typer.Option(
        "--cap", metavar="NAME=N", rich_help_panel=MIX_SPLIT,
        help="NAME=N: at most N rows from a dataset, a seeded sample (repeatable).")
        ] = None,
    weight: Annotated[list[str] | None, typer.Option(
        "--weight", metavar="NAME=W", rich_help_panel=MIX_SPLIT,
        help="NAME=W: row multiplier for a dataset: 0.5 keeps a seeded half, 2 "
        "writes each answer twice; applied before --cap (repeatable).")] = None,
    exclude_truncated: Annotated[bool, typer.Option(
        "--exclude-truncated/--keep-truncated", rich_help_panel=LEAVE_OUT,
        help="Leave out answers cut off by max_tokens.")] = True,
    min_check: Annotated[MinCheck, typer.Option(
        "--min-check", rich_help_panel=LEAVE_OUT,
        help="Weakest token check exported: exact (native IDs), length_ok "
        "(also rebuilt IDs whose length matched), any.")] = MinCheck.length_ok,
    exact_only: Annotated[bool, typer.Option(
        "--exact-only", rich_help_panel=LEAVE_OUT, help="Same as --min-check exact.")] = False,
    checks: Annotated[bool, typer.Option(
        "--checks/--no-checks", rich_help_panel=LEAVE_OUT,
        help="Leave out answers failing the audit (stop token "
        "consistent with finish_reason, no special-token text in reasoning/content).")] = True,
    max_len: Annotated[int | None, typer.Option(
        "--max-len", rich_help_panel=LEAVE_OUT,
        help="Maximum row length in tokens (prompt + answer).")] = None,
    overlong: Annotated[Overlong, typer.Option(
        "--overlong", rich_help_panel=LEAVE_OUT,
        help="Rows over --max-len: drop them, or truncate (cut the answer's "
        "tail; the prompt is kept whole).")] = Overlong.drop,
    seed: Annotated[int, typer.Option(
        "--seed", rich_help_panel=MIX_SPLIT, help="Seed of shuffle, split, weights, caps, "
        "turn dropout.")] = 0,
    turn_dropout: Annotated[float, typer.Option(
        "--turn-dropout", rich_help_panel=MIX_SPLIT,
        help="turns: all datasets: the probability that a conversation is "
        "cut after a seeded random number of turns (1 to all but one).")] = 0.0,
    shuffle: Annotated[bool, typer.Option(
        "--shuffle/--no-shuffle", rich_help_panel=MIX_SPLIT,
        help="Shuffle the rows (seeded).")] = True,
    val_fraction: Annotated[float, typer.Option(
        "--val-fraction", rich_help_panel=MIX_SPLIT,
        help="Fraction of answers put in a validation split (by hash).")
        ] = 0.0,
    jsonl: Annotated[bool, typer.Option(
        "--jsonl", rich_help_panel=WHAT_TO_WRITE,
        help="speculators: also write OUT/jsonl/SPLIT.jsonl.")] = False,
    text: Annotated[bool, typer.Option(
        "--text/--no-text", rich_help_panel=WHAT_TO_WRITE,
        help="speculators: decode a text column with the run's "
        "tokenizer.")] = True,
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", rich_help_panel=WHAT_TO_WRITE,
        help="tokenizer.json to use instead of the one run.json names.")] = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", rich_help_panel=WHAT_TO_WRITE,
        help="Replace --out when it holds an earlier draftgen export (its "
        "draftgen_export.json); any other folder, and a run folder, is refused.")] = False,
    skip_broken: Annotated[bool, typer.Option(
        "--skip-broken", rich_help_panel=LEAVE_OUT,
        help="Leave out (and count) rows that cannot be sound instead of "
        "failing.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE)] = False,
) -> None:
    """Write a run's answers for a draft-model trainer: exact token IDs, checked loss masks."""
    from draftgen.export import ExportOptions, export_run
    from draftgen.export.options import parse_pairs
    from draftgen.export.summary import print_summary

    _setup_logging(verbose)
    opts = ExportOptions(
        format=fmt, out=out, datasets=dataset or None,
        caps=parse_pairs(cap, "--cap", int), weights=parse_pairs(weight, "--weight", float),
        exclude_truncated=exclude_truncated,
        min_check=MinCheck.exact if exact_only else min_check, checks=checks,
        max_len=max_len, overlong=overlong, seed=seed, turn_dropout=turn_dropout,
        shuffle=shuffle, val_fraction=val_fraction, jsonl=jsonl, text=text, tokenizer=tokenizer,
        overwrite=overwrite, skip_broken=skip_broken,
    )
    summary = export_run(run_dir, opts)
    print_summary(summary, _console())
    if summary.written() == 0:
        raise _fail("no row was written: every answer was excluded (see above)", code=1)


@app.command(cls=HelpCommand, rich_help_panel=INSPECT,
             epilog=_examples("draftgen report runs/qwen3",
                              "draftgen report runs/qwen3 -o /tmp/qwen3-report"))
def report(
    run_dir: RunDir,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Folder for index.html and the PNGs (default: RUN_DIR/report).")
        ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE)] = False,
) -> None:
    """Write an HTML report of a run (spend, lengths, checks, latency, failures) with PNGs."""
    from draftgen.report import write_report

    _setup_logging(verbose)
    result = write_report(run_dir, out)
    stats = result.stats
    _console().print(f"report of {stats.answers:,} answers (${stats.cost:.4f}) → {result.index} "
                     f"(+ {len(result.pngs)} PNGs)", highlight=False, soft_wrap=True)


@app.command(cls=HelpCommand, rich_help_panel=INSPECT,
             short_help="How far a run got: live, stopped or killed.",
             epilog=_examples("draftgen status runs/qwen3",
                              "watch -n 5 draftgen status runs/qwen3",
                              "draftgen status runs/qwen3 --wide | less -S",
                              "draftgen status runs/qwen3 --json | jq .datasets"))
def status(
    run_dir: RunDir,
    wide: Annotated[bool, typer.Option(
        "--wide", help="Every table: each dataset's numbers, by backend, by provider, "
        "conversations, shards (as wide as they need).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """How far a run got: live, stopped or killed. A few lines: done of total, failed,
    skipped and why, in flight, $ spent of budget.usd and what is left, the rate. Reads only;
    never disturbs a live run."""
    from draftgen.status import collect_status, print_status

    st = collect_status(run_dir)
    print_status(st, as_json, wide=wide)


@app.command(cls=HelpCommand, rich_help_panel=INSPECT,
             short_help="Check every answer's tokens against the run's model format.",
             epilog=_examples("draftgen audit runs/qwen3",
                              "draftgen audit runs/qwen3 --quarantine  # then run again"))
def audit(
    run_dir: RunDir,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    quarantine: Annotated[bool, typer.Option(
        "--quarantine", help="Move failing answers from responses.jsonl to quarantine.jsonl "
        "(atomically; refused while a run is live) so the next draftgen run regenerates "
        "them.")] = False,
    workers: Annotated[int | None, typer.Option(
        "--workers", "-j", help="Worker processes (default: one per CPU).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", help="tokenizer.json to use instead of the one run.json names.")] = None,
    all_checks: Annotated[bool, typer.Option(
        "--all-checks", help="List every check with its count, passed ones too (by default "
        "only the failing checks).")] = False,
) -> None:
    """Check every answer's tokens against the run's model format. Stop and reasoning tokens, tool
    tokens, prompt IDs, decoded text, token_check claims, provider routing, duplicate IDs. Exit
    status 1 when any answer fails or cannot be checked."""
    from draftgen.audit import audit_run, render_report
    from draftgen.audit.quarantine import quarantine as move_failing
    from draftgen.store.shards import live_parts, run_parts

    _setup_logging(False)
    if quarantine:  # refuse before spending minutes on the audit
        held = live_parts(run_parts(run_dir))
        if held:
            part, holder = held[0]
            raise _fail(f"{part.folder}: a draftgen run is live on this folder (pid "
                        f"{holder.get('pid', '?')}); stop it first (draftgen stop {run_dir})")
    report = audit_run(run_dir, workers=workers, tokenizer=tokenizer,
                       progress=None if as_json else _audit_progress())
    moved = move_failing(report) if quarantine and not report.ok else None
    data = report.as_json()
    if moved is not None:
        data["quarantined"] = moved.moved
    if as_json:
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        render_report(report, _console(soft_wrap=True), all_checks=all_checks)
        if moved is not None:
            for name, n in moved.moved.items():
                _console().print(f"{name}: {n:,} failing lines moved to {name}/quarantine.jsonl; "
                                 "the next draftgen run regenerates them", highlight=False)
    raise typer.Exit(0 if report.ok else 1)


def _audit_progress() -> Any:
    """A progress line on stderr (a terminal only)."""
    if not sys.stderr.isatty():
        return None
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5 or done >= total:
            last[0] = now
            _stderr().print(f"audited {done:,}/{total:,} answers",
                            end="\n" if done >= total else "\r", highlight=False)
    return show


@app.command(cls=HelpCommand, rich_help_panel=GENERATE,
             short_help="List the dataset presets and mixes run.yaml can name.",
             epilog=_examples("draftgen datasets", "draftgen datasets --kind code",
                              "draftgen datasets hendrycks_math",
                              "draftgen datasets eagle3-reasoning"))
def datasets(
    name: Annotated[str | None, typer.Argument(
        metavar="NAME", help="A preset or mix: show it in full.")] = None,
    kind: Annotated[str | None, typer.Option(
        "--kind", help="Only the presets of this kind: chat, code, math, science, reasoning "
        "or tools.")] = None,
) -> None:
    """The dataset presets (`datasets: - {preset: NAME}` in run.yaml) and mixes (`- {preset_mix:
    NAME}`): hub dataset, split, kind, size and licence. With NAME, one in full: how its rows
    become messages and tools, which rows it drops, and the datasets it stands for. Any field
    of a preset can be overridden in run.yaml (`path:` a local copy, `limit:`, `split:`...); a
    mix's total `max_output_tokens` is shared among its sets by weight."""
    from draftgen.presets import print_preset, print_presets

    out = _console(soft_wrap=name is not None)
    if name is None:
        print_presets(out, kind)
    else:
        print_preset(out, name)


def main() -> None:  # pragma: no cover - console entry point convenience
    app()
