"""An answer's logprob entries as a chat endpoint sent them: `LogprobTokens`, read by the chat
backends (`backends.chat_logprobs`), whose IDs `tokenize.logprobs` recovers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar, overload


@dataclass(slots=True)
class LogprobToken:
    """One sampled token as an endpoint's logprobs describe it."""

    token: str
    bytes: bytes | list[int] | None = None
    """The token's bytes: the wire's list of byte values, which the chat backends keep as
    `bytes` (a list per token kept the garbage collector busy)."""
    id: int | None = None
    """Present when the endpoint reports it (llama.cpp; vLLM `return_tokens_as_token_ids`)."""
    logprob: float | None = None


_T = TypeVar("_T")
EntryBytes = bytes | list[int] | None
"""An entry's bytes: the wire's list of byte values, or `bytes` made of it."""
_Column = list[_T] | Callable[[], list[_T]]
"""A column, or a function that reads it when it is first asked for."""


@dataclass(frozen=True, slots=True)
class SentBytes:
    """An answer's logprob entries' bytes as the endpoint sent them (`LogprobTokens`)."""

    joined: bytes
    """Every entry's byte values end to end."""
    spelled: bytes
    """Each entry's byte values as the JSON text sent, joined by "|": `b"[60,116]|[10]"`."""
    ids: list[int] | None = None
    """The vocabulary IDs whose bytes the entries' are, entry by entry, when the backend read
    them through the target's spellings (`tokenize.TokenSpellings`): each entry's bytes were
    then sent exactly as that token's compact spelling, and its reported `id`, if any, is it."""
    may_name_ids: bool = True
    """Whether an entry without `id` may spell its `token` as vLLM's `token_id:N`, which names
    its ID (False: every entry reports its `id`, or the answer's body does not hold that
    text)."""


class LogprobTokens(Sequence[LogprobToken]):
    """An answer's logprob entries as parallel columns, one list per field, instead of one
    object per token: an answer has hundreds of entries and thousands of answers are in flight,
    so per-token objects cost the event loop their construction and kept the garbage collector
    re-scanning them (docs/benchmarks.md, client throughput). Reads as a sequence of
    `LogprobToken`, each built when asked for.

    The `tokens`, `bytes` and `logprobs` columns can be given as functions that read them,
    called when the column is first asked for: the chat backends read the IDs as they decode an
    answer and leave the rest to whoever needs it (recovering IDs reads no logprob value, no
    token text when the entries report IDs or their bytes are tokens' spellings, and no entry's
    bytes when the `sent_bytes` they keep match the IDs). The `ids` column gives the length."""

    __slots__ = ("_bytes", "_logprobs", "_sent", "_tokens", "ids")

    def __init__(self, tokens: _Column[str] | None = None,
                 bytes: _Column[EntryBytes] | None = None,
                 ids: list[int | None] | None = None,
                 logprobs: _Column[float | None] | None = None, *,
                 sent: SentBytes | None = None) -> None:
        if ids is None:
            if callable(tokens):
                raise ValueError("LogprobTokens: a deferred tokens column needs the ids column")
            ids = [None] * len(tokens or ())
        self.ids = ids
        n = len(ids)
        self._tokens = tokens if tokens is not None else [""] * n
        self._bytes = bytes if bytes is not None else [None] * n
        self._logprobs = logprobs if logprobs is not None else [None] * n
        self._sent = sent
        if not all(len(c) == n for c in (self._tokens, self._bytes, self._logprobs)
                   if isinstance(c, list)):
            raise ValueError("LogprobTokens: columns of different lengths")

    @property
    def tokens(self) -> list[str]:
        if not isinstance(self._tokens, list):
            self._tokens = self._read(self._tokens)
        return self._tokens

    @tokens.setter
    def tokens(self, column: list[str]) -> None:
        self._tokens = column

    @property
    def bytes(self) -> list[EntryBytes]:
        """Each entry's bytes. Handing the column out drops `sent_bytes`: the caller may
        change it."""
        self._sent = None
        if not isinstance(self._bytes, list):
            self._bytes = self._read(self._bytes)
        return self._bytes

    @bytes.setter
    def bytes(self, column: list[EntryBytes]) -> None:
        self._bytes, self._sent = column, None

    @property
    def logprobs(self) -> list[float | None]:
        if not isinstance(self._logprobs, list):
            self._logprobs = self._read(self._logprobs)
        return self._logprobs

    @logprobs.setter
    def logprobs(self, column: list[float | None]) -> None:
        self._logprobs = column

    def _read(self, read: Callable[[], list[_T]]) -> list[_T]:
        column = read()
        if len(column) != len(self.ids):
            raise ValueError("LogprobTokens: columns of different lengths")
        return column

    def sent_bytes(self) -> SentBytes | None:
        """The entries' bytes as the endpoint sent them, when whoever made the columns kept
        them (the chat backends read every entry's bytes as one string, and build the column
        only when asked); None otherwise, and once the `bytes` column was handed out."""
        return self._sent

    @classmethod
    def of(cls, entries: Iterable[LogprobToken]) -> LogprobTokens:
        out = cls()
        for e in entries:
            out.append(e)
        return out

    def append(self, entry: LogprobToken) -> None:
        self.tokens.append(entry.token)
        self.bytes.append(entry.bytes)
        self.ids.append(entry.id)
        self.logprobs.append(entry.logprob)

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> LogprobToken: ...

    @overload
    def __getitem__(self, index: slice) -> LogprobTokens: ...

    def __getitem__(self, index: int | slice) -> LogprobToken | LogprobTokens:
        if isinstance(index, slice):
            return LogprobTokens(self.tokens[index], self.bytes[index], self.ids[index],
                                 self.logprobs[index])
        return LogprobToken(self.tokens[index], self.bytes[index], self.ids[index],
                            self.logprobs[index])

    def __iter__(self) -> Iterator[LogprobToken]:
        return map(LogprobToken, self.tokens, self.bytes, self.ids, self.logprobs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LogprobTokens):
            return (self.tokens, self.bytes, self.ids, self.logprobs) == (
                other.tokens, other.bytes, other.ids, other.logprobs)
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"LogprobTokens({list(self)!r})"
