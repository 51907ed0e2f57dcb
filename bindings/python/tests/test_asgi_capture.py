"""How the ASGI integrations (the middleware and the FastAPI dependency) capture a response
(issue 13): exact replays with compression on either side (finding 2), background tasks after the
record (finding 3), ``http.response.pathsend`` (finding 4), streams teed as they are produced
(finding 5). Real uvicorn where the transport matters."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

import httpx
import pytest
from fastapi import BackgroundTasks, Depends, FastAPI
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.middleware.gzip import GZipMiddleware

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.fastapi import Idempotency
from idempo.stores import AsyncMemoryStore

from asgi_servers import run, serving

INTEGRATIONS = ["middleware", "dependency"]


def protected(integration: str, config: Optional[idempo.Config] = None
              ) -> Tuple[FastAPI, List[Any]]:
    """A FastAPI app and the route dependencies that protect a route with ``integration``."""
    app = FastAPI()
    store = AsyncMemoryStore()
    if integration == "dependency":
        idempotency = Idempotency(store=store, public=True, config=config)
        app.router.route_class = idempotency.route_class
        return app, [Depends(idempotency)]
    app.add_middleware(IdempotencyMiddleware, store=store, public=True, config=config)
    return app, []


async def raw(c: httpx.AsyncClient, path: str, headers: Dict[str, str]) -> Tuple[httpx.Response, bytes]:
    """The response and its body bytes exactly as sent (not decoded)."""
    request = c.build_request("POST", path, json={"amount": 1}, headers=headers)
    response = await c.send(request, stream=True)
    body = b"".join([chunk async for chunk in response.aiter_raw()])
    await response.aclose()
    return response, body


# --- finding 2: compression ----------------------------------------------------------------

TEXT = b"compress me, a payment receipt " * 200


@pytest.mark.parametrize("streamed", [False, True])
def test_gzip_inside_the_middleware_replays_the_first_clients_bytes(streamed: bool) -> None:
    """GZip added before idempo runs inside it: idempo records the compressed bytes, and a replay
    is exactly those bytes with their Content-Encoding and Vary, whatever the retry asks."""
    runs: List[str] = []
    app = FastAPI()

    @app.post("/receipt")
    async def receipt() -> Any:
        runs.append("receipt")
        if streamed:
            async def parts() -> AsyncIterator[bytes]:
                for i in range(0, len(TEXT), 1000):
                    yield TEXT[i:i + 1000]
            return StreamingResponse(parts(), media_type="text/plain")
        return Response(TEXT, media_type="text/plain")

    app.add_middleware(GZipMiddleware, minimum_size=10)  # inner
    app.add_middleware(IdempotencyMiddleware, store=AsyncMemoryStore(), public=True)  # outer

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "receipt-0001", "accept-encoding": "gzip"}
        first, first_bytes = await raw(c, "/receipt", h)
        assert first.headers["content-encoding"] == "gzip"
        assert gzip.decompress(first_bytes) == TEXT
        for accept in ("gzip", "identity"):
            replay, replay_bytes = await raw(c, "/receipt", {**h, "accept-encoding": accept})
            assert replay.headers["idempotent-replayed"] == "true"
            assert replay_bytes == first_bytes  # byte for byte what the first client received
            assert replay.headers["content-encoding"] == "gzip"
            assert replay.headers["content-type"] == first.headers["content-type"]
            assert "accept-encoding" in replay.headers["vary"].lower()

    run(app, go)
    assert runs == ["receipt"]


@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_gzip_outside_idempo_compresses_each_replay_as_its_client_asks(integration: str) -> None:
    """GZip outside idempo (added after the middleware; always so for the dependency): idempo
    records the plain bytes; each answer is compressed by GZip for its own request."""
    runs: List[str] = []
    app, deps = protected(integration)

    @app.post("/receipt", dependencies=deps)
    async def receipt() -> Any:
        runs.append("receipt")
        return Response(TEXT, media_type="text/plain")

    app.add_middleware(GZipMiddleware, minimum_size=10)  # outer

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "receipt-0002", "accept-encoding": "gzip"}
        first, first_bytes = await raw(c, "/receipt", h)
        assert first.headers["content-encoding"] == "gzip" and gzip.decompress(first_bytes) == TEXT
        zipped, zipped_bytes = await raw(c, "/receipt", h)
        assert zipped.headers["idempotent-replayed"] == "true"
        assert zipped.headers["content-encoding"] == "gzip"
        assert gzip.decompress(zipped_bytes) == TEXT
        assert "accept-encoding" in zipped.headers["vary"].lower()
        plain, plain_bytes = await raw(c, "/receipt", {**h, "accept-encoding": "identity"})
        assert plain.headers["idempotent-replayed"] == "true"
        assert "content-encoding" not in plain.headers and plain_bytes == TEXT

    run(app, go)
    assert runs == ["receipt"]


# --- finding 3: background tasks -----------------------------------------------------------


@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_a_failing_background_task_changes_neither_the_answer_nor_the_record(integration: str) -> None:
    runs: List[str] = []
    app, deps = protected(integration)

    def explode() -> None:
        runs.append("background")
        raise RuntimeError("the receipt mailer is down")

    @app.post("/payments", status_code=201, dependencies=deps)
    async def pay() -> Any:
        runs.append("pay")
        return JSONResponse({"charge": len(runs)}, status_code=201,
                            background=BackgroundTask(explode))

    # Connection: close: the server closes a connection whose application raised (with or
    # without idempo), so each request gets its own.
    with serving(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        h = {"Idempotency-Key": "pay-bg-00001", "connection": "close"}
        first = c.post("/payments", json={"amount": 1}, headers=h)
        assert first.status_code == 201 and first.json() == {"charge": 1}
        retry = c.post("/payments", json={"amount": 1}, headers=h)
        assert retry.status_code == 201, retry.text  # not outcome-unknown
        assert retry.headers["idempotent-replayed"] == "true" and retry.json() == {"charge": 1}
    assert runs == ["pay", "background"]


@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_a_slow_background_task_runs_after_the_record_and_does_not_delay_the_answer(
        integration: str) -> None:
    runs: List[str] = []
    seen_by_background: List[str] = []
    app, deps = protected(integration)
    base: Dict[str, str] = {}

    async def slow_follow_up() -> None:
        # The record is written before the background task runs: a retry now is a replay.
        async with httpx.AsyncClient(base_url=base["url"], timeout=5) as c:
            r = await c.post("/payments", json={"amount": 1},
                             headers={"Idempotency-Key": "pay-bg-00002"})
            seen_by_background.append(r.headers.get("idempotent-replayed", "no"))
        await asyncio.sleep(1.5)
        runs.append("background done")

    @app.post("/payments", status_code=201, dependencies=deps)
    async def pay(tasks: BackgroundTasks) -> Dict[str, int]:
        runs.append("pay")
        tasks.add_task(slow_follow_up)
        return {"charge": len(runs)}

    with serving(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        base["url"] = url
        started = time.monotonic()
        first = c.post("/payments", json={"amount": 1}, headers={"Idempotency-Key": "pay-bg-00002"})
        elapsed = time.monotonic() - started
        assert first.status_code == 201 and first.json() == {"charge": 1}
        assert elapsed < 1.0, f"the answer waited for the background task ({elapsed:.2f} s)"
        deadline = time.monotonic() + 5
        while "background done" not in runs and time.monotonic() < deadline:
            time.sleep(0.05)
    assert seen_by_background == ["true"]
    assert runs == ["pay", "background done"]


# --- finding 4: http.response.pathsend -----------------------------------------------------


async def pathsend_server(app: Any, path: str, headers: Dict[str, str], body: bytes
                          ) -> Tuple[int, Dict[str, str], bytes]:
    """One request through an ASGI server that offers ``http.response.pathsend`` (as Granian
    and Hypercorn do; uvicorn does not): it sends the file named by a pathsend message."""
    done = asyncio.Event()
    sent_body = False
    status = 0
    out_headers: Dict[str, str] = {}
    chunks: List[bytes] = []
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
        "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in
                    {**headers, "content-length": str(len(body)),
                     "content-type": "application/json"}.items()],
        "server": ("test", 80), "client": ("127.0.0.1", 5000),
        "extensions": {"http.response.pathsend": {}},
    }

    async def receive() -> Dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            out_headers.update({k.decode(): v.decode() for k, v in message["headers"]})
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()
        elif message["type"] == "http.response.pathsend":
            chunks.append(Path(message["path"]).read_bytes())
            done.set()

    await app(scope, receive, send)
    return status, out_headers, b"".join(chunks)


@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_a_file_response_under_a_pathsend_server_is_sent_recorded_and_replayed(
        integration: str, tmp_path: Path) -> None:
    runs: List[str] = []
    report = tmp_path / "report.csv"
    content = b"id,amount\n" + b"".join(b"%d,100\n" % i for i in range(150))  # about 1.1 kB
    report.write_bytes(content)
    app, deps = protected(integration)

    @app.post("/reports", dependencies=deps)
    async def make_report() -> FileResponse:
        runs.append("report")
        return FileResponse(report, media_type="text/csv")

    async def main() -> None:
        h = {"idempotency-key": "report-00001"}
        status, headers, body = await pathsend_server(app, "/reports", h, b"{}")
        assert status == 200 and body == content
        assert headers["content-length"] == str(len(content))
        status2, headers2, body2 = await pathsend_server(app, "/reports", h, b"{}")
        assert status2 == 200 and headers2["idempotent-replayed"] == "true" and body2 == content

    asyncio.run(main())
    assert runs == ["report"]


def test_an_app_that_sends_pathsend_anyway_has_its_file_read(tmp_path: Path) -> None:
    """A raw ASGI app that sends ``pathsend`` although idempo does not offer it: idempo reads
    the file (the client gets its bytes, the record keeps them)."""
    report = tmp_path / "big.bin"
    content = bytes(range(256)) * 700  # 179,200 bytes: several file chunks
    report.write_bytes(content)
    calls: List[Dict[str, Any]] = []

    async def raw_app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        calls.append(dict(scope.get("extensions") or {}))
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.pathsend", "path": str(report)})

    app = IdempotencyMiddleware(raw_app, store=AsyncMemoryStore(), public=True,
                                config=idempo.Config(max_stored_body_bytes=1 << 20))

    async def main() -> None:
        h = {"idempotency-key": "raw-file-0001"}
        status, _, body = await pathsend_server(app, "/file", h, b"{}")
        assert status == 200 and body == content
        status2, headers2, body2 = await pathsend_server(app, "/file", h, b"{}")
        assert headers2["idempotent-replayed"] == "true" and body2 == content

    asyncio.run(main())
    assert len(calls) == 1 and "http.response.pathsend" not in calls[0]


# --- finding 5: streams --------------------------------------------------------------------


@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_sse_headers_and_each_event_reach_the_client_as_the_handler_produces_them(
        integration: str) -> None:
    """A server-sent event stream through idempo under uvicorn: the headers arrive before the
    first event exists, each event before the next is produced; the retry replays the stream."""
    runs: List[str] = []
    go_on = threading.Event()  # set by the client once it saw what it should have seen
    app, deps = protected(integration)

    async def wait_for_client() -> None:
        deadline = time.monotonic() + 5
        while not go_on.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        go_on.clear()

    @app.post("/events", dependencies=deps)
    async def events() -> StreamingResponse:
        runs.append("events")

        async def stream() -> AsyncIterator[bytes]:
            await wait_for_client()  # the client holds the headers before the first event
            yield b"data: one\n\n"
            await wait_for_client()  # ... and the first event before the second exists
            yield b"data: two\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    with serving(app) as url, httpx.Client(base_url=url, timeout=3) as c:
        h = {"Idempotency-Key": "events-00001"}
        with c.stream("POST", "/events", json={"amount": 1}, headers=h) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            go_on.set()
            parts = r.iter_raw()
            assert next(parts) == b"data: one\n\n"
            go_on.set()
            assert b"".join(parts) == b"data: two\n\n"
        replay = c.post("/events", json={"amount": 1}, headers=h)
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.content == b"data: one\n\ndata: two\n\n"
    assert runs == ["events"]


@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_a_stream_past_the_record_limit_reaches_the_client_and_retries_get_not_retained(
        integration: str) -> None:
    runs: List[str] = []
    app, deps = protected(integration, config=idempo.Config(max_stored_body_bytes=4096))

    @app.post("/export", dependencies=deps)
    async def export() -> StreamingResponse:
        runs.append("export")

        async def parts() -> AsyncIterator[bytes]:
            for i in range(10):
                yield bytes([65 + i]) * 1000

        return StreamingResponse(parts(), media_type="application/octet-stream")

    with serving(app) as url, httpx.Client(base_url=url, timeout=5) as c:
        h = {"Idempotency-Key": "export-00001"}
        first = c.post("/export", json={"amount": 1}, headers=h)
        assert first.status_code == 200
        assert first.content == b"".join(bytes([65 + i]) * 1000 for i in range(10))
        for _ in range(2):
            retry = c.post("/export", json={"amount": 1}, headers=h)
            assert retry.status_code == 500 and retry.headers["idempotent-replayed"] == "true"
            assert retry.json()["type"] == "urn:idempo:problem:response-not-retained"
    assert runs == ["export"]


@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_a_stream_the_client_left_midway_is_never_replayed_as_the_whole_response(
        integration: str) -> None:
    """Under uvicorn (ASGI spec 2.3) Starlette stops a stream when the client disconnects and
    returns normally: the part that was sent is not the response, so retries get core's
    not-retained problem, never the partial body as if it were complete."""
    runs: List[str] = []
    left = threading.Event()
    app, deps = protected(integration)

    @app.post("/export", dependencies=deps)
    async def export() -> StreamingResponse:
        runs.append("export")

        async def parts() -> AsyncIterator[bytes]:
            yield b"part one\n"
            deadline = time.monotonic() + 5
            while not left.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # the server has seen the disconnect by now
            yield b"part two\n"

        return StreamingResponse(parts(), media_type="text/plain")

    with serving(app) as url:
        h = {"Idempotency-Key": "export-left-01"}
        with httpx.Client(base_url=url, timeout=5) as c:
            with c.stream("POST", "/export", json={"amount": 1}, headers=h) as r:
                assert next(r.iter_raw()) == b"part one\n"
        left.set()  # the connection is closed
        time.sleep(0.6)
        with httpx.Client(base_url=url, timeout=5) as c:
            retry = c.post("/export", json={"amount": 1}, headers=h)
        assert retry.status_code == 500, (retry.status_code, retry.content)
        assert retry.headers["idempotent-replayed"] == "true"
        assert retry.json()["type"] == "urn:idempo:problem:response-not-retained"
    assert runs == ["export"]


# --- finding 7: what says the request never ran is not stored (core's table, PROTOCOL §9) ---


@pytest.mark.parametrize("status", [401, 403, 407, 408, 429])
@pytest.mark.parametrize("integration", INTEGRATIONS)
def test_a_refusal_status_is_not_stored_and_the_fixed_request_runs(integration: str,
                                                                    status: int) -> None:
    runs: List[str] = []
    app, deps = protected(integration)
    answer = {"status": status}

    @app.post("/payments", status_code=201, dependencies=deps)
    async def pay() -> Any:
        runs.append("pay")
        if answer["status"] != 201:
            return JSONResponse({"error": "refused"}, status_code=answer["status"])
        return {"charge": len(runs)}

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "refused-0001"}
        refused = await c.post("/payments", json={"amount": 1}, headers=h)
        assert refused.status_code == status
        answer["status"] = 201
        fixed = await c.post("/payments", json={"amount": 1}, headers=h)
        assert fixed.status_code == 201 and "idempotent-replayed" not in fixed.headers
        again = await c.post("/payments", json={"amount": 1}, headers=h)
        assert again.headers["idempotent-replayed"] == "true" and again.json() == fixed.json()

    run(app, go)
    assert runs == ["pay", "pay"]


@pytest.mark.parametrize("raw", [
    [(b"content-type", b"application/json"), (b"content-length", b"7")],
    [(b"Content-Length", b"7"), (b"x-caf\xe9", b"\xe9t\xe9")],
    [(b"CONTENT-LENGTH", b"0")],
    [(b"x-a", b"1"), (b"x-a", b"2")],
    [(b"content-lengt", b"1"), (b"content-length-x", b"2")],
    [],
    (),
    ((b"content-length", b"3"),),
    [(bytearray(b"content-length"), b"3")],
    [(b"content-length", memoryview(b"3"))],
    [[b"content-length", b"3"]],
    [(b"a", b"b", b"c")],
    (h for h in [(b"content-length", b"3")]),
])
def test_the_response_headers_decoded_in_the_extension_are_the_capture_s(raw: Any) -> None:
    """``asgi_response_headers`` (what the capture uses) against the capture's own decoding:
    the same pairs and the same ``content-length`` verdict, or None (the capture decodes them
    itself) for any other shape."""
    from idempo._idempo import asgi_response_headers
    from idempo.asgi import _has_length

    got = asgi_response_headers(raw)
    shaped = type(raw) in (list, tuple) and all(
        type(p) is tuple and len(p) == 2 and type(p[0]) is bytes and type(p[1]) is bytes
        for p in raw)
    if not shaped:
        assert got is None
        return
    want = [(bytes(n).decode("latin-1"), bytes(v).decode("latin-1")) for n, v in raw]
    assert got == (want, _has_length(want))
