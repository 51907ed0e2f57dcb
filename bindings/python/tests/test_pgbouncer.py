"""The PostgreSQL stores behind PgBouncer in transaction pooling mode (``spec/STORAGE.md`` §4.6).

PgBouncer (started by ``scripts/test-services.sh``) hands each transaction to whichever server
connection is free, so a store that leaves state on a server session (a named prepared statement,
a plain ``SET``) breaks behind it. The conformance scenarios and the contract suite already run
against the ``pgbouncer`` store kinds (``storekit.py``); this module adds duplicate storms through
the pooler and checks that no named statement is ever created on a direct connection.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Dict, List

import psycopg
import pytest

import idempo
from idempo.stores import AsyncPostgresStore, PostgresStore
from idempo.stores._base import COMPLETED, Claimed, Existing

from storekit import _truncate_pg

KEYS = 12
CLIENTS_PER_KEY = 10
LEASE_MS = 30_000
TTL_MS = 600_000


def _scope(i: int) -> bytes:
    return idempo.scope_id("tenant", "POST", "/payments", f"storm-key-{i:04d}")


def _token(i: int, c: int) -> bytes:
    return os.urandom(8) + bytes([i % 256, c % 256]) + os.urandom(6)


def test_sync_duplicate_storm_through_pgbouncer_has_one_winner_per_key(services: Any) -> None:
    _truncate_pg(services.pg_dsn)
    store = PostgresStore(services.pgbouncer_dsn)
    winners: Dict[int, List[bytes]] = {i: [] for i in range(KEYS)}
    errors: List[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(KEYS * CLIENTS_PER_KEY)

    def client(i: int, c: int) -> None:
        token = _token(i, c)
        try:
            start.wait(timeout=30)
            result = store.claim(_scope(i), "v1:" + "a" * 64, token, LEASE_MS, TTL_MS)
            if isinstance(result, Claimed):
                response = idempo.encode_response(201, [], b'{"key":%d}' % i)
                assert store.complete(_scope(i), token, response, TTL_MS)
                with lock:
                    winners[i].append(token)
            else:
                assert isinstance(result, Existing), result
        except BaseException as exc:  # noqa: BLE001 - reported below
            with lock:
                errors.append(exc)

    threads = [
        threading.Thread(target=client, args=(i, c))
        for i in range(KEYS)
        for c in range(CLIENTS_PER_KEY)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a client got no answer within 60 s"
        assert errors == [], errors[:3]
        assert {i: len(w) for i, w in winners.items()} == {i: 1 for i in range(KEYS)}
        for i in range(KEYS):
            record, _now = store.get(_scope(i))
            assert record is not None and record.state == COMPLETED
            assert record.token == winners[i][0]
    finally:
        store.close()


def test_async_duplicate_storm_through_pgbouncer_has_one_winner_per_key(services: Any) -> None:
    _truncate_pg(services.pg_dsn)

    async def run() -> Dict[int, int]:
        # One store per client: each has its own connection to the pooler, as separate worker
        # processes would.
        clients = [AsyncPostgresStore(services.pgbouncer_dsn) for _ in range(CLIENTS_PER_KEY)]
        claimed: Dict[int, int] = {i: 0 for i in range(KEYS)}

        async def one(store: AsyncPostgresStore, i: int, c: int) -> None:
            token = _token(i, c)
            result = await store.claim(_scope(i), "v1:" + "b" * 64, token, LEASE_MS, TTL_MS)
            if isinstance(result, Claimed):
                claimed[i] += 1
                response = idempo.encode_response(201, [], b"{}")
                assert await store.complete(_scope(i), token, response, TTL_MS)
            else:
                assert isinstance(result, Existing), result

        try:
            await asyncio.wait_for(
                asyncio.gather(
                    *(one(store, i, c) for c, store in enumerate(clients) for i in range(KEYS))
                ),
                timeout=60,
            )
        finally:
            for store in clients:
                await store.close()
        return claimed

    assert asyncio.run(run()) == {i: 1 for i in range(KEYS)}


@pytest.mark.parametrize("prepared", [False, True])
def test_no_named_statement_is_created_unless_asked(services: Any, prepared: bool) -> None:
    _truncate_pg(services.pg_dsn)
    conn = psycopg.connect(services.pg_dsn, autocommit=True)
    try:
        store = PostgresStore(conn, prepared_statements=prepared)
        token = os.urandom(16)
        # More executions than psycopg's prepare threshold (5) of every statement kind used.
        for n in range(8):
            scope = idempo.scope_id("p", "POST", "/r", f"prepared-{prepared}-{n}")
            assert isinstance(store.claim(scope, "v1:" + "c" * 64, token, LEASE_MS, TTL_MS), Claimed)
            store.get(scope)
            assert store.renew(scope, token, LEASE_MS)
            assert store.release(scope, token)
        named = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
        assert named is not None
        if prepared:
            assert named[0] > 0
        else:
            assert named[0] == 0
    finally:
        conn.close()


def test_prepared_statements_must_be_a_bool(services: Any) -> None:
    with pytest.raises(idempo.InvalidArgument):
        PostgresStore(services.pg_dsn, prepared_statements="yes")  # type: ignore[arg-type]
