"""Client intents (spec/KEYS.md §3.6) against a real local server: uvicorn running a Starlette app
behind idempo's own ASGI middleware. Single flight per intent (threads and asyncio), the SQLite
pending-key store shared by two clients, the request bound to its pending key, an application's
422 as its answer, and the ImportError naming the client extra."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
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
from idempo.client import (
    AsyncIdempotentClient,
    IdempotentClient,
    IntentChangedWhilePendingError,
)
from idempo.pending import MemoryPendingKeyStore, PendingIntent, SQLitePendingKeyStore
from idempo.stores import MemoryStore


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charges: List[Dict[str, Any]] = []
        self.requests: Dict[str, List[str]] = defaultdict(list)  # path -> keys sent

    def sent(self, path: str) -> List[str]:
        with self.lock:
            return list(self.requests[path])


def build(ledger: Ledger) -> Any:
    async def charge(request: Request) -> Response:
        doc = await request.json()
        await asyncio.sleep(0.5)  # the charge takes a while: concurrent clicks overlap it
        with ledger.lock:
            ledger.charges.append(doc)
            n = len(ledger.charges)
        return JSONResponse({"charge": n, "amount": doc.get("amount")}, status_code=201)

    async def down(request: Request) -> Response:
        return JSONResponse({"error": "upstream down"}, status_code=503, headers={"Retry-After": "0"})

    async def validate(request: Request) -> Response:
        # A framework's validation error: application/json, not idempo's problem type.
        return JSONResponse({"detail": [{"loc": ["body", "amount"], "msg": "must be positive"}]}, status_code=422)

    app = Starlette(routes=[
        Route("/charge", charge, methods=["POST"]),
        Route("/down", down, methods=["POST"]),
        Route("/validate", validate, methods=["POST"]),
    ])
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), config=idempo.Config(lease_ms=5000))

    async def log_keys(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            key = dict(scope.get("headers", [])).get(b"idempotency-key", b"").decode()
            with ledger.lock:
                ledger.requests[scope["path"]].append(key)
        await app(scope, receive, send)

    return log_keys


@pytest.fixture()
def server(unused_port: int) -> Iterator[tuple[str, Ledger]]:
    ledger = Ledger()
    srv = uvicorn.Server(uvicorn.Config(build(ledger), host="127.0.0.1", port=unused_port,
                                        log_level="error", lifespan="off", limit_concurrency=1000))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{unused_port}", ledger
    srv.should_exit = True
    thread.join(10)


@pytest.fixture()
def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fast() -> idempo.RetryPolicy:
    return idempo.RetryPolicy(max_attempts=5, base_delay_ms=20, max_delay_ms=200, max_elapsed_ms=20_000)


def test_hundred_threads_one_intent_one_charge_one_key(server: tuple[str, Ledger], tmp_path: Path) -> None:
    url, ledger = server
    store = SQLitePendingKeyStore(str(tmp_path / "pending.db"))
    with IdempotentClient(base_url=url, store=store, policy=fast(), timeout=30,
                          limits=httpx.Limits(max_connections=200)) as http:
        # Every thread is running before any sends: the clicks are concurrent, not a queue of
        # sends that start after the first answer (a send after the intent settled is a new one).
        ready = threading.Barrier(100)

        def click(_: int) -> httpx.Response:
            ready.wait()
            return http.post("/charge", json={"amount": 100, "currency": "EUR"}, intent="checkout-1")

        with ThreadPoolExecutor(max_workers=100) as pool:
            answers = list(pool.map(click, range(100)))
    assert {r.status_code for r in answers} == {201}
    assert len({r.extensions["idempo_key"] for r in answers}) == 1, "one key for the intent"
    assert len({r.content for r in answers}) == 1, "every caller gets the same answer"
    assert len(ledger.charges) == 1, "charged once"
    assert len(ledger.sent("/charge")) == 1, "one attempt sequence: one request"
    assert store.all() == {}, "settled: nothing pending"


def test_hundred_tasks_one_intent_one_charge_one_key(server: tuple[str, Ledger], tmp_path: Path) -> None:
    url, ledger = server
    store = SQLitePendingKeyStore(str(tmp_path / "pending.db"))

    async def main() -> List[httpx.Response]:
        async with AsyncIdempotentClient(base_url=url, store=store, policy=fast(), timeout=30) as http:
            return list(await asyncio.gather(*(
                http.post("/charge", json={"amount": 100, "currency": "EUR"}, intent="checkout-async")
                for _ in range(100)
            )))

    answers = asyncio.run(main())
    assert {r.status_code for r in answers} == {201}
    assert len({r.extensions["idempo_key"] for r in answers}) == 1
    assert len({r.content for r in answers}) == 1
    assert len(ledger.charges) == 1
    assert len(ledger.sent("/charge")) == 1
    assert store.all() == {}


def test_two_clients_sharing_the_sqlite_store_mint_one_key(server: tuple[str, Ledger], tmp_path: Path) -> None:
    # Two clients (two processes, or two workers) over one SQLite file: one record, one charge.
    url, ledger = server
    path = str(tmp_path / "shared.db")
    stores = [SQLitePendingKeyStore(path), SQLitePendingKeyStore(path)]
    candidates = [PendingIntent(key=idempo.generate_key(), fingerprint="v1:" + "ab" * 32, created_ms=i)
                  for i in range(40)]
    with ThreadPoolExecutor(max_workers=40) as pool:
        keys = set(pool.map(lambda i: stores[i % 2].get_or_create("x", candidates[i]).key, range(40)))
    assert len(keys) == 1

    clients = [IdempotentClient(base_url=url, store=s, policy=fast(), timeout=30) for s in stores]
    try:
        ready = threading.Barrier(20)

        def click(i: int) -> httpx.Response:
            ready.wait()
            return clients[i % 2].post("/charge", json={"amount": 7}, intent="checkout-shared")

        with ThreadPoolExecutor(max_workers=20) as pool:
            answers = list(pool.map(click, range(20)))
    finally:
        for c in clients:
            c.close()
    assert {r.status_code for r in answers} == {201}
    assert len({r.extensions["idempo_key"] for r in answers}) == 1
    assert len(ledger.charges) == 1


def test_a_changed_request_under_a_pending_intent_raises_and_sends_nothing(
    server: tuple[str, Ledger], tmp_path: Path
) -> None:
    url, ledger = server
    store = SQLitePendingKeyStore(str(tmp_path / "pending.db"))
    two = idempo.RetryPolicy(max_attempts=2, base_delay_ms=10, max_delay_ms=20, max_elapsed_ms=5_000)
    with IdempotentClient(base_url=url, store=store, policy=two, timeout=10) as http:
        r = http.post("/down", json={"amount": 100}, intent="checkout-change")
        assert r.status_code == 503 and r.extensions["idempo_stop"] == "attempts_exhausted"
        pending = store.get("checkout-change")
        assert pending is not None and pending.key == r.extensions["idempo_key"], "the key stays pending"
        sent = len(ledger.sent("/down"))

        with pytest.raises(IntentChangedWhilePendingError) as info:
            http.post("/down", json={"amount": 250}, intent="checkout-change")
        assert info.value.code == "intent_changed_while_pending"
        assert info.value.key == pending.key
        assert len(ledger.sent("/down")) == sent, "nothing was sent"
        assert store.get("checkout-change") == pending, "kept for reconciliation"

        # The same request (member order aside) reuses the pending key.
        r2 = http.post("/down", content=b'{ "amount" : 100 }', headers={"content-type": "application/json"},
                       intent="checkout-change")
        assert r2.extensions["idempo_key"] == pending.key
        assert set(ledger.sent("/down")) == {idempo.key_header_value(pending.key)}


def test_a_changed_request_while_the_first_is_in_flight_raises(server: tuple[str, Ledger]) -> None:
    url, ledger = server
    with IdempotentClient(base_url=url, policy=fast(), timeout=10) as http:
        with ThreadPoolExecutor(max_workers=1) as pool:
            first = pool.submit(http.post, "/charge", json={"amount": 100}, intent="checkout-race")
            deadline = time.monotonic() + 5
            while not ledger.sent("/charge"):
                assert time.monotonic() < deadline
                time.sleep(0.005)
            with pytest.raises(IntentChangedWhilePendingError):
                http.post("/charge", json={"amount": 250}, intent="checkout-race")
            assert first.result().status_code == 201
    assert len(ledger.sent("/charge")) == 1
    assert len(ledger.charges) == 1


def test_an_applications_422_is_its_answer_for_every_caller(server: tuple[str, Ledger]) -> None:
    url, ledger = server
    store = MemoryPendingKeyStore()
    with IdempotentClient(base_url=url, store=store, policy=fast(), timeout=10) as http:
        with ThreadPoolExecutor(max_workers=10) as pool:
            ready = threading.Barrier(10)

            def click(_: int) -> httpx.Response:
                ready.wait()
                return http.post("/validate", json={"amount": -1}, intent="checkout-422")

            answers = list(pool.map(click, range(10)))
    for r in answers:
        assert r.status_code == 422
        assert r.extensions["idempo_stop"] == "client_error", "the application's 422 is not key reuse"
    assert store.get("checkout-422") is None, "an application's answer settles the intent"


def test_without_an_intent_every_call_has_its_own_key(server: tuple[str, Ledger]) -> None:
    url, ledger = server
    with IdempotentClient(base_url=url, policy=fast(), timeout=10) as http:
        a = http.post("/charge", json={"amount": 1})
        b = http.post("/charge", json={"amount": 1})
    assert a.extensions["idempo_key"] != b.extensions["idempo_key"]
    assert len(ledger.charges) == 2


def test_import_without_httpx_names_the_extra() -> None:
    code = "import sys; sys.modules['httpx'] = None; import idempo.client"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ}, timeout=60)
    assert out.returncode != 0
    assert "ImportError" in out.stderr
    assert "pip install 'idempo[client]'" in out.stderr
    # The pending stores do not need httpx.
    ok = subprocess.run([sys.executable, "-c", "import sys; sys.modules['httpx'] = None; import idempo.pending"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
