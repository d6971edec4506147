"""Pooled connections: reused while busy, never after an idle spell the engine may be ending.

llama.cpp's server and uvicorn close an idle connection after 5 s. A client that reuses one at
that moment gets "Can not write request body" (seen in CI against llama-server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from draftgen.backends import base, make_backend
from draftgen.config import ModelConfig, SamplingConfig
from draftgen.config.backends import parse_backend

MODEL = ModelConfig(name="m", format="chatml", tokenizer="t.json")
SAMPLING = SamplingConfig(max_tokens=8)


async def _peer_port(request: web.Request) -> web.Response:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return web.json_response({"port": peer[1] if peer else None})


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    app = web.Application()
    app.router.add_post("/port", _peer_port)
    async with TestServer(app, host="127.0.0.1") as srv:
        yield srv


async def _ports(server: TestServer, pause_s: float, type_: str = "openai"
                 ) -> tuple[int, int, int]:
    backend = make_backend(
        parse_backend({"name": "b", "type": type_, "url": str(server.make_url(""))}),
        MODEL, SAMPLING)
    await backend.start()
    try:
        url = str(server.make_url("/port"))
        first = (await backend.post_json(url, {}))[0]["port"]
        second = (await backend.post_json(url, {}))[0]["port"]
        await asyncio.sleep(pause_s)
        third = (await backend.post_json(url, {}))[0]["port"]
    finally:
        await backend.close()
    return first, second, third


def test_idle_cap_is_under_the_engines_idle_close() -> None:
    assert base.IDLE_REUSE_S <= base.ENGINE_IDLE_CLOSE_S - 1.0


async def test_busy_connection_reused_idle_one_replaced(
    server: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "IDLE_REUSE_S", 0.3)
    first, second, third = await _ports(server, pause_s=0.6)
    assert first == second, "a connection used back to back must be reused"
    assert third != second, "a connection idle past IDLE_REUSE_S must not be reused"


async def test_short_pause_keeps_the_connection(
    server: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "IDLE_REUSE_S", 2.0)
    first, _, third = await _ports(server, pause_s=0.2)
    assert third == first


async def test_hosted_api_keeps_idle_connections_longer(
    server: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "IDLE_REUSE_S", 0.3)
    monkeypatch.setattr(base, "HOSTED_IDLE_REUSE_S", 5.0)
    first, _, third = await _ports(server, pause_s=0.6, type_="openrouter")
    assert third == first
