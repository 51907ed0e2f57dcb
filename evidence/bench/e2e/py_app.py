"""The FastAPI app of `make bench-e2e`: one trivial JSON handler behind the variant under test.

    E2E_VARIANT=bare|idempo-memory|idempo-sqlite|idempo-postgres|idempo-redis|asgi-idempotency-header
                |idempo-dependency-memory
    E2E_STORE_URL=<SQLite path, PostgreSQL DSN or Redis URL>   E2E_COUNT=1 (count store primitives)

Routes: ``POST /pay`` (the handler: counts its invocations, answers a small JSON body),
``GET /count`` (invocations and, with E2E_COUNT=1, store primitives by name), ``GET /rtt?n=``
(the store's own round trip: ``SELECT 1`` / ``PING`` over a connection of the store's kind, mean
µs), ``GET /health``. ``idempo-<store>`` wraps the app in ``idempo.asgi.IdempotencyMiddleware``;
``idempo-dependency-memory`` protects ``POST /pay`` with the FastAPI integration instead, as the
README recommends (``idempo.fastapi.Idempotency``: the app router's ``route_class`` and
``Depends(idempotency)`` on the endpoint), on a ``MemoryStore``. The peer (asgi-idempotency-header) is imported from the bench-only folder
the harness installs it in (on PYTHONPATH), never from the project's .venv requirements.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

VARIANT = os.environ.get("E2E_VARIANT", "bare")
STORE_URL = os.environ.get("E2E_STORE_URL", "")
COUNT = os.environ.get("E2E_COUNT") == "1"

invocations = 0
store_ops: Dict[str, int] = {}


def _make_store() -> Any:
    from idempo import stores

    if VARIANT in ("idempo-memory", "idempo-dependency-memory"):
        # Room for every fresh key of a run (the default partition holds a tenth of 100,000).
        return stores.MemoryStore(max_entries=2_000_000, max_entries_per_partition=2_000_000,
                                  max_bytes=2 << 30, max_bytes_per_partition=2 << 30)
    if VARIANT == "idempo-sqlite":
        return stores.SQLiteStore(STORE_URL)
    if VARIANT == "idempo-postgres":
        return stores.AsyncPostgresStore(STORE_URL)
    if VARIANT == "idempo-redis":
        return stores.AsyncRedisStore(STORE_URL)
    raise SystemExit(f"unknown E2E_VARIANT {VARIANT}")


def _on_store_op(route: str, op: str, seconds: float, failed: bool) -> None:
    store_ops[op] = store_ops.get(op, 0) + 1


def _hooks() -> Any:
    import idempo

    return idempo.Hooks(on_store_op=_on_store_op) if COUNT else None


app = FastAPI()


async def _pay(request: Request) -> JSONResponse:
    global invocations
    body = await request.json()
    invocations += 1
    return JSONResponse({"status": "succeeded", "id": invocations, "amount": body.get("amount")}, 201)


if VARIANT == "idempo-dependency-memory":
    from fastapi import Depends

    import idempo
    from idempo.fastapi import Idempotency

    idempotency = Idempotency(store=_make_store(), public=True, hooks=_hooks())
    app.router.route_class = idempotency.route_class  # before the routes, as the README says

    @app.post("/pay")
    async def pay_protected(
        request: Request, execution: idempo.Execution = Depends(idempotency)
    ) -> JSONResponse:
        return await _pay(request)
else:
    app.post("/pay")(_pay)


@app.get("/count")
async def count() -> Dict[str, Any]:
    return {"handler": invocations, "store_ops": store_ops}


@app.get("/health")
async def health() -> Dict[str, bool]:
    return {"ok": True}


@app.get("/rtt")
async def rtt(n: int = 1000) -> Dict[str, float]:
    """Mean time of one store round trip, sequential, on a connection of the store's kind."""
    if VARIANT == "idempo-postgres":
        import psycopg

        async with await psycopg.AsyncConnection.connect(
            STORE_URL, autocommit=True, prepare_threshold=None  # no prepared statements: PgBouncer
        ) as conn:
            await conn.execute("SELECT 1")
            t0 = time.perf_counter()
            for _ in range(n):
                await (await conn.execute("SELECT 1")).fetchone()
            return {"us": (time.perf_counter() - t0) / n * 1e6}
    if VARIANT == "idempo-redis":
        import redis.asyncio as aioredis

        client = aioredis.from_url(STORE_URL)
        try:
            await client.ping()
            t0 = time.perf_counter()
            for _ in range(n):
                await client.ping()
            return {"us": (time.perf_counter() - t0) / n * 1e6}
        finally:
            await client.aclose()
    return {"us": 0.0}


if VARIANT == "idempo-dependency-memory":
    pass  # protected by the route class and the dependency (above)
elif VARIANT.startswith("idempo-"):
    from idempo.asgi import IdempotencyMiddleware

    app.add_middleware(IdempotencyMiddleware, store=_make_store(), public=True, hooks=_hooks())
elif VARIANT == "asgi-idempotency-header":
    from idempotency_header_middleware import IdempotencyHeaderMiddleware
    from idempotency_header_middleware.backends import MemoryBackend

    app.add_middleware(IdempotencyHeaderMiddleware, backend=MemoryBackend())
elif VARIANT != "bare":
    raise SystemExit(f"unknown E2E_VARIANT {VARIANT}")
