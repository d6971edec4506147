"""The command line: `python -m draftgen.testing.fake_engine --port 0 ...` prints
`LISTENING http://HOST:PORT` and serves until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, get_args

from draftgen.testing.fake_engine.config import ServerConfig
from draftgen.testing.fake_engine.faults import FAULT_KINDS
from draftgen.testing.fake_engine.kinds import (
    Layout,
    LogprobsScope,
    Mode,
    ReasoningField,
    ToolCallDisplay,
)
from draftgen.testing.fake_engine.server import serve


def _pair(text: str, kind: Callable[[str], Any]) -> tuple[Any, Any]:
    first, second = text.split(",")
    return kind(first), kind(second)


def _fault_rate(text: str) -> tuple[str, float]:
    kind, _, p = text.partition("=")
    if kind not in FAULT_KINDS or not p:
        raise argparse.ArgumentTypeError(f"want KIND=P with KIND one of {sorted(FAULT_KINDS)}")
    return kind, float(p)


def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m draftgen.testing.fake_engine",
        description="A local fake inference engine (OpenAI, OpenRouter, SGLang wire protocols).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokenizer", help="tokenizer.json or its folder (default: Qwen3)")
    p.add_argument("--layout", choices=get_args(Layout), default="qwen3")
    p.add_argument("--model", default="test/qwen3")
    p.add_argument("--mode", choices=get_args(Mode), default="openai")
    p.add_argument(
        "--api-key-env", metavar="VAR", help="require Bearer auth with this env var's key"
    )
    p.add_argument("--providers", default="TestProvider", help="comma-separated names")
    p.add_argument(
        "--prices", type=lambda s: _pair(s, float), help="USD/M tokens: PROMPT,COMPLETION"
    )
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    p.add_argument("--stream-interval", type=float, default=0.0,
                   help="seconds between a stream's writes (8 events each; 0: all at once)")
    p.add_argument("--reasoning-tokens", type=lambda s: _pair(s, int), default=(30, 300))
    p.add_argument("--content-tokens", type=lambda s: _pair(s, int), default=(20, 200))
    p.add_argument("--strip-whitespace", action="store_true")
    p.add_argument("--raw-slices", action="store_true")
    p.add_argument(
        "--reasoning-field",
        choices=get_args(ReasoningField),
        default="reasoning",
    )
    p.add_argument(
        "--tool-call-display", choices=get_args(ToolCallDisplay), default="structured"
    )
    p.add_argument("--no-tools", action="store_true", help="ignore the requests' tools")
    p.add_argument("--logprobs-scope", choices=get_args(LogprobsScope), default="all")
    p.add_argument(
        "--quantization", action="append", default=[], metavar="PROVIDER=Q",
        help="quantization the endpoints listing names for a provider (repeatable)",
    )
    p.add_argument("--noncanonical-rate", type=float, default=0.0)
    p.add_argument("--generate-omits-stop-id", action="store_true")
    p.add_argument("--fault-rate", type=_fault_rate, action="append", default=[], metavar="KIND=P")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--huge-body-mb", type=int, default=64,
                   help="size of the huge_body and gzip_bomb answers")
    p.add_argument("--echo-auth", action="store_true",
                   help="error bodies echo the request's Authorization header")
    return p


def config_from_args(argv: Sequence[str] | None = None) -> ServerConfig:
    args = _arg_parser().parse_args(argv)
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise SystemExit(f"environment variable {args.api_key_env} is not set")
    return ServerConfig(
        host=args.host,
        port=args.port,
        tokenizer_path=args.tokenizer,
        layout=args.layout,
        model=args.model,
        mode=args.mode,
        api_key=api_key,
        providers=[p for p in args.providers.split(",") if p],
        prices=args.prices,
        latency_s=args.latency,
        stream_interval_s=args.stream_interval,
        reasoning_tokens=args.reasoning_tokens,
        content_tokens=args.content_tokens,
        strip_whitespace=args.strip_whitespace,
        raw_slices=args.raw_slices,
        reasoning_field=args.reasoning_field,
        tool_call_display=args.tool_call_display,
        tools_supported=not args.no_tools,
        logprobs_scope=args.logprobs_scope,
        quantizations=dict(q.split("=", 1) for q in args.quantization),
        noncanonical_rate=args.noncanonical_rate,
        generate_omits_stop_id=args.generate_omits_stop_id,
        fault_rates=dict(args.fault_rate),
        seed=args.seed,
        huge_body_mb=args.huge_body_mb,
        echo_auth=args.echo_auth,
    )


async def serve_until_signal(config: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serve(config) as url:
        print(f"LISTENING {url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(serve_until_signal(config_from_args(argv)))
    return 0
