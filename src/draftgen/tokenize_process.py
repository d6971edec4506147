"""Answers encoded in a tokenizer process beside the run, as vLLM and SGLang keep tokenization
out of the process that serves requests.

At 2,000 requests in flight one run process is bound by its event loop, and encoding each
answer (`tiktoken`, on the loop: a thread would wait for the interpreter lock after every text,
see `draftgen.tokenize.OffLoopBatcher`) was about a quarter of the loop's time on a streamed
answer. A child process loads the same tokenizer file and encodes whole batches: the loop only
frames the texts and reads back the IDs (a few µs per answer), and the encoding runs on another
core.

The IDs are those of `Tokenizer.encode_batch` over the same file, by construction: the child
runs that very method (its file's sha256 is checked against the run's). Until the child is
ready, and for good once it fails (it exits, answers garbage, or reports an error), the caller
encodes in its own process: `encode_batch` then answers None, and a warning says why, once.

Wire (the child's stdin and stdout), little-endian u32s:
- child → parent, once: `READY`, length, the tokenizer's sha256 (ASCII); or `FAILED`, length,
  the reason (UTF-8).
- parent → child: count, then `count` byte lengths, then the texts (UTF-8, lone surrogates kept).
- child → parent: `IDS`, count, then `count` ID counts, then the IDs; or `FAILED` as above.

    python -m draftgen.tokenize_process TOKENIZER   (the child; started by `TokenizerProcess`)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import sys
from array import array
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

READY, IDS, FAILED = 1, 2, 3
_U32 = struct.Struct("<I")
_TWO = struct.Struct("<II")

# array("I") is the platform's unsigned int: 4 bytes on every platform CPython runs draftgen
# on; checked, as the wire is u32.
assert array("I").itemsize == 4


def _u32s(values: Sequence[int]) -> bytes:
    a = array("I", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def _from_u32s(data: bytes) -> array[int]:
    a = array("I")
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def texts_frame(texts: Sequence[str]) -> bytes:
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    return b"".join([_U32.pack(len(encoded)), _u32s([len(b) for b in encoded]), *encoded])


def ids_frame(batches: Sequence[Sequence[int]]) -> bytes:
    flat = array("I")
    for ids in batches:
        flat.extend(ids)
    if sys.byteorder != "little":
        flat.byteswap()
    return b"".join([_TWO.pack(IDS, len(batches)), _u32s([len(i) for i in batches]),
                     flat.tobytes()])


def message_frame(kind: int, text: str) -> bytes:
    data = text.encode("utf-8", "replace")
    return _TWO.pack(kind, len(data)) + data


# ---- the child ---------------------------------------------------------------------------------


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    """`n` bytes, or None at the end of the stream (the parent closed it, or died)."""
    parts, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _read_texts(stream: BinaryIO) -> list[str] | None:
    head = _read_exactly(stream, 4)
    if head is None:
        return None
    (count,) = _U32.unpack(head)
    lengths = _read_exactly(stream, 4 * count)
    if lengths is None:
        return None
    sizes = _from_u32s(lengths)
    data = _read_exactly(stream, sum(sizes))
    if data is None:
        return None
    texts, at = [], 0
    for size in sizes:
        texts.append(data[at : at + size].decode("utf-8", "surrogatepass"))
        at += size
    return texts


def serve(tokenizer_path: str, stdin: BinaryIO, stdout: BinaryIO) -> int:
    """The child: encode every batch read from `stdin` until it ends."""
    from draftgen.tokenize import load_tokenizer

    try:
        tokenizer = load_tokenizer(tokenizer_path)
        tokenizer.warm_up()
        stdout.write(message_frame(READY, tokenizer.sha256))
        stdout.flush()
    except Exception as e:
        stdout.write(message_frame(FAILED, f"cannot load {tokenizer_path}: {e}"))
        stdout.flush()
        return 1
    while (texts := _read_texts(stdin)) is not None:
        try:
            frame = ids_frame(tokenizer.encode_batch(texts))
        except Exception as e:
            frame = message_frame(FAILED, f"{type(e).__name__}: {e}")
        stdout.write(frame)
        stdout.flush()
    return 0


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m draftgen.tokenize_process TOKENIZER", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        return serve(argv[0], sys.stdin.buffer, sys.stdout.buffer)
    return 0


# ---- the parent --------------------------------------------------------------------------------


class TokenizerProcess:
    """A child process encoding batches of texts with the run's tokenizer (see the module doc).

    `start()` returns at once (`wait_ready` waits for the child); `encode_batch` answers None
    until the child said it is ready, and from the first failure on. Batches are answered in
    the order they were sent."""

    def __init__(self, tokenizer_path: Path, sha256: str) -> None:
        self._path = tokenizer_path
        self._sha256 = sha256
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: deque[asyncio.Future[list[list[int]] | None]] = deque()
        self.ready = False
        self.failed: str | None = None
        self._settled = asyncio.Event()
        """Set once the child said it is ready, or failed."""
        self._closing = False
        self.batches = 0
        """Batches encoded by the child."""

    async def start(self) -> None:
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "draftgen.tokenize_process", str(self._path),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            self._fail(f"cannot start it: {e}")
            return
        self._reader = asyncio.create_task(self._read_answers())

    async def encode_batch(self, texts: Sequence[str]) -> list[list[int]] | None:
        """The IDs of `texts`, encoded by the child; None when the child cannot (not ready
        yet, or failed): the caller then encodes them itself."""
        proc = self._proc
        if not self.ready or self.failed or proc is None or proc.stdin is None:
            return None
        answer: asyncio.Future[list[list[int]] | None] = (
            asyncio.get_running_loop().create_future())
        self._waiting.append(answer)
        try:
            proc.stdin.write(texts_frame(texts))
            await proc.stdin.drain()
        except (OSError, RuntimeError) as e:
            self._fail(f"cannot write to it: {e}")
        ids = await answer
        if ids is not None and len(ids) != len(texts):
            self._fail(f"it answered {len(ids)} texts for {len(texts)}")
            return None
        return ids

    async def _read_answers(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        out = self._proc.stdout
        try:
            kind, size = _TWO.unpack(await out.readexactly(8))
            message = (await out.readexactly(size)).decode("utf-8", "replace")
            if kind != READY:
                self._fail(message)
                return
            if message != self._sha256:
                self._fail("it loaded another tokenizer file (the file changed?)")
                return
            self.ready = True
            self._settled.set()
            while True:
                kind, count = _TWO.unpack(await out.readexactly(8))
                if kind == FAILED:
                    self._fail((await out.readexactly(count)).decode("utf-8", "replace"))
                    return
                if kind != IDS:
                    self._fail(f"unknown answer kind {kind}")
                    return
                sizes = _from_u32s(await out.readexactly(4 * count))
                flat = _from_u32s(await out.readexactly(4 * sum(sizes)))
                ids, at = [], 0
                for size in sizes:
                    ids.append(flat[at : at + size].tolist())
                    at += size
                self.batches += 1
                if self._waiting and not (waiting := self._waiting.popleft()).done():
                    waiting.set_result(ids)  # done: its caller was cancelled
        except asyncio.IncompleteReadError:
            self._fail("it exited")
        except Exception as e:  # whatever it was, the run encodes in its own process
            self._fail(f"{type(e).__name__}: {e}")

    async def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Wait until the child is ready (loading the tokenizer takes ~1 s); False when it
        failed, or is not ready in `timeout_s` (the run then encodes in its own process)."""
        try:
            await asyncio.wait_for(self._settled.wait(), timeout_s)
        except TimeoutError:
            self._fail(f"not ready after {timeout_s:.0f} s")
        return self.ready and not self.failed

    def _fail(self, reason: str) -> None:
        self._settled.set()
        if self.failed is None:
            self.failed = reason
            if not self._closing:
                log.warning("tokenizer process: %s; answers are encoded in the run's own process "
                            "from now on", reason)
        while self._waiting:
            waiting = self._waiting.popleft()
            if not waiting.done():
                waiting.set_result(None)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Close its input (it exits at the end of it) and wait for it; kill it if it does not
        exit in `timeout_s`."""
        proc = self._proc
        if proc is None:
            return
        self._closing = True
        if proc.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._fail("closed")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
