"""Transactional mode against real PostgreSQL and SQLite (sync and async stores): the handler's
business row and the idempotency record commit together or not at all."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import (
    AsyncPostgresStore,
    AsyncSQLiteStore,
    MemoryStore,
    PostgresStore,
    SQLiteStore,
)

KINDS = ["postgres", "async-postgres", "sqlite", "async-sqlite"]
PG_TABLE = "CREATE TABLE IF NOT EXISTS tx_payment (id bigserial PRIMARY KEY, note text NOT NULL)"
PG_DEFERRED = (
    "CREATE TABLE IF NOT EXISTS tx_deferred (id int, CONSTRAINT tx_deferred_once UNIQUE (id) "
    "DEFERRABLE INITIALLY DEFERRED)"
)
LITE_TABLE = "CREATE TABLE IF NOT EXISTS tx_payment (id INTEGER PRIMARY KEY, note TEXT NOT NULL)"


class Bench:
    """A store of one kind, its business table, and ways to count both tables."""

    def __init__(self, kind: str, tmp_path: Path, dsn: str, **options: Any) -> None:
        self.kind = kind
        self.dsn = dsn
        self.path = tmp_path / "tx.sqlite3"
        pg = kind.endswith("postgres")
        if pg:
            setup = PostgresStore(dsn)
            setup.create_schema()
            with setup._conn() as conn:  # noqa: SLF001 - test setup
                conn.execute(PG_TABLE)
                conn.execute(PG_DEFERRED)
                conn.execute("TRUNCATE idempo_record, tx_payment, tx_deferred")
            setup.close()
        else:
            lite = SQLiteStore(self.path)
            lite._conn().execute(LITE_TABLE)  # noqa: SLF001 - test setup
            lite.close()
        factory: Any = {
            "postgres": PostgresStore,
            "async-postgres": AsyncPostgresStore,
            "sqlite": SQLiteStore,
            "async-sqlite": AsyncSQLiteStore,
        }[kind]
        self.store = factory(dsn if pg else self.path, **options)

    def counts(self) -> Tuple[int, int]:
        """(business rows, record rows), read on a fresh connection."""
        if self.kind.endswith("postgres"):
            import psycopg

            with psycopg.connect(self.dsn, autocommit=True) as conn:
                payments = conn.execute("SELECT count(*) FROM tx_payment").fetchone()
                records = conn.execute("SELECT count(*) FROM idempo_record").fetchone()
        else:
            import sqlite3

            conn = sqlite3.connect(self.path)
            payments = conn.execute("SELECT count(*) FROM tx_payment").fetchone()
            records = conn.execute("SELECT count(*) FROM idempo_record").fetchone()
            conn.close()
        assert payments is not None and records is not None
        return int(payments[0]), int(records[0])

    async def close(self) -> None:
        result = self.store.close()
        if asyncio.iscoroutine(result):
            await result


async def insert(note: str) -> None:
    """The handler's business write, through the open transaction."""
    conn = idempo.current_transaction().connection
    if isinstance(conn, __import__("sqlite3").Connection):
        conn.execute("INSERT INTO tx_payment (note) VALUES (?)", (note,))
        return
    result = conn.execute("INSERT INTO tx_payment (note) VALUES (%s)", (note,))
    if asyncio.iscoroutine(result):
        await result


async def run_sql(sqlite_sql: str, pg_sql: str) -> None:
    """One statement through the open transaction (the handler's connection)."""
    conn = idempo.current_transaction().connection
    if isinstance(conn, __import__("sqlite3").Connection):
        conn.execute(sqlite_sql)
        return
    result = conn.execute(pg_sql)
    if asyncio.iscoroutine(result):
        await result


async def steal_the_claim() -> None:
    """Inside the transaction, the record's token changes: the completion will not apply."""
    await run_sql(
        "UPDATE idempo_record SET token = zeroblob(16)",
        "UPDATE idempo_record SET token = '\\x00000000000000000000000000000000'::bytea",
    )


async def break_the_commit() -> None:
    """A deferred unique constraint violated now fails only at ``COMMIT`` (PostgreSQL)."""
    await run_sql("", "INSERT INTO tx_deferred (id) VALUES (1), (1)")


def make_app(bench: Bench, **options: Any) -> Starlette:
    async def pay(request: Request) -> Response:
        body = await request.json()
        assert request.state.idempotency.transaction is idempo.current_transaction()
        await insert(str(body.get("note", "")))
        if body.get("steal"):
            await steal_the_claim()
        if body.get("break_commit"):
            await break_the_commit()
        if body.get("sleep"):
            await asyncio.sleep(float(body["sleep"]))
        if body.get("fail"):
            raise RuntimeError("handler failed after its write")
        return JSONResponse({"note": body.get("note")}, status_code=int(body.get("status", 201)))

    app = Starlette(routes=[Route("/pay", pay, methods=["POST"])])
    options.setdefault("config", idempo.Config(transactional=True))
    app.add_middleware(IdempotencyMiddleware, store=bench.store, **options)
    return app


def client(app: Starlette) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30)


def dsn_for(kind: str, request: pytest.FixtureRequest) -> str:
    if kind.endswith("postgres"):
        services = request.getfixturevalue("services")
        return str(services.pg_dsn)
    return ""


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param.endswith("postgres"):
        request.applymarker(pytest.mark.services)
    yield request.param


def post(c: httpx.AsyncClient, key: str, body: Dict[str, Any]) -> Any:
    return c.post("/pay", json=body, headers={"Idempotency-Key": key})


def test_business_row_and_record_commit_together(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def scenario() -> None:
        bench = Bench(kind, tmp_path, dsn_for(kind, request))
        async with client(make_app(bench)) as c:
            first = await post(c, "commit-key-1", {"note": "a"})
            assert first.status_code == 201 and first.json() == {"note": "a"}
            assert bench.counts() == (1, 1)
            replay = await post(c, "commit-key-1", {"note": "a"})
            assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
            assert replay.content == first.content
            mismatch = await post(c, "commit-key-1", {"note": "b"})
            assert mismatch.status_code == 422
            assert bench.counts() == (1, 1)
        await bench.close()

    asyncio.run(scenario())


def test_handler_exception_leaves_neither_row(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def scenario() -> None:
        bench = Bench(kind, tmp_path, dsn_for(kind, request))
        async with client(make_app(bench)) as c:
            failed = await post(c, "fail-key-01", {"note": "x", "fail": True})
            assert failed.status_code == 500
            assert bench.counts() == (0, 0)
            # Nothing was left behind: the same key runs at once (no lease to wait for).
            retry = await post(c, "fail-key-01", {"note": "x"})
            assert retry.status_code == 201 and "idempotent-replayed" not in retry.headers
            assert bench.counts() == (1, 1)
        await bench.close()

    asyncio.run(scenario())


def test_status_not_stored_rolls_the_writes_back(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def scenario() -> None:
        bench = Bench(kind, tmp_path, dsn_for(kind, request))
        async with client(make_app(bench)) as c:
            r = await post(c, "status-key-1", {"note": "y", "status": 500})
            assert r.status_code == 500 and r.json() == {"note": "y"}
            assert bench.counts() == (0, 0)
        await bench.close()

    asyncio.run(scenario())


def test_too_large_response_commits_as_not_retained_even_under_re_run(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Core's transactional flow: a response too large to keep is committed with the record
    completed as the response-not-retained problem (never left in progress, where re_run would
    run the committed write again), and the live client gets the handler's response only after
    the commit."""

    async def scenario() -> None:
        bench = Bench(kind, tmp_path, dsn_for(kind, request))
        outcomes: List[str] = []
        hooks = idempo.Hooks(on_outcome=lambda route, outcome: outcomes.append(outcome))
        config = idempo.Config(max_stored_body_bytes=4, takeover="re_run", transactional=True)
        async with client(make_app(bench, config=config, hooks=hooks)) as c:
            first = await post(c, "large-key-01", {"note": "too long to keep"})
            assert first.status_code == 201 and first.json() == {"note": "too long to keep"}
            assert bench.counts() == (1, 1)
            again = await post(c, "large-key-01", {"note": "too long to keep"})
            assert again.status_code == 500
            assert again.headers["idempotent-replayed"] == "true"
            assert again.json()["type"] == "urn:idempo:problem:response-not-retained"
            assert bench.counts() == (1, 1)
        assert outcomes == ["not_retained", "replayed"]
        await bench.close()

    asyncio.run(scenario())


def test_failed_commit_is_503_and_nothing_stored(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Core's ``commit`` is the session's ``COMMIT``: when it fails (here a deferred constraint
    the handler violated) the client gets 503 ``not_committed``, and neither row exists."""
    if not kind.endswith("postgres"):
        pytest.skip("a COMMIT that fails needs a deferred constraint (PostgreSQL)")

    async def scenario() -> None:
        bench = Bench(kind, tmp_path, dsn_for(kind, request))
        outcomes: List[str] = []
        hooks = idempo.Hooks(on_outcome=lambda route, outcome: outcomes.append(outcome))
        async with client(make_app(bench, hooks=hooks)) as c:
            r = await post(c, "commit-fail-1", {"note": "c", "break_commit": True})
            assert r.status_code == 503
            assert r.json()["type"] == "urn:idempo:problem:store-unavailable"
            assert int(r.headers["retry-after"]) >= 1
            assert bench.counts() == (0, 0)
            # Nothing was kept: the same key runs anew and commits.
            again = await post(c, "commit-fail-1", {"note": "c"})
            assert again.status_code == 201 and "idempotent-replayed" not in again.headers
        assert outcomes == ["not_committed", "stored"]
        assert bench.counts() == (1, 1)
        await bench.close()

    asyncio.run(scenario())


def test_refused_completion_then_release_rolls_back_on_the_same_connection(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A completion that does not apply leaves the transaction open; core's ``release`` is its
    ``ROLLBACK`` on the session's connection, never a delete through the store."""

    async def scenario() -> None:
        bench = Bench(kind, tmp_path, dsn_for(kind, request))
        store = bench.store
        inner = getattr(store, "sync", store)  # AsyncSQLiteStore wraps a SQLiteStore
        outside: List[str] = []
        for target in {id(store): store, id(inner): inner}.values():
            for name in ("release", "complete"):
                original = getattr(target, name)

                def spy(*args: Any, _name: str = name, _original: Any = original) -> Any:
                    outside.append(_name)
                    return _original(*args)

                setattr(target, name, spy)
        outcomes: List[str] = []
        hooks = idempo.Hooks(on_outcome=lambda route, outcome: outcomes.append(outcome))
        async with client(make_app(bench, hooks=hooks)) as c:
            r = await post(c, "stolen-key-1", {"note": "s", "steal": True})
            assert r.status_code == 503
            assert r.json()["type"] == "urn:idempo:problem:store-unavailable"
            assert bench.counts() == (0, 0)
            again = await post(c, "stolen-key-1", {"note": "s"})
            assert again.status_code == 201 and "idempotent-replayed" not in again.headers
        assert outcomes == ["not_committed", "stored"]
        assert outside == []
        assert bench.counts() == (1, 1)
        await bench.close()

    asyncio.run(scenario())


def test_concurrent_duplicates_one_business_row(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def scenario() -> None:
        bench = Bench(kind, tmp_path, dsn_for(kind, request))
        async with client(make_app(bench)) as c:
            first = asyncio.ensure_future(post(c, "dup-key-001", {"note": "d", "sleep": 0.3}))
            await asyncio.sleep(0.1)
            rest = await asyncio.gather(
                *(post(c, "dup-key-001", {"note": "d", "sleep": 0.3}) for _ in range(7))
            )
            answers = [await first, *rest]
        assert bench.counts() == (1, 1)
        assert all(r.status_code in (201, 409) for r in answers), [r.status_code for r in answers]
        fresh = [r for r in answers if r.status_code == 201 and "idempotent-replayed" not in r.headers]
        assert len(fresh) == 1
        # Duplicates waited on the row lock, then replayed (the wait is far below the timeout).
        assert sum(r.headers.get("idempotent-replayed") == "true" for r in answers) == 7
        await bench.close()

    asyncio.run(scenario())


def test_lock_wait_past_the_timeout_is_409_then_replay(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    options = (
        {"lock_timeout_ms": 200} if kind.endswith("postgres") else {"busy_timeout_ms": 200}
    )

    async def scenario() -> None:
        bench = Bench(kind, tmp_path, dsn_for(kind, request), **options)
        async with client(make_app(bench)) as c:
            first = asyncio.ensure_future(post(c, "slow-key-01", {"note": "s", "sleep": 1.0}))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            dup = await post(c, "slow-key-01", {"note": "s", "sleep": 1.0})
            assert time.monotonic() - started < 0.9
            assert dup.status_code == 409
            assert dup.headers["content-type"] == "application/problem+json"
            assert int(dup.headers["retry-after"]) >= 1
            assert (await first).status_code == 201
            replay = await post(c, "slow-key-01", {"note": "s", "sleep": 1.0})
            assert replay.headers["idempotent-replayed"] == "true"
        assert bench.counts() == (1, 1)
        await bench.close()

    asyncio.run(scenario())


def test_stores_without_transactions_are_refused() -> None:
    app = Starlette(routes=[])
    with pytest.raises(idempo.TransactionalUnsupported):
        IdempotencyMiddleware(app, store=MemoryStore(), config=idempo.Config(transactional=True))
    assert isinstance(idempo.TransactionalUnsupported("x"), idempo.InvalidArgument)
    with pytest.raises(idempo.NoTransaction):
        idempo.current_transaction()


def test_per_route_transactional_mark(tmp_path: Path) -> None:
    bench = Bench("sqlite", tmp_path, "")
    seen: List[bool] = []

    @idempo.idempotent(config=idempo.Config(transactional=True))
    async def tx_route(request: Request) -> Response:
        await insert("marked")
        return JSONResponse({}, status_code=201)

    async def plain(request: Request) -> Response:
        try:
            idempo.current_transaction()
            seen.append(True)
        except idempo.NoTransaction:
            seen.append(False)
        return JSONResponse({}, status_code=201)

    app = Starlette(routes=[Route("/tx", tx_route, methods=["POST"]), Route("/plain", plain, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=bench.store)

    async def scenario() -> None:
        async with client(app) as c:
            assert (await c.post("/tx", json={}, headers={"Idempotency-Key": "mark-key-1"})).status_code == 201
            assert (await c.post("/plain", json={}, headers={"Idempotency-Key": "mark-key-2"})).status_code == 201

    asyncio.run(scenario())
    assert seen == [False]
    assert bench.counts() == (1, 2)
    asyncio.run(bench.close())


CHILD = textwrap.dedent(
    """
    import json, sqlite3, sys, time
    from werkzeug.test import Client
    import idempo
    from idempo.wsgi import IdempotencyMiddleware
    from idempo.stores import PostgresStore, SQLiteStore

    kind, where, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    store = PostgresStore(where) if kind == "postgres" else SQLiteStore(where)

    def app(environ, start_response):
        conn = idempo.current_transaction().connection
        mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
        conn.execute(f"INSERT INTO tx_payment (note) VALUES ({mark})", ("kill",))
        if mode == "hang":
            print("inside", flush=True)
            time.sleep(600)
        start_response("201 Created", [("content-type", "application/json")])
        return [b'{"ok": true}']

    client = Client(IdempotencyMiddleware(app, store=store, config=idempo.Config(transactional=True)))
    started = time.monotonic()
    r = client.post("/pay", json={"n": 1}, headers={"Idempotency-Key": "kill-key-01"})
    print(json.dumps({"status": r.status_code, "replayed": r.headers.get("idempotent-replayed"),
                      "seconds": time.monotonic() - started}), flush=True)
    """
)


@pytest.mark.parametrize("store_kind", ["postgres", "sqlite"])
def test_worker_killed_mid_handler_leaves_nothing_and_a_retry_runs_once(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    bench = Bench(store_kind, tmp_path, dsn_for(store_kind, request))
    where = bench.dsn if store_kind == "postgres" else str(bench.path)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen(
        [sys.executable, str(script), store_kind, where, "hang"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "inside"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert bench.counts() == (0, 0)
    retry = subprocess.run(
        [sys.executable, str(script), store_kind, where, "run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert retry.returncode == 0, retry.stderr
    answer = json.loads(retry.stdout.strip().splitlines()[-1])
    assert answer["status"] == 201 and answer["replayed"] is None
    # Claimable at once: no lease and no lock wait.
    assert answer["seconds"] < 1.5
    assert bench.counts() == (1, 1)
    asyncio.run(bench.close())


@pytest.mark.parametrize("store_kind", ["postgres", "sqlite"])
def test_concurrent_duplicates_in_threads_through_wsgi(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Eight threads, one key, the WSGI middleware and a sync store: one business row; the
    others waited on the lock and replayed."""
    import sqlite3
    import threading

    from werkzeug.test import Client

    from idempo.wsgi import IdempotencyMiddleware as WsgiMiddleware

    bench = Bench(store_kind, tmp_path, dsn_for(store_kind, request))

    def app(environ: Dict[str, Any], start_response: Any) -> List[bytes]:
        execution = environ["idempo.execution"]
        conn = execution.transaction.connection
        assert execution.transaction is idempo.current_transaction()
        mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
        conn.execute(f"INSERT INTO tx_payment (note) VALUES ({mark})", ("thread",))
        time.sleep(0.2)
        start_response("201 Created", [("content-type", "application/json")])
        return [b'{"ok": true}']

    wsgi = WsgiMiddleware(app, store=bench.store, config=idempo.Config(transactional=True))
    barrier = threading.Barrier(8)
    answers: List[Tuple[int, Any]] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        r = Client(wsgi).post("/pay", json={"n": 1}, headers={"Idempotency-Key": "thread-key-1"})
        with lock:
            answers.append((r.status_code, r.headers.get("idempotent-replayed")))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == 8
    assert bench.counts() == (1, 1)
    assert sorted(answers, key=str) == sorted([(201, None)] + [(201, "true")] * 7, key=str)
    asyncio.run(bench.close())


def test_single_connection_postgres_store_is_refused(request: pytest.FixtureRequest) -> None:
    import psycopg

    services = request.getfixturevalue("services")
    with psycopg.connect(services.pg_dsn, autocommit=True) as conn:
        with pytest.raises(idempo.TransactionalUnsupported, match="single connection"):
            IdempotencyMiddleware(Starlette(routes=[]), store=PostgresStore(conn), config=idempo.Config(transactional=True))


def test_a_session_outside_its_transaction_writes_nothing(tmp_path: Path) -> None:
    """Before its claim (or after its end) a session refuses the writes that belong inside the
    transaction (fail closed), rolls nothing back on ``release`` and cannot ``commit``; the
    background purge runs on the store."""
    store = SQLiteStore(tmp_path / "outside.sqlite3")
    session = store.transaction()
    key, token = bytes(range(32)), bytes(16)
    try:
        assert session.release(key, token) is False
        with pytest.raises(idempo.StoreUnavailable, match="no open transaction"):
            session.complete(key, token, b"", 60_000)
        with pytest.raises(idempo.StoreUnavailable, match="no open transaction"):
            session.commit()
        assert session.purge_expired(10).total == 0
        assert not session.open and not session.committed
    finally:
        session.close()
        store.close()
