"""Single flight per intent (``spec/KEYS.md`` §3.6 item 4): concurrent sends of one intent in one
client share one record lookup and one attempt sequence, and every caller gets the same result.

Plain bookkeeping: which caller runs, who waits, when a flight is over. The decisions (mint,
reuse, refuse; settle or keep pending) are core's.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict, Generic, Optional, Tuple, TypeVar

T = TypeVar("T")


class _Once(Generic[T]):
    """A value (or an exception) set once by one thread, awaited by others."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Optional[T] = None
        self._error: Optional[BaseException] = None

    def set(self, value: T) -> None:
        self._value = value
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def wait(self) -> T:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Flight:
    """One intent's in-flight sends (threads)."""

    def __init__(self) -> None:
        self.record: _Once[Any] = _Once()
        self.result: _Once[Any] = _Once()
        self.runner_claimed = False
        self.waiters = 0


class Flights:
    """The flights of one sync client, by intent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: Dict[str, Flight] = {}

    def join(self, intent: str) -> Tuple[Flight, bool]:
        """The intent's flight, and True for the caller that must resolve its record."""
        with self._lock:
            flight = self._flights.get(intent)
            created = flight is None
            if flight is None:
                flight = self._flights[intent] = Flight()
            flight.waiters += 1
            return flight, created

    def claim_run(self, flight: Flight) -> bool:
        """True for the one caller that runs the flight's attempts."""
        with self._lock:
            if flight.runner_claimed:
                return False
            flight.runner_claimed = True
            return True

    def leave(self, intent: str, flight: Flight) -> None:
        with self._lock:
            flight.waiters -= 1
            if flight.waiters == 0 and self._flights.get(intent) is flight:
                del self._flights[intent]


class AsyncFlight:
    """One intent's in-flight sends (asyncio)."""

    def __init__(self) -> None:
        self.record: Optional["asyncio.Task[Any]"] = None
        self.result: Optional["asyncio.Task[Any]"] = None
        self.waiters = 0


class AsyncFlights:
    """The flights of one asyncio client, by intent. A caller that is cancelled stops waiting;
    when every caller has gone, the flight's tasks are cancelled (the key stays pending)."""

    def __init__(self) -> None:
        self._flights: Dict[str, AsyncFlight] = {}

    def join(self, intent: str) -> AsyncFlight:
        flight = self._flights.get(intent)
        if flight is None:
            flight = self._flights[intent] = AsyncFlight()
        flight.waiters += 1
        return flight

    def leave(self, intent: str, flight: AsyncFlight) -> None:
        flight.waiters -= 1
        if flight.waiters:
            return
        if self._flights.get(intent) is flight:
            del self._flights[intent]
        for task in (flight.record, flight.result):
            if task is not None and not task.done():
                task.cancel()
