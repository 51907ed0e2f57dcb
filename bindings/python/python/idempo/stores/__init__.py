"""Record stores implementing the eight primitives of ``spec/STORAGE.md``.

``MemoryStore`` and ``SQLiteStore`` need nothing beyond the standard library;
``PostgresStore`` needs psycopg 3 and ``RedisStore``/``CachedStore`` need redis-py, imported on
first use. Every store has an asyncio twin (``Async...``). The SQL stores also open transactional sessions
(``store.transaction()``: :class:`PostgresTransaction`, :class:`SQLiteTransaction`) for
transactional mode, where the handler's writes commit with the record.

Cleanup: ``store.purge_expired(batch=1000)`` deletes up to one batch of expired records (earliest
expiry first) and returns :class:`PurgeCounts` per state; :func:`purge_all` repeats it until a batch
comes back short. Run it periodically: from cron or a scheduler, or with the :class:`Purger`
thread::

    counts = purge_all(store, batch=1000)
    Purger(store, interval_s=300, on_counts=lambda c: metrics.gauge("idempo.purged", c.total)).start()
    log.info("idempo purge: %d records (%d completed)", counts.total, counts.completed)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from idempo.stores._base import (
    COMPLETED,
    IN_PROGRESS,
    OUTCOME_UNKNOWN,
    AsyncStore,
    Claimed,
    ClaimResult,
    Existing,
    Locked,
    PurgeCounts,
    Store,
    StoredRecord,
    StoreStats,
    Purger,
    purge_all,
    purge_all_async,
)
from idempo.stores.memory import AsyncMemoryStore, MemoryStore, memory_partition
from idempo.stores.sqlite import AsyncSQLiteStore, SQLiteStore, SQLiteTransaction
from idempo.stores._tx import ThreadedSession, Transaction

if TYPE_CHECKING:
    from idempo.stores.cached import AsyncCachedStore, CachedStore
    from idempo.stores.postgres import (
        AsyncPostgresStore,
        AsyncPostgresTransaction,
        PostgresStore,
        PostgresTransaction,
    )
    from idempo.stores.redis import AsyncRedisStore, RedisStore

_LAZY = {
    "PostgresStore": "idempo.stores.postgres",
    "AsyncPostgresStore": "idempo.stores.postgres",
    "PostgresTransaction": "idempo.stores.postgres",
    "AsyncPostgresTransaction": "idempo.stores.postgres",
    "RedisStore": "idempo.stores.redis",
    "AsyncRedisStore": "idempo.stores.redis",
    "CachedStore": "idempo.stores.cached",
    "AsyncCachedStore": "idempo.stores.cached",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'idempo.stores' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "COMPLETED",
    "IN_PROGRESS",
    "OUTCOME_UNKNOWN",
    "AsyncCachedStore",
    "AsyncMemoryStore",
    "AsyncPostgresStore",
    "AsyncPostgresTransaction",
    "AsyncRedisStore",
    "AsyncSQLiteStore",
    "AsyncStore",
    "CachedStore",
    "ClaimResult",
    "Claimed",
    "Existing",
    "Locked",
    "MemoryStore",
    "memory_partition",
    "PostgresStore",
    "PostgresTransaction",
    "PurgeCounts",
    "StoreStats",
    "Purger",
    "RedisStore",
    "SQLiteStore",
    "SQLiteTransaction",
    "ThreadedSession",
    "Transaction",
    "Store",
    "StoredRecord",
    "purge_all",
    "purge_all_async",
]
