"""An HTTP session that answers in process, for backend tests, as httpx's `MockTransport`
does: `backend.use_session(FakeSession(handler))`, where `handler` is given each request and
returns its answer. It offers what the backends read of aiohttp's session and responses
(status, headers, content type and length, the body whole, in pieces or by line), no more: a
backend that reads something else fails its test here instead of on a real server. End-to-end
tests keep the loopback engine (`fake_engine`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy


@dataclass(frozen=True)
class FakeRequest:
    method: str
    url: str
    body: Any
    """The JSON body, parsed (None for a request without one)."""


@dataclass
class FakeAnswer:
    status: int = 200
    body: bytes | Sequence[bytes] = b""
    """The body, or the pieces it arrives in (a stream's reads)."""
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, data: Any, status: int = 200, **headers: str) -> FakeAnswer:
        return cls(status, orjson.dumps(data), {"Content-Type": "application/json", **headers})

    @classmethod
    def sse(cls, events: Sequence[Any], done: bool = True, **headers: str) -> FakeAnswer:
        """A stream of `data:` events (JSON objects), one read each, then `[DONE]`."""
        lines = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]
        return cls(200, [*lines, *([b"data: [DONE]\n\n"] if done else [])],
                   {"Content-Type": "text/event-stream", **headers})


class _Content:
    def __init__(self, pieces: Sequence[bytes]) -> None:
        self._pieces = pieces

    async def iter_any(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece

    async def __aiter__(self) -> AsyncIterator[bytes]:  # by line, as aiohttp's StreamReader
        for line in b"".join(self._pieces).splitlines(keepends=True):
            yield line


class _Response:
    def __init__(self, answer: FakeAnswer) -> None:
        pieces = [answer.body] if isinstance(answer.body, bytes) else list(answer.body)
        self.status = answer.status
        self.headers = CIMultiDictProxy(CIMultiDict(answer.headers))
        self.content_type = self.headers.get("Content-Type", "application/octet-stream"
                                             ).split(";")[0].strip()
        self.content_length = (sum(map(len, pieces))
                               if isinstance(answer.body, bytes) else None)
        self.content = _Content(pieces)

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.content.iter_any()])


class FakeSession:
    """What `Backend` uses of `aiohttp.ClientSession`; `requests` keeps what was sent."""

    def __init__(self, handler: Callable[[FakeRequest], FakeAnswer]) -> None:
        self.handler = handler
        self.requests: list[FakeRequest] = []
        self.closed = False

    @contextlib.asynccontextmanager
    async def _request(self, method: str, url: str, data: bytes | None) -> AsyncIterator[Any]:
        request = FakeRequest(method, url, orjson.loads(data) if data else None)
        self.requests.append(request)
        yield _Response(self.handler(request))

    def post(self, url: str, *, data: bytes | None = None, **_: Any
             ) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._request("POST", url, data)

    def get(self, url: str, **_: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._request("GET", url, None)

    async def close(self) -> None:
        self.closed = True
