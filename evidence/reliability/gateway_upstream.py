"""The upstream service of the gateway scenarios (evidence/reliability/gateway.py): a Starlette
app written without idempo, run by uvicorn worker processes behind idempo-gateway.

It counts every execution in the same ``effects`` table as evidence/reliability/app.py (its own
SQLite file, never the gateway's records), keyed by the client's key, which the gateway forwards
untouched because its ``downstream_key_header`` is ``X-Idempo-Downstream-Key``: the downstream
key arrives in that header and ``downstream`` keeps one charge per downstream key (route
``/pay/keyed``), as a payment API deduplicating on it would.

Environment: ``EV_EFFECTS`` (the SQLite path), ``EV_STOP_SLEEP_MS`` (400). Fault injection per
request: ``x-ev-crash`` = ``in_handler`` (SIGKILL before the effect) | ``after_effect`` (after it,
before answering); ``x-ev-stop: 1`` writes a ``started`` row and sleeps, so the harness can
SIGSTOP the worker mid-request; ``x-ev-sleep-ms`` lengthens the request (after ``started``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import threading
import time
from typing import Optional, Tuple

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

EFFECTS = os.environ.get("EV_EFFECTS", "/tmp/idempo-evidence-gateway-effects.sqlite3")
STOP_SLEEP_MS = int(os.environ.get("EV_STOP_SLEEP_MS", "400"))
DOWNSTREAM_HEADER = "x-idempo-downstream-key"
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT, "
    "key TEXT, generation INTEGER, downstream_key TEXT, tag TEXT, pid INTEGER, at_ms INTEGER)",
    "CREATE TABLE IF NOT EXISTS downstream (downstream_key TEXT PRIMARY KEY, effect_id INTEGER)",
    "CREATE TABLE IF NOT EXISTS started (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, pid INTEGER)",
)
_local = threading.local()


def _db() -> sqlite3.Connection:
    conn: Optional[sqlite3.Connection] = getattr(_local, "conn", None)
    if conn is None:
        conn = sqlite3.connect(EFFECTS, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA busy_timeout = 30000")
        _local.conn = conn
    return conn


def _record(route: str, key: str, dkey: str, tag: str, keyed: bool) -> Tuple[int, int]:
    conn = _db()
    conn.execute("BEGIN IMMEDIATE")
    try:
        cur = conn.execute(
            "INSERT INTO effects (route, key, generation, downstream_key, tag, pid, at_ms) VALUES (?, ?, 0, ?, ?, ?, ?)",
            (route, key, dkey, tag, os.getpid(), int(time.time() * 1000)),
        )
        effect = int(cur.lastrowid or 0)
        charge = effect
        if keyed:
            conn.execute("INSERT OR IGNORE INTO downstream (downstream_key, effect_id) VALUES (?, ?)", (dkey, effect))
            charge = int(conn.execute("SELECT effect_id FROM downstream WHERE downstream_key = ?", (dkey,)).fetchone()[0])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return effect, charge


def _started(key: str) -> None:
    _db().execute("INSERT INTO started (key, pid) VALUES (?, ?)", (key, os.getpid()))


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def pay(request: Request) -> Response:
    route = request.path_params["route"]
    raw = await request.body()
    try:
        tag = str(json.loads(raw).get("tag", ""))
    except (ValueError, AttributeError):
        tag = ""
    key = request.headers.get("idempotency-key", "")
    dkey = request.headers.get(DOWNSTREAM_HEADER, "")
    crash = request.headers.get("x-ev-crash", "")
    if request.headers.get("x-ev-stop"):
        await asyncio.to_thread(_started, key)
        await asyncio.sleep(STOP_SLEEP_MS / 1000)
    sleep_ms = int(request.headers.get("x-ev-sleep-ms", "0") or 0)
    if sleep_ms:
        await asyncio.sleep(sleep_ms / 1000)
    if crash == "in_handler":
        _die()
    effect, charge = await asyncio.to_thread(_record, route, key, dkey, tag, route == "keyed")
    if crash == "after_effect":
        _die()
    return JSONResponse({"effect": effect, "charge": charge, "tag": tag, "downstream_key": dkey,
                         "pid": os.getpid()}, status_code=201)


async def health(request: Request) -> Response:
    return JSONResponse({"pid": os.getpid()})


for _stmt in SCHEMA:
    _db().execute(_stmt)
app = Starlette(routes=[
    Route("/health", health, methods=["GET"]),
    Route("/pay/{route}", pay, methods=["POST"]),
])
