"""Builds every store variant behind one awaitable interface for the parametrized suites."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional

SYNC_KINDS = ["memory", "sqlite", "postgres", "pgbouncer", "redis", "redis-cluster", "cached"]
ASYNC_KINDS = [
    "async-memory",
    "async-sqlite",
    "async-postgres",
    "async-pgbouncer",
    "async-redis",
    "async-redis-cluster",
    "async-cached",
]
ALL_KINDS = SYNC_KINDS + ASYNC_KINDS
SERVICE_KINDS = {
    "postgres",
    "pgbouncer",
    "redis",
    "cached",
    "async-postgres",
    "async-pgbouncer",
    "async-redis",
    "async-redis-cluster",
    "async-cached",
    "redis-cluster",
}


class SyncAsAsync:
    """Awaitable facade over a sync store: each primitive runs in a worker thread, so many
    concurrent calls really race inside the store."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(fn, *args, **kwargs)

        return call


def _flush_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


def cluster_url(services: Any) -> str:
    """A URL of one node of the test Redis Cluster (any node seeds a cluster client)."""
    return "redis://" + str(services.redis_cluster_nodes).split(",")[0]


def _flush_cluster(services: Any) -> None:
    import redis

    for node in str(services.redis_cluster_nodes).split(","):
        client = redis.Redis.from_url("redis://" + node)
        client.flushall()
        client.close()


def _truncate_pg(dsn: str) -> None:
    from idempo.stores import PostgresStore

    store = PostgresStore(dsn)
    store.create_schema()
    with store._conn() as conn:  # noqa: SLF001 - test setup
        conn.execute("TRUNCATE idempo_record")
    store.close()


@asynccontextmanager
async def open_store(
    kind: str, tmp_path: Path, services: Optional[Any], clock: Optional[Callable[[], int]] = None
) -> AsyncIterator[Any]:
    """Yields (an awaitable store) of the given kind, fresh and empty."""
    from idempo import stores

    if kind in SERVICE_KINDS:
        assert services is not None
        _truncate_pg(services.pg_dsn)
        _flush_redis(services.redis_url)
        if "cluster" in kind:
            _flush_cluster(services)
    if kind == "memory":
        yield SyncAsAsync(stores.MemoryStore(clock=clock))
    elif kind == "sqlite":
        s = stores.SQLiteStore(tmp_path / "idempo.sqlite3", clock=clock)
        try:
            yield SyncAsAsync(s)
        finally:
            s.close()
    elif kind == "postgres":
        s = stores.PostgresStore(services.pg_dsn, clock=clock)
        try:
            yield SyncAsAsync(s)
        finally:
            s.close()
    elif kind == "pgbouncer":
        # The same server behind PgBouncer in transaction pooling mode.
        s = stores.PostgresStore(services.pgbouncer_dsn, clock=clock)
        try:
            yield SyncAsAsync(s)
        finally:
            s.close()
    elif kind == "redis":
        s = stores.RedisStore(services.redis_url, clock=clock)
        try:
            yield SyncAsAsync(s)
        finally:
            s.close()
    elif kind == "redis-cluster":
        s = stores.RedisStore(cluster_url(services), cluster=True, clock=clock)
        try:
            yield SyncAsAsync(s)
        finally:
            s.close()
    elif kind == "cached":
        pg = stores.PostgresStore(services.pg_dsn, clock=clock)
        s = stores.CachedStore(services.redis_url, pg, clock=clock)
        try:
            yield SyncAsAsync(s)
        finally:
            s.redis.close()
            pg.close()
    elif kind == "async-memory":
        yield stores.AsyncMemoryStore(clock=clock)
    elif kind == "async-sqlite":
        a = stores.AsyncSQLiteStore(tmp_path / "idempo-async.sqlite3", clock=clock)
        try:
            yield a
        finally:
            a.close()
    elif kind == "async-postgres":
        a = stores.AsyncPostgresStore(services.pg_dsn, clock=clock)
        try:
            yield a
        finally:
            await a.close()
    elif kind == "async-pgbouncer":
        a = stores.AsyncPostgresStore(services.pgbouncer_dsn, clock=clock)
        try:
            yield a
        finally:
            await a.close()
    elif kind == "async-redis":
        a = stores.AsyncRedisStore(services.redis_url, clock=clock)
        try:
            yield a
        finally:
            await a.close()
    elif kind == "async-redis-cluster":
        a = stores.AsyncRedisStore(cluster_url(services), cluster=True, clock=clock)
        try:
            yield a
        finally:
            await a.close()
    elif kind == "async-cached":
        apg = stores.AsyncPostgresStore(services.pg_dsn, clock=clock)
        a = stores.AsyncCachedStore(services.redis_url, apg, clock=clock)
        try:
            yield a
        finally:
            await a.redis.aclose()
            await apg.close()
    else:
        raise ValueError(kind)
