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

from idempo.stores._base import record_from_row
from idempo.stores.postgres._lease import MAX_IDLE_DEDICATED
from idempo.stores.postgres._plans import (
    CLAIM_ATTEMPTS,
    DEFAULT_TIMEOUT,
    POOL_ATTEMPTS,
    SCHEMA_LOCK,
    SCHEMA_STATEMENTS,
    CompletedRow,
)
from idempo.stores.postgres._sessions import AsyncPostgresTransaction, PostgresTransaction
from idempo.stores.postgres._stores import AsyncPostgresStore, PostgresStore

__all__ = [
    "CLAIM_ATTEMPTS",
    "DEFAULT_TIMEOUT",
    "MAX_IDLE_DEDICATED",
    "POOL_ATTEMPTS",
    "SCHEMA_LOCK",
    "SCHEMA_STATEMENTS",
    "AsyncPostgresStore",
    "AsyncPostgresTransaction",
    "CompletedRow",
    "PostgresStore",
    "PostgresTransaction",
    "record_from_row",
]
