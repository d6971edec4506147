"""aiohttp responses the handlers share: a JSON body, a 400, an aborted connection, and a huge
answer written a megabyte at a time."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import orjson
from aiohttp import web

from draftgen.testing.fake_engine.faults import HUGE_MARK
from draftgen.testing.fake_engine.kinds import Json


def json_response(
    body: Json, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def bad_request(message: str) -> web.Response:
    return json_response({"error": {"code": 400, "message": message, "metadata": {}}}, 400)


def abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


_MB_OF_X = b"x" * (1 << 20)


def huge_pieces(data: bytes, mb: int) -> Iterator[bytes]:
    """`data` (JSON with `HUGE_MARK` as a string's value) with `mb` MB of "x" in place of the
    mark, a megabyte at a time: a gigabyte answer costs the server no gigabyte. (`/generate`
    answers have no mark: they are sent as they are.)"""
    if HUGE_MARK not in data:
        yield data
        return
    head, tail = data.split(HUGE_MARK)
    yield head
    for _ in range(mb):
        yield _MB_OF_X
    yield tail


async def write_in_pieces(request: web.Request, data: bytes, mb: int,
                          headers: Mapping[str, str], declared: bool = True
                          ) -> web.StreamResponse:
    """`huge_pieces` as a JSON body, a write each (the client may stop reading part way): of a
    declared length, else chunked."""
    response = web.StreamResponse(headers=headers)
    response.content_type = "application/json"
    if declared:
        response.content_length = sum(map(len, huge_pieces(data, mb)))
    else:
        response.enable_chunked_encoding()
    await response.prepare(request)
    for piece in huge_pieces(data, mb):
        await response.write(piece)
    await response.write_eof()
    return response
