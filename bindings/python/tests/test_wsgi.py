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


# --- real Werkzeug server (threaded, keep-alive) --------------------------------------------

import json  # noqa: E402
import logging  # noqa: E402
import socket  # noqa: E402
import tracemalloc  # noqa: E402
import warnings  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Dict, Iterator, Optional, Tuple  # noqa: E402
from unittest.mock import ANY  # noqa: E402

from werkzeug.serving import make_server  # noqa: E402

from idempo.stores import AsyncMemoryStore, SQLiteStore  # noqa: E402


@contextmanager
def werkzeug_server(app: Any) -> Iterator[Tuple[str, int]]:
    """Werkzeug's threaded development server on a random loopback port (HTTP/1.1 keep-alive)."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_port
    finally:
        server.shutdown()
        thread.join(10)


def read_response(sock: socket.socket) -> Tuple[str, Dict[str, str], bytes]:
    """One HTTP/1.1 response from a socket (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return lines[0], headers, rest[:length]


def echo_app(runs: List[Any], **options: Any) -> Flask:
    app = Flask(__name__)

    @app.post("/echo")
    def echo() -> Any:
        data = request.get_data()
        runs.append(data)
        return jsonify({"n": len(runs), "got": data.decode()}), 201

    FlaskIdempotency(app, store=MemoryStore(), **options)
    return app


def test_keep_alive_post_without_length_has_no_body_and_does_not_hang() -> None:
    """PEP 3333: no CONTENT_LENGTH and no wsgi.input_terminated means no body; reading the
    socket for one would hang the server thread until the client gives up (the client here keeps
    its connection open, waiting for the answer)."""
    runs: List[Any] = []
    request_bytes = (
        b"POST /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: no-length-key-1\r\n"
        b"Connection: keep-alive\r\n\r\n"
    )
    with werkzeug_server(echo_app(runs)) as (host, port):
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(request_bytes)
            status, headers, body = read_response(sock)
            assert status.startswith("HTTP/1.1 201"), status
            assert json.loads(body)["got"] == ""
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(request_bytes)
            status, headers, again = read_response(sock)
            assert status.startswith("HTTP/1.1 201") and again == body
            assert headers["idempotent-replayed"] == "true"
    assert runs == [b""]


def test_chunked_request_body_is_read_to_its_end() -> None:
    """Werkzeug sets wsgi.input_terminated for a chunked upload: the body is read to its end,
    fingerprinted, and passed on to the view."""
    runs: List[Any] = []

    def chunked(key: str, parts: List[bytes]) -> bytes:
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        return (
            b"POST /echo HTTP/1.1\r\nHost: t\r\nIdempotency-Key: " + key.encode()
            + b"\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n" + body
        )

    with werkzeug_server(echo_app(runs)) as (host, port):
        def send(raw: bytes) -> Tuple[str, Dict[str, str], bytes]:
            with socket.create_connection((host, port), timeout=5) as sock:
                sock.sendall(raw)
                return read_response(sock)

        status, _, body = send(chunked("chunked-key-01", [b"hello ", b"world"]))
        assert status.startswith("HTTP/1.1 201") and json.loads(body)["got"] == "hello world"
        status, headers, again = send(chunked("chunked-key-01", [b"hello world"]))
        assert again == body and headers["idempotent-replayed"] == "true"
        status, _, _ = send(chunked("chunked-key-01", [b"other"]))
        assert status.startswith("HTTP/1.1 422")
    assert runs == [b"hello world"]


def stream_app(runs: List[Any], gate: Optional[threading.Event] = None, **options: Any) -> Flask:
    app = Flask(__name__)

    @app.post("/feed")
    def feed() -> Any:
        runs.append("feed")
        size = int(request.args.get("size", "4"))
        chunk = int(request.args.get("chunk", "1"))

        def body() -> Iterator[bytes]:
            yield b"first;"
            if gate is not None:
                # Produced only after the client saw the first chunk: a host that buffers the
                # whole response deadlocks here (and the client sees no first byte).
                assert gate.wait(10), "the first chunk never reached the client"
            for _ in range(size):
                yield b"x" * chunk

        return app.response_class(body(), status=200, mimetype="text/plain")

    FlaskIdempotency(app, store=MemoryStore(), **options)
    return app


def test_streamed_response_reaches_the_client_as_produced_then_replays() -> None:
    import http.client

    runs: List[Any] = []
    gate = threading.Event()
    with werkzeug_server(stream_app(runs, gate)) as (host, port):
        conn = http.client.HTTPConnection(host, port, timeout=15)
        conn.request("POST", "/feed?size=3&chunk=4", body=b"{}",
                     headers={"Idempotency-Key": "feed-key-0001", "Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        assert response.read(6) == b"first;"  # before the handler produced the rest
        gate.set()
        assert response.read() == b"x" * 12
        conn.close()
        conn = http.client.HTTPConnection(host, port, timeout=15)
        conn.request("POST", "/feed?size=3&chunk=4", body=b"{}",
                     headers={"Idempotency-Key": "feed-key-0001", "Content-Type": "application/json"})
        replay = conn.getresponse()
        assert replay.getheader("Idempotent-Replayed") == "true"
        assert replay.read() == b"first;" + b"x" * 12
        conn.close()
    assert runs == ["feed"]


def test_stream_over_the_record_limit_reaches_the_client_and_is_not_retained() -> None:
    runs: List[Any] = []
    app = stream_app(runs, config=idempo.Config(max_stored_body_bytes=1000))
    c = app.test_client()
    h = {"Idempotency-Key": "feed-key-0002"}
    first = c.post("/feed?size=50&chunk=100", json={}, headers=h)
    assert first.status_code == 200 and first.data == b"first;" + b"x" * 5000
    for _ in range(2):
        again = c.post("/feed?size=50&chunk=100", json={}, headers=h)
        assert again.status_code == 500 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json is not None
        assert again.json["type"] == "urn:idempo:problem:response-not-retained"
    assert runs == ["feed"]


def test_large_stream_memory_stays_within_the_record_limit() -> None:
    """A 64 MiB streamed response: the host holds at most the record limit (1 MiB here) plus a
    small constant, never the response."""
    runs: List[Any] = []
    limit = 1 << 20
    app = stream_app(runs, config=idempo.Config(max_stored_body_bytes=limit))
    c = app.test_client()
    tracemalloc.start()
    try:
        response = c.post("/feed?size=1024&chunk=65536", json={},
                          headers={"Idempotency-Key": "feed-key-0003"}, buffered=False)
        seen = 0
        for chunk in response.response:
            seen += len(chunk)
        response.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == 6 + 1024 * 65536
    assert peak < limit + (16 << 20), peak
    print(f"\nWSGI 64 MiB stream: peak traced memory {peak / (1 << 20):.1f} MiB")


def test_client_gone_mid_stream_leaves_no_key_in_flight() -> None:
    runs: List[Any] = []
    app = stream_app(runs)
    c = app.test_client()
    h = {"Idempotency-Key": "feed-key-0004"}
    response = c.post("/feed?size=100", json={}, headers=h, buffered=False)
    next(iter(response.response))
    response.close()  # the server closes the iterable: the client went away
    retry = c.post("/feed?size=100", json={}, headers=h)
    assert retry.status_code == 500  # the record says: processed, response not retained
    assert retry.json is not None
    assert retry.json["type"] == "urn:idempo:problem:response-not-retained"
    assert runs == ["feed"]


# --- construction checks, reason phrases, renderer, warnings --------------------------------


@pytest.mark.parametrize(
    "store, fix",
    [
        ("idempo.sqlite3", "SQLiteStore('idempo.sqlite3')"),
        (SQLiteStore, "store=SQLiteStore(...)"),
        (lambda: MemoryStore(), "call it"),
        (object(), "not an idempotency store"),
        (AsyncMemoryStore(), "synchronous twin (MemoryStore)"),
    ],
)
def test_a_store_that_is_not_a_sync_store_fails_when_built(store: Any, fix: str) -> None:
    with pytest.raises(TypeError, match=__import__("re").escape(fix)):
        FlaskIdempotency(Flask(__name__), store=store)
    with pytest.raises(TypeError, match=__import__("re").escape(fix)):
        from idempo.wsgi import IdempotencyMiddleware

        IdempotencyMiddleware(lambda e, s: [], store=store)


def test_reason_phrases_pass_through_unchanged() -> None:
    import http.client

    app = Flask(__name__)

    @app.post("/declined")
    def declined() -> Any:
        return jsonify({"error": "card_declined"}), "402 Card Declined"

    @app.post("/plain402")
    def plain402() -> Any:
        return jsonify({"error": "card_declined"}), 402

    FlaskIdempotency(app, store=MemoryStore())
    with werkzeug_server(app) as (host, port):
        def post(path: str, key: str) -> Tuple[int, str, Optional[str]]:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request("POST", path, body=b"{}", headers={
                "Idempotency-Key": key, "Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            conn.close()
            return r.status, r.reason, r.getheader("Idempotent-Replayed")

        assert post("/declined", "reason-key-01") == (402, "Card Declined", None)
        assert post("/plain402", "reason-key-02") == (402, "PAYMENT REQUIRED", None)
        assert post("/plain402", "reason-key-02") == (402, "Payment Required", "true")
        assert post("/plain402", "x")[:2] == (400, "Bad Request")


def envelope(problem: idempo.Problem) -> Tuple[bytes, str]:
    body = {"error": {"type": problem.slug, "message": problem.detail,
                      "retry_after": problem.retry_after}}
    return json.dumps(body).encode(), "application/vnd.acme.error+json"


def test_problem_renderer_in_flask() -> None:
    runs: List[Any] = []
    app = Flask(__name__)

    @app.post("/own-problem")
    def own_problem() -> Any:
        runs.append("own")
        return app.response_class(b'{"type":"about:blank","title":"nope"}', status=400,
                                  content_type="application/problem+json")

    FlaskIdempotency(app, store=MemoryStore(), problem_renderer=envelope)
    c = app.test_client()
    missing = c.post("/own-problem", json={})
    assert missing.status_code == 400
    assert missing.content_type == "application/vnd.acme.error+json"
    assert missing.json == {"error": {"type": "missing-key", "message":
                                      "This endpoint requires an Idempotency-Key request header.",
                                      "retry_after": None}}
    assert int(missing.headers["Content-Length"]) == len(missing.data)
    # The handler's own problem+json is never rewritten, live or replayed.
    own = c.post("/own-problem", json={}, headers={"Idempotency-Key": "own-key-0001"})
    assert own.content_type == "application/problem+json" and own.json is not None
    assert own.json["type"] == "about:blank"
    assert c.post("/own-problem", json={"b": 2}, headers={"Idempotency-Key": "own-key-0001"}
                  ).json == {"error": {"type": "key-reused", "message": ANY,
                                       "retry_after": None}}
    with pytest.raises(TypeError, match="problem_renderer"):
        FlaskIdempotency(Flask(__name__), store=MemoryStore(), problem_renderer="json")


def test_problem_renderer_sees_retry_after_and_replayed_problems() -> None:
    runs: List[Any] = []
    gate = threading.Event()
    app = stream_app(runs, gate, problem_renderer=envelope,
                     config=idempo.Config(max_stored_body_bytes=5))
    c = app.test_client()
    h = {"Idempotency-Key": "render-key-01"}
    first = c.post("/feed?size=3", json={}, headers=h, buffered=False)
    chunks = iter(first.response)
    assert next(chunks) == b"first;"
    busy = c.post("/feed?size=3", json={}, headers=h)
    assert busy.status_code == 409 and busy.headers["Retry-After"] == "1"
    assert busy.json is not None and busy.json["error"]["type"] == "in-flight"
    assert busy.json["error"]["retry_after"] == 1
    gate.set()
    assert b"".join(chunks) == b"xxx"
    first.close()
    replay = c.post("/feed?size=3", json={}, headers=h)
    assert replay.status_code == 500 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json is not None and replay.json["error"]["type"] == "response-not-retained"


def test_a_failing_renderer_is_logged_and_rfc9457_is_sent(caplog: pytest.LogCaptureFixture) -> None:
    def broken(problem: idempo.Problem) -> Tuple[bytes, str]:
        raise RuntimeError("boom")

    app = echo_app([], problem_renderer=broken)
    with caplog.at_level(logging.ERROR, logger="idempo"):
        r = app.test_client().post("/echo", data=b"x")
    assert r.status_code == 400 and r.content_type == "application/problem+json"
    assert "problem_renderer failed" in caplog.text


def test_unscoped_warning_names_what_happened(caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        app = echo_app([])
        r = app.test_client().post("/echo", data=b"x", headers={
            "Idempotency-Key": "warn-key-0001", "Authorization": "Bearer t"})
    assert r.status_code == 201
    texts = [str(w.message) for w in seen if issubclass(w.category, idempo.UnscopedKeyWarning)]
    assert len(texts) == 1 and "has no scope function" in texts[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        app = echo_app([], scope=lambda environ: None)
        with caplog.at_level(logging.ERROR, logger="idempo"):
            r = app.test_client().post("/echo", data=b"x", headers={
                "Idempotency-Key": "warn-key-0002", "Authorization": "Bearer t"})
    assert r.status_code == 500 and r.json is not None
    assert r.json["type"] == "urn:idempo:problem:scope-unresolved"
    assert not [w for w in seen if issubclass(w.category, idempo.UnscopedKeyWarning)]
    assert "returned None" in caplog.text and "has no scope function" not in caplog.text
