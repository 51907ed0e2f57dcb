"""Transactional sessions (``Config(transactional=True)``): one request's claim, handler writes and
completion in one PostgreSQL transaction on a dedicated connection."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, TypeVar

from idempo._idempo import StoreUnavailable
from idempo.stores._primitives import AsyncPrimitives, Primitives
from idempo.stores._tx import SessionEnds, Transaction, no_open_transaction
from idempo.stores._base import (
    PURGE_BATCH,
    ClaimResult,
    PurgeCounts,
    fail_closed,
    fail_closed_async,
    unavailable,
)
from idempo.stores.postgres._plans import (
    SQL_NOW,
    _Op,
    _Plans,
    _bind,
    _claim,
    _errors,
    _execute,
    _execute_async,
)
from idempo.stores.postgres._lease import _Lease, _discardable

if TYPE_CHECKING:
    from idempo.stores.postgres._stores import AsyncPostgresStore, PostgresStore


T = TypeVar("T")


def _tx_setup(store: Any, conn: Any) -> str:
    setup = (
        f"SET LOCAL lock_timeout = '{math.ceil(store.lock_timeout * 1000)}ms'; "
        "SET LOCAL idle_in_transaction_session_timeout = "
        f"'{math.ceil(store.idle_in_transaction_timeout * 1000)}ms'"
    )
    # A connection outside autocommit opens its transaction implicitly on the first statement.
    return "BEGIN; " + setup if conn.autocommit else setup


class _Session:
    """State and deadlines the sync and async transactional sessions share."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.transaction: Optional[Transaction] = None
        self.committed = False
        """True once this session's transaction committed (the handler's writes are durable)."""
        self._lease: Optional[_Lease] = None

    @property
    def open(self) -> bool:
        """True while the transaction is open."""
        return self._lease is not None

    def _timeout(self, op: _Op) -> float:
        """A claim may wait ``lock_timeout`` for a duplicate's row lock on top of ``timeout``."""
        extra = self.store.lock_timeout if op.wait == "lock" else 0.0
        return float(self.store.timeout + extra)

    def _lock_wait_ms(self) -> int:
        return math.ceil(self.store.lock_timeout * 1000)

    def _connection_lost(self) -> bool:
        """The open transaction's connection is closed or broken (the server went away, e.g.
        during the handler's own statement): the server rolled it back, and ``release`` reports
        that as a store failure (core answers 503, PROTOCOL §7.6), not as a rollback."""
        lease = self._lease
        return lease is not None and bool(lease.conn.closed or lease.conn.broken)


def _lost(what: str) -> StoreUnavailable:
    return unavailable(
        f"{what} release failed",
        ConnectionError("the connection was lost; the server rolled the transaction back"),
    )


class PostgresTransaction(_Session, SessionEnds, _Plans, Primitives):
    """One request's transactional session on a :class:`PostgresStore` (``store.transaction()``).

    The primitives core asks for run on one dedicated connection inside one transaction:
    ``claim`` opens it (``BEGIN``, ``SET LOCAL lock_timeout``, ``SET LOCAL
    idle_in_transaction_session_timeout``), the later primitives (``complete`` included) write
    inside it, :meth:`commit` runs ``COMMIT`` when core's flow asks for it (``spec/PROTOCOL.md``
    §7.6) and ``release`` is ``ROLLBACK``. A claim that waits on a duplicate's row lock longer
    than ``lock_timeout`` (SQLSTATE 55P03) is reported as an in-flight record (409). The host
    calls :meth:`close` in every case (rolling back whatever is still open).
    """

    store: PostgresStore

    def release(self, scope_key: bytes, token: bytes) -> bool:
        """``ROLLBACK`` (:meth:`SessionEnds.release`); a lost connection raises
        :class:`~idempo.StoreUnavailable` after giving it back."""
        lost = self._connection_lost()
        released = SessionEnds.release(self, scope_key, token)
        if lost:
            raise _lost(self._what)
        return released

    def _begin(self) -> None:
        lease = self.store._acquire(dedicated=True)
        self._lease = lease
        self._call(lambda c: c.execute(_tx_setup(self.store, c)), self.store.timeout)
        self.transaction = Transaction(lease.conn, self.store)

    def _call(self, fn: Callable[[Any], T], timeout: float) -> T:
        lease = self._lease
        assert lease is not None
        try:
            return self.store._guarded(lease, fn, timeout)
        except BaseException as exc:
            self._end(commit=False, discard=_discardable(exc))
            raise

    def _end(self, *, commit: bool, discard: bool = False) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        conn = lease.conn
        try:
            if commit:
                self.store._guarded(lease, lambda c: c.commit(), self.store.timeout)
                self.committed = True
            elif not discard and not conn.closed and not conn.broken:
                self.store._guarded(lease, lambda c: c.rollback(), self.store.timeout)
        except BaseException:
            discard = True
            raise
        finally:
            self.store._release(lease, None, discard or conn.closed or conn.broken)

    def _op(self, op: _Op) -> Any:
        """Inside the open transaction; without one only the clock read of a claim that found
        the row locked runs (on the store), anything else fails closed."""
        if self._lease is None:
            if op.sql != SQL_NOW:
                raise no_open_transaction(self._what)
            return self.store._op(op)
        params = _bind(op, self.store._clock)
        return self._call(lambda c: _execute(c, op, params, False, self.store.prepared_statements), self._timeout(op))

    @fail_closed(_errors, "PostgreSQL claim failed")
    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """``BEGIN`` (first call), then primitive 1 inside the transaction."""
        plan = _claim(scope_key, fingerprint, token, lease_ms, ttl_ms, self._lock_wait_ms())
        if self._lease is None:
            self._begin()
        return self._drive("claim", plan)


class AsyncPostgresTransaction(_Session, _Plans, AsyncPrimitives):
    """The asyncio form of :class:`PostgresTransaction` (``AsyncPostgresStore.transaction()``)."""

    store: AsyncPostgresStore

    async def _begin(self) -> None:
        lease = await self.store._acquire(dedicated=True)
        self._lease = lease
        await self._call(lambda c: c.execute(_tx_setup(self.store, c)), self.store.timeout)
        self.transaction = Transaction(lease.conn, self.store)

    async def _call(self, fn: Callable[[Any], Awaitable[T]], timeout: float) -> T:
        lease = self._lease
        assert lease is not None
        try:
            return await self.store._guarded(lease, fn, timeout)
        except BaseException as exc:
            await self._end(commit=False, discard=_discardable(exc))
            raise

    async def _end(self, *, commit: bool, discard: bool = False) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        conn = lease.conn
        try:
            if commit:
                await self.store._guarded(lease, lambda c: c.commit(), self.store.timeout)
                self.committed = True
            elif not discard and not conn.closed and not conn.broken:
                await self.store._guarded(lease, lambda c: c.rollback(), self.store.timeout)
        except BaseException:
            discard = True
            raise
        finally:
            await self.store._release(lease, None, discard or conn.closed or conn.broken)

    async def _op(self, op: _Op) -> Any:
        """Inside the open transaction; without one only the clock read of a claim that found
        the row locked runs (on the store), anything else fails closed."""
        if self._lease is None:
            if op.sql != SQL_NOW:
                raise no_open_transaction(self._what)
            return await self.store._op(op)
        params = _bind(op, self.store._clock)
        return await self._call(
            lambda c: _execute_async(c, op, params, False, self.store.prepared_statements),
            self._timeout(op),
        )

    @fail_closed_async(_errors, "PostgreSQL claim failed")
    async def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """``BEGIN`` (first call), then primitive 1 inside the transaction."""
        plan = _claim(scope_key, fingerprint, token, lease_ms, ttl_ms, self._lock_wait_ms())
        if self._lease is None:
            await self._begin()
        return await self._drive("claim", plan)

    @fail_closed_async(_errors, "PostgreSQL release failed")
    async def release(self, scope_key: bytes, token: bytes) -> bool:
        """``ROLLBACK``: the claim and the handler's writes vanish together. Without an open
        transaction there is nothing to roll back (False); nothing is deleted outside one. A lost
        connection raises :class:`~idempo.StoreUnavailable` (after giving it back)."""
        if self._lease is None:
            return False
        lost = self._connection_lost()
        await self._end(commit=False)
        if lost:
            raise _lost(self._what)
        return True

    @fail_closed_async(_errors, "PostgreSQL commit failed")
    async def commit(self) -> None:
        """``COMMIT`` (core's ``commit``); a failure, or no open transaction, fails closed."""
        if self._lease is None:
            raise no_open_transaction(self._what)
        await self._end(commit=True)

    async def close(self) -> None:
        """Rolls back what is still open and gives the connection back."""
        await self._end(commit=False)

    async def purge_expired(self, batch: int = PURGE_BATCH) -> PurgeCounts:
        """Primitive 8 on the store itself (a background batch, never part of a request)."""
        return await self.store.purge_expired(batch)
