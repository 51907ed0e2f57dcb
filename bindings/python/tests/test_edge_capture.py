"""What is stored and how a response is captured (PROTOCOL §7.5, §9), through the hosts:
FastAPI/Starlette (ASGI) and Flask (WSGI)."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any, AsyncIterator, Dict, List

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from flask import Flask
from flask import Response as FlaskResponse
from flask import request as flask_request
from pydantic import BaseModel
from starlette.middleware.gzip import GZipMiddleware

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import AsyncMemoryStore, MemoryStore
from idempo.wsgi import FlaskIdempotency

NOT_RETAINED = "urn:idempo:problem:response-not-retained"
LIMIT = 64


class Payment(BaseModel):
    amount: int


def fastapi_app(runs: List[str], **options: Any) -> FastAPI:
    app = FastAPI()

    @app.post("/pay", status_code=201)
    async def pay(payment: Payment, request: Request) -> Any:
        runs.append("pay")
        if request.headers.get("authorization") != "Bearer ok":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return {"amount": payment.amount, "n": len(runs)}

    @app.post("/declined")
    async def declined(payment: Payment) -> Any:
        runs.append("declined")
        return JSONResponse({"error": "card_declined", "n": len(runs)}, status_code=402)

    @app.post("/stream")
    async def stream(payment: Payment, request: Request) -> Any:
        runs.append("stream")
        size = int(request.query_params.get("size", "8"))

        async def parts() -> AsyncIterator[bytes]:
            for i in range(4):
                yield (str(i) * size).encode()

        return StreamingResponse(parts(), media_type="text/plain")

    app.add_middleware(IdempotencyMiddleware, store=AsyncMemoryStore(),
                       config=idempo.Config(max_stored_body_bytes=LIMIT * 20),
                       scope=lambda s: "tenant-1", **options)
    return app


def run(app: Any, fn: Any) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            await fn(c)

    asyncio.run(main())


def test_asgi_401_then_the_fixed_request_runs_and_is_stored() -> None:
    runs: List[str] = []

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "pay-key-0001"}
        first = await c.post("/pay", json={"amount": 5}, headers=h)
        assert first.status_code == 401
        fixed = await c.post("/pay", json={"amount": 5}, headers={**h, "authorization": "Bearer ok"})
        assert fixed.status_code == 201 and "idempotent-replayed" not in fixed.headers
        again = await c.post("/pay", json={"amount": 5}, headers={**h, "authorization": "Bearer ok"})
        assert again.headers["idempotent-replayed"] == "true" and again.json() == fixed.json()

    run(fastapi_app(runs), go)
    assert runs == ["pay", "pay"]


def test_fastapi_validation_422_then_the_corrected_body_runs() -> None:
    runs: List[str] = []

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "pay-key-0002", "authorization": "Bearer ok"}
        bad = await c.post("/pay", json={"amount": "lots"}, headers=h)
        assert bad.status_code == 422 and bad.headers["content-type"] == "application/json"
        assert "detail" in bad.json()
        good = await c.post("/pay", json={"amount": 7}, headers=h)
        assert good.status_code == 201, good.text  # not idempo's 422 key-reused
        assert good.json()["amount"] == 7
        replay = await c.post("/pay", json={"amount": 7}, headers=h)
        assert replay.headers["idempotent-replayed"] == "true"

    run(fastapi_app(runs), go)
    assert runs == ["pay"]


def test_asgi_business_402_is_stored() -> None:
    runs: List[str] = []

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "pay-key-0003"}
        a = await c.post("/declined", json={"amount": 5}, headers=h)
        b = await c.post("/declined", json={"amount": 5}, headers=h)
        assert a.status_code == b.status_code == 402
        assert b.headers["idempotent-replayed"] == "true" and a.json() == b.json()

    run(fastapi_app(runs), go)
    assert runs == ["declined"]


def check_not_retained(r: httpx.Response) -> None:
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["idempotent-replayed"] == "true"
    assert r.json()["type"] == NOT_RETAINED


def test_asgi_streamed_body_over_the_limit_reaches_the_client_and_is_not_retained() -> None:
    runs: List[str] = []

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "stream-key-01", "accept-encoding": "identity"}
        size = LIMIT * 10  # 4 parts of 640 bytes: past the 1280-byte record limit
        first = await c.post(f"/stream?size={size}", json={"amount": 1}, headers=h)
        assert first.status_code == 200
        assert first.content == b"".join((str(i) * size).encode() for i in range(4))
        for _ in range(2):  # nothing stays in flight: every retry gets the stored problem
            check_not_retained(await c.post(f"/stream?size={size}", json={"amount": 1}, headers=h))

    run(fastapi_app(runs), go)
    assert runs == ["stream"]


def test_asgi_buffered_body_over_the_limit_is_not_retained() -> None:
    runs: List[str] = []
    app = FastAPI()

    @app.post("/big")
    async def big(payment: Payment) -> Any:
        runs.append("big")
        return Response(b"y" * 500, media_type="text/plain")

    app.add_middleware(IdempotencyMiddleware, store=AsyncMemoryStore(),
                       config=idempo.Config(max_stored_body_bytes=100))

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "big-key-0001"}
        first = await c.post("/big", json={"amount": 1}, headers=h)
        assert first.status_code == 200 and first.content == b"y" * 500
        check_not_retained(await c.post("/big", json={"amount": 1}, headers=h))

    run(app, go)
    assert runs == ["big"]


def test_asgi_streamed_response_is_replayed_exactly() -> None:
    runs: List[str] = []

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "stream-key-02", "accept-encoding": "identity"}
        first = await c.post("/stream", json={"amount": 1}, headers=h)
        second = await c.post("/stream", json={"amount": 1}, headers=h)
        assert first.content == second.content == b"0" * 8 + b"1" * 8 + b"2" * 8 + b"3" * 8
        assert second.headers["idempotent-replayed"] == "true"
        assert second.headers["content-type"] == first.headers["content-type"]

    run(fastapi_app(runs), go)
    assert runs == ["stream"]


def test_asgi_gzip_response_replays_with_its_content_encoding() -> None:
    runs: List[str] = []
    # idempo outside GZip (added last = outermost): it records what GZip produced.
    app2 = FastAPI()

    @app2.post("/gzip")
    async def zipped2(payment: Payment) -> Any:
        runs.append("gzip")
        return Response(b"compress me " * 100, media_type="text/plain")

    app2.add_middleware(GZipMiddleware, minimum_size=10)
    app2.add_middleware(IdempotencyMiddleware, store=AsyncMemoryStore())

    async def go2(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "gzip-key-001", "accept-encoding": "gzip"}
        first = await c.post("/gzip", json={"amount": 1}, headers=h)
        second = await c.post("/gzip", json={"amount": 1}, headers=h)
        assert first.headers["content-encoding"] == "gzip"
        assert second.headers["idempotent-replayed"] == "true"
        assert second.headers["content-encoding"] == "gzip"
        assert second.content == first.content == b"compress me " * 100  # httpx decodes
        assert "accept-encoding" in second.headers.get("vary", "").lower()

    run(app2, go2)
    assert runs == ["gzip"]


def flask_app(runs: List[str], **options: Any) -> Flask:
    app = Flask(__name__)

    @app.post("/pay")
    def pay() -> Any:
        runs.append("pay")
        if flask_request.headers.get("authorization") != "Bearer ok":
            return {"error": "unauthorized"}, 401
        return {"n": len(runs)}, 201

    @app.post("/big")
    def big() -> Any:
        runs.append("big")
        return "z" * 500, 200, {"Content-Type": "text/plain"}

    @app.post("/stream")
    def stream() -> Any:
        runs.append("stream")

        def parts() -> Any:
            for p in (b"aaaa", b"bbbb", b"cccc"):
                yield p

        return FlaskResponse(parts(), mimetype="text/plain")

    @app.post("/gzip")
    def zipped() -> Any:
        runs.append("gzip")
        body = gzip.compress(b"compress me " * 100)
        return body, 200, {"Content-Type": "text/plain", "Content-Encoding": "gzip",
                           "Vary": "Accept-Encoding"}

    FlaskIdempotency(app, store=MemoryStore(), config=idempo.Config(max_stored_body_bytes=100),
                     scope=lambda environ: "tenant-1", **options)
    return app


def test_wsgi_401_then_the_fixed_request_runs_and_is_stored() -> None:
    runs: List[str] = []
    c = flask_app(runs).test_client()
    h = {"Idempotency-Key": "pay-key-0001"}
    assert c.post("/pay", json={"a": 1}, headers=h).status_code == 401
    fixed = c.post("/pay", json={"a": 1}, headers={**h, "Authorization": "Bearer ok"})
    assert fixed.status_code == 201 and "Idempotent-Replayed" not in fixed.headers
    again = c.post("/pay", json={"a": 1}, headers={**h, "Authorization": "Bearer ok"})
    assert again.headers["Idempotent-Replayed"] == "true" and again.data == fixed.data
    assert runs == ["pay", "pay"]


def test_wsgi_body_over_the_limit_reaches_the_client_and_is_not_retained() -> None:
    runs: List[str] = []
    c = flask_app(runs).test_client()
    h = {"Idempotency-Key": "big-key-0001"}
    first = c.post("/big", json={"a": 1}, headers=h)
    assert first.status_code == 200 and first.data == b"z" * 500
    for _ in range(2):
        r = c.post("/big", json={"a": 1}, headers=h)
        assert r.status_code == 500 and r.headers["Idempotent-Replayed"] == "true"
        body: Dict[str, Any] = json.loads(r.data)
        assert body["type"] == NOT_RETAINED
    assert runs == ["big"]


def test_wsgi_gzip_response_replays_with_its_content_encoding() -> None:
    runs: List[str] = []
    c = flask_app(runs).test_client()
    h = {"Idempotency-Key": "gzip-key-001"}
    first = c.post("/gzip", json={"a": 1}, headers=h)
    second = c.post("/gzip", json={"a": 1}, headers=h)
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.headers["Content-Encoding"] == "gzip" and second.headers["Vary"] == "Accept-Encoding"
    assert gzip.decompress(second.data) == gzip.decompress(first.data) == b"compress me " * 100
    assert runs == ["gzip"]


def test_wsgi_streamed_response_is_replayed_exactly() -> None:
    runs: List[str] = []
    c = flask_app(runs).test_client()
    h = {"Idempotency-Key": "stream-key-01"}
    first = c.post("/stream", json={"a": 1}, headers=h)
    # Teed: the record completes when the body has been sent; a retry before that is in flight.
    assert c.post("/stream", json={"a": 1}, headers=h).status_code == 409
    assert first.data == b"aaaabbbbcccc"
    second = c.post("/stream", json={"a": 1}, headers=h)
    assert second.data == b"aaaabbbbcccc"
    assert second.headers["Idempotent-Replayed"] == "true"
    assert runs == ["stream"]
