"""A server that cannot be reached, said as what it is: the backend, its URL (redacted), why
(connection refused, connect timeout, DNS lookup failed, ...) and the error itself.

- `connection_reason` names a connection failure in a few words (None: the server answered,
  however badly); `never_connected` tells one where no byte reached the server (nothing was
  processed or billed, so the request may be sent again as if never sent).
- `check_reachable` opens one TCP connection to a backend's host at start, so that a wrong
  port or a server that is down is one line within seconds (`BackendUnreachable`), not a
  missing price or a probe's verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import urllib.parse
from collections.abc import Awaitable, Iterable

import aiohttp

from draftgen.errors import DraftgenError
from draftgen.redact import redact

_ERRNO_REASONS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.ECONNABORTED: "connection aborted",
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ETIMEDOUT: "connect timeout",
}


class BackendUnreachable(DraftgenError):
    """A backend's server could not be reached (the message names it, its URL, why, and the
    error)."""

    exit_code = 1


def connection_reason(e: BaseException) -> str | None:
    """What kind of connection failure `e` is, in a few words; None when it is none."""
    if isinstance(e, aiohttp.ClientConnectorDNSError | socket.gaierror):
        return "DNS lookup failed"
    if isinstance(e, aiohttp.ClientSSLError):
        return "TLS handshake failed"
    if isinstance(e, aiohttp.ClientConnectorError):
        return _os_reason(e.os_error) or "cannot connect"
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return "connect timeout"
    if isinstance(e, TimeoutError):  # a connection open but an answer late: no failure
        return None
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    if isinstance(e, aiohttp.ClientPayloadError):
        return "connection lost mid-answer"
    if isinstance(e, aiohttp.ClientConnectionError | ConnectionError):
        return _os_reason(e) or "connection failed"
    return None


def _os_reason(e: BaseException) -> str | None:
    if isinstance(e, socket.gaierror):
        return "DNS lookup failed"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, ConnectionResetError):
        return "connection reset"
    return _ERRNO_REASONS.get(e.errno) if isinstance(e, OSError) and e.errno else None


def never_connected(e: BaseException) -> bool:
    """No connection was made (refused, DNS, connect timeout, TLS): the server saw nothing."""
    return isinstance(e, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)


def unreachable_text(backend: str, url: str, reason: str, error: str) -> str:
    """"backend 'b': cannot reach URL: connection refused (the error)", redacted."""
    return redact(f"backend {backend!r}: cannot reach {url}: {reason} ({error})")


async def check_reachable(backend: str, url: str, timeout_s: float) -> None:
    """One TCP connection to `url`'s host and port, closed at once; BackendUnreachable when
    none opens within `timeout_s` (a connection refused or a name that does not resolve
    fails at once)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except TimeoutError:
        raise BackendUnreachable(unreachable_text(
            backend, url, "connect timeout",
            f"no connection to {host}:{port} within connect_timeout_s {timeout_s:g}s")) from None
    except OSError as e:
        reason = _os_reason(e) or "cannot connect"
        raise BackendUnreachable(unreachable_text(
            backend, url, reason, f"{host}:{port}: {e.strerror or e}")) from None
    writer.close()
    with contextlib.suppress(OSError):  # closed by the server as it opened: it was reached
        await writer.wait_closed()


async def all_reachable(checks: Iterable[Awaitable[None]]) -> None:
    """The checks (`check_reachable`) run together: one BackendUnreachable naming every
    backend that cannot be reached."""
    results = await asyncio.gather(*checks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, BackendUnreachable):
            raise result
    failed = [str(r) for r in results if isinstance(r, BackendUnreachable)]
    if failed:
        raise BackendUnreachable("; ".join(failed))
