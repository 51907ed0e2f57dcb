"""The WSGI middleware through the Flask extension (Flask's test client, real WSGI calls)."""

from __future__ import annotations

import threading
from typing import Any, List

import pytest
from flask import Flask, jsonify, request

import idempo
from idempo.stores import MemoryStore
from idempo.wsgi import FlaskIdempotency


def make_app(store: Any, runs: List[Any], **options: Any) -> Flask:
    app = Flask(__name__)

    @app.post("/orders/<int:order>/pay")
    def pay(order: int) -> Any:
        body = request.get_json()
        execution = request.environ["idempo.execution"]
        runs.append(body)
        return jsonify({"order": order, "n": len(runs), "dk": execution.downstream_key}), 201, {
            "Location": f"/orders/{order}", "Set-Cookie": "s=1"}

    @app.post("/free")
    @idempo.idempotent(enabled=False)
    def free() -> Any:
        runs.append("free")
        return jsonify({}), 200

    FlaskIdempotency(app, store=store, **options)
    return app


def test_flask_replay_mismatch_and_problems() -> None:
    runs: List[Any] = []
    app = make_app(MemoryStore(), runs, config=idempo.Config(lease_ms=1000))
    c = app.test_client()
    h = {"Idempotency-Key": '"order-key-0001"'}
    a = c.post("/orders/7/pay", json={"amount": 3}, headers=h)
    b = c.post("/orders/7/pay", json={"amount": 3}, headers=h)
    assert a.status_code == b.status_code == 201 and a.data == b.data
    assert b.headers["Idempotent-Replayed"] == "true" and "Set-Cookie" not in b.headers
    assert b.headers["Location"] == "/orders/7"
    assert c.post("/orders/7/pay", json={"amount": 4}, headers=h).status_code == 422
    assert c.post("/orders/8/pay", json={"amount": 3}, headers=h).status_code == 422
    missing = c.post("/orders/7/pay", json={"amount": 3})
    assert missing.status_code == 400 and missing.content_type == "application/problem+json"
    assert c.post("/free", json={}).status_code == 200
    assert c.post("/nowhere", json={}).status_code == 404
    assert len(runs) == 2


def test_flask_body_limit() -> None:
    runs: List[Any] = []
    app = make_app(MemoryStore(), runs, config=idempo.Config(max_request_body_bytes=32))
    r = app.test_client().post("/orders/1/pay", json={"pad": "x" * 64},
                               headers={"Idempotency-Key": "k-12345678"})
    assert r.status_code == 413 and runs == []


def test_flask_threads_one_execution() -> None:
    runs: List[Any] = []
    gate = threading.Barrier(8)
    app = Flask(__name__)

    @app.post("/slow")
    def slow() -> Any:
        import time

        time.sleep(0.3)
        runs.append(1)
        return jsonify({"n": len(runs)}), 201

    FlaskIdempotency(app, store=MemoryStore())
    statuses: List[int] = []

    def hit() -> None:
        gate.wait()
        r = app.test_client().post("/slow", json={}, headers={"Idempotency-Key": "same-key-123"})
        statuses.append(r.status_code)

    threads = [threading.Thread(target=hit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [201] + [409] * 7
    assert len(runs) == 1


def test_redact_hook_needs_config() -> None:
    with pytest.raises(idempo.InvalidArgument):
        make_app(MemoryStore(), [], redact=lambda s, h, b: b"")
    runs: List[Any] = []
    app = make_app(MemoryStore(), runs, config=idempo.Config(redact=True),
                   redact=lambda status, headers, body: b'{"redacted":true}')
    c = app.test_client()
    h = {"Idempotency-Key": "redact-key-1"}
    live = c.post("/orders/1/pay", json={"card": "4242"}, headers=h)
    replay = c.post("/orders/1/pay", json={"card": "4242"}, headers=h)
    assert b"dk" in live.data and replay.data == b'{"redacted":true}'
