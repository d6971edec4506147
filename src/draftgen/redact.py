"""Secrets never shown: the one helper for every place that stores or shows a body, a header
or a URL (failures.jsonl, logs, stderr, run.json, status and report output).

Four things are redacted wherever they appear in a text:

- every value registered with `keep_secret` (the API keys read from the environment, the
  values of configured headers named like credentials, a URL's password and query values):
  a server that echoes the request's `Authorization` header in an error body gets the key
  shown as `***`;
- a URL's credentials (`https://user:KEY@host/...` -> `https://***@host/...`);
- a URL's query values, but for the parameters of SAFE_QUERY_NAMES (`.../v1?key=KEY` ->
  `.../v1?key=***`; an absolute path's query too: `GET /v1/models?key=***`);
- the credentials after `Bearer ` or `Basic ` (a key not registered here, or a URL's user and
  password as HTTP basic auth sends them, still look like one there).
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"
MIN_SECRET_CHARS = 6
"""Shorter values are not registered: replacing "abc" everywhere would garble the text and
protect nothing (a key that short is guessed anyway)."""

_SECRETS: set[str] = set()
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"<>]+@")
SAFE_QUERY_NAMES = frozenset({"api-version", "api_version", "version", "id"})
"""Query parameters whose values are shown: a version, a record's ID. Every other one's value
is a credential as far as draftgen knows (gateways take keys as `?key=`, `?token=`, signed URLs
carry `?sig=`, and a name says little), so it is redacted wherever a URL is shown or stored."""
_URL_QUERY = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s'\"<>?#]*|(?<![\w/.])/[^\s'\"<>?#]*)"
                        r"\?([^\s'\"<>#]*[^\s'\"<>#:,.;!)\]])")
"""A URL (or an absolute path, as a request line shows it) and its query string (not the
punctuation after it: "GET URL: HTTP 404")."""
_AUTH_SCHEME = re.compile(r"\b((?i:bearer)\s+)[^\s'\",;}\]\\]{6,}"
                          r"|\b(Basic\s+)(?=[A-Za-z0-9+/]\S*[0-9+/=A-Z])[A-Za-z0-9+/]{8,}=*")
"""An Authorization header's credentials: a bearer token, or base64 after `Basic` (with a
digit, a capital after the first letter, or +/=: "Basic understanding" is no key)."""


def keep_secret(value: str | None) -> None:
    """`value` is redacted from every text `redact` sees from now on (this process)."""
    if value and len(value) >= MIN_SECRET_CHARS:
        _SECRETS.add(value)
        quoted = urllib.parse.quote(value, safe="")
        if quoted != value:  # as it appears inside a URL
            _SECRETS.add(quoted)


def keep_secrets(values: Iterable[str | None]) -> None:
    for value in values:
        keep_secret(value)


_CREDENTIAL_HEADER = re.compile(r"(?i)auth|key|token|secret|cookie|passw|signature|session")
"""Header names whose values are credentials. Others (`X-Title`, `HTTP-Referer`) are not
registered: their values (an app's name) are words that logs and messages may hold."""


def keep_header_secrets(headers: Mapping[str, str]) -> None:
    """The values of the headers named like credentials."""
    keep_secrets(v for k, v in headers.items() if _CREDENTIAL_HEADER.search(k))


def keep_url_secrets(url: str | None) -> None:
    """The password (and user name) of a URL with credentials, and its query values (but
    SAFE_QUERY_NAMES'), as written and decoded."""
    if not url:
        return
    parts = urllib.parse.urlsplit(url)
    keep_secrets([parts.password, parts.username])
    if parts.password:
        keep_secret(urllib.parse.unquote(parts.password))
    for piece in parts.query.split("&"):
        name, _, value = piece.partition("=")
        if not _safe_query_name(name):
            keep_secrets([value or name, urllib.parse.unquote_plus(value or name)])


def _safe_query_name(name: str) -> bool:
    return urllib.parse.unquote_plus(name).strip().lower() in SAFE_QUERY_NAMES


def _redact_query(query: str) -> str:
    """`a=1&key=K` -> `a=***&key=***`: each value but SAFE_QUERY_NAMES' (a bare `?K` too)."""
    pieces = []
    for piece in query.split("&"):
        name, eq, _ = piece.partition("=")
        if _safe_query_name(name) or not piece:
            pieces.append(piece)
        else:
            pieces.append(f"{name}={REDACTED}" if eq else REDACTED)
    return "&".join(pieces)


def redact(text: str) -> str:
    """`text` with every registered secret, URL credential, URL query value (but
    SAFE_QUERY_NAMES') and bearer or basic credential as `***`."""
    if not text:
        return text
    text = _URL_CREDENTIALS.sub(r"\1" + REDACTED + "@", text)
    text = _URL_QUERY.sub(lambda m: f"{m[1]}?{_redact_query(m[2])}", text)
    text = _AUTH_SCHEME.sub(lambda m: (m[1] or m[2]) + REDACTED, text)
    for secret in sorted((s for s in _SECRETS if s in text), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_value(value: Any) -> Any:
    """`redact` applied to every string inside a JSON-like value (dicts, lists), keys too."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_value(k): redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """Redacts each record's message (arguments merged in) and its exception text before a
    handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            if redact(str(exc)) != str(exc):
                # The trace would print the exception's text: show it redacted instead.
                record.msg = f"{record.msg}: {type(exc).__name__}: {redact(str(exc))}"
                record.args = None
                record.exc_info = None
                record.exc_text = None
        return True
