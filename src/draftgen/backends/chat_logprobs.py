"""The logprob entries of a chat answer, as columns (`LogprobTokens`): read from a parsed
choice (`logprobs_of`: the generic reading, and streams) or from the `wire` types
(`decoded_logprobs`: the entries' bytes checked for the whole answer at once, the other columns
read from the body only when asked for)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import msgspec
import orjson

from draftgen.backends import wire
from draftgen.tokenize import TokenSpellings
from draftgen.tokenize.logprob_tokens import LogprobTokens, SentBytes
from draftgen.types import BackendError


def logprobs_of(choice: Mapping[str, Any], into: LogprobTokens | None = None
                 ) -> LogprobTokens | None:
    """The choice's `logprobs.content` entries, as columns, appended to `into` when given (a
    stream's entries come a few per chunk); None when the choice has none. Entries that are
    not objects are left out.

    Runs on the event loop for every answer: one pass, no object per entry, `top_logprobs`
    not read. Each entry's byte list becomes `bytes`: byte lists kept alive until the answer
    was stored were most of what the garbage collector scanned."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
        return None
    out = into if into is not None else LogprobTokens()
    tokens, byte_values, ids, logprobs = out.tokens, out.bytes, out.ids, out.logprobs
    content = lp["content"]
    for e in content:
        if isinstance(e, dict):
            tokens.append(e.get("token", ""))
            b = e.get("bytes")
            if b is not None:
                if not isinstance(b, list):
                    raise _bad_bytes(content, e)
                try:
                    b = bytes(b)
                except (TypeError, ValueError):
                    raise _bad_bytes(content, e) from None
            byte_values.append(b)
            ids.append(e.get("id"))
            logprobs.append(e.get("logprob"))
    return out


def decoded_logprobs(logprobs: wire.Logprobs | None, body: bytes,
                      spellings: TokenSpellings | None = None) -> LogprobTokens | None:
    """`logprobs_of` a decoded choice's `logprobs` (`body` is the answer they come from): the
    IDs a column at a time (a comprehension reads a struct's fields faster than
    `operator.attrgetter`), the entries' bytes checked for the whole answer at once, and every
    other column left to be read when asked for: recovering IDs reads none of them when the
    entries' bytes, end to end, are the IDs' own.

    The bytes are checked by the target's `spellings` when given: when each entry's are sent
    exactly as a token's compact spelling (the reported ID's, if any), they are that token's
    and nothing is parsed (`SentBytes.ids`). Otherwise they are parsed (`_joined_bytes`).
    ValueError when an entry's `bytes` is neither a list of byte values nor null."""
    if logprobs is None or logprobs.content is None:
        return None
    entries = logprobs.content
    spelled = [e.bytes for e in entries]
    text = b"|".join(spelled)
    ids = [e.id for e in entries]
    n = len(entries)
    may_name_ids = None in ids and b"token_id:" in body
    found = spellings.spelled_ids(text, ids) if spellings is not None else None
    if found is not None and spellings is not None:
        joined: bytes | None = spellings.joined(found)
    else:
        joined = _joined_bytes(text)
    return LogprobTokens(
        tokens=partial(_logprob_tokens, body, n),
        bytes=_checked_bytes(spelled) if joined is None else partial(_listed_bytes, text),
        ids=ids,
        logprobs=partial(_logprob_values, body, n),
        sent=None if joined is None else SentBytes(joined, text, found, may_name_ids),
    )


_NUMBER_LISTS = b"0123456789,[]| \t\r\n"
"""What `_joined_bytes` lets through: no letters, so no true (a byte value 1 to `bytes()`)."""


def _joined_bytes(text: bytes) -> bytes | None:
    """Every entry's byte values end to end, when each entry is a list of byte values (not
    null, not absent); else None. `text`: the entries' `bytes`, the JSON text sent (which
    msgspec has checked), joined by "|". Checked and read for the whole answer in a few C
    calls: about a third of the CPU of a tuple of ints and a `bytes` per entry.

    Empty lists dropped, then each "]|[" made a comma, the text is one list of numbers when
    every entry is a list of numbers; a "|" left over, a nested list or a number alone fails
    below, and `bytes()` checks the numbers."""
    if (text.translate(None, _NUMBER_LISTS) or not text or b"||" in text
            or text.startswith(b"|") or text.endswith(b"|")):  # an entry without bytes
        return None
    if b"[]" in text:  # "[]" is a whole entry (it ends it; JSON): drop it and its "|"
        text = (text + b"|").replace(b"[]|", b"")[:-1]
        if not text:
            return b""
    try:
        values = orjson.loads(text.replace(b"]|[", b","))
        return bytes(values) if isinstance(values, list) else None  # bytes(5): 5 zero bytes
    except (TypeError, ValueError):  # orjson.JSONDecodeError is a ValueError
        return None


def _listed_bytes(text: bytes) -> list[bytes | list[int] | None]:
    """The `bytes` column of entries that `_joined_bytes` read (so none can fail here)."""
    return list(map(bytes, orjson.loads(b"[" + text.replace(b"|", b",") + b"]")))


_BYTE_LISTS = msgspec.json.Decoder(list[tuple[int, ...] | None])


def _checked_bytes(spelled: Sequence[msgspec.Raw]) -> list[bytes | list[int] | None]:
    """The `bytes` column of entries that `_joined_bytes` did not read: some are absent or
    null (None), or not lists of byte values: ValueError then (msgspec's errors are
    ValueErrors; booleans are not integers here, as in the typed decoding before)."""
    values = _BYTE_LISTS.decode(b"[" + b",".join([s or b"null" for s in spelled]) + b"]")
    return [None if v is None else bytes(v) for v in values]


def _logprob_values(body: bytes, count: int) -> list[Any]:
    """The `logprobs` column of an answer that `answer_from_body` decoded (so its `count`
    entries are objects), read as the generic reading reads it: nothing the IDs are recovered
    from needs the values, so they are not decoded with the answer.

    Not decoding them lets through one body that the generic reading refuses: a value beyond
    float range (`-1e400`; orjson refuses the whole body, msgspec skips a field it does not
    read without checking it). Its values read as None: what they hold cannot be said."""
    return _entry_fields(body, count, "logprob", None)


def _logprob_tokens(body: bytes, count: int) -> list[Any]:
    """The `tokens` column, read like `_logprob_values` (as "" from a body orjson refuses)."""
    return _entry_fields(body, count, "token", "")


def _entry_fields(body: bytes, count: int, key: str, default: Any) -> list[Any]:
    """Each logprob entry's `key` (`default` where absent), as the generic reading reads it;
    all `default` when orjson refuses the body."""
    try:
        content = orjson.loads(body)["choices"][0]["logprobs"]["content"]
    except orjson.JSONDecodeError:
        return [default] * count
    return [e.get(key, default) for e in content]


def _bad_bytes(content: list[Any], entry: Any) -> BackendError:
    index = next(i for i, e in enumerate(content) if e is entry)  # only on this error's path
    return BackendError("bad_response", f"logprobs.content[{index}].bytes is not a list of byte "
                        "values", retryable=True)
