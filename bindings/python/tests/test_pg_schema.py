"""``create_schema()`` from several workers at once against a database without the table (a
deploy where every worker creates the schema at start-up), on a real server: all succeed, sync and
async. Before the DDL ran in one transaction after an advisory lock (``spec/STORAGE.md`` §4.1),
two concurrent ``CREATE TABLE IF NOT EXISTS`` failed with a unique violation on ``pg_type``."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Iterator, List

import psycopg
import pytest
from conftest import Services

from idempo.stores import AsyncPostgresStore, PostgresStore

pytestmark = pytest.mark.services

WORKERS = 4
ROUNDS = 12


@pytest.fixture()
def empty_db(services: Services) -> Iterator[str]:
    """A database of its own (the suite's shared one keeps its table), dropped afterwards."""
    name = f"idempo_schema_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    dsn = psycopg.conninfo.make_conninfo(services.pg_dsn, dbname=name)
    yield dsn
    with psycopg.connect(services.pg_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def _drop_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS idempo_record")


def test_workers_creating_the_schema_together_all_succeed(empty_db: str) -> None:
    failures: List[str] = []
    for _ in range(ROUNDS):
        _drop_table(empty_db)
        gate = threading.Barrier(WORKERS)

        def worker() -> None:
            store = PostgresStore(empty_db)
            try:
                gate.wait()
                store.create_schema()
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                failures.append(repr(exc))
            finally:
                store.close()

        threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []
    with psycopg.connect(empty_db) as conn:
        row = conn.execute("SELECT count(*) FROM pg_indexes WHERE tablename = 'idempo_record'")
        assert row.fetchone() == (2,)  # the primary key and the expiry index


def test_async_workers_creating_the_schema_together_all_succeed(empty_db: str) -> None:
    async def scenario() -> List[BaseException]:
        stores = [AsyncPostgresStore(empty_db) for _ in range(WORKERS)]
        try:
            got = await asyncio.gather(*(s.create_schema() for s in stores), return_exceptions=True)
        finally:
            for s in stores:
                await s.close()
        return [r for r in got if isinstance(r, BaseException)]

    failures: List[BaseException] = []
    for _ in range(ROUNDS):
        _drop_table(empty_db)
        failures += asyncio.run(scenario())
    assert failures == []
