"""Many threads, one key, every synchronous store: the handler runs exactly once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, List

import pytest
from storekit import SERVICE_KINDS, SYNC_KINDS, _flush_cluster, cluster_url

import idempo
from idempo._flow import Execution, HandlerResult, Hooks, run_sync
from idempo import stores


def make(kind: str, tmp_path: Path, services: Any) -> Any:
    if kind == "memory":
        return stores.MemoryStore()
    if kind == "sqlite":
        return stores.SQLiteStore(tmp_path / "threads.sqlite3")
    import redis

    client = redis.Redis.from_url(services.redis_url)
    client.flushdb()
    client.close()
    if kind == "redis":
        return stores.RedisStore(services.redis_url)
    if kind == "redis-cluster":
        _flush_cluster(services)
        return stores.RedisStore(cluster_url(services), cluster=True)
    pg = stores.PostgresStore(services.pg_dsn)
    pg.create_schema()
    with pg._conn() as conn:  # noqa: SLF001 - test setup
        conn.execute("TRUNCATE idempo_record")
    if kind == "postgres":
        return pg
    if kind == "pgbouncer":
        pg.close()
        return stores.PostgresStore(services.pgbouncer_dsn)
    assert kind == "cached", kind
    return stores.CachedStore(services.redis_url, pg)


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_threads_one_execution(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    services = request.getfixturevalue("services") if kind in SERVICE_KINDS else None
    store = make(kind, tmp_path, services)
    try:
        _play(store)
    finally:
        if kind == "cached":
            store.redis.close()
            store.postgres.close()
        elif hasattr(store, "close"):
            store.close()


def _play(store: Any) -> None:
    config = idempo.Config(lease_ms=5000)
    key = "thread-key-0001"
    scope = idempo.scope_id("tenant", "POST", "/charge", key)
    fp = idempo.fingerprint("POST", "/charge", b'{"amount":1}')
    executions: List[str] = []
    statuses: List[int] = []
    lock = threading.Lock()
    start = threading.Barrier(24)

    def handler(ex: Execution) -> HandlerResult:
        with lock:
            executions.append(ex.downstream_key)
        time.sleep(0.3)
        return HandlerResult(201, [("content-type", "application/json")], b'{"ok":true}')

    def worker() -> None:
        start.wait()
        r = run_sync(store=store, config=config, scope=scope, fingerprint=fp, key=key,
                     route="/charge", handler=handler, hooks=Hooks())
        with lock:
            statuses.append(r.status)

    threads = [threading.Thread(target=worker) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(executions) == 1
    assert sorted(statuses) == [201] + [409] * 23
    replay = run_sync(store=store, config=config, scope=scope, fingerprint=fp, key=key,
                      route="/charge", handler=handler, hooks=Hooks())
    assert replay.outcome == "replayed" and len(executions) == 1
