"""The PostgreSQL plans: core's statements (``spec/STORAGE.md`` §4) as the operations of each
primitive, and how one operation runs on a psycopg connection."""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple, Type, TypeVar

from idempo._idempo import StoreUnavailable
from idempo._options import default
from idempo.stores._primitives import Plan, PlanHooks
from idempo.stores._recipes import pyformat, recipe
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
    record_or_none,
)

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.postgres needs psycopg 3: pip install 'psycopg[binary]'") from exc


T = TypeVar("T")

DEFAULT_TIMEOUT = default("postgres_store", "timeout_ms") / 1000
"""Seconds a store operation may take before the store gives up on the server (client side;
``timeout_ms``, from core)."""
POOL_ATTEMPTS = 4

NOW = recipe("postgres_now")
"""The database clock in unix ms (``spec/STORAGE.md`` §4.2)."""
COLUMNS = "scope_key, fingerprint, state, token, generation, lease_until, expires_at, response"
CLAIM_ATTEMPTS = 3

SCHEMA_STATEMENTS = tuple(
    s.strip() for s in recipe("postgres_schema").split(";") if s.strip()
)
"""The DDL ``create_schema()`` runs; copy it into your migrations instead if you prefer."""

SCHEMA_LOCK = recipe("postgres_schema_lock")
"""The advisory lock ``create_schema()`` takes first, in the same transaction as the DDL, so
workers starting together create the schema one after another (``spec/STORAGE.md`` §4.1)."""

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
    """One statement claims or reads the live record (``spec/STORAGE.md`` §4.3); no row: the
    conflicting row was not in the statement's snapshot, or vanished: claim again."""
    key: bytes = claim.params["p1"]
    for _ in range(CLAIM_ATTEMPTS):
        try:
            row = yield claim
        except psycopg.errors.LockNotAvailable:
            if lock_wait_ms is None:
                raise
            now = yield _stmt(SQL_NOW)
            return Locked(int(now[0]))
        if row is None:
            continue
        if row[0]:
            return Claimed(int(row[4]), int(row[8]))
        record, now_ms = record_or_none(key, row[1:]), int(row[8])
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
