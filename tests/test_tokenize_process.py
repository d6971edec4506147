"""The tokenizer process (`tokenizer_process: true`): the child encodes as the run's tokenizer
does, text for text; the run falls back to encoding itself when the child cannot; a run with
it writes the same token IDs as a run without it."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path

import orjson
import pytest

from draftgen import tokenize_process as tp
from draftgen.testing.server import TestServer
from draftgen.tokenize import Tokenizer
from tests.e2e_helpers import (
    fast_backend,
    mixed_rows,
    read_records,
    run_config,
    write_config,
    write_jsonl,
)

TEXTS = [
    "", "Hello, world", "<think>\nLet me see.\n</think>\n\nThe answer is 42.<|im_end|>",
    "東京 🙂 café ǅ", "  leading and trailing  ", "a\u0301 not NFC", "\U000e0001 tag",
    "line\r\nbreaks\n\n\n", "x" * 5000,
]


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """The child's answers: (kind, payload) for a message frame, (IDS, the rest) for IDs."""
    out, at = [], 0
    while at < len(data):
        kind, size = tp._TWO.unpack_from(data, at)
        at += 8
        if kind == tp.IDS:
            sizes = tp._from_u32s(data[at : at + 4 * size])
            end = at + 4 * size + 4 * sum(sizes)
        else:
            end = at + size
        out.append((kind, data[at:end]))
        at = end
    return out


def _ids_of(payload: bytes, count: int) -> list[list[int]]:
    sizes = tp._from_u32s(payload[: 4 * count])
    flat = tp._from_u32s(payload[4 * count :])
    ids, at = [], 0
    for size in sizes:
        ids.append(flat[at : at + size].tolist())
        at += size
    return ids


def test_child_encodes_each_batch_as_the_tokenizer_does(qwen3_dir: Path,
                                                        qwen3_tok: Tokenizer) -> None:
    """`serve` over in-memory pipes: ready with the file's sha256, then one answer per batch,
    the IDs of `encode_batch`; it returns at the end of its input."""
    batches = [TEXTS, TEXTS[::-1][:3], []]
    stdin = io.BytesIO(b"".join(tp.texts_frame(b) for b in batches))
    stdout = io.BytesIO()
    assert tp.serve(str(qwen3_dir), stdin, stdout) == 0
    frames = _frames(stdout.getvalue())
    assert frames[0] == (tp.READY, qwen3_tok.sha256.encode())
    assert [kind for kind, _ in frames[1:]] == [tp.IDS] * len(batches)
    for batch, (_, payload) in zip(batches, frames[1:], strict=True):
        assert _ids_of(payload, len(batch)) == qwen3_tok.encode_batch(batch)


def test_child_reports_what_it_cannot_encode(qwen3_dir: Path, qwen3_tok: Tokenizer) -> None:
    """A lone surrogate crosses the wire intact; the tokenizer refuses it in the child as in
    the run's process, and the child says so instead of dying."""
    bad = ["ok", "\ud800 lone"]
    with pytest.raises(Exception) as in_process:
        qwen3_tok.encode_batch(bad)
    stdin = io.BytesIO(tp.texts_frame(bad) + tp.texts_frame(["after"]))
    stdout = io.BytesIO()
    tp.serve(str(qwen3_dir), stdin, stdout)
    frames = _frames(stdout.getvalue())
    assert frames[1][0] == tp.FAILED
    assert type(in_process.value).__name__ in frames[1][1].decode()
    assert frames[2] == (tp.IDS, frames[2][1])
    assert _ids_of(frames[2][1], 1) == qwen3_tok.encode_batch(["after"])


def test_child_that_cannot_load_says_why(tmp_path: Path) -> None:
    stdout = io.BytesIO()
    assert tp.serve(str(tmp_path / "missing"), io.BytesIO(), stdout) == 1
    ((kind, message),) = _frames(stdout.getvalue())
    assert kind == tp.FAILED and b"missing" in message


def test_process_encodes_like_the_run_and_exits_on_close(qwen3_dir: Path,
                                                          qwen3_tok: Tokenizer) -> None:
    async def main() -> None:
        process = tp.TokenizerProcess(qwen3_tok.path, qwen3_tok.sha256)
        await process.start()
        assert await process.wait_ready()
        got = await asyncio.gather(*(process.encode_batch(TEXTS[i:]) for i in range(4)))
        assert got == [qwen3_tok.encode_batch(TEXTS[i:]) for i in range(4)]
        assert process.batches == 4
        await process.close(timeout_s=10)
        assert process._proc is not None and process._proc.returncode == 0  # not killed
        assert await process.encode_batch(["closed"]) is None

    asyncio.run(main())


def test_another_tokenizer_file_is_not_used(qwen3_tok: Tokenizer,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """The child loaded a file whose sha256 is not the run's: never used, said once."""
    async def main() -> None:
        process = tp.TokenizerProcess(qwen3_tok.path, "0" * 64)
        await process.start()
        assert not await process.wait_ready()
        assert await process.encode_batch(["a"]) is None
        await process.close()

    with caplog.at_level(logging.WARNING, logger="draftgen.tokenize_process"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "another tokenizer file" in warnings[0], warnings


def test_child_that_dies_mid_run_leaves_the_encoding_to_the_run(
        qwen3_tok: Tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        process = tp.TokenizerProcess(qwen3_tok.path, qwen3_tok.sha256)
        await process.start()
        assert await process.wait_ready()
        assert process._proc is not None
        process._proc.kill()
        await process._proc.wait()
        assert await process.encode_batch(["a", "b"]) is None
        assert process.failed
        await process.close()

    with caplog.at_level(logging.WARNING, logger="draftgen.tokenize_process"):
        asyncio.run(main())
    assert any("encoded in the run's own process" in r.getMessage() for r in caplog.records)


def test_run_with_the_tokenizer_process_writes_the_same_ids(
        tmp_path: Path, qwen3_dir: Path) -> None:
    """Reconstructed answers (no IDs from the server), streamed: the records of a run with the
    tokenizer process equal those of a run without it, and the child encoded them all."""
    data = write_jsonl(tmp_path / "d.jsonl", mixed_rows(120))
    records: dict[bool, dict[str, list[int]]] = {}
    with TestServer(mode="openrouter", latency_s=0.01, noncanonical_rate=0.2) as server:
        for on in (True, False):
            folder = tmp_path / f"on-{on}"
            cfg = write_config(folder, qwen3_dir, backends=[
                fast_backend("or", "openrouter", server.url, logprobs=False, stream=True,
                             concurrency=16)],
                datasets=[{"name": "d", "path": str(data)}], tokenizer_process=on)
            assert run_config(cfg).status == "completed"
            rows = read_records(folder / "run", "d")
            assert {r["token_source"] for r in rows} == {"reconstructed"}
            records[on] = {r["id"]: r["output_ids"] for r in rows}
            summary = orjson.loads((folder / "run" / "run.json").read_bytes())["sessions"][-1]
            report = summary["summary"].get("tokenizer_process")
            if on:
                assert report is not None and report["failed"] is None
                assert report["batches"] > 0
            else:
                assert report is None
    assert len(records[True]) == 120 and records[True] == records[False]
