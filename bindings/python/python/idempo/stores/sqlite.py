"""SQLite store: the embedded default, for one host (any number of processes on it).

Every connection runs ``journal_mode=WAL``, ``synchronous=FULL`` (with ``NORMAL`` a committed
completion may roll back after a power loss, and a lost completion re-executes) and a
``busy_timeout``; it is opened with ``isolation_level=None`` so Python never opens a deferred
transaction on its own, and each read-then-write primitive runs in ``BEGIN IMMEDIATE`` (the write
lock first, so ``busy_timeout`` applies and no ``SQLITE_BUSY_SNAPSHOT`` can occur). Time is the
SQLite host's clock in milliseconds. WAL does not work over a network filesystem: keep the file
local. The statements are core's (``idempo_core::recipes``, ``spec/STORAGE.md`` §7), shared with
the Node binding; they need SQLite 3.35.0 (``RETURNING``).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
import weakref
from contextlib import contextmanager
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from idempo._idempo import InvalidArgument, StoreUnavailable, sqlite_setup_pause_ms
from idempo._options import default
from idempo._loop import PID, running_loop
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
    record_or_none,
    unavailable,
)
from idempo._plan import drive
from idempo.stores._primitives import AsyncPrimitivesBase, Plan, PlanHooks, PrimitivesBase
from idempo.stores._recipes import PRIMITIVES, family, recipe
from idempo.stores._tx import (
    SessionEnds,
    ThreadedSession,
    Transaction,
    no_open_transaction,
)

T = TypeVar("T")

_NOW = recipe("sqlite_now")
MIN_SQLITE = (3, 35, 0)
"""``RETURNING`` (``spec/STORAGE.md`` §7)."""
MAX_IDLE_DEDICATED = 16
"""Idle connections a store keeps for transactional requests."""

SCHEMA = recipe("sqlite_schema")
"""The DDL ``create_schema()`` runs (idempotent)."""

# The statements of spec/STORAGE.md §7, from core; ``:now`` is the clock override (NULL in
# production).
_SQL = family("sqlite", (*PRIMITIVES, "purge"))
SQL_NOW = f"SELECT {_NOW}"
SQL_STATS = recipe("sqlite_stats")
CLAIM_ATTEMPTS = 3
DEFAULT_BUSY_TIMEOUT_MS: int = default("sqlite_store", "busy_timeout_ms")
"""SQLite's ``busy_timeout`` by default (from core)."""

_errors: Tuple[Type[BaseException], ...] = (sqlite3.Error,)


_WRITERS: Dict[str, threading.Lock] = {}
_WRITERS_LOCK = threading.Lock()


def _writer_lock(path: str) -> threading.Lock:
    """The lock that this process's writers of the database file ``path`` take in turn (one per
    file, shared by every store on it; ``:memory:`` databases are separate, but serialising them
    costs nothing)."""
    key = path if path == ":memory:" else os.path.realpath(path)
    with _WRITERS_LOCK:
        lock = _WRITERS.get(key)
        if lock is None:
            lock = _WRITERS[key] = threading.Lock()
        return lock


class _Op(NamedTuple):
    """One statement a plan needs run (inside the primitive's transaction)."""

    sql: str
    params: Dict[str, Any]
    fetch: str = "all"
    """``all``: every row (RETURNING / SELECT); ``count``: the number of rows changed."""


_Plan = Plan[_Op, T]


def _execute(
    conn: Union[sqlite3.Connection, sqlite3.Cursor], op: _Op, clock: Optional[Callable[[], int]]
) -> Any:
    params = {**op.params, "now": None if clock is None else int(clock())}
    cur = conn.execute(op.sql, params)
    if op.fetch == "count":
        return cur.rowcount
    return cur.fetchall()


def _applied(op: _Op) -> "_Plan[bool]":
    count = yield op._replace(fetch="count")
    return bool(count == 1)


def _get_steps(key: bytes) -> "_Plan[Tuple[Optional[StoredRecord], int]]":
    rows = yield _Op(_SQL["get"], {"scope": key})
    return record_or_none(key, rows[0]), int(rows[0][7])


def _contention() -> StoreUnavailable:
    return unavailable(
        "SQLite claim failed",
        RuntimeError(f"the record kept changing over {CLAIM_ATTEMPTS} attempts"),
    )


def _claim_steps(params: Dict[str, Any]) -> "_Plan[ClaimResult]":
    key: bytes = params["scope"]
    for _ in range(CLAIM_ATTEMPTS):
        rows = yield _Op(_SQL["claim"], params)
        if rows:
            return Claimed(int(rows[0][0]), int(rows[0][1]))
        record, now = yield from _get_steps(key)
        if record is not None and record.expires_at > now:
            return Existing(record, now)
    raise _contention()


def _first_int(op: _Op) -> "_Plan[Optional[int]]":
    rows = yield op
    return int(rows[0][0]) if rows else None


def _purge_counts(op: _Op) -> "_Plan[PurgeCounts]":
    rows = yield op
    return PurgeCounts.from_states([int(r[0]) for r in rows])


class _Plans(PlanHooks):
    """The SQLite plans behind :class:`SQLiteStore` and :class:`SQLiteTransaction`."""

    _errors = _errors
    _what = "SQLite"

    def _plan_claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> "_Plan[ClaimResult]":
        params = {
            "scope": check_key(scope_key),
            "fp": fingerprint,
            "token": check_token(token),
            "lease": check_ms("lease_ms", lease_ms),
            "ttl": check_ms("ttl_ms", ttl_ms),
        }
        return _claim_steps(params)

    def _plan_get(self, scope_key: bytes) -> "_Plan[Tuple[Optional[StoredRecord], int]]":
        return _get_steps(check_key(scope_key))

    def _plan_takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> "_Plan[Optional[int]]":
        params = {
            "scope": check_key(scope_key),
            "seen": check_token(seen_token),
            "new": check_token(new_token),
            "lease": check_ms("lease_ms", lease_ms),
        }
        return _first_int(_Op(_SQL["takeover"], params))

    def _plan_mark_unknown(
        self, scope_key: bytes, seen_token: bytes, ttl_ms: int
    ) -> "_Plan[bool]":
        params = {
            "scope": check_key(scope_key),
            "seen": check_token(seen_token),
            "ttl": check_ms("ttl_ms", ttl_ms),
        }
        return _applied(_Op(_SQL["mark_unknown"], params))

    def _plan_complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> "_Plan[bool]":
        params = {
            "scope": check_key(scope_key),
            "token": check_token(token),
            "response": bytes(response),
            "ttl": check_ms("ttl_ms", ttl_ms),
        }
        return _applied(_Op(_SQL["complete"], params))

    def _plan_release(self, scope_key: bytes, token: bytes) -> "_Plan[bool]":
        params = {"scope": check_key(scope_key), "token": check_token(token)}
        return _applied(_Op(_SQL["release"], params))

    def _plan_renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> "_Plan[bool]":
        params = {
            "scope": check_key(scope_key),
            "token": check_token(token),
            "lease": check_ms("lease_ms", lease_ms),
        }
        return _applied(_Op(_SQL["renew"], params))

    def _plan_purge_expired(self, batch: int) -> "_Plan[PurgeCounts]":
        """Up to ``batch`` expired records (earliest expiry first) in one ``BEGIN IMMEDIATE``."""
        return _purge_counts(_Op(_SQL["purge"], {"batch": check_batch(batch)}))


def _stats() -> "_Plan[StoreStats]":
    rows = yield _Op(SQL_STATS, {})
    return StoreStats.from_row(rows[0])


class SQLiteStore(_Plans, PrimitivesBase):
    """The storage contract on one SQLite database file (one connection per thread)."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        create_schema: bool = True,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        """``clock`` replaces the SQLite clock (conformance tests only)."""
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise InvalidArgument(
                f"SQLite {sqlite3.sqlite_version} is too old: idempo needs "
                f"{'.'.join(map(str, MIN_SQLITE))} or newer"
            )
        self.path = os.fspath(path)
        self._busy_timeout_ms = check_ms("busy_timeout_ms", busy_timeout_ms)
        self._clock = clock
        self._local = threading.local()
        self._all: List[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._idle: List[Tuple[int, sqlite3.Connection]] = []
        self._writer = _writer_lock(self.path)
        """This process's lock for writers of the file (:func:`_writer_lock`)."""
        self._groups: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopGroup]" = (
            weakref.WeakKeyDictionary()
        )
        if create_schema:
            self.create_schema()

    @property
    def timeout(self) -> float:
        """Seconds one operation may wait for the database lock (``busy_timeout_ms``). Driven from
        asyncio, a write first tries the loop's group commit, which never waits for a lock; one
        that runs in a worker thread instead (the lock held elsewhere, or a read) is answered 503
        once this much time (plus a small margin) has passed since the request asked, however
        long it queued for the thread."""
        return self._busy_timeout_ms / 1000

    def _conn(self) -> sqlite3.Connection:
        conn: Optional[sqlite3.Connection] = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == PID[0]:
            return conn
        conn = self._open()
        self._local.conn = conn
        self._local.pid = PID[0]
        return conn

    def _open(self, busy_timeout_ms: Optional[int] = None) -> sqlite3.Connection:
        """A new connection (WAL, ``synchronous=FULL``) whose statements wait for a lock held
        elsewhere up to ``busy_timeout_ms`` (the store's own by default)."""
        busy_ms = self._busy_timeout_ms if busy_timeout_ms is None else busy_timeout_ms
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=busy_ms / 1000,
                isolation_level=None,
                # Each connection is used only by the thread that opened it; close() may run
                # elsewhere.
                check_same_thread=False,
            )
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise
            raise sqlite3.OperationalError(
                f"cannot open {self.path!r}: {exc} (does its directory exist, and may this "
                "process write there?)") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
            mode = _while_busy(self._busy_timeout_ms, "switching to WAL",
                               lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
            if mode is None or str(mode[0]).lower() != "wal" and self.path != ":memory:":
                raise InvalidArgument(f"SQLite refused WAL mode for {self.path!r}")
            conn.execute("PRAGMA synchronous = FULL")
        except BaseException:
            conn.close()
            raise
        with self._all_lock:
            self._all.append(conn)
        return conn

    @contextmanager
    def _immediate(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, after this process's other writers of the file: SQLite has one
        writer, and a connection that finds the write lock taken sleeps in its busy handler
        (growing steps up to 100 ms) however soon the lock is free again, so writers of one
        process queue on a lock of their own first and SQLite's busy wait is left to writers in
        other processes. The wait counts toward ``busy_timeout_ms``."""
        conn = self._conn()
        writer = self._writer
        if not writer.acquire(timeout=self._busy_timeout_ms / 1000):
            raise sqlite3.OperationalError(
                "database is locked (this process's other writers held it past busy_timeout_ms)")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")
        finally:
            writer.release()

    def _dedicated(self) -> sqlite3.Connection:
        """A connection for one transactional request (kept idle between requests)."""
        with self._all_lock:
            while self._idle:
                pid, conn = self._idle.pop()
                if pid == PID[0]:
                    return conn
        return self._open()

    def _give_back(self, conn: sqlite3.Connection, keep: bool) -> None:
        with self._all_lock:
            if keep and not conn.in_transaction and len(self._idle) < MAX_IDLE_DEDICATED:
                self._idle.append((PID[0], conn))
                return
            if conn in self._all:
                self._all.remove(conn)
        conn.close()

    def _now(self, conn: sqlite3.Connection) -> int:
        return int(_execute(conn, _Op(SQL_NOW, {}), self._clock)[0][0])

    def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        """Runs a primitive's plan in one ``BEGIN IMMEDIATE`` (a ``get`` reads without it)."""
        try:
            if name in ("get", "stats"):  # reads: no write lock
                return drive(plan, lambda op: _execute(self._conn(), op, self._clock))
            with self._immediate() as conn:
                return drive(plan, lambda op: _execute(conn, op, self._clock))
        except self._errors as exc:
            raise unavailable(f"{self._what} {name} failed", exc) from exc

    def transaction(self) -> "SQLiteTransaction":
        """A transactional session for one request (see :class:`SQLiteTransaction`)."""
        return SQLiteTransaction(self)

    def stats(self) -> StoreStats:
        """The database's figures for metrics (``spec/STORAGE.md`` §4.7): records by state,
        expired records and the purge lag, the file's size in bytes."""
        return self._drive("stats", _stats())

    @fail_closed(_errors, "SQLite create_schema failed")
    def create_schema(self) -> None:
        """Creates the table and its expiry index (idempotent). One ``BEGIN IMMEDIATE``
        transaction: statements in autocommit would each read the schema before taking the
        write lock, and SQLite refuses that upgrade at once (no busy wait) when another
        connection (a thread or worker process opening the same file) wrote in between."""
        with self._immediate() as conn:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

    def close(self) -> None:
        """Closes every connection this store opened (in any thread)."""
        with self._all_lock:
            conns, self._all = self._all, []
            self._idle = []
        for conn in conns:
            conn.close()
        self._local = threading.local()
        self._groups = weakref.WeakKeyDictionary()

    def _loop_group(self) -> "Optional[_LoopGroup]":
        """The running event loop's group commit (:class:`_LoopGroup`), once its connection is
        open (it opens in a worker thread on first use; until then, None)."""
        loop = running_loop()
        try:
            group = self._groups.get(loop)
            if group is None:
                group = self._groups[loop] = _LoopGroup(self, loop)
        except TypeError:  # a loop without weak references: keep the worker threads
            return None
        return group if group.ready(loop) else None


class AsyncSQLiteStore(_Plans, AsyncPrimitivesBase):
    """The asyncio face of :class:`SQLiteStore`: the writes run in the event loop's group commit
    (:class:`_LoopGroup`), the reads and anything the group hands back in a worker thread."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], **kwargs: Any) -> None:
        self.sync = SQLiteStore(path, **kwargs)

    async def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        """A write primitive joins the loop's group commit (:class:`_LoopGroup`); a read, or a
        write the group hands back unstarted, runs in a worker thread."""
        if name in GROUPED:
            group = self.sync._loop_group()
            if group is not None:
                try:
                    return await group.submit(name, plan)
                except Unstarted:
                    pass
        return await asyncio.to_thread(self.sync._drive, name, plan)

    async def stats(self) -> StoreStats:
        """As :meth:`SQLiteStore.stats`."""
        return await asyncio.to_thread(self.sync.stats)

    def transaction(self) -> ThreadedSession:
        """A transactional session for one request (a :class:`SQLiteTransaction` on a thread of
        its own)."""
        return ThreadedSession(self.sync.transaction())

    def close(self) -> None:
        """Closes the underlying connections."""
        self.sync.close()


GROUPED = frozenset(("claim", "takeover", "mark_unknown", "complete", "release", "renew"))
"""The primitives the asyncio path runs in the loop's group commit (the writes a request's flow
makes; ``get``, ``stats`` and ``purge_expired`` keep their worker thread)."""

_GROUP_SAVEPOINT = "idempo_group"
_OVERRIDES = frozenset(
    (*PRIMITIVES, "purge_expired", "_drive", *(f"_plan_{name}" for name in PRIMITIVES))
)


class Unstarted(Exception):
    """The loop's group commit could not start this primitive (the write lock was held by this
    process's other writers or by another connection, or the group's transaction could not
    begin): nothing of it ran, and the caller runs it the ordinary way, in a worker thread."""


class _LoopGroup:
    """Group commit on one asyncio event loop, the asyncio path of :class:`SQLiteStore` (and
    :class:`AsyncSQLiteStore`).

    The write primitives asked for during one turn of the loop run on the loop's own connection
    in one ``BEGIN IMMEDIATE`` transaction, each inside a savepoint of its own (a primitive that
    fails rolls back only itself and answers its own error), and each is answered only after the
    group's ``COMMIT`` returned: one synchronous disk write for the group instead of one per
    primitive, and no hop to a worker thread and back. A failed ``COMMIT`` answers every
    primitive that had succeeded with the store error (503); none of them is durable.

    The loop's connection never waits for a lock (``busy_timeout`` 0), so the loop is never
    blocked by another writer: when this process's other writers (threads) or another process
    hold the write lock, the group hands its primitives back unstarted (:class:`Unstarted`) and
    they run as before, in worker threads with the store's ``busy_timeout`` and deadline. A
    primitive whose caller gave up (its future cancelled) before the group ran is not applied.
    The loop still waits for the ``COMMIT``'s own disk write, as the Node store's group commit
    does."""

    def __init__(self, store: SQLiteStore, loop: asyncio.AbstractEventLoop) -> None:
        # The loop is not held: the store keeps its groups in a dict weakly keyed by loop.
        self.store = store
        self.pid = PID[0]
        self.conn: Optional[sqlite3.Connection] = None
        self.cur: Optional[sqlite3.Cursor] = None
        """One cursor for every statement the group runs (no cursor built per statement)."""
        self.pending: "List[_Entry]" = []
        self.batches = 0
        """Group transactions committed (for tests and figures)."""
        self.opening = False
        self.retry_at = 0.0
        self._open(loop)

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Opens the loop's connection in a worker thread (opening may wait for a lock)."""
        self.opening = True
        opening = loop.run_in_executor(None, self.store._open, 0)
        opening.add_done_callback(lambda fut: self._opened(loop, fut))

    def _opened(
        self, loop: asyncio.AbstractEventLoop, fut: "asyncio.Future[sqlite3.Connection]"
    ) -> None:
        self.opening = False
        if not fut.cancelled() and fut.exception() is None:
            self.conn = fut.result()
            self.cur = self.conn.cursor()
            weakref.finalize(loop, _close_quietly, self.store, self.conn)
        else:
            # Until it opens, every call keeps the worker thread (which reports the store's own
            # error); another attempt after a second.
            self.retry_at = time.monotonic() + 1.0

    def ready(self, loop: asyncio.AbstractEventLoop) -> bool:
        """True once the loop's connection is open (in this process)."""
        if self.conn is not None:
            return self.pid == PID[0]
        if not self.opening and time.monotonic() >= self.retry_at:
            self._open(loop)
        return False

    def submit(self, name: str, plan: "Plan[Any, T]") -> "asyncio.Future[T]":
        """Queue primitive ``name``'s plan for the next group commit."""
        loop = running_loop()
        fut: "asyncio.Future[T]" = loop.create_future()
        self.pending.append((name, plan, fut))
        if len(self.pending) == 1:
            loop.call_soon(self._flush)
        return fut

    def submit_call(self, name: str, args: Tuple[Any, ...]) -> "asyncio.Future[Any]":
        """:meth:`submit` for the store's primitive ``name`` called with ``args`` (validated now,
        as the primitive validates them)."""
        plan = getattr(self.store, f"_plan_{name}")(*args)
        return self.submit(name, plan)

    def _flush(self) -> None:
        batch = [entry for entry in self.pending if not entry[2].done()]
        self.pending = []
        if not batch:
            return
        conn, cur = self.conn, self.cur
        writer = self.store._writer
        if conn is None or cur is None or not writer.acquire(blocking=False):
            _hand_back(batch)
            return
        try:
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error:
                _hand_back(batch)
                return
            answers = self._run(conn, cur, batch)
        finally:
            writer.release()
        _answer(answers)

    def _run(
        self, conn: sqlite3.Connection, cur: sqlite3.Cursor, batch: "List[_Entry]"
    ) -> "List[_Answer]":
        """Runs ``batch`` inside the open transaction and ends it; returns each answer. A group
        of one needs no savepoint: when its primitive fails, the transaction is rolled back."""
        clock = self.store._clock
        errors = self.store._errors
        answers: "List[_Answer]" = []
        alone = len(batch) == 1
        try:
            for name, plan, fut in batch:
                if not alone:
                    cur.execute(f"SAVEPOINT {_GROUP_SAVEPOINT}")
                try:
                    value = drive(plan, lambda op: _execute(cur, op, clock))
                except Exception as exc:  # noqa: BLE001 - answered to its own caller
                    if isinstance(exc, errors):
                        answers.append((fut, False, _caused(f"SQLite {name} failed", exc)))
                    else:
                        answers.append((fut, False, exc))
                    if alone:
                        cur.execute("ROLLBACK")
                        return answers
                    cur.execute(f"ROLLBACK TO {_GROUP_SAVEPOINT}")
                    cur.execute(f"RELEASE {_GROUP_SAVEPOINT}")
                else:
                    if not alone:
                        cur.execute(f"RELEASE {_GROUP_SAVEPOINT}")
                    answers.append((fut, True, value))
            cur.execute("COMMIT")
        except BaseException as exc:
            # The transaction itself failed (a savepoint statement or the commit): nothing of it
            # is durable. The primitives that ran are answered 503 (those that failed on their
            # own keep their error); those not started yet go back to the worker thread.
            try:
                if conn.in_transaction:
                    cur.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            cause: BaseException = exc

            def failed() -> StoreUnavailable:
                return _caused("SQLite group commit failed", cause)

            ran = len(answers)
            answers = [(fut, False, value if not ok else failed()) for fut, ok, value in answers]
            if ran < len(batch):
                answers.append((batch[ran][2], False, failed()))  # the one that broke it
                rest = batch[ran + 1:]
                if isinstance(exc, Exception):
                    _hand_back(rest)
                else:
                    answers.extend((fut, False, failed()) for _, _, fut in rest)
            if not isinstance(exc, Exception):
                _answer(answers)
                raise
            return answers
        self.batches += 1
        return answers


_Entry = Tuple[str, "Plan[Any, Any]", "asyncio.Future[Any]"]
_Answer = Tuple["asyncio.Future[Any]", bool, Any]


def _caused(message: str, exc: BaseException) -> StoreUnavailable:
    """``unavailable(message, exc)`` raised ``from exc``, as the worker thread's path raises it."""
    failed = unavailable(message, exc)
    failed.__cause__ = exc
    return failed


def _answer(answers: "List[_Answer]") -> None:
    for fut, ok, value in answers:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _hand_back(batch: "List[_Entry]") -> None:
    for _, plan, fut in batch:
        plan.close()
        if not fut.done():
            fut.set_exception(Unstarted())


def _close_quietly(store: SQLiteStore, conn: sqlite3.Connection) -> None:
    """Closes a finished loop's group connection and forgets it."""
    with store._all_lock:
        if conn in store._all:
            store._all.remove(conn)
    try:
        conn.close()
    except sqlite3.Error:
        pass


def loop_group(store: Any, op: Optional[str]) -> "Optional[_LoopGroup]":
    """The running loop's group commit for primitive ``op`` of ``store``, when ``store`` is
    exactly idempo's :class:`SQLiteStore` with none of its primitives replaced on the instance and
    ``op`` is one the group runs (:data:`GROUPED`); else None (the caller uses a worker thread)."""
    if type(store) is not SQLiteStore or op not in GROUPED:
        return None
    if not _OVERRIDES.isdisjoint(store.__dict__):
        return None
    return store._loop_group()


def _while_busy(bound_ms: int, what: str, step: Callable[[], T]) -> T:
    """Runs one setup step of a new connection, again while SQLite refuses it as busy, until
    ``bound_ms`` from the first attempt (core's schedule: pauses doubling from 1 ms to 25 ms).
    Switching a fresh file to WAL needs an exclusive lock, and SQLite refuses it at once, without
    its busy handler, while another connection opens the same file."""
    since = time.monotonic()
    refused = 0
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            if not _busy(exc):
                raise
            refused += 1
            pause = sqlite_setup_pause_ms(refused, int((time.monotonic() - since) * 1000), bound_ms)
            if pause is None:
                raise sqlite3.OperationalError(
                    f"{what}: the database stayed locked past busy_timeout_ms ({bound_ms} ms)"
                ) from exc
            time.sleep(pause / 1000)


def _busy(exc: sqlite3.OperationalError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY or "locked" in str(exc)


class SQLiteTransaction(SessionEnds, _Plans, PrimitivesBase):
    """One request's transactional session on a :class:`SQLiteStore` (``store.transaction()``).

    ``claim`` opens ``BEGIN IMMEDIATE`` on a dedicated connection (SQLite has one writer: every
    other write, on any key, waits for this transaction, up to ``busy_timeout_ms``); the handler
    writes on that connection and the later primitives (``complete`` included) write inside the
    transaction; :meth:`commit` runs ``COMMIT`` when core's flow asks for it (``spec/PROTOCOL.md``
    §7.6), ``release`` rolls back. A claim that waited ``busy_timeout_ms`` in vain is reported as an in-flight record
    (409 with ``Retry-After``).
    """

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.transaction: Optional[Transaction] = None
        self.committed = False
        """True once this session's transaction committed (the handler's writes are durable)."""
        self._conn: Optional[sqlite3.Connection] = None

    @property
    def open(self) -> bool:
        """True while the transaction is open."""
        return self._conn is not None

    def _end(self, *, commit: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        keep = False
        try:
            if conn.in_transaction:
                conn.execute("COMMIT" if commit else "ROLLBACK")
            self.committed = commit
            keep = True
        finally:
            self.store._give_back(conn, keep)

    def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        """Inside the open transaction; without one the step fails closed."""
        conn = self._conn
        if conn is None:
            raise no_open_transaction(self._what)
        try:
            return drive(plan, lambda op: _execute(conn, op, self.store._clock))
        except BaseException as exc:
            self._end(commit=False)
            if isinstance(exc, self._errors):
                raise unavailable(f"{self._what} {name} failed", exc) from exc
            raise

    @fail_closed(_errors, "SQLite claim failed")
    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """``BEGIN IMMEDIATE`` (first call), then primitive 1 inside the transaction."""
        plan = self._plan_claim(scope_key, fingerprint, token, lease_ms, ttl_ms)
        if self._conn is None:
            conn = self.store._dedicated()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    self.store._give_back(conn, False)
                    raise
                now = self.store._now(conn)
                self.store._give_back(conn, True)
                check_key(scope_key)
                return Locked(now)
            except BaseException:
                self.store._give_back(conn, False)
                raise
            self._conn = conn
            self.transaction = Transaction(conn, self.store)
        return self._drive("claim", plan)

