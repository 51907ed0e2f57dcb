"""The ASGI middleware's construction checks and problem renderer (issue 13 findings 8 and the
problem-envelope hook), through httpx's ASGI transport and a real uvicorn server."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, List, Tuple

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import AsyncMemoryStore, MemoryStore, SQLiteStore


async def _app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never called
    raise AssertionError


@pytest.mark.parametrize(
    "store, fix",
    [
        ("idempo.sqlite3", "SQLiteStore('idempo.sqlite3')"),
        (SQLiteStore, "store=SQLiteStore(...)"),
        (lambda: MemoryStore(), "call it"),
        (object(), "not an idempotency store"),
    ],
)
def test_a_store_argument_that_is_not_a_store_fails_when_built(store: Any, fix: str) -> None:
    with pytest.raises(TypeError, match=re.escape(fix)):
        IdempotencyMiddleware(_app, store=store)


def test_both_store_kinds_are_accepted_by_the_asgi_host() -> None:
    """An asyncio host drives asyncio stores directly and sync stores in worker threads."""
    IdempotencyMiddleware(_app, store=MemoryStore())
    IdempotencyMiddleware(_app, store=AsyncMemoryStore())


def envelope(problem: idempo.Problem) -> Tuple[bytes, str]:
    body = {"error": {"type": problem.slug, "message": problem.detail,
                      "retry_after": problem.retry_after, "status": problem.status}}
    return json.dumps(body).encode(), "application/vnd.acme.error+json"


def make_app(runs: List[str], gate: asyncio.Event, **options: Any) -> Starlette:
    async def pay(request: Request) -> Response:
        runs.append("pay")
        if (await request.json()).get("wait"):
            await gate.wait()
        return JSONResponse({"n": len(runs)}, status_code=201)

    async def big(request: Request) -> Response:
        runs.append("big")

        async def body() -> Any:
            for _ in range(4):
                yield b"y" * 100

        return StreamingResponse(body(), media_type="text/plain")

    async def own(request: Request) -> Response:
        return Response(b'{"type":"about:blank","title":"x"}', status_code=400,
                        media_type="application/problem+json")

    app = Starlette(routes=[Route("/pay", pay, methods=["POST"]),
                            Route("/big", big, methods=["POST"]),
                            Route("/own", own, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), problem_renderer=envelope,
                       **options)
    return app


def test_problem_renderer_in_the_asgi_middleware() -> None:
    async def scenario() -> None:
        runs: List[str] = []
        gate = asyncio.Event()
        app = make_app(runs, gate, config=idempo.Config(max_stored_body_bytes=100))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            missing = await c.post("/pay", json={})
            assert missing.status_code == 400
            assert missing.headers["content-type"] == "application/vnd.acme.error+json"
            assert missing.json()["error"]["type"] == "missing-key"
            assert int(missing.headers["content-length"]) == len(missing.content)
            h = {"Idempotency-Key": "asgi-render-1"}
            first = asyncio.ensure_future(c.post("/pay", json={"wait": True}, headers=h))
            while not runs:
                await asyncio.sleep(0.01)
            busy = await c.post("/pay", json={"wait": True}, headers=h)
            assert busy.status_code == 409 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"] == {
                "type": "in-flight", "retry_after": 1, "status": 409,
                "message": busy.json()["error"]["message"]}
            gate.set()
            assert (await first).status_code == 201
            mismatch = await c.post("/pay", json={"other": 1}, headers=h)
            assert mismatch.status_code == 422
            assert mismatch.json()["error"]["type"] == "key-reused"
            hb = {"Idempotency-Key": "asgi-render-2"}
            assert (await c.post("/big", json={}, headers=hb)).content == b"y" * 400
            replay = await c.post("/big", json={}, headers=hb)
            assert replay.status_code == 500 and replay.headers["idempotent-replayed"] == "true"
            assert replay.json()["error"]["type"] == "response-not-retained"
            own = await c.post("/own", json={}, headers={"Idempotency-Key": "asgi-render-3"})
            assert own.headers["content-type"] == "application/problem+json"
            assert own.json()["type"] == "about:blank"

    asyncio.run(scenario())


def test_renderer_must_be_callable() -> None:
    with pytest.raises(TypeError, match="problem_renderer"):
        IdempotencyMiddleware(_app, store=MemoryStore(), problem_renderer={"a": 1})
