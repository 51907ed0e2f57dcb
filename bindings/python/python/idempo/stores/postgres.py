"""PostgreSQL store (psycopg 3): the authority for production.

Each primitive is one autocommit statement under Read Committed, timed by the database clock
(``clock_timestamp()`` in unix milliseconds), so skewed application hosts change nothing. Claim is
``INSERT ... ON CONFLICT DO UPDATE ... WHERE expires_at <= now RETURNING``: a live row is left
untouched and returns nothing, an expired one is replaced in the same statement with
``generation + 1``. The loser re-reads in a *new* statement (a new snapshot); if the row vanished
in between (released or purged) it claims again, at most three times, then fails closed. The
statements are core's (``idempo_core::recipes``, ``spec/STORAGE.md`` §4), shared with the Node
binding.

Pass a DSN (one connection per thread, opened lazily), a ``psycopg_pool.ConnectionPool`` (anything
with a ``connection()`` context manager) or a single ``psycopg.Connection`` (serialized by a lock).
Do not run the claim inside your own Repeatable Read or Serializable transaction.
"""

from __future__ import annotations

import asyncio
import math
import threading
from abc import abstractmethod
from contextlib import asynccontextmanager, contextmanager
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Tuple,
    Type,
    TypeVar,
)

from idempo._idempo import InvalidArgument, StoreUnavailable
from idempo.stores._deadline import WATCHDOG, idle_socket_is_dead
from idempo.stores._primitives import AsyncPrimitives, Plan, PlanHooks, Primitives
from idempo.stores._recipes import pyformat, recipe
from idempo.stores._tx import (
    SessionEnds,
    Transaction,
    TransactionalUnsupported,
    no_open_transaction,
)
from idempo.stores._base import (
    ClaimResult,
    Claimed,
    Existing,
    Locked,
    PurgeCounts,
    StoreStats,
    StoredRecord,
    check_batch,
    check_key,
    check_ms,
    check_token,
    fail_closed,
    fail_closed_async,
    record_from_row,  # re-exported: idempo.stores.postgres.record_from_row
    record_or_none,
    unavailable,
)

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.postgres needs psycopg 3: pip install 'psycopg[binary]'") from exc
from psycopg.pq import TransactionStatus

T = TypeVar("T")

DEFAULT_TIMEOUT = 2.0
"""Seconds a store operation may take before the store gives up on the server (client side)."""
POOL_ATTEMPTS = 4

NOW = recipe("postgres_now")
"""The database clock in unix ms (``spec/STORAGE.md`` §4.2)."""
COLUMNS = "scope_key, fingerprint, state, token, generation, lease_until, expires_at, response"
CLAIM_ATTEMPTS = 3

SCHEMA_STATEMENTS = tuple(
    s.strip() for s in recipe("postgres_schema").split(";") if s.strip()
)
"""The DDL ``create_schema()`` runs; copy it into your migrations instead if you prefer."""

# The statements of spec/STORAGE.md §4.3, from core, with psycopg placeholders (``%(p1)s`` for
# ``$1``). The last parameter of each (except release) is the clock override, NULL in production.
SQL_CLAIM = pyformat(recipe("postgres_claim"))
SQL_GET = pyformat(recipe("postgres_get"))
SQL_TAKEOVER = pyformat(recipe("postgres_takeover"))
SQL_MARK_UNKNOWN = pyformat(recipe("postgres_mark_unknown"))
SQL_COMPLETE = pyformat(recipe("postgres_complete"))
SQL_COMPLETE_RETURNING = pyformat(recipe("postgres_complete_returning"))
SQL_RELEASE = pyformat(recipe("postgres_release"))
SQL_RENEW = pyformat(recipe("postgres_renew"))
SQL_PURGE = pyformat(recipe("postgres_purge"))
SQL_STATS = pyformat(recipe("postgres_stats"))
SQL_NOW = pyformat(f"SELECT coalesce($1::bigint, {NOW})")

_errors: Tuple[Type[BaseException], ...] = (psycopg.Error,)


def _contention() -> StoreUnavailable:
    err = StoreUnavailable(
        f"claim did not settle after {CLAIM_ATTEMPTS} attempts (the record kept changing)"
    )
    err.retry_after = 1.0
    return err


class CompletedRow:
    """What a successful ``complete`` returns to a cache in front of the store."""

    __slots__ = ("fingerprint", "generation", "expires_at", "now_ms")

    def __init__(self, fingerprint: str, generation: int, expires_at: int, now_ms: int) -> None:
        self.fingerprint = fingerprint
        self.generation = generation
        self.expires_at = expires_at
        self.now_ms = now_ms


# ---------------------------------------------------------------------------------------------
# The primitives as plans (sans-IO): written once, run by the sync and the async classes.
# ---------------------------------------------------------------------------------------------


class _Op(NamedTuple):
    """One statement a plan needs run."""

    sql: str
    params: Dict[str, Any]
    clock: Optional[str]
    """The clock-override parameter's name (``None``: the statement reads no clock)."""
    fetch: str = "one"
    """``one``: the first row or ``None``; ``count``: the number of rows affected."""
    wait: str = "op"
    """The deadline: ``op`` (``timeout``), ``lock`` (plus ``lock_timeout``), ``purge``."""


_Plan = Plan[_Op, T]


def _bind(op: _Op, clock: Optional[Callable[[], int]]) -> Dict[str, Any]:
    """The statement's parameters with the clock override (None: the database clock)."""
    if op.clock is None:
        return op.params
    return {**op.params, op.clock: None if clock is None else int(clock())}


def _applied(op: _Op) -> "_Plan[bool]":
    count = yield op._replace(fetch="count")
    return bool(count == 1)


def _stmt(sql: str, *values: Any, clock: bool = True, wait: str = "op") -> _Op:
    """A statement with ``values`` as ``$1…$n`` and, with ``clock``, the override as ``$n+1``."""
    params = {f"p{i}": value for i, value in enumerate(values, 1)}
    return _Op(sql, params, f"p{len(values) + 1}" if clock else None, wait=wait)


def _get_steps(key: bytes) -> "_Plan[Tuple[Optional[StoredRecord], int]]":
    row = yield _stmt(SQL_GET, key)
    return record_or_none(key, row), int(row[7])


def _get(scope_key: bytes) -> "_Plan[Tuple[Optional[StoredRecord], int]]":
    return _get_steps(check_key(scope_key))


def _claim(
    scope_key: bytes,
    fingerprint: str,
    token: bytes,
    lease_ms: int,
    ttl_ms: int,
    lock_wait_ms: Optional[int] = None,
) -> "_Plan[ClaimResult]":
    """Primitive 1; ``lock_wait_ms`` (transactional mode): a lock wait past ``lock_timeout``
    (SQLSTATE 55P03) is answered as an in-flight record."""
    claim = _stmt(
        SQL_CLAIM,
        check_key(scope_key),
        fingerprint,
        check_token(token),
        check_ms("lease_ms", lease_ms),
        check_ms("ttl_ms", ttl_ms),
        wait="op" if lock_wait_ms is None else "lock",
    )
    return _claim_steps(claim, lock_wait_ms)


def _claim_steps(claim: _Op, lock_wait_ms: Optional[int]) -> "_Plan[ClaimResult]":
    key: bytes = claim.params["p1"]
    for _ in range(CLAIM_ATTEMPTS):
        try:
            row = yield claim
        except psycopg.errors.LockNotAvailable:
            if lock_wait_ms is None:
                raise
            now = yield _stmt(SQL_NOW)
            return Locked(int(now[0]))
        if row is not None:
            return Claimed(int(row[0]), int(row[1]))
        record, now_ms = yield from _get_steps(key)
        if record is not None and record.expires_at > now_ms:
            return Existing(record, now_ms)
    raise _contention()


def _takeover(
    scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
) -> "_Plan[Optional[int]]":
    return _first_int(
        _stmt(
            SQL_TAKEOVER,
            check_key(scope_key),
            check_token(seen_token),
            check_token(new_token),
            check_ms("lease_ms", lease_ms),
        )
    )


def _first_int(op: _Op) -> "_Plan[Optional[int]]":
    row = yield op
    return None if row is None else int(row[0])


def _mark_unknown(scope_key: bytes, seen_token: bytes, ttl_ms: int) -> "_Plan[bool]":
    key, seen, ttl = check_key(scope_key), check_token(seen_token), check_ms("ttl_ms", ttl_ms)
    return _applied(_stmt(SQL_MARK_UNKNOWN, key, seen, ttl))


def _completion(sql: str, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> _Op:
    key, tok, ttl = check_key(scope_key), check_token(token), check_ms("ttl_ms", ttl_ms)
    return _stmt(sql, key, tok, bytes(response), ttl)


def _complete(scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> "_Plan[bool]":
    return _applied(_completion(SQL_COMPLETE, scope_key, token, response, ttl_ms))


def _complete_returning(
    scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
) -> "_Plan[Optional[CompletedRow]]":
    return _completed_row(
        _completion(SQL_COMPLETE_RETURNING, scope_key, token, response, ttl_ms)
    )


def _completed_row(op: _Op) -> "_Plan[Optional[CompletedRow]]":
    row = yield op
    if row is None:
        return None
    return CompletedRow(str(row[0]), int(row[3]), int(row[5]), int(row[7]))


def _release(scope_key: bytes, token: bytes) -> "_Plan[bool]":
    return _applied(_stmt(SQL_RELEASE, check_key(scope_key), check_token(token), clock=False))


def _renew(scope_key: bytes, token: bytes, lease_ms: int) -> "_Plan[bool]":
    key, tok, lease = check_key(scope_key), check_token(token), check_ms("lease_ms", lease_ms)
    return _applied(_stmt(SQL_RENEW, key, tok, lease))


def _purge(batch: int) -> "_Plan[PurgeCounts]":
    return _counts(_stmt(SQL_PURGE, check_batch(batch), wait="purge"))


def _stats() -> "_Plan[StoreStats]":
    row = yield _stmt(SQL_STATS, wait="purge")
    return StoreStats.from_row(row)


def _counts(op: _Op) -> "_Plan[PurgeCounts]":
    row = yield op
    return PurgeCounts(int(row[0]), int(row[1]), int(row[2]))


def _execute(
    conn: Any, op: _Op, params: Dict[str, Any], commit: bool, prepare: bool = False
) -> Any:
    """Runs one statement on a blocking connection (``commit``: outside autocommit, commit).

    ``prepare=False`` (the default, ``spec/STORAGE.md`` §4.6) never creates a named server-side
    statement: psycopg would otherwise prepare one per connection after a few executions, which a
    pooler in transaction mode (PgBouncer) hands to another server connection mid-session."""
    cur = conn.execute(op.sql, params, prepare=prepare)
    result = cur.fetchone() if op.fetch == "one" else cur.rowcount
    if commit and not conn.autocommit:
        conn.commit()
    return result


async def _execute_async(
    conn: Any, op: _Op, params: Dict[str, Any], commit: bool, prepare: bool = False
) -> Any:
    """Runs one statement on an asyncio connection (``prepare`` as for :func:`_execute`)."""
    cur = await conn.execute(op.sql, params, prepare=prepare)
    result = await cur.fetchone() if op.fetch == "one" else cur.rowcount
    if commit and not conn.autocommit:
        await conn.commit()
    return result


class _Plans(PlanHooks):
    """The PostgreSQL plans behind :class:`~idempo.stores._primitives.Primitives`."""

    _errors = _errors
    _what = "PostgreSQL"
    _plan_claim = staticmethod(_claim)
    _plan_get = staticmethod(_get)
    _plan_takeover = staticmethod(_takeover)
    _plan_mark_unknown = staticmethod(_mark_unknown)
    _plan_complete = staticmethod(_complete)
    _plan_release = staticmethod(_release)
    _plan_renew = staticmethod(_renew)
    _plan_purge_expired = staticmethod(_purge)


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


def _check_timeout(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgument(f"{name} must be a positive number of seconds")
    return float(value)


def _connect_timeout(timeout: float, given: Optional[int]) -> int:
    # libpq counts whole seconds and treats anything below 2 as 2.
    if given is None:
        return max(2, math.ceil(timeout))
    if isinstance(given, bool) or not isinstance(given, int) or given <= 0:
        raise InvalidArgument("connect_timeout must be a positive whole number of seconds")
    return given


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
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: Optional[int] = None,
        lock_timeout: float = 2.0,
        idle_in_transaction_timeout: float = 60.0,
        purge_timeout: float = 30.0,
        prepared_statements: bool = False,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        """``clock`` replaces the database clock (conformance tests only)."""
        self._clock = clock
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
        self.timeout = _check_timeout("timeout", timeout)
        self.lock_timeout = _check_timeout("lock_timeout", lock_timeout)
        self.purge_timeout = _check_timeout("purge_timeout", purge_timeout)
        self.idle_in_transaction_timeout = _check_timeout(
            "idle_in_transaction_timeout", idle_in_transaction_timeout
        )
        self._connect_timeout = _connect_timeout(self.timeout, connect_timeout)
        self._init_io()

    @abstractmethod
    def _init_io(self) -> None:
        """Sets up the connection handling (a pool, one connection or a DSN) of the store's kind."""


class PostgresStore(_StoreBase, Primitives):
    """The storage contract on PostgreSQL (psycopg 3, sync).

    Every operation has a client-side deadline of ``timeout`` seconds (default 2.0): past it the
    socket is shut down, the connection discarded, and :class:`~idempo.StoreUnavailable` raised
    (the middleware answers 503 with ``Retry-After``; the handler never runs). Opening a
    connection is bounded by ``connect_timeout`` (whole seconds, default ``ceil(timeout)``, at
    least 2). Before each use an idle connection is checked without a round trip (its socket
    must have nothing to read): one the server closed (restart, terminated backend) is replaced
    before any statement is sent, so no request fails after the server is back. A statement that
    failed mid-request is never re-sent.

    Works unchanged directly and behind a pooler in transaction or session mode (PgBouncer): no
    named server-side statements are created and no session state is relied on (every ``SET`` is
    ``SET LOCAL`` inside the transaction it belongs to). ``prepared_statements=True`` lets psycopg
    prepare the statements on each connection (slightly less parsing on a direct connection; never
    behind a transaction-mode pooler).

    ``purge_expired`` (a background batch) has its own deadline, ``purge_timeout`` (default 30 s).
    ``lock_timeout`` and ``idle_in_transaction_timeout`` apply to transactional mode
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

    def _connect(self) -> psycopg.Connection[Any]:
        assert self._dsn is not None
        conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout)
        with self._all_lock:
            self._all.append(conn)
        return conn

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

    @fail_closed(_errors, "PostgreSQL create_schema failed")
    def stats(self) -> StoreStats:
        """The table's figures for metrics (``spec/STORAGE.md`` §4.7): records by state, expired
        records and the purge lag, size in bytes. Reads the whole table."""
        return self._drive("stats", _stats())

    def create_schema(self) -> None:
        """Creates the table and its expiry index if missing (see :data:`SCHEMA_STATEMENTS`)."""
        with self._conn() as conn:
            for stmt in SCHEMA_STATEMENTS:
                conn.execute(stmt)  # type: ignore[arg-type]
            if not conn.autocommit:
                conn.commit()

    def close(self) -> None:
        """Closes the connections this store opened (not a pool or connection passed in)."""
        with self._all_lock:
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

    @fail_closed_async(_errors, "PostgreSQL create_schema failed")
    async def stats(self) -> StoreStats:
        """As :meth:`PostgresStore.stats`."""
        return await self._drive("stats", _stats())

    async def create_schema(self) -> None:
        """Creates the table and its expiry index if missing."""
        async with self._conn() as conn:
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

    async def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8 on the store itself (a background batch, never part of a request)."""
        return await self.store.purge_expired(batch)
