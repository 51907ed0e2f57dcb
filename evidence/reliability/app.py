"""The service under test: a Starlette app behind idempo's ASGI middleware, run by uvicorn in
worker processes (so kill -9 and SIGSTOP hit real processes).

Every handler execution appends a row to an ``effects`` table in its own SQLite file (never
idempo's records): that table is what the suites count. ``downstream`` plays a payment API that
deduplicates on the downstream key idempo hands the handler.

Configuration (environment): ``EV_STORE`` memory|sqlite|postgres|redis|redis-cluster,
``EV_STORE_URL`` (path, DSN (multi-host too) or URL; redis-cluster: any node's URL), ``EV_EFFECTS`` (SQLite path), ``EV_LEASE_MS`` (1000), ``EV_TTL_MS`` (600000),
``EV_SHORT_TTL_MS`` (3000, route /ttl), ``EV_STOP_SLEEP_MS`` (400), ``EV_STORE_TIMEOUT_MS``
(the PostgreSQL store's client-side deadline per operation, 2000).

With the SQLite and PostgreSQL stores, ``/pay/tx`` runs in idempo's transactional mode: the claim,
the handler's write and the completion commit in one transaction of the store's database, and
the handler writes its execution row into the ``ev_effects_tx`` table there (created by the
harness; still not idempo's records), so a crash before the commit leaves neither.

Fault injection, per request (headers are not part of the fingerprint): ``x-ev-crash`` =
``after_claim`` | ``in_handler`` | ``after_effect`` | ``before_complete`` | ``after_complete``
makes the worker SIGKILL itself at that step; ``x-ev-stop: 1`` writes a ``started`` row and sleeps,
so the harness can SIGSTOP the worker mid-handler; ``x-ev-sleep-ms`` lengthens the handler.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import signal
import sqlite3
import threading
import time
from typing import Any, Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import idempo
from idempo.asgi import IdempotencyMiddleware

STORE = os.environ.get("EV_STORE", "memory")
STORE_URL = os.environ.get("EV_STORE_URL", "")
EFFECTS = os.environ.get("EV_EFFECTS", "/tmp/idempo-evidence-effects.sqlite3")
LEASE_MS = int(os.environ.get("EV_LEASE_MS", "1000"))
TTL_MS = int(os.environ.get("EV_TTL_MS", "600000"))
SHORT_TTL_MS = int(os.environ.get("EV_SHORT_TTL_MS", "3000"))
STOP_SLEEP_MS = int(os.environ.get("EV_STOP_SLEEP_MS", "400"))
STORE_TIMEOUT_MS = int(os.environ.get("EV_STORE_TIMEOUT_MS", "2000"))
TX_STORES = ("sqlite", "postgres")
"""Stores whose database can hold the handler's write in idempo's transaction."""

CRASH: contextvars.ContextVar[str] = contextvars.ContextVar("ev_crash", default="")

EFFECTS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT, "
    "key TEXT, generation INTEGER, downstream_key TEXT, tag TEXT, pid INTEGER, at_ms INTEGER)",
    "CREATE TABLE IF NOT EXISTS downstream (downstream_key TEXT PRIMARY KEY, effect_id INTEGER)",
    "CREATE TABLE IF NOT EXISTS started (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, pid INTEGER)",
)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


_local = threading.local()


def effects_db() -> sqlite3.Connection:
    conn: Optional[sqlite3.Connection] = getattr(_local, "conn", None)
    if conn is None:
        conn = sqlite3.connect(EFFECTS, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA busy_timeout = 30000")
        _local.conn = conn
    return conn


def init_effects() -> None:
    conn = effects_db()
    for stmt in EFFECTS_SCHEMA:
        conn.execute(stmt)


def record_effect(route: str, ex: idempo.Execution, tag: str, keyed: bool) -> tuple[int, int]:
    """One execution: (effect id, charge id). Keyed: the downstream keeps the first charge."""
    conn = effects_db()
    conn.execute("BEGIN IMMEDIATE")
    try:
        cur = conn.execute(
            "INSERT INTO effects (route, key, generation, downstream_key, tag, pid, at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (route, ex.key, ex.generation, ex.downstream_key, tag, os.getpid(), int(time.time() * 1000)),
        )
        effect_id = int(cur.lastrowid or 0)
        charge = effect_id
        if keyed:
            conn.execute(
                "INSERT OR IGNORE INTO downstream (downstream_key, effect_id) VALUES (?, ?)",
                (ex.downstream_key, effect_id),
            )
            charge = int(conn.execute(
                "SELECT effect_id FROM downstream WHERE downstream_key = ?", (ex.downstream_key,)
            ).fetchone()[0])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return effect_id, charge


def mark_started(key: str) -> None:
    effects_db().execute("INSERT INTO started (key, pid) VALUES (?, ?)", (key, os.getpid()))


class CrashingStore:
    """Delegates to the real store; kills the worker around ``complete`` when asked to (in the
    transactional session: before the completion's write and after the commit)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _crash(self) -> str:
        return CRASH.get()

    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        if self._crash() == "before_complete":
            _die()
        applied = bool(self.inner.complete(scope_key, token, response, ttl_ms))
        if self._crash() == "after_complete":
            _die()
        return applied

    def transaction(self) -> "CrashingSession":
        return CrashingSession(self.inner.transaction(), CRASH.get())


class CrashingSession(CrashingStore):
    """The same around a transactional session. Its steps run on a thread of its own that does
    not see the request's context variables, so the crash step is taken when the session is
    opened; its ``transaction`` attribute (the open database transaction) is not shadowed."""

    def __init__(self, inner: Any, crash: str) -> None:
        super().__init__(inner)
        self.crash = crash

    def _crash(self) -> str:
        return self.crash

    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        # In a transaction the completion is only a write; it becomes durable at core's commit,
        # so "after_complete" kills the worker after the COMMIT (a kill between the two is
        # "before_complete" as far as durability goes: everything rolls back).
        if self._crash() == "before_complete":
            _die()
        return bool(self.inner.complete(scope_key, token, response, ttl_ms))

    def commit(self) -> None:
        self.inner.commit()
        if self._crash() == "after_complete":
            _die()

    def __getattribute__(self, name: str) -> Any:
        if name == "transaction":
            return object.__getattribute__(self, "inner").transaction
        return object.__getattribute__(self, name)


def make_store() -> Any:
    from idempo import stores

    if STORE == "memory":
        return stores.MemoryStore()
    if STORE == "sqlite":
        return stores.SQLiteStore(STORE_URL, busy_timeout_ms=int(os.environ.get("EV_BUSY_MS", "5000")))
    if STORE == "postgres":
        return stores.PostgresStore(STORE_URL, connect_timeout_ms=2000, timeout_ms=STORE_TIMEOUT_MS)
    if STORE == "redis":
        return stores.RedisStore(STORE_URL)
    if STORE == "redis-cluster":
        return stores.RedisStore(STORE_URL, cluster=True)
    raise SystemExit(f"unknown EV_STORE {STORE!r}")


async def _handle(request: Request, route: str, keyed: bool) -> Response:
    ex: idempo.Execution = request.state.idempotency
    raw = await request.body()
    try:
        tag = str(json.loads(raw).get("tag", ""))
    except (ValueError, AttributeError):
        tag = ""
    crash = request.headers.get("x-ev-crash", "")
    if crash == "after_claim":
        _die()
    if request.headers.get("x-ev-stop"):
        await asyncio.to_thread(mark_started, ex.key)
        await asyncio.sleep(STOP_SLEEP_MS / 1000)
    sleep_ms = int(request.headers.get("x-ev-sleep-ms", "0") or 0)
    if sleep_ms:
        await asyncio.sleep(sleep_ms / 1000)
    if crash == "in_handler":
        _die()
    effect_id, charge = await asyncio.to_thread(record_effect, route, ex, tag, keyed)
    if crash == "after_effect":
        _die()
    return JSONResponse(
        {"effect": effect_id, "charge": charge, "tag": tag, "generation": ex.generation,
         "pid": os.getpid()},
        status_code=201,
    )


def _cfg(takeover: str, ttl_ms: int = TTL_MS, transactional: bool = False) -> idempo.Config:
    return idempo.Config(
        lease_ms=LEASE_MS, ttl_ms=ttl_ms, takeover=takeover,  # type: ignore[arg-type]
        max_request_body_bytes=int(os.environ.get("EV_MAX_BODY", str(1024 * 1024))),
        transactional=transactional,
    )


@idempo.idempotent(config=_cfg("outcome_unknown"))
async def pay_ou(request: Request) -> Response:
    return await _handle(request, "ou", keyed=False)


@idempo.idempotent(config=_cfg("re_run"))
async def pay_rerun(request: Request) -> Response:
    return await _handle(request, "rerun", keyed=False)


@idempo.idempotent(config=_cfg("re_run"))
async def pay_keyed(request: Request) -> Response:
    return await _handle(request, "keyed", keyed=True)


@idempo.idempotent(config=_cfg("outcome_unknown", SHORT_TTL_MS))
async def pay_ttl(request: Request) -> Response:
    return await _handle(request, "ttl", keyed=False)


@idempo.idempotent(config=_cfg("outcome_unknown", transactional=True))
async def pay_tx(request: Request) -> Response:
    """Transactional mode: the execution row is written in idempo's own transaction."""
    ex: idempo.Execution = request.state.idempotency
    raw = await request.body()
    try:
        tag = str(json.loads(raw).get("tag", ""))
    except (ValueError, AttributeError):
        tag = ""
    crash = request.headers.get("x-ev-crash", "")
    if crash == "after_claim":
        _die()
    if request.headers.get("x-ev-stop"):
        await asyncio.to_thread(mark_started, ex.key)
        await asyncio.sleep(STOP_SLEEP_MS / 1000)
    sleep_ms = int(request.headers.get("x-ev-sleep-ms", "0") or 0)
    if sleep_ms:
        await asyncio.sleep(sleep_ms / 1000)
    if crash == "in_handler":
        _die()
    conn = idempo.current_transaction().connection
    mark = "%s" if STORE == "postgres" else "?"
    cur = conn.execute(
        f"INSERT INTO ev_effects_tx (key, generation, tag, pid) VALUES ({mark}, {mark}, {mark}, {mark}) RETURNING id",
        (ex.key, ex.generation, tag, os.getpid()),
    )
    effect_id = int(cur.fetchone()[0])
    if crash == "after_effect":
        _die()
    return JSONResponse(
        {"effect": effect_id, "charge": effect_id, "tag": tag, "generation": ex.generation, "pid": os.getpid()},
        status_code=201,
    )


@idempo.idempotent(enabled=False)
async def plain(request: Request) -> Response:
    """The same handler without idempo (the benchmark's baseline)."""
    raw = await request.body()
    try:
        tag = str(json.loads(raw).get("tag", ""))
    except (ValueError, AttributeError):
        tag = ""
    ex = idempo.Execution(key="", generation=0, downstream_key="")
    effect_id, charge = await asyncio.to_thread(record_effect, "plain", ex, tag, False)
    return JSONResponse({"effect": effect_id, "charge": charge, "tag": tag, "pid": os.getpid()}, status_code=201)


async def health(request: Request) -> Response:
    return JSONResponse({"pid": os.getpid(), "store": STORE})


class CrashContext:
    """Outermost layer: exposes the crash header to the store wrapper (context variables follow
    the request into the worker threads that run sync store primitives), and reports in
    ``x-ev-body-read`` how many body bytes the app had received when it answered."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for n, v in scope.get("headers", []):
            if n == b"x-ev-crash":
                CRASH.set(v.decode("latin-1"))
        read = 0

        async def counting_receive() -> Any:
            nonlocal read
            message = await receive()
            if message.get("type") == "http.request":
                read += len(message.get("body", b""))
            return message

        async def reporting_send(message: Any) -> None:
            if message.get("type") == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-ev-body-read", str(read).encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, counting_receive, reporting_send)


def _tenant(scope: Any) -> Optional[str]:
    for n, v in scope.get("headers", []):
        if n == b"x-tenant":
            return str(v.decode("latin-1"))
    return ""  # anonymous (empty_scope_is_anonymous below)


init_effects()
_inner = Starlette(
    routes=[
        Route("/health", health, methods=["GET"]),
        Route("/pay/ou", pay_ou, methods=["POST"]),
        Route("/pay/rerun", pay_rerun, methods=["POST"]),
        Route("/pay/keyed", pay_keyed, methods=["POST"]),
        Route("/ttl", pay_ttl, methods=["POST"]),
        Route("/plain", plain, methods=["POST"]),
        *([Route("/pay/tx", pay_tx, methods=["POST"])] if STORE in TX_STORES else []),
    ]
)
store = make_store()
_inner.add_middleware(
    IdempotencyMiddleware,
    store=CrashingStore(store),
    config=_cfg("outcome_unknown"),
    scope=_tenant,
    empty_scope_is_anonymous=True,  # requests without X-Tenant share the anonymous namespace
    warn_unscoped=False,
)
app = CrashContext(_inner)
