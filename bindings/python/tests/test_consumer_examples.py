"""The consumer examples (bindings/python/examples) against real Redis Streams and PostgreSQL:
duplicated deliveries to several consumers and a redelivery after a lost acknowledgement run
the handler once per message."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import redis

from idempo.stores import PostgresStore, RedisStore

from storekit import _flush_redis, _truncate_pg

class Locked(list):  # type: ignore[type-arg]
    """A list appended to from several consumer threads."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def append(self, item: Any) -> None:
        with self._lock:
            super().append(item)


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import pg_job_queue  # noqa: E402
import redis_streams_consumer as rsc  # noqa: E402


def test_redis_streams_group_charges_each_message_once(services: Any) -> None:
    _flush_redis(services.redis_url)
    client: "redis.Redis" = redis.Redis.from_url(services.redis_url)
    rsc.ensure_group(client)
    # 20 orders, each added three times (a producer that retried its XADD).
    for n in range(20):
        for _ in range(3):
            client.xadd(rsc.STREAM, {"msg_id": f"m-{n}", "order": f"o-{n}"})
    shared = Locked()
    stores = [RedisStore(services.redis_url) for _ in range(3)]

    def consumer(i: int) -> None:
        c: "redis.Redis" = redis.Redis.from_url(services.redis_url)
        handler = rsc.make_handler(stores[i], shared)
        idle = 0
        while idle < 3:
            idle = idle + 1 if rsc.consume_once(c, f"c-{i}", handler, min_idle_ms=100) == 0 else 0

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o for o, _ in shared) == sorted(f"o-{n}" for n in range(20))
    pending = client.xpending(rsc.STREAM, rsc.GROUP)
    assert pending["pending"] == 0
    # A message delivered again after its acknowledgement was lost replays, without a charge.
    client.xadd(rsc.STREAM, {"msg_id": "m-3", "order": "o-3"})
    handler = rsc.make_handler(stores[0], shared)
    assert rsc.consume_once(client, "c-0", handler) == 1
    assert len(shared) == 20
    for s in stores:
        s.close()


def test_pg_skip_locked_jobs_run_once(services: Any) -> None:
    _truncate_pg(services.pg_dsn)
    with psycopg.connect(services.pg_dsn) as conn:
        conn.execute("DROP TABLE IF EXISTS jobs")
        conn.execute(pg_job_queue.SCHEMA)
        conn.commit()
        ids = [pg_job_queue.enqueue(conn, {"invoice": f"inv-{n}"}) for n in range(30)]
    shared = Locked()
    stores = [PostgresStore(services.pg_dsn) for _ in range(3)]

    def worker(i: int) -> None:
        with psycopg.connect(services.pg_dsn) as conn:
            handler = pg_job_queue.make_handler(stores[i], shared)
            while pg_job_queue.work_once(conn, handler) is not None:
                pass

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(shared) == ids
    # A worker that died after the handler, before marking the job done: the job is visible
    # again and its redelivery replays the stored result without sending again.
    with psycopg.connect(services.pg_dsn) as conn:
        conn.execute("UPDATE jobs SET done = false, visible_at = now() WHERE id = %s", (ids[4],))
        conn.commit()
        handler = pg_job_queue.make_handler(stores[0], shared)
        assert pg_job_queue.work_once(conn, handler) == ids[4]
        row = conn.execute("SELECT done, result FROM jobs WHERE id = %s", (ids[4],)).fetchone()
        assert row is not None and row[0] is True and row[1] == {"invoice": "inv-4", "sent": True}
    assert len(shared) == 30
    for s in stores:
        s.close()
