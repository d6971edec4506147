"""Running the server: on the current event loop (`serve`), or on its own thread
(`TestServer`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from draftgen.testing.fake_engine.config import ServerConfig
from draftgen.testing.fake_engine.engine import create_app
from draftgen.testing.fake_engine.stats import ServerStats


@contextlib.asynccontextmanager
async def serve(config: ServerConfig, stats: ServerStats | None = None) -> AsyncIterator[str]:
    """Run the server on the current event loop; yields its URL once the port listens."""
    runner = web.AppRunner(
        create_app(config, stats), access_log=None, handler_cancellation=True, shutdown_timeout=0.5
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port, backlog=config.backlog)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    finally:
        await runner.cleanup()


class TestServer:
    """The server on its own event loop in a background thread.

    >>> with TestServer(mode="openrouter", prices=(0.5, 2.5)) as server:
    ...     url = server.url  # "http://127.0.0.1:PORT"
    """

    __test__ = False  # not a pytest test class

    def __init__(self, config: ServerConfig | None = None, **overrides: Any) -> None:
        self.config = dataclasses.replace(config or ServerConfig(), **overrides)
        self.stats = ServerStats()
        self.url = ""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def start(self, timeout: float = 60.0) -> TestServer:
        if self._thread is not None:
            raise RuntimeError("the server is already started")
        self._thread = threading.Thread(target=self._run, name="draftgen-test-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the test server did not start within {timeout} s")
        if self._error is not None:
            self._thread.join()
            raise RuntimeError("the test server failed to start") from self._error
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # reported to start()
            self._error = e
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self.config, self.stats) as url:
            self.url = url
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just finished
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> TestServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
