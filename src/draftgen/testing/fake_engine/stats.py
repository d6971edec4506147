"""The server's counters, for tests: readable from any thread while the server runs."""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from draftgen.testing.fake_engine.kinds import Json


class ServerStats(Mapping[str, Any]):
    """Counters, readable from any thread as a mapping (each read takes a snapshot):
    `requests` (by endpoint), `responses` (by HTTP status, "reset" or "cancelled"), `faults`
    (by kind, plus "noncanonical"), `in_flight` and `max_in_flight` (chat and generate calls),
    `per_prompt` (by the last user message text), `billed_usd` (what the server charged, at
    its prices), `query_names` (requests by "ENDPOINT?NAME" for each query parameter they
    carried: names only, values are never stored), and `bodies` (the last received request
    bodies; headers are never stored)."""

    def __init__(self, max_bodies: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._max_bodies = max_bodies
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._requests: Counter[str] = Counter()
            self._responses: Counter[str] = Counter()
            self._faults: Counter[str] = Counter()
            self._per_prompt: Counter[str] = Counter()
            self._query_names: Counter[str] = Counter()
            self._bodies: deque[Any] = deque(maxlen=self._max_bodies)
            self._in_flight = 0
            self._max_in_flight = 0
            self._billed_usd = 0.0

    def begin(self, endpoint: str, counts_in_flight: bool, query_names: Iterable[str] = ()
              ) -> None:
        with self._lock:
            self._requests[endpoint] += 1
            self._query_names.update(f"{endpoint}?{name}" for name in set(query_names))
            if counts_in_flight:
                self._in_flight += 1
                self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def end(self, outcome: str, counts_in_flight: bool) -> None:
        with self._lock:
            self._responses[outcome] += 1
            if counts_in_flight:
                self._in_flight -= 1

    def count(self, counter: Literal["faults", "per_prompt"], key: str) -> None:
        with self._lock:
            (self._faults if counter == "faults" else self._per_prompt)[key] += 1

    def bill(self, usd: float) -> None:
        """What the server charged for one answer or billed error (its prices, not what it
        reports)."""
        with self._lock:
            self._billed_usd += usd

    def received(self, body: Any) -> None:
        with self._lock:
            self._bodies.append(body)

    def snapshot(self, bodies: bool = True) -> Json:
        with self._lock:
            snap: Json = {
                "requests": dict(self._requests),
                "responses": dict(self._responses),
                "faults": dict(self._faults),
                "in_flight": self._in_flight,
                "max_in_flight": self._max_in_flight,
                "per_prompt": dict(self._per_prompt),
                "query_names": dict(self._query_names),
                "billed_usd": self._billed_usd,
            }
            if bodies:
                snap["bodies"] = list(self._bodies)
            return snap

    @property
    def bodies(self) -> list[Any]:
        with self._lock:
            return list(self._bodies)

    def __getitem__(self, key: str) -> Any:
        return self.snapshot(bodies=key == "bodies")[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.snapshot(bodies=True))

    def __len__(self) -> int:
        return len(self.snapshot(bodies=True))
