"""The stores: :class:`PostgresStore` (blocking) and :class:`AsyncPostgresStore` (asyncio)."""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, List, Optional, TypeVar

from idempo.stores._primitives import AsyncPrimitives, Primitives
from idempo.stores._tx import TransactionalUnsupported
from idempo.stores._base import StoreStats, fail_closed, fail_closed_async, unavailable

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.postgres needs psycopg 3: pip install 'psycopg[binary]'") from exc
from psycopg.pq import TransactionStatus

from idempo.stores.postgres._plans import (
    CompletedRow,
    POOL_ATTEMPTS,
    SCHEMA_LOCK,
    SCHEMA_STATEMENTS,
    _Op,
    _bind,
    _complete_returning,
    _errors,
    _execute,
    _execute_async,
    _stats,
)
from idempo.stores.postgres._lease import (
    MAX_IDLE_DEDICATED,
    _Lease,
    _StoreBase,
    _dead,
    _spoiled,
    _timed_out,
    _watched,
)
from idempo.stores.postgres._sessions import AsyncPostgresTransaction, PostgresTransaction


T = TypeVar("T")


class PostgresStore(_StoreBase, Primitives):
    """The storage contract on PostgreSQL (psycopg 3, sync).

    Every operation has a client-side deadline of ``timeout_ms`` (default 2000): past it the
    socket is shut down, the connection discarded, and :class:`~idempo.StoreUnavailable` raised
    (the middleware answers 503 with ``Retry-After``; the handler never runs). Opening a
    connection is bounded by ``connect_timeout_ms`` (libpq counts whole seconds, at least 2;
    default: ``timeout_ms``). Defaults come from core (``spec/OPTIONS.md``). Before each use an idle connection is checked without a round trip (its socket
    must have nothing to read): one the server closed (restart, terminated backend) is replaced
    before any statement is sent, so no request fails after the server is back. A statement that
    failed mid-request is never re-sent.

    Works unchanged directly and behind a pooler in transaction or session mode (PgBouncer): no
    named server-side statements are created and no session state is relied on (every ``SET`` is
    ``SET LOCAL`` inside the transaction it belongs to). ``prepared_statements=True`` lets psycopg
    prepare the statements on each connection (slightly less parsing on a direct connection; never
    behind a transaction-mode pooler).

    ``purge_expired`` (a background batch) has its own deadline, ``purge_timeout_ms`` (default 30000).
    ``lock_timeout_ms`` and ``idle_in_transaction_timeout_ms`` apply to transactional mode
    (:meth:`transaction`): how long a duplicate waits for the first request's row lock before it
    is answered 409, and how long an open transaction may sit idle before the server ends it.
    """

    _single_type = psycopg.Connection
    _wrong_target = "PostgresStore needs a DSN, a psycopg Connection or a connection pool"

    def _init_io(self) -> None:
        self._single_lock = threading.Lock()
        self._local = threading.local()
        self._all: List[psycopg.Connection[Any]] = []
        self._all_lock = threading.Lock()
        self._idle: List[psycopg.Connection[Any]] = []
        self._closed = False

    def _connect(self) -> psycopg.Connection[Any]:
        assert self._dsn is not None
        if self._closed:
            raise unavailable("PostgreSQL", RuntimeError("the store is closed"))
        conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout)
        with self._all_lock:
            # A call that outlived close() (a worker thread past its deadline) must not leave a
            # connection nobody closes.
            if not self._closed:
                self._all.append(conn)
                return conn
        conn.close()
        raise unavailable("PostgreSQL", RuntimeError("the store is closed"))

    def _forget(self, conn: psycopg.Connection[Any]) -> None:
        with self._all_lock:
            if conn in self._all:
                self._all.remove(conn)
        conn.close()

    def _acquire(self, dedicated: bool = False) -> _Lease:
        """A live connection: thread-local (or, ``dedicated``, from the idle list) for a DSN,
        checked out of a pool, or the single connection under its lock."""
        if self._pool is not None:
            for _ in range(POOL_ATTEMPTS):
                cm = self._pool.connection()
                conn = cm.__enter__()
                if not _dead(conn):
                    return _Lease(conn, "pool", cm)
                conn.close()  # the pool discards a closed connection
                cm.__exit__(None, None, None)
            raise unavailable(
                "PostgreSQL pool", RuntimeError(f"{POOL_ATTEMPTS} dead connections in a row")
            )
        if self._single is not None:
            if not self._single_lock.acquire(timeout=self.timeout):
                raise _timed_out(self.timeout)
            if _dead(self._single):
                self._single_lock.release()
                raise unavailable(
                    "PostgreSQL connection", RuntimeError("the connection given is closed")
                )
            return _Lease(self._single, "single")
        if dedicated:
            while True:
                with self._all_lock:
                    conn = self._idle.pop() if self._idle else None
                if conn is None:
                    return _Lease(self._connect(), "dedicated")
                if not _dead(conn):
                    return _Lease(conn, "dedicated")
                self._forget(conn)
        local: Optional[psycopg.Connection[Any]] = getattr(self._local, "conn", None)
        if local is not None and not _dead(local):
            return _Lease(local, "local")
        if local is not None:
            self._local.conn = None
            self._forget(local)
        conn = self._connect()
        self._local.conn = conn
        return _Lease(conn, "local")

    def _release(self, lease: _Lease, exc: Optional[BaseException], discard: bool) -> None:
        conn = lease.conn
        if lease.kind == "pool":
            if discard:
                conn.close()
            lease.cm.__exit__(
                None if exc is None else type(exc), exc, None if exc is None else exc.__traceback__
            )
        elif lease.kind == "single":
            self._single_lock.release()
        elif lease.kind == "dedicated":
            keep = not discard and conn.info.transaction_status == TransactionStatus.IDLE
            with self._all_lock:
                if keep and len(self._idle) < MAX_IDLE_DEDICATED:
                    self._idle.append(conn)
                    return
            self._forget(conn)
        elif discard:
            if getattr(self._local, "conn", None) is conn:
                self._local.conn = None
            self._forget(conn)

    def _guarded(self, lease: _Lease, fn: Callable[[Any], T], timeout: float) -> T:
        """Runs ``fn(conn)`` under the watchdog; a timeout raises :class:`StoreUnavailable`."""
        conn = lease.conn
        with _watched(conn, timeout) as watch:
            result = fn(conn)
        if watch.late:
            # Finished just as the deadline hit: the answer is whole, the socket is not.
            conn.close()
        return result

    def _run(self, fn: Callable[[Any], T], timeout: Optional[float] = None) -> T:
        lease = self._acquire()
        try:
            result = self._guarded(lease, fn, self.timeout if timeout is None else timeout)
        except BaseException as exc:
            self._release(lease, exc, _spoiled(exc, lease.conn))
            raise
        self._release(lease, None, lease.conn.closed)
        return result

    def _op(self, op: _Op) -> Any:
        params = _bind(op, self._clock)
        timeout = self.purge_timeout if op.wait == "purge" else self.timeout
        return self._run(lambda conn: _execute(conn, op, params, True, self.prepared_statements), timeout)

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for a few statements (schema setup, tests), no deadline."""
        lease = self._acquire()
        try:
            yield lease.conn
        except BaseException as exc:
            self._release(lease, exc, isinstance(exc, psycopg.OperationalError))
            raise
        self._release(lease, None, False)

    def transaction(self) -> "PostgresTransaction":
        """A transactional session for one request (see :class:`PostgresTransaction`).

        Needs a DSN or a pool: each open transaction holds a connection for the whole request,
        which one shared connection cannot give (duplicates would queue on it, not on the row).
        """
        self.check_transactional()
        return PostgresTransaction(self)

    def check_transactional(self) -> None:
        """Raises :class:`~idempo.TransactionalUnsupported` when built on a single connection."""
        if self._single is not None:
            raise TransactionalUnsupported(
                "transactional mode needs a DSN or a pool, not a single connection"
            )

    @fail_closed(_errors, "PostgreSQL stats failed")
    def stats(self) -> StoreStats:
        """The table's figures for metrics (``spec/STORAGE.md`` §4.7): records by state, expired
        records and the purge lag, size in bytes. Reads the whole table."""
        return self._drive("stats", _stats())

    @fail_closed(_errors, "PostgreSQL create_schema failed")
    def create_schema(self) -> None:
        """Creates the table and its expiry index if missing (see :data:`SCHEMA_STATEMENTS`), in
        one transaction after :data:`SCHEMA_LOCK`: workers starting together against an empty
        database wait for each other instead of failing (``spec/STORAGE.md`` §4.1)."""
        with self._conn() as conn:
            with conn.transaction():
                conn.execute(SCHEMA_LOCK)  # type: ignore[arg-type]
                for stmt in SCHEMA_STATEMENTS:
                    conn.execute(stmt)  # type: ignore[arg-type]
            if not conn.autocommit:
                conn.commit()

    def close(self) -> None:
        """Closes the connections this store opened (not a pool or connection passed in)."""
        with self._all_lock:
            self._closed = True
            conns, self._all = self._all, []
            self._idle = []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    def complete_returning(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> Optional[CompletedRow]:
        """``complete`` that also returns what a cache needs (None when the token is stale)."""
        return self._drive("complete", _complete_returning(scope_key, token, response, ttl_ms))


class AsyncPostgresStore(_StoreBase, AsyncPrimitives):
    """The storage contract on PostgreSQL with psycopg's asyncio API.

    Pass a DSN (one connection, opened on first use, serialized by an asyncio lock; transactional
    requests get connections of their own), an ``AsyncConnection``, or a
    ``psycopg_pool.AsyncConnectionPool``. Deadlines, the idle-connection check and the
    transactional options are those of :class:`PostgresStore`; waiting for the shared
    connection counts against ``timeout`` too.
    """

    _single_type = psycopg.AsyncConnection
    _wrong_target = "AsyncPostgresStore needs a DSN, a psycopg AsyncConnection or an async pool"

    def _init_io(self) -> None:
        self._lock: Optional[asyncio.Lock] = None
        self._owned = False
        self._idle: List[psycopg.AsyncConnection[Any]] = []

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        assert self._dsn is not None
        return await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=self._connect_timeout
        )

    async def _acquire(self, dedicated: bool = False) -> _Lease:
        if self._pool is not None:
            for _ in range(POOL_ATTEMPTS):
                cm = self._pool.connection()
                conn = await cm.__aenter__()
                if not _dead(conn):
                    return _Lease(conn, "pool", cm)
                await conn.close()
                await cm.__aexit__(None, None, None)
            raise unavailable(
                "PostgreSQL pool", RuntimeError(f"{POOL_ATTEMPTS} dead connections in a row")
            )
        if dedicated and self._dsn is not None:
            while self._idle:
                conn = self._idle.pop()
                if not _dead(conn):
                    return _Lease(conn, "dedicated")
                await conn.close()
            return _Lease(await self._connect(), "dedicated")
        if self._lock is None:
            self._lock = asyncio.Lock()
        try:
            await asyncio.wait_for(self._lock.acquire(), self.timeout)
        except asyncio.TimeoutError:
            raise _timed_out(self.timeout) from None
        try:
            if self._single is not None and _dead(self._single):
                if not self._owned:
                    raise unavailable(
                        "PostgreSQL connection", RuntimeError("the connection given is closed")
                    )
                await self._single.close()
                self._single = None
            if self._single is None:
                self._single = await self._connect()
                self._owned = True
        except BaseException:
            self._lock.release()
            raise
        return _Lease(self._single, "single")

    async def _release(self, lease: _Lease, exc: Optional[BaseException], discard: bool) -> None:
        conn = lease.conn
        if lease.kind == "pool":
            if discard:
                await conn.close()
            await lease.cm.__aexit__(
                None if exc is None else type(exc), exc, None if exc is None else exc.__traceback__
            )
        elif lease.kind == "dedicated":
            keep = not discard and conn.info.transaction_status == TransactionStatus.IDLE
            if keep and len(self._idle) < MAX_IDLE_DEDICATED:
                self._idle.append(conn)
            else:
                await conn.close()
        else:
            assert self._lock is not None
            try:
                if discard and self._owned:
                    await conn.close()
                    self._single = None
            finally:
                self._lock.release()

    async def _guarded(
        self, lease: _Lease, fn: Callable[[Any], Awaitable[T]], timeout: float
    ) -> T:
        conn = lease.conn
        with _watched(conn, timeout) as watch:
            result = await fn(conn)
        if watch.late:
            await conn.close()
        return result

    async def _run(
        self, fn: Callable[[Any], Awaitable[T]], timeout: Optional[float] = None
    ) -> T:
        lease = await self._acquire()
        try:
            result = await self._guarded(lease, fn, self.timeout if timeout is None else timeout)
        except BaseException as exc:
            await self._release(lease, exc, _spoiled(exc, lease.conn))
            raise
        await self._release(lease, None, lease.conn.closed)
        return result

    async def _op(self, op: _Op) -> Any:
        params = _bind(op, self._clock)
        timeout = self.purge_timeout if op.wait == "purge" else self.timeout
        return await self._run(lambda conn: _execute_async(conn, op, params, True, self.prepared_statements), timeout)

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for a few statements (schema setup, tests), no deadline."""
        lease = await self._acquire()
        try:
            yield lease.conn
        except BaseException as exc:
            await self._release(lease, exc, isinstance(exc, psycopg.OperationalError))
            raise
        await self._release(lease, None, False)

    def transaction(self) -> "AsyncPostgresTransaction":
        """A transactional session for one request (see :class:`AsyncPostgresTransaction`);
        needs a DSN or a pool, as for :meth:`PostgresStore.transaction`."""
        self.check_transactional()
        return AsyncPostgresTransaction(self)

    def check_transactional(self) -> None:
        """Raises :class:`~idempo.TransactionalUnsupported` when built on a single connection."""
        if self._dsn is None and self._pool is None:
            raise TransactionalUnsupported(
                "transactional mode needs a DSN or a pool, not a single connection"
            )

    @fail_closed_async(_errors, "PostgreSQL stats failed")
    async def stats(self) -> StoreStats:
        """As :meth:`PostgresStore.stats`."""
        return await self._drive("stats", _stats())

    @fail_closed_async(_errors, "PostgreSQL create_schema failed")
    async def create_schema(self) -> None:
        """As :meth:`PostgresStore.create_schema` (one transaction after the advisory lock)."""
        async with self._conn() as conn:
            async with conn.transaction():
                await conn.execute(SCHEMA_LOCK)  # type: ignore[arg-type]
                for stmt in SCHEMA_STATEMENTS:
                    await conn.execute(stmt)  # type: ignore[arg-type]
            if not conn.autocommit:
                await conn.commit()

    async def close(self) -> None:
        """Closes the connection this store opened (not one or a pool passed in)."""
        if self._owned and self._single is not None:
            await self._single.close()
            self._single = None
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

    async def complete_returning(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> Optional[CompletedRow]:
        """``complete`` that also returns what a cache needs (None when the token is stale)."""
        plan = _complete_returning(scope_key, token, response, ttl_ms)
        return await self._drive("complete", plan)
