"""Connection leasing: how a store gets a connection for one operation (a DSN's per-thread
connection, a pool's, or one shared connection under a lock), the watchdog that bounds a statement,
and when a connection is thrown away."""

from __future__ import annotations

import math
from abc import abstractmethod
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from idempo._idempo import InvalidArgument, StoreUnavailable
from idempo._options import default, renamed_seconds
from idempo.stores._base import check_ms
from idempo.stores._deadline import WATCHDOG, idle_socket_is_dead

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.postgres needs psycopg 3: pip install 'psycopg[binary]'") from exc
from idempo.stores.postgres._plans import _Plans


class _Lease:
    """A checked-out connection and how to give it back."""

    __slots__ = ("conn", "kind", "cm")

    def __init__(self, conn: Any, kind: str, cm: Any = None) -> None:
        self.conn = conn
        self.kind = kind
        self.cm = cm


def _dead(conn: Any) -> bool:
    """A connection that must not be used: closed, broken, or an idle socket with data pending."""
    if conn.closed or conn.broken:
        return True
    try:
        fd = conn.fileno()
    except psycopg.Error:
        return True
    return idle_socket_is_dead(fd)


def _timed_out(timeout: float) -> StoreUnavailable:
    err = StoreUnavailable(
        f"PostgreSQL did not answer within {timeout:g} s (connection discarded)"
    )
    err.retry_after = 1.0
    return err


def _positive(ms: int) -> float:
    """Milliseconds (already checked) as the seconds the drivers take; 0 is refused."""
    if ms <= 0:
        raise InvalidArgument("a timeout must be positive")
    return ms / 1000


def _connect_timeout(timeout: float, given_ms: Optional[int]) -> int:
    """libpq's ``connect_timeout``: whole seconds, anything below 2 counts as 2."""
    if given_ms is None:
        return max(2, math.ceil(timeout))
    if isinstance(given_ms, bool) or not isinstance(given_ms, int) or given_ms <= 0:
        raise InvalidArgument("connect_timeout_ms must be a positive whole number of milliseconds")
    return max(2, math.ceil(given_ms / 1000))


MAX_IDLE_DEDICATED = 32
"""Idle connections a DSN-configured store keeps for transactional requests."""


class _Watch:
    """Whether the deadline hit just as the operation finished (``late``)."""

    late = False


@contextmanager
def _watched(conn: Any, timeout: float) -> Iterator[_Watch]:
    """Arms the watchdog on ``conn`` for ``timeout`` seconds around the block: a driver error
    after the deadline becomes :class:`StoreUnavailable` (timed out)."""
    watch = _Watch()
    ticket = WATCHDOG.arm(conn.fileno(), timeout)
    try:
        yield watch
    except psycopg.Error as exc:
        if WATCHDOG.disarm(ticket):
            raise _timed_out(timeout) from exc
        raise
    except BaseException:
        WATCHDOG.disarm(ticket)
        raise
    watch.late = WATCHDOG.disarm(ticket)


def _discardable(exc: BaseException) -> bool:
    """After this failure the connection cannot be trusted (anything but a plain SQL error)."""
    return not isinstance(exc, psycopg.Error) or isinstance(exc, psycopg.OperationalError)


def _spoiled(exc: BaseException, conn: Any) -> bool:
    """The connection must not be reused after ``exc`` (untrusted, closed or broken)."""
    return _discardable(exc) or bool(conn.closed) or bool(conn.broken)


class _StoreBase(_Plans):
    """What :class:`PostgresStore` and :class:`AsyncPostgresStore` share: the constructor (the
    target and the deadlines); each adds its own connection handling (``_init_io``)."""

    _dsn: Optional[str]
    _pool: Any
    _single: Any
    _clock: Optional[Callable[[], int]]
    _single_type: type
    _wrong_target: str

    def __init__(
        self,
        conninfo_or_pool: Any,
        *,
        timeout_ms: Optional[int] = None,
        connect_timeout_ms: Optional[int] = None,
        lock_timeout_ms: Optional[int] = None,
        idle_in_transaction_timeout_ms: Optional[int] = None,
        purge_timeout_ms: Optional[int] = None,
        prepared_statements: Optional[bool] = None,
        clock: Optional[Callable[[], int]] = None,
        timeout: Optional[float] = None,
        connect_timeout: Optional[int] = None,
        lock_timeout: Optional[float] = None,
        idle_in_transaction_timeout: Optional[float] = None,
        purge_timeout: Optional[float] = None,
    ) -> None:
        """Durations in milliseconds, defaults from core (``spec/OPTIONS.md``); the former
        seconds-valued names (``timeout=2.0``) still work, with a :class:`DeprecationWarning`.
        ``clock`` replaces the database clock (conformance tests only)."""
        what = type(self).__name__
        self._clock = clock
        if prepared_statements is None:
            prepared_statements = bool(default("postgres_store", "prepared_statements"))
        if not isinstance(prepared_statements, bool):
            raise InvalidArgument("prepared_statements must be True or False")
        self.prepared_statements = prepared_statements
        self._dsn = None
        self._pool = None
        self._single = None
        if isinstance(conninfo_or_pool, str):
            self._dsn = conninfo_or_pool
        elif isinstance(conninfo_or_pool, self._single_type):
            self._single = conninfo_or_pool
        elif hasattr(conninfo_or_pool, "connection"):
            self._pool = conninfo_or_pool
        else:
            raise TypeError(self._wrong_target)

        def ms(name: str, given: Optional[int], old: str, seconds: Optional[float]) -> int:
            value = renamed_seconds(what, old, seconds, name, given)
            return check_ms(name, default("postgres_store", name) if value is None else value)

        self.timeout_ms = ms("timeout_ms", timeout_ms, "timeout", timeout)
        self.lock_timeout_ms = ms("lock_timeout_ms", lock_timeout_ms, "lock_timeout", lock_timeout)
        self.purge_timeout_ms = ms("purge_timeout_ms", purge_timeout_ms, "purge_timeout", purge_timeout)
        self.idle_in_transaction_timeout_ms = ms(
            "idle_in_transaction_timeout_ms", idle_in_transaction_timeout_ms,
            "idle_in_transaction_timeout", idle_in_transaction_timeout)
        if connect_timeout is not None:
            connect_ms = renamed_seconds(
                what, "connect_timeout", connect_timeout, "connect_timeout_ms", connect_timeout_ms)
        else:
            connect_ms = connect_timeout_ms
        self.timeout = _positive(self.timeout_ms)
        """Seconds one operation may take (``timeout_ms``)."""
        self.lock_timeout = _positive(self.lock_timeout_ms)
        self.purge_timeout = _positive(self.purge_timeout_ms)
        self.idle_in_transaction_timeout = _positive(self.idle_in_transaction_timeout_ms)
        self._connect_timeout = _connect_timeout(self.timeout, connect_ms)
        self._init_io()

    @abstractmethod
    def _init_io(self) -> None:
        """Sets up the connection handling (a pool, one connection or a DSN) of the store's kind."""
