"""Transactional mode on a dying server (issue 13 finding 9, issue 16 item 3): PostgreSQL shuts
down while the handler's own INSERT runs. Nothing committed, so every host answers core's 503
``store-unavailable`` with ``Retry-After`` (outcome ``not_committed``), never the framework's 500;
once the server is back the same key runs anew and is stored once.

The server is this module's own (``own_pg``): ``pg_ctl restart -m fast`` terminates every
connection mid-statement, as a shutdown does, then starts it again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Iterator, List, Tuple

import httpx
import psycopg
import pytest
from conftest import PgServer
from flask import Flask, jsonify, request as flask_request
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import AsyncPostgresStore, PostgresStore
from idempo.wsgi import FlaskIdempotency

TABLE = "CREATE TABLE IF NOT EXISTS gone_payment (id bigserial PRIMARY KEY, note text NOT NULL)"
SLOW_INSERT = "INSERT INTO gone_payment (note) SELECT %s FROM pg_sleep(5)"
FAST_INSERT = "INSERT INTO gone_payment (note) VALUES (%s)"
TX = idempo.Config(transactional=True)


@pytest.fixture()
def server(own_pg: PgServer) -> Iterator[PgServer]:
    store = PostgresStore(own_pg.dsn)
    store.create_schema()
    with store._conn() as conn:  # noqa: SLF001 - test setup
        conn.execute(TABLE)
        conn.execute("TRUNCATE idempo_record, gone_payment")
    store.close()
    yield own_pg


def counts(dsn: str) -> Tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        payments = conn.execute("SELECT count(*) FROM gone_payment").fetchone()
        records = conn.execute("SELECT count(*) FROM idempo_record").fetchone()
    assert payments is not None and records is not None
    return int(payments[0]), int(records[0])


class Shutdown:
    """Restarts the server once the handler's slow INSERT is running."""

    def __init__(self, server: PgServer) -> None:
        self.server = server
        self.entered = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        assert self.entered.wait(30)
        time.sleep(0.3)  # the INSERT is in pg_sleep on the server
        self.server.restart()

    def join(self) -> None:
        self.thread.join(90)
        assert not self.thread.is_alive()

    def insert(self) -> str:
        """The handler's INSERT: slow (and announced) until the server was restarted once."""
        if self.entered.is_set():
            return FAST_INSERT
        self.entered.set()
        return SLOW_INSERT


def check_503(status: int, headers: Any, problem: Any) -> None:
    assert status == 503, (status, problem)
    assert headers["retry-after"] == "1"
    assert problem["type"] == "urn:idempo:problem:store-unavailable"


@pytest.mark.parametrize("kind", ["postgres", "async-postgres"])
def test_asgi_server_gone_during_the_handlers_insert_is_503(server: PgServer, kind: str) -> None:
    outcomes: List[str] = []
    shutdown = Shutdown(server)

    async def pay(request: Request) -> Response:
        body = await request.json()
        conn = idempo.current_transaction().connection
        result = conn.execute(shutdown.insert(), (body["note"],))
        if asyncio.iscoroutine(result):
            await result
        return JSONResponse({"note": body["note"]}, status_code=201)

    async def scenario() -> None:
        store: Any = (PostgresStore if kind == "postgres" else AsyncPostgresStore)(server.dsn)
        app = Starlette(routes=[Route("/pay", pay, methods=["POST"])])
        app.add_middleware(IdempotencyMiddleware, store=store, config=TX, hooks=idempo.Hooks(
            on_outcome=lambda route, outcome: outcomes.append(outcome)))
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as c:
            h = {"Idempotency-Key": f"gone-{kind}-0001"}
            r = await c.post("/pay", json={"note": "a"}, headers=h)
            check_503(r.status_code, r.headers, r.json())
            await asyncio.to_thread(shutdown.join)
            assert counts(server.dsn) == (0, 0)
            # The retry the 503 asks for (same key, same body) runs anew and is stored.
            again = await c.post("/pay", json={"note": "a"}, headers=h)
            assert again.status_code == 201 and "idempotent-replayed" not in again.headers
        closed = store.close()
        if asyncio.iscoroutine(closed):
            await closed

    asyncio.run(scenario())
    assert outcomes[0] == "not_committed" and outcomes[-1] == "stored"
    assert counts(server.dsn) == (1, 1)


def test_flask_server_gone_during_the_views_insert_is_503(server: PgServer) -> None:
    """Flask turns the view's exception into its own 500: the rollback that follows fails on the
    dead connection, and core answers 503 instead."""
    shutdown = Shutdown(server)
    app = Flask(__name__)

    @app.post("/pay")
    def pay() -> Any:
        body = flask_request.get_json()
        conn = idempo.current_transaction().connection
        conn.execute(shutdown.insert(), (body["note"],))
        return jsonify({"note": body["note"]}), 201

    store = PostgresStore(server.dsn)
    FlaskIdempotency(app, store=store, config=TX)
    c = app.test_client()
    h = {"Idempotency-Key": "gone-flask-0001"}
    r = c.post("/pay", json={"note": "f"}, headers=h)
    check_503(r.status_code, r.headers, r.json)
    shutdown.join()
    assert counts(server.dsn) == (0, 0)
    again = c.post("/pay", json={"note": "f"}, headers=h)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again.headers
    store.close()
    assert counts(server.dsn) == (1, 1)
