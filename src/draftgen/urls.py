"""A backend's base URL and the endpoints under it. A path goes onto the URL's path, never onto
the end of the whole text: the base URL's query string (`?key=...` as some gateways take their
key, Azure's `?api-version=...`) stays a query string, and is sent with every request."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping


def url_path(url: str) -> str:
    """The URL's path ("" for a bare host)."""
    return urllib.parse.urlsplit(url).path


def with_path(url: str, path: str) -> str:
    """`url` with its path replaced: scheme, credentials, host, port and query kept."""
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(path=path))


def join_url(base: str, path: str, query: Mapping[str, str] | None = None) -> str:
    """`path` ("/models") appended to `base`'s path, `base`'s query kept, `query` added after
    it."""
    parts = urllib.parse.urlsplit(base)
    params = parts.query
    if query:
        added = urllib.parse.urlencode(query)
        params = f"{params}&{added}" if params else added
    return urllib.parse.urlunsplit(
        parts._replace(path=parts.path.rstrip("/") + path, query=params))


def without_path_suffix(url: str, suffix: str) -> str:
    """`url` with `suffix` ("/v1") taken off the end of its path (a trailing / first)."""
    return with_path(url, url_path(url).rstrip("/").removesuffix(suffix))


def strip_trailing_slash(url: str) -> str:
    """`url` without a trailing / on its path; the query and fragment as written."""
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=len(url))
    return url[:cut].rstrip("/") + url[cut:]
