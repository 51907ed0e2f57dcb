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
from idempo.client import AsyncIdempotentTransport, IdempotentTransport, OutcomeUnknownError
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

    async def boom(request: Request) -> Response:
        # A handler that may have had its effect and then failed: idempo marks the key
        # outcome-unknown (takeover policy "outcome_unknown", the default).
        key = request.headers["idempotency-key"]
        with seen.lock:
            seen.runs[key] += 1
        raise RuntimeError("crashed after a possible side effect")

    app = Starlette(routes=[
        Route("/flaky", flaky, methods=["POST"]),
        Route("/slow", slow, methods=["POST"]),
        Route("/pay", pay, methods=["POST"]),
        Route("/bad", bad, methods=["POST"]),
        Route("/boom", boom, methods=["POST"]),
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


def _assert_outcome_unknown(err: OutcomeUnknownError, seen: Seen) -> None:
    # Attempt 1 crashed (a plain 500, retried); attempt 2 got idempo's outcome-unknown problem
    # and the client stopped there although the policy allows 6 attempts.
    assert isinstance(err, idempo.OutcomeUnknown)
    assert err.attempts == 2
    assert err.response.status_code == 500
    assert err.response.headers["content-type"].startswith("application/problem+json")
    assert err.response.json()["type"] == "urn:idempo:problem:outcome-unknown"
    assert err.response.extensions["idempo_key"] == err.key
    header = idempo.key_header_value(err.key)
    assert seen.keys["/boom"].count(header) == 2
    assert seen.runs[header] == 1


def test_outcome_unknown_stops_with_a_typed_error(server: tuple[str, Seen]) -> None:
    url, seen = server
    waits: List[float] = []
    transport = IdempotentTransport(policy=policy(), sleep=waits.append)
    with httpx.Client(transport=transport, base_url=url) as c:
        with pytest.raises(OutcomeUnknownError) as info:
            c.post("/boom", json={"n": 1})
    _assert_outcome_unknown(info.value, seen)
    assert len(waits) == 1
    # The same key again: answered outcome-unknown at once, one attempt, the handler not run.
    with httpx.Client(transport=IdempotentTransport(policy=policy(), sleep=waits.append),
                      base_url=url) as c:
        with pytest.raises(OutcomeUnknownError) as again:
            c.post("/boom", json={"n": 1},
                   headers={"Idempotency-Key": idempo.key_header_value(info.value.key)})
    # A key the request already carries is kept as sent (here its sf-string header form).
    assert again.value.attempts == 1
    assert again.value.key == idempo.key_header_value(info.value.key)
    assert seen.runs[idempo.key_header_value(info.value.key)] == 1
    assert len(waits) == 1


def test_async_outcome_unknown_stops_with_a_typed_error(server: tuple[str, Seen]) -> None:
    url, seen = server

    async def main() -> None:
        transport = AsyncIdempotentTransport(policy=policy())
        async with httpx.AsyncClient(transport=transport, base_url=url) as c:
            await c.post("/boom", json={"n": 2})

    with pytest.raises(OutcomeUnknownError) as info:
        asyncio.run(main())
    _assert_outcome_unknown(info.value, seen)


def test_policy_classifies_outcome_unknown_through_core() -> None:
    p = policy()
    body = b'{"status": 500, "type": "urn:idempo:problem:outcome-unknown"}'
    ct = "application/problem+json; charset=utf-8"
    assert idempo.response_body_needed(500, ct)
    assert not idempo.response_body_needed(503, ct)
    assert not idempo.response_body_needed(500, None)
    advice = p.decide(1, 0, 500, 0.5, content_type=ct, body=body)
    assert not advice.retry and advice.reason == "outcome_unknown"
    assert p.decide(1, 0, 500, 0.5, content_type="text/plain", body=body).retry
    assert p.decide(1, 0, 500, 0.5).retry
    assert p.decide(3, 0, "outcome_unknown", 0.5).reason == "outcome_unknown"


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


def _scripted(answers: List[httpx.Response]) -> "tuple[IdempotentTransport, List[str]]":
    """A transport over a mock that answers ``answers`` in order (the last one repeats)."""
    seen: List[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["idempotency-key"])
        return answers[min(len(seen) - 1, len(answers) - 1)]

    policy = idempo.RetryPolicy(max_attempts=4, base_delay_ms=1, max_delay_ms=2)
    return IdempotentTransport(httpx.MockTransport(handle), policy=policy), seen


def test_an_applications_422_is_its_answer_and_idempos_422_is_key_reuse() -> None:
    app_422 = httpx.Response(422, json={"detail": [{"loc": ["body", "amount"], "msg": "Field required"}]})
    transport, seen = _scripted([app_422, httpx.Response(201)])
    with httpx.Client(transport=transport) as c:
        r = c.post("http://api/pay", json={})
    assert r.status_code == 422 and len(seen) == 1
    assert r.extensions["idempo_stop"] == "client_error", "an application's 422 is not key reuse"
    reused = httpx.Response(
        422, headers={"content-type": "application/problem+json"},
        content=b'{"type":"urn:idempo:problem:key-reused","title":"t","status":422,"detail":"d"}')
    transport, seen = _scripted([reused, httpx.Response(201)])
    with httpx.Client(transport=transport) as c:
        r = c.post("http://api/pay", json={})
    assert r.status_code == 422 and len(seen) == 1
    assert r.extensions["idempo_stop"] == "key_reused_with_different_request"


def test_an_applications_409_is_not_retried_and_idempos_409_is() -> None:
    conflict = httpx.Response(409, json={"error": "already shipped"}, headers={"retry-after": "0"})
    transport, seen = _scripted([conflict, httpx.Response(201)])
    with httpx.Client(transport=transport) as c:
        r = c.post("http://api/pay", json={})
    assert r.status_code == 409 and len(seen) == 1
    assert r.extensions["idempo_stop"] == "client_error"
    in_flight = httpx.Response(
        409, headers={"content-type": "application/problem+json", "retry-after": "0"},
        content=b'{"type":"urn:idempo:problem:in-flight","title":"t","status":409,"detail":"d"}')
    transport, seen = _scripted([in_flight, httpx.Response(201)])
    with httpx.Client(transport=transport) as c:
        r = c.post("http://api/pay", json={})
    assert r.status_code == 201 and len(seen) == 2 and len(set(seen)) == 1
    not_retained = httpx.Response(
        500, headers={"content-type": "application/problem+json"},
        content=b'{"type":"urn:idempo:problem:response-not-retained","title":"t","status":500}')
    transport, seen = _scripted([not_retained, httpx.Response(201)])
    with httpx.Client(transport=transport) as c:
        r = c.post("http://api/pay", json={})
    assert r.status_code == 500 and len(seen) == 1
    assert r.extensions["idempo_stop"] == "response_not_retained"
