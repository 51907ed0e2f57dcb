"""The retrying httpx transports against a real local server (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections import defaultdict
from typing import Any, Dict, Iterator, List

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.client import AsyncIdempotentTransport, IdempotentTransport
from idempo.stores import MemoryStore


class Seen:
    def __init__(self) -> None:
        self.keys: Dict[str, List[str]] = defaultdict(list)
        self.runs: Dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()


def build(seen: Seen) -> Starlette:
    async def flaky(request: Request) -> Response:
        key = request.headers["idempotency-key"]
        with seen.lock:
            seen.runs[key] += 1
            n = seen.runs[key]
        if n <= 2:
            return JSONResponse({"error": "try later"}, status_code=503)
        return JSONResponse({"ok": n}, status_code=201)

    async def slow(request: Request) -> Response:
        await asyncio.sleep(1.0)
        return JSONResponse({"done": True}, status_code=201)

    async def pay(request: Request) -> Response:
        return JSONResponse(await request.json(), status_code=201)

    async def bad(request: Request) -> Response:
        return JSONResponse({"error": "bad"}, status_code=400)

    app = Starlette(routes=[
        Route("/flaky", flaky, methods=["POST"]),
        Route("/slow", slow, methods=["POST"]),
        Route("/pay", pay, methods=["POST"]),
        Route("/bad", bad, methods=["POST"]),
    ])
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(),
                       config=idempo.Config(lease_ms=5000))

    async def log_keys(scope: Any, receive: Any, send: Any) -> None:
        for n, v in scope.get("headers", []):
            if n == b"idempotency-key":
                with seen.lock:
                    seen.keys[scope["path"]].append(v.decode())
        await app(scope, receive, send)

    return log_keys  # type: ignore[return-value]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Seen]]:
    seen = Seen()
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(build(seen), host="127.0.0.1", port=port,
                                        log_level="error", lifespan="off"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", seen
    srv.should_exit = True
    thread.join(10)


def policy() -> idempo.RetryPolicy:
    return idempo.RetryPolicy(max_attempts=6, base_delay_ms=20, max_delay_ms=200, max_elapsed_ms=15_000)


def test_retries_5xx_with_the_same_key(server: tuple[str, Seen]) -> None:
    url, seen = server
    waits: List[float] = []
    transport = IdempotentTransport(policy=policy(), sleep=waits.append, rng=random.Random(7))
    with httpx.Client(transport=transport, base_url=url) as c:
        r = c.post("/flaky", json={"a": 1})
    assert r.status_code == 201 and r.extensions["idempo_attempts"] == 3
    keys = seen.keys["/flaky"][-3:]
    assert len(set(keys)) == 1 and keys[0] == idempo.key_header_value(r.extensions["idempo_key"])
    assert len(waits) == 2 and all(0 < w <= 0.2 for w in waits)
    # a second logical operation gets a fresh key
    with httpx.Client(transport=IdempotentTransport(policy=policy(), sleep=lambda s: None),
                      base_url=url) as c:
        r2 = c.post("/flaky", json={"a": 1})
    assert r2.extensions["idempo_key"] != r.extensions["idempo_key"]


def test_timeout_then_409_retry_after_then_replay(server: tuple[str, Seen]) -> None:
    url, _seen = server
    outcomes: List[str] = []
    waits: List[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        time.sleep(s)

    transport = IdempotentTransport(policy=policy(), sleep=sleep,
                                    on_retry=lambda a, o, d: outcomes.append(o))
    with httpx.Client(transport=transport, base_url=url, timeout=0.3) as c:
        r = c.post("/slow", json={})
    assert r.status_code == 201 and r.headers["idempotent-replayed"] == "true"
    assert outcomes[0] == "timeout" and "409" in outcomes
    assert max(waits) >= 1.0  # Retry-After: 1 honoured, beyond the 200 ms backoff cap


def test_stops_on_422_and_4xx(server: tuple[str, Seen]) -> None:
    url, _seen = server
    transport = IdempotentTransport(policy=policy(), sleep=lambda s: None)
    with httpx.Client(transport=transport, base_url=url) as c:
        first = c.post("/pay", json={"amount": 1}, headers={"Idempotency-Key": '"fixed-key-1"'})
        other = c.post("/pay", json={"amount": 2}, headers={"Idempotency-Key": '"fixed-key-1"'})
        bad = c.post("/bad", json={})
    assert first.status_code == 201
    assert other.status_code == 422 and other.extensions["idempo_attempts"] == 1
    assert bad.status_code == 400 and bad.extensions["idempo_attempts"] == 1


def test_connection_errors_give_up_with_the_error() -> None:
    waits: List[float] = []
    transport = IdempotentTransport(
        policy=idempo.RetryPolicy(max_attempts=3, base_delay_ms=1, max_delay_ms=5),
        sleep=waits.append)
    with httpx.Client(transport=transport, base_url=f"http://127.0.0.1:{free_port()}") as c:
        with pytest.raises(httpx.ConnectError):
            c.post("/pay", json={})
    assert len(waits) == 2


def test_get_is_not_keyed(server: tuple[str, Seen]) -> None:
    url, seen = server
    with httpx.Client(transport=IdempotentTransport(), base_url=url) as c:
        r = c.get("/pay")
    assert r.status_code == 405 and "idempo_key" not in r.extensions


def test_async_transport(server: tuple[str, Seen]) -> None:
    url, seen = server

    async def main() -> httpx.Response:
        transport = AsyncIdempotentTransport(policy=policy())
        async with httpx.AsyncClient(transport=transport, base_url=url) as c:
            return await c.post("/flaky", json={"b": 2})

    r = asyncio.run(main())
    assert r.status_code == 201 and r.extensions["idempo_attempts"] == 3
