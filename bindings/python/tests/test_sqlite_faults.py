"""SQLite with its database file locked by another process's open write transaction: every
request driven from asyncio must get its 503 within the store's ``busy_timeout`` (plus a margin),
however many wait at once, and the handler never runs."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import List, Tuple

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from idempo.asgi import IdempotencyMiddleware
from idempo.stores import SQLiteStore

BUSY_MS = 500


def test_locked_file_many_concurrent_requests_answer_within_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path, busy_timeout_ms=BUSY_MS)
    runs: List[int] = []

    async def pay(request: Request) -> Response:
        runs.append(1)
        return JSONResponse({"n": len(runs)}, status_code=201)

    app = Starlette(routes=[Route("/pay", pay, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=store)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            warm = await client.post("/pay", json={"a": 0}, headers={"Idempotency-Key": "warm-key-1"})
            assert warm.status_code == 201 and runs == [1]

            async def one(i: int) -> Tuple[int, float]:
                started = time.monotonic()
                r = await client.post(
                    "/pay", json={"a": i}, headers={"Idempotency-Key": f"locked-many-{i:04d}"}
                )
                return r.status_code, time.monotonic() - started

            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")
            try:
                answers = await asyncio.gather(*(one(i) for i in range(24)))
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            assert [status for status, _ in answers] == [503] * 24
            slowest = max(elapsed for _, elapsed in answers)
            assert slowest < BUSY_MS / 1000 + 1, f"slowest 503 after {slowest:.2f} s"
            assert runs == [1], "the handler ran while the store was locked"
            after = await client.post("/pay", json={"a": 1}, headers={"Idempotency-Key": "after-unlock"})
            assert after.status_code == 201

    asyncio.run(scenario())
    store.close()
