"""A server that cannot be reached is named as such: at start, one line with its URL and why
(connection refused), within seconds, never a missing price nor a probe's `unsafe`."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_helpers import fast_backend, write_config
from tests.reliability.helpers import draftgen, prompt_rows, write_jsonl

PRICE = {"prompt": 1.0, "completion": 2.0}
WITHIN_S = 45.0
"""A refusal at start comes this soon, interpreter start and tokenizer load included (a few
seconds on an idle machine); a backend retried for minutes would pass it."""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: Path, qwen3_dir: Path, backend: dict[str, Any], n: int = 5,
            **top: Any) -> Path:
    data = write_jsonl(tmp_path / "d.jsonl", prompt_rows(n))
    return write_config(tmp_path, qwen3_dir, [backend], [{"name": "d", "path": str(data)}],
                        sampling={"max_tokens": 64}, **top)


@pytest.mark.parametrize("command,price", [("run", None), ("run", PRICE), ("probe", None)],
                         ids=["run-listed-price", "run-price-set", "probe"])
def test_a_closed_port_at_start(tmp_path: Path, qwen3_dir: Path, command: str,
                                price: dict[str, float] | None) -> None:
    port = _closed_port()
    url = f"http://127.0.0.1:{port}/api/v1?key=SECRET-IN-URL"
    backend = fast_backend("or", "openrouter", url, **({"price": price} if price else {}))
    cfg = _config(tmp_path, qwen3_dir, backend, budget={"usd": 1.0})
    t0 = time.monotonic()
    proc = draftgen(command, str(cfg), *(("--no-live",) if command == "run" else ()),
                    timeout=120)
    wall = time.monotonic() - t0
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said
    assert wall < WITHIN_S
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, said
    assert f"http://127.0.0.1:{port}/api/v1?key=***" in lines[0]
    assert "connection refused" in lines[0]
    assert "SECRET-IN-URL" not in said
    assert "price" not in said and "unsafe" not in said
    assert not (tmp_path / "run" / "d" / "failures.jsonl").exists()
