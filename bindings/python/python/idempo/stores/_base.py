"""Types shared by every store: the stored record, primitive results, and the store protocols.

A store implements the eight atomic primitives of ``spec/STORAGE.md`` and nothing else: it makes
no protocol decision. Every time it uses comes from its own clock (the database's, Redis ``TIME``,
or the process clock for :class:`~idempo.stores.MemoryStore`), and ``claim``/``get`` return that
clock's ``now_ms`` so core decides with it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Generator,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from idempo._idempo import InvalidArgument, StoreUnavailable
from idempo._plan import drive, drive_async
from idempo._options import default

PURGE_BATCH: int = default("purge", "batch")
"""Records one ``purge_expired`` call deletes at most, by default (from core)."""

IN_PROGRESS = 1
"""Record state: claimed, the handler is (or may be) running under a lease."""
COMPLETED = 2
"""Record state: the handler finished and its response is stored."""
OUTCOME_UNKNOWN = 3
"""Record state: an attempt may have had its effect but never completed (terminal)."""

SCOPE_KEY_LEN = 32
TOKEN_LEN = 16
TABLE = "idempo_record"


@dataclass(frozen=True)
class StoredRecord:
    """One row of ``idempo_record``, exactly as stored (columns of the storage contract)."""

    scope_key: bytes
    fingerprint: str
    state: int
    token: bytes
    generation: int
    lease_until: Optional[int]
    expires_at: int
    response: Optional[bytes]


@dataclass(frozen=True)
class Claimed:
    """``claim`` inserted a new in-progress record; the caller owns it."""

    generation: int
    now_ms: int


@dataclass(frozen=True)
class Existing:
    """``claim`` found a live record and wrote nothing."""

    record: StoredRecord
    now_ms: int


@dataclass(frozen=True)
class Locked:
    """A transactional ``claim`` waited for the record's row lock past the lock timeout.

    The lock belongs to another request's uncommitted claim; nothing was written or read.
    Core answers it 409 ``in-flight`` with ``Retry-After`` (``spec/PROTOCOL.md`` §7.6).
    """

    now_ms: int
    locked: bool = True


ClaimResult = Union[Claimed, Existing, Locked]


@dataclass(frozen=True)
class StoreStats:
    """A store's figures for operations (``store.stats()``, ``spec/STORAGE.md`` §4.7): records by
    state, records past their expiry not purged yet, the age of the oldest of those (the purge
    lag), the size in bytes where the store can tell, and the store's clock."""

    in_progress: int
    completed: int
    outcome_unknown: int
    expired: int
    purge_lag_ms: Optional[int]
    """Age of the oldest expired record not purged yet; None when there is none."""
    size_bytes: Optional[int]
    """Table and indexes (PostgreSQL), database file (SQLite); None where not measurable."""
    now_ms: int

    @property
    def total(self) -> int:
        """All records."""
        return self.in_progress + self.completed + self.outcome_unknown

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> StoreStats:
        """From the row of the ``postgres_stats`` / ``sqlite_stats`` recipe."""
        return cls(
            in_progress=int(row[0]),
            completed=int(row[1]),
            outcome_unknown=int(row[2]),
            expired=int(row[3]),
            purge_lag_ms=None if row[4] is None else max(0, int(row[4])),
            size_bytes=None if row[5] is None else int(row[5]),
            now_ms=int(row[6]),
        )


@dataclass(frozen=True)
class PurgeCounts:
    """Records deleted by ``purge_expired``, per state."""

    in_progress: int = 0
    completed: int = 0
    outcome_unknown: int = 0

    @property
    def total(self) -> int:
        """All records deleted."""
        return self.in_progress + self.completed + self.outcome_unknown

    def __add__(self, other: PurgeCounts) -> PurgeCounts:
        return PurgeCounts(
            self.in_progress + other.in_progress,
            self.completed + other.completed,
            self.outcome_unknown + other.outcome_unknown,
        )

    @classmethod
    def from_states(cls, states: "list[int]") -> PurgeCounts:
        """Counts from the states of the deleted rows."""
        return cls(
            sum(1 for s in states if s == IN_PROGRESS),
            sum(1 for s in states if s == COMPLETED),
            sum(1 for s in states if s == OUTCOME_UNKNOWN),
        )


class Store(Protocol):
    """The synchronous storage contract (``spec/STORAGE.md``): each method is one atomic step."""

    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult: ...

    def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]: ...

    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]: ...

    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool: ...

    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool: ...

    def release(self, scope_key: bytes, token: bytes) -> bool: ...

    def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool: ...

    def purge_expired(self, batch: int = PURGE_BATCH) -> PurgeCounts: ...


class AsyncStore(Protocol):
    """The asyncio storage contract: the same primitives as :class:`Store`, awaitable."""

    async def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult: ...

    async def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]: ...

    async def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]: ...

    async def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool: ...

    async def complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> bool: ...

    async def release(self, scope_key: bytes, token: bytes) -> bool: ...

    async def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool: ...

    async def purge_expired(self, batch: int = PURGE_BATCH) -> PurgeCounts: ...


def _purge_batches(
    batch: int, max_batches: Optional[int]
) -> Generator[int, PurgeCounts, PurgeCounts]:
    """Asks for batches of ``batch`` until one comes back short (or ``max_batches``); the
    total."""
    total = PurgeCounts()
    done = 0
    while max_batches is None or done < max_batches:
        counts = yield batch
        total = total + counts
        done += 1
        if counts.total < batch:
            break
    return total


def purge_all(
    store: Store,
    batch: int = PURGE_BATCH,
    max_batches: Optional[int] = None,
    on_counts: Optional[Callable[[PurgeCounts], None]] = None,
) -> PurgeCounts:
    """Calls ``store.purge_expired(batch)`` until a batch comes back short (or ``max_batches``).

    Each batch is its own short transaction; run this from a periodic job (or
    :class:`Purger`). ``on_counts`` receives the total (metrics).
    """
    total = drive(_purge_batches(batch, max_batches), store.purge_expired)
    if on_counts is not None:
        on_counts(total)
    return total


async def purge_all_async(
    store: AsyncStore,
    batch: int = PURGE_BATCH,
    max_batches: Optional[int] = None,
    on_counts: Optional[Callable[[PurgeCounts], None]] = None,
) -> PurgeCounts:
    """Async form of :func:`purge_all`."""
    total = await drive_async(_purge_batches(batch, max_batches), store.purge_expired)
    if on_counts is not None:
        on_counts(total)
    return total


class Purger:
    """Runs :func:`purge_all` every ``interval_s`` seconds in a daemon thread.

    ::

        purger = Purger(store, interval_s=300, on_counts=lambda c: log.info("purged %d", c.total))
        purger.start()
        ...
        purger.stop()

    A failing purge (store down) is reported to ``on_error`` and retried at the next interval.
    """

    def __init__(
        self,
        store: Store,
        *,
        interval_s: float = 300.0,
        batch: int = PURGE_BATCH,
        max_batches: Optional[int] = 100,
        on_counts: Optional[Callable[[PurgeCounts], None]] = None,
        on_error: Optional[Callable[[BaseException], None]] = None,
    ) -> None:
        import threading

        if interval_s <= 0:
            raise InvalidArgument("interval_s must be positive")
        check_batch(batch)
        self.store = store
        self.interval_s = interval_s
        self.batch = batch
        self.max_batches = max_batches
        self.on_counts = on_counts
        self.on_error = on_error
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idempo-purger", daemon=True)

    def start(self) -> "Purger":
        """Starts the thread (the first purge runs at once)."""
        self._thread.start()
        return self

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops the thread after the current purge."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                purge_all(self.store, self.batch, self.max_batches, self.on_counts)
            except Exception as exc:  # noqa: BLE001 - reported, retried next interval
                if self.on_error is not None:
                    self.on_error(exc)
            self._stop.wait(self.interval_s)


def record_from_row(row: Sequence[Any]) -> StoredRecord:
    """A :class:`StoredRecord` from the 8 contract columns in order."""
    return StoredRecord(
        scope_key=bytes(row[0]),
        fingerprint=str(row[1]),
        state=int(row[2]),
        token=bytes(row[3]),
        generation=int(row[4]),
        lease_until=None if row[5] is None else int(row[5]),
        expires_at=int(row[6]),
        response=None if row[7] is None else bytes(row[7]),
    )


def record_or_none(scope_key: bytes, row: Sequence[Any]) -> Optional[StoredRecord]:
    """The record of a row shaped like the ``get`` recipes' (the 7 columns after ``scope_key``,
    all NULL when there is no record)."""
    if row[0] is None:
        return None
    return record_from_row((scope_key, *row[:7]))


def check_key(scope_key: bytes) -> bytes:
    """Validates a scope key (32 bytes, a core ScopeId)."""
    if not isinstance(scope_key, (bytes, bytearray)) or len(scope_key) != SCOPE_KEY_LEN:
        raise InvalidArgument(f"scope_key must be {SCOPE_KEY_LEN} bytes")
    return bytes(scope_key)


def check_token(token: bytes) -> bytes:
    """Validates a fencing token (16 random bytes)."""
    if not isinstance(token, (bytes, bytearray)) or len(token) != TOKEN_LEN:
        raise InvalidArgument(f"token must be {TOKEN_LEN} bytes")
    return bytes(token)


def check_ms(name: str, value: int) -> int:
    """Validates a duration in milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2**53:
        raise InvalidArgument(f"{name} must be a non-negative integer number of milliseconds")
    return value


def check_batch(batch: int) -> int:
    """Validates a purge batch size."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise InvalidArgument("batch must be a positive integer")
    return batch


def unavailable(message: str, cause: BaseException, retry_after: float = 1.0) -> StoreUnavailable:
    """A :class:`StoreUnavailable` with ``retry_after`` set, chained to its cause by the caller."""
    err = StoreUnavailable(f"{message}: {type(cause).__name__}: {cause}")
    err.retry_after = retry_after
    return err


F = TypeVar("F", bound=Callable[..., Any])


def fail_closed(errors: Tuple[Type[BaseException], ...], what: str) -> Callable[[F], F]:
    """Maps the driver's errors to :class:`StoreUnavailable` (store errors fail closed)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except errors as exc:
                raise unavailable(what, exc) from exc

        return inner  # type: ignore[return-value]

    return wrap


def fail_closed_async(errors: Tuple[Type[BaseException], ...], what: str) -> Callable[[F], F]:
    """Async form of :func:`fail_closed`."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        async def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except errors as exc:
                raise unavailable(what, exc) from exc

        return inner  # type: ignore[return-value]

    return wrap

