"""SQLite store: the embedded default, for one host (any number of processes on it).

Every connection runs ``journal_mode=WAL``, ``synchronous=FULL`` (with ``NORMAL`` a committed
completion may roll back after a power loss, and a lost completion re-executes) and a
``busy_timeout``; it is opened with ``isolation_level=None`` so Python never opens a deferred
transaction on its own, and each read-then-write primitive runs in ``BEGIN IMMEDIATE`` (the write
lock first, so ``busy_timeout`` applies and no ``SQLITE_BUSY_SNAPSHOT`` can occur). Time is the
SQLite host's clock in milliseconds. WAL does not work over a network filesystem: keep the file
local.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Tuple, TypeVar, Union

from idempo._idempo import InvalidArgument
from idempo.stores._base import (
    COMPLETED,
    IN_PROGRESS,
    OUTCOME_UNKNOWN,
    TABLE,
    ClaimResult,
    Claimed,
    Existing,
    PurgeCounts,
    StoredRecord,
    check_batch,
    check_key,
    check_ms,
    check_token,
    fail_closed,
)
from idempo.stores._tx import ThreadedSession, Transaction, lock_wait_expired

T = TypeVar("T")

_NOW = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
_COLUMNS = "scope_key, fingerprint, state, token, generation, lease_until, expires_at, response"
MIN_SQLITE = (3, 24, 0)
MAX_IDLE_DEDICATED = 16
"""Idle connections a store keeps for transactional requests."""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
  scope_key   BLOB PRIMARY KEY CHECK (length(scope_key) = 32),
  fingerprint TEXT NOT NULL,
  state       INTEGER NOT NULL CHECK (state IN ({IN_PROGRESS}, {COMPLETED}, {OUTCOME_UNKNOWN})),
  token       BLOB NOT NULL CHECK (length(token) = 16),
  generation  INTEGER NOT NULL CHECK (generation >= 1),
  lease_until INTEGER,
  expires_at  INTEGER NOT NULL,
  response    BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {TABLE}_expires_at ON {TABLE} (expires_at);
"""

_errors = (sqlite3.Error,)


def _record(row: Tuple[Any, ...]) -> StoredRecord:
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


def _claim_in(
    conn: sqlite3.Connection, now: int, key: bytes, fp: str, tok: bytes, lease_ms: int, ttl_ms: int
) -> ClaimResult:
    row = conn.execute(f"SELECT {_COLUMNS} FROM {TABLE} WHERE scope_key = ?", (key,)).fetchone()
    if row is not None and int(row[6]) > now:
        return Existing(_record(row), now)
    generation = 1 if row is None else min(int(row[4]) + 1, 2**31 - 1)
    conn.execute(
        f"INSERT OR REPLACE INTO {TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
        (key, fp, IN_PROGRESS, tok, generation, now + lease_ms, now + max(ttl_ms, lease_ms)),
    )
    return Claimed(generation, now)


def _get_in(
    conn: sqlite3.Connection, clock: Optional[Callable[[], int]], key: bytes
) -> Tuple[Optional[StoredRecord], int]:
    # One statement, one snapshot: the row and the clock together.
    now_sql = _NOW if clock is None else str(int(clock()))
    row = conn.execute(
        f"SELECT {now_sql}, r.scope_key, r.fingerprint, r.state, r.token, r.generation, "
        f"r.lease_until, r.expires_at, r.response FROM (SELECT 1) "
        f"LEFT JOIN {TABLE} r ON r.scope_key = ?",
        (key,),
    ).fetchone()
    now = int(row[0])
    return (None if row[1] is None else _record(row[1:])), now


def _takeover_in(
    conn: sqlite3.Connection, now: int, key: bytes, seen: bytes, new: bytes, lease_ms: int
) -> Optional[int]:
    cur = conn.execute(
        f"UPDATE {TABLE} SET token = :new, lease_until = :now + :lease, "
        f"expires_at = max(expires_at, :now + :lease) "
        f"WHERE scope_key = :key AND state = {IN_PROGRESS} AND token = :seen "
        f"AND lease_until <= :now",
        {"new": new, "now": now, "lease": lease_ms, "key": key, "seen": seen},
    )
    if cur.rowcount != 1:
        return None
    gen = conn.execute(f"SELECT generation FROM {TABLE} WHERE scope_key = ?", (key,)).fetchone()
    return int(gen[0])


def _mark_unknown_in(
    conn: sqlite3.Connection, now: int, key: bytes, seen: bytes, ttl_ms: int
) -> bool:
    cur = conn.execute(
        f"UPDATE {TABLE} SET state = {OUTCOME_UNKNOWN}, lease_until = NULL, "
        f"expires_at = :now + :ttl WHERE scope_key = :key AND state = {IN_PROGRESS} "
        f"AND token = :seen AND lease_until <= :now",
        {"now": now, "ttl": ttl_ms, "key": key, "seen": seen},
    )
    return cur.rowcount == 1


def _complete_in(
    conn: sqlite3.Connection, now: int, key: bytes, tok: bytes, response: bytes, ttl_ms: int
) -> bool:
    cur = conn.execute(
        f"UPDATE {TABLE} SET state = {COMPLETED}, response = :resp, lease_until = NULL, "
        f"expires_at = :now + :ttl WHERE scope_key = :key AND state = {IN_PROGRESS} "
        f"AND token = :tok",
        {"resp": response, "now": now, "ttl": ttl_ms, "key": key, "tok": tok},
    )
    return cur.rowcount == 1


def _renew_in(conn: sqlite3.Connection, now: int, key: bytes, tok: bytes, lease_ms: int) -> bool:
    cur = conn.execute(
        f"UPDATE {TABLE} SET lease_until = :now + :lease, "
        f"expires_at = max(expires_at, :now + :lease) "
        f"WHERE scope_key = :key AND state = {IN_PROGRESS} AND token = :tok",
        {"now": now, "lease": lease_ms, "key": key, "tok": tok},
    )
    return cur.rowcount == 1


class SQLiteStore:
    """The storage contract on one SQLite database file (one connection per thread)."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        busy_timeout_ms: int = 5000,
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
        if create_schema:
            self.create_schema()

    def _conn(self) -> sqlite3.Connection:
        conn: Optional[sqlite3.Connection] = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        conn = self._open()
        self._local.conn = conn
        self._local.pid = os.getpid()
        return conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout_ms / 1000,
            isolation_level=None,
            # Each connection is used only by the thread that opened it; close() may run
            # elsewhere.
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal" and self.path != ":memory:":
            conn.close()
            raise InvalidArgument(f"SQLite refused WAL mode for {self.path!r}")
        conn.execute("PRAGMA synchronous = FULL")
        with self._all_lock:
            self._all.append(conn)
        return conn

    @contextmanager
    def _immediate(self) -> Iterator[Tuple[sqlite3.Connection, int]]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self._clock is not None:
                now = self._clock()
            else:
                now = int(conn.execute(f"SELECT {_NOW}").fetchone()[0])
            yield conn, now
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def _dedicated(self) -> sqlite3.Connection:
        """A connection for one transactional request (kept idle between requests)."""
        with self._all_lock:
            while self._idle:
                pid, conn = self._idle.pop()
                if pid == os.getpid():
                    return conn
        return self._open()

    def _give_back(self, conn: sqlite3.Connection, keep: bool) -> None:
        with self._all_lock:
            if keep and not conn.in_transaction and len(self._idle) < MAX_IDLE_DEDICATED:
                self._idle.append((os.getpid(), conn))
                return
            if conn in self._all:
                self._all.remove(conn)
        conn.close()

    def _now(self, conn: sqlite3.Connection) -> int:
        if self._clock is not None:
            return int(self._clock())
        return int(conn.execute(f"SELECT {_NOW}").fetchone()[0])

    def transaction(self) -> "SQLiteTransaction":
        """A transactional session for one request (see :class:`SQLiteTransaction`)."""
        return SQLiteTransaction(self)

    @fail_closed(_errors, "SQLite create_schema failed")
    def create_schema(self) -> None:
        """Creates the table and its expiry index (idempotent)."""
        self._conn().executescript(SCHEMA)

    def close(self) -> None:
        """Closes every connection this store opened (in any thread)."""
        with self._all_lock:
            conns, self._all = self._all, []
            self._idle = []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    @fail_closed(_errors, "SQLite claim failed")
    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """Primitive 1: insert-if-absent (an expired record counts as absent)."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("lease_ms", lease_ms)
        check_ms("ttl_ms", ttl_ms)
        with self._immediate() as (conn, now):
            return _claim_in(conn, now, key, fingerprint, tok, lease_ms, ttl_ms)

    @fail_closed(_errors, "SQLite get failed")
    def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: the record (expired ones included) and the store's now."""
        key = check_key(scope_key)
        return _get_in(self._conn(), self._clock, key)

    @fail_closed(_errors, "SQLite takeover failed")
    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3: take over an expired lease with a new token."""
        key = check_key(scope_key)
        seen = check_token(seen_token)
        new = check_token(new_token)
        check_ms("lease_ms", lease_ms)
        with self._immediate() as (conn, now):
            return _takeover_in(conn, now, key, seen, new, lease_ms)

    @fail_closed(_errors, "SQLite mark_unknown failed")
    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4: an abandoned in-progress record becomes outcome-unknown."""
        key = check_key(scope_key)
        seen = check_token(seen_token)
        check_ms("ttl_ms", ttl_ms)
        with self._immediate() as (conn, now):
            return _mark_unknown_in(conn, now, key, seen, ttl_ms)

    @fail_closed(_errors, "SQLite complete failed")
    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        """Primitive 5: store the response, only while still holding the token."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("ttl_ms", ttl_ms)
        with self._immediate() as (conn, now):
            return _complete_in(conn, now, key, tok, bytes(response), ttl_ms)

    @fail_closed(_errors, "SQLite release failed")
    def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6: delete the caller's own in-progress record."""
        key = check_key(scope_key)
        tok = check_token(token)
        with self._immediate() as (conn, _now):
            cur = conn.execute(
                f"DELETE FROM {TABLE} WHERE scope_key = ? AND state = {IN_PROGRESS} AND token = ?",
                (key, tok),
            )
            return cur.rowcount == 1

    @fail_closed(_errors, "SQLite renew failed")
    def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7: extend the caller's lease (heartbeat)."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("lease_ms", lease_ms)
        with self._immediate() as (conn, now):
            return _renew_in(conn, now, key, tok, lease_ms)

    @fail_closed(_errors, "SQLite purge_expired failed")
    def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records (earliest expiry first) in one
        ``BEGIN IMMEDIATE``; counts per state."""
        check_batch(batch)
        with self._immediate() as (conn, now):
            rows = conn.execute(
                f"SELECT scope_key, state FROM {TABLE} WHERE expires_at <= ? "
                f"ORDER BY expires_at LIMIT ?",
                (now, batch),
            ).fetchall()
            conn.executemany(f"DELETE FROM {TABLE} WHERE scope_key = ?", [(r[0],) for r in rows])
        return PurgeCounts.from_states([int(r[1]) for r in rows])


class AsyncSQLiteStore:
    """The asyncio face of :class:`SQLiteStore`: each primitive runs in a worker thread."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], **kwargs: Any) -> None:
        self.sync = SQLiteStore(path, **kwargs)

    async def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        return await asyncio.to_thread(
            self.sync.claim, scope_key, fingerprint, token, lease_ms, ttl_ms
        )

    async def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        return await asyncio.to_thread(self.sync.get, scope_key)

    async def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        return await asyncio.to_thread(self.sync.takeover, scope_key, seen_token, new_token, lease_ms)

    async def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        return await asyncio.to_thread(self.sync.mark_unknown, scope_key, seen_token, ttl_ms)

    async def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        return await asyncio.to_thread(self.sync.complete, scope_key, token, response, ttl_ms)

    async def release(self, scope_key: bytes, token: bytes) -> bool:
        return await asyncio.to_thread(self.sync.release, scope_key, token)

    async def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        return await asyncio.to_thread(self.sync.renew, scope_key, token, lease_ms)

    async def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        return await asyncio.to_thread(self.sync.purge_expired, batch)

    def transaction(self) -> ThreadedSession:
        """A transactional session for one request (a :class:`SQLiteTransaction` on a thread of
        its own)."""
        return ThreadedSession(self.sync.transaction())

    def close(self) -> None:
        """Closes the underlying connections."""
        self.sync.close()


def _busy(exc: sqlite3.OperationalError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY or "locked" in str(exc)


class SQLiteTransaction:
    """One request's transactional session on a :class:`SQLiteStore` (``store.transaction()``).

    ``claim`` opens ``BEGIN IMMEDIATE`` on a dedicated connection (SQLite has one writer: every
    other write, on any key, waits for this transaction, up to ``busy_timeout_ms``); the handler
    writes on that connection; ``complete`` writes the record and commits, ``release`` rolls
    back. A claim that waited ``busy_timeout_ms`` in vain is reported as an in-flight record
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

    def _in(self, fn: Callable[[sqlite3.Connection, int], T]) -> T:
        conn = self._conn
        assert conn is not None
        try:
            return fn(conn, self.store._now(conn))
        except BaseException:
            self._end(commit=False)
            raise

    @fail_closed(_errors, "SQLite claim failed")
    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """``BEGIN IMMEDIATE`` (first call), then primitive 1 inside the transaction."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("lease_ms", lease_ms)
        check_ms("ttl_ms", ttl_ms)
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
                return lock_wait_expired(key, fingerprint, now, self.store._busy_timeout_ms)
            except BaseException:
                self.store._give_back(conn, False)
                raise
            self._conn = conn
            self.transaction = Transaction(conn, self.store)
        return self._in(lambda c, now: _claim_in(c, now, key, fingerprint, tok, lease_ms, ttl_ms))

    @fail_closed(_errors, "SQLite get failed")
    def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2 (inside the transaction while it is open)."""
        key = check_key(scope_key)
        if self._conn is None:
            return self.store.get(key)
        return self._in(lambda c, _now: _get_in(c, self.store._clock, key))

    @fail_closed(_errors, "SQLite takeover failed")
    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3 inside the transaction."""
        if self._conn is None:
            return self.store.takeover(scope_key, seen_token, new_token, lease_ms)
        key, seen, new = check_key(scope_key), check_token(seen_token), check_token(new_token)
        check_ms("lease_ms", lease_ms)
        return self._in(lambda c, now: _takeover_in(c, now, key, seen, new, lease_ms))

    @fail_closed(_errors, "SQLite mark_unknown failed")
    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4 inside the transaction."""
        if self._conn is None:
            return self.store.mark_unknown(scope_key, seen_token, ttl_ms)
        key, seen = check_key(scope_key), check_token(seen_token)
        check_ms("ttl_ms", ttl_ms)
        return self._in(lambda c, now: _mark_unknown_in(c, now, key, seen, ttl_ms))

    @fail_closed(_errors, "SQLite complete failed")
    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        """Primitive 5, then ``COMMIT`` (``ROLLBACK`` when the token is not ours)."""
        if self._conn is None:
            return self.store.complete(scope_key, token, response, ttl_ms)
        key, tok = check_key(scope_key), check_token(token)
        check_ms("ttl_ms", ttl_ms)
        body = bytes(response)
        done = self._in(lambda c, now: _complete_in(c, now, key, tok, body, ttl_ms))
        self._end(commit=done)
        return done

    @fail_closed(_errors, "SQLite release failed")
    def release(self, scope_key: bytes, token: bytes) -> bool:
        """``ROLLBACK``: the claim and the handler's writes vanish together."""
        if self._conn is None:
            return self.store.release(scope_key, token)
        self._end(commit=False)
        return True

    @fail_closed(_errors, "SQLite renew failed")
    def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7 inside the transaction (core asks for it only to expire a lease)."""
        if self._conn is None:
            return self.store.renew(scope_key, token, lease_ms)
        key, tok = check_key(scope_key), check_token(token)
        check_ms("lease_ms", lease_ms)
        return self._in(lambda c, now: _renew_in(c, now, key, tok, lease_ms))

    @fail_closed(_errors, "SQLite commit failed")
    def finish(self) -> None:
        """Commits what is still open (a flow that ended without ``complete``)."""
        self._end(commit=True)

    def close(self) -> None:
        """Rolls back what is still open and gives the connection back."""
        self._end(commit=False)

