"""Shortcuts of the ASGI hosts' per-request work, each checked against the ordinary path it
replaces: the request target read in the extension (``asgi_target``), the memory store's step
read in the extension (``InlineMemory`` with its store), the middleware's decision remembered
per (method, path), and the flow's answer made of the handler's own header list and body."""

from __future__ import annotations

import asyncio
import types
from typing import Any, Dict, List, Optional

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import idempo
from idempo._idempo import ServerFlow, asgi_target
from idempo.asgi import IdempotencyMiddleware, _target
from idempo.stores import MemoryStore, memory_partition
from idempo.stores import memory as memory_module
from idempo.stores.memory import inline_memory

FP = "v1:" + "7" * 64


class Str(str):
    pass


SCOPES: List[Dict[str, Any]] = [
    {"path": "/a", "raw_path": b"/a", "query_string": b""},
    {"path": "/a", "raw_path": b"/a%20b", "query_string": b"x=1&y=\xe9"},
    {"path": "/\u00e9", "query_string": b"q"},
    {"path": "/p", "raw_path": None, "query_string": None},
    {"path": "/p", "raw_path": b"", "query_string": b"z"},
    {"raw_path": b"/only-raw"},
    {},
    {"path": "/p", "raw_path": bytearray(b"/ba"), "query_string": b"q"},
    {"path": "/p", "raw_path": b"/r", "query_string": bytearray(b"q")},
    {"path": "/p", "raw_path": b"/r", "query_string": memoryview(b"mv")},
    {"path": Str("/sub"), "query_string": b""},
    {"path": 7, "query_string": b""},
    {"path": "/lone-\udc80", "query_string": b""},
]


@pytest.mark.parametrize("scope", SCOPES)
def test_the_target_read_in_the_extension_is_the_hosts(scope: Dict[str, Any]) -> None:
    expected = _target(scope)
    found = asgi_target(scope)
    assert found is None or found == expected
    assert (found or _target(scope)) == expected


def test_the_target_of_a_scope_that_is_not_a_dict_is_left_to_the_host() -> None:
    class Scope(dict):  # type: ignore[type-arg]
        pass

    assert asgi_target(Scope(path="/a")) is None
    assert asgi_target(types.MappingProxyType({"path": "/a"})) is None


def _claimed_lease(store: MemoryStore) -> Optional[int]:
    """The lease end of a claim the flow made on ``store`` inline (None: it went to the host)."""
    memory = inline_memory(store.with_partition(memory_partition("p")))
    assert memory is not None
    _, action = ServerFlow.start(b"\x01" * 32, FP, idempo.Config(lease_ms=1_000), b"\x05" * 16,
                                 memory)
    if action.kind != "run_handler":
        return None
    row = store._core.get(b"\x01" * 32)
    return int(row[4])


def test_the_step_read_in_the_extension_is_the_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    # The default clock, read through the module's ``time`` as ``_monotonic_ms`` reads it.
    fake = types.SimpleNamespace(monotonic_ns=lambda: 7_000_000_123)
    monkeypatch.setattr(memory_module, "time", fake)
    assert MemoryStore()._step() == 7_000
    assert _claimed_lease(MemoryStore()) == 7_000 + 1_000
    # A clock of the store's own, set at construction or later: called.
    assert _claimed_lease(MemoryStore(clock=lambda: 50_000)) == 51_000
    late = MemoryStore()
    memory = inline_memory(late.with_partition(memory_partition("p")))
    late._clock = lambda: 90_000  # type: ignore[method-assign]
    assert memory is not None
    _, action = ServerFlow.start(b"\x02" * 32, FP, idempo.Config(lease_ms=1_000), b"\x06" * 16,
                                 memory)
    assert action.kind == "run_handler" and int(late._core.get(b"\x02" * 32)[4]) == 91_000
    # A clock that raises, once: the claim goes to the store's method (which raises it).
    calls: List[int] = []

    def broken() -> int:
        calls.append(1)
        raise RuntimeError("clock")

    monkeypatch.setattr(memory_module, "time", types.SimpleNamespace(monotonic_ns=broken))
    assert _claimed_lease(MemoryStore()) is None
    assert calls == [1]


def test_a_forked_store_is_refused_by_its_own_step(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    store._pid = -1  # as if this process were a fork of the one that built the store
    assert _claimed_lease(store) is None  # the store's method raises StoreUnavailable
    allowed = MemoryStore(allow_multiprocess=True, clock=lambda: 3_000)
    allowed._pid = -1
    assert _claimed_lease(allowed) == 4_000


def _app(seen: List[str]) -> Starlette:
    async def pay(request: Request) -> Response:
        seen.append(request.url.path)
        return JSONResponse({"ok": True}, status_code=201)

    @idempo.idempotent(enabled=False)
    async def free(request: Request) -> Response:
        seen.append("free")
        return JSONResponse({"free": True})

    return Starlette(routes=[Route("/pay/{id}", pay, methods=["POST", "PUT"]),
                             Route("/free", free, methods=["POST"])])


def _post(app: Any, path: str, key: str, method: str = "POST") -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.request(method, path, json={"a": 1}, headers={"Idempotency-Key": f"fast-path-key-{key}-0123456789"})

    return asyncio.run(go())


def _middleware(app: Starlette) -> IdempotencyMiddleware:
    """The app's idempo middleware (built with its first request)."""
    found: Any = app.middleware_stack
    while not isinstance(found, IdempotencyMiddleware):
        found = found.app
    return found


def test_the_remembered_decision_is_the_decision() -> None:
    seen: List[str] = []
    app = _app(seen)
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore())
    mw = app
    for _ in range(2):
        assert _post(mw, "/pay/1", "k1").status_code == 201
    assert seen == ["/pay/1"]  # the second was a replay
    for _ in range(2):  # exempt: runs every time
        assert _post(mw, "/free", "k2").status_code == 200
    for _ in range(2):  # not a protected method: runs every time
        assert _post(mw, "/pay/2", "k3", "PUT").status_code == 201
    assert _post(mw, "/nowhere", "k4").status_code == 404
    assert seen == ["/pay/1", "free", "free", "/pay/2", "/pay/2"]
    assert ("POST", "/pay/1", "") in _middleware(app)._routes.decided
    # The app's routes replaced: decided again.
    app.router.routes = [Route("/pay/{id}", app.routes[1].endpoint, methods=["POST"])]
    for _ in range(2):
        assert _post(mw, "/pay/1", "k5").status_code == 200
    assert seen[-2:] == ["free", "free"]


def test_a_route_function_is_called_for_every_request() -> None:
    seen: List[str] = []
    called: List[str] = []

    def route(scope: Any) -> Optional[str]:
        called.append(scope["path"])
        return "/custom"

    app = _app(seen)
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), route=route)
    for _ in range(2):
        assert _post(app, "/pay/1", "k1").status_code == 201
    assert seen == ["/pay/1"] and called == ["/pay/1", "/pay/1"]
    assert not _middleware(app)._routes.decided


def _answer_to(headers: Any, body: Any) -> Any:
    """The action answering a handler's response with ``headers`` and ``body``."""
    store = MemoryStore()
    memory = inline_memory(store.with_partition(memory_partition("p")))
    flow, action = ServerFlow.start(b"\x03" * 32, FP, idempo.Config(), b"\x07" * 16, memory)
    assert action.kind == "run_handler"
    return flow.handler_finished(201, headers, body, None, False, False, memory)


def test_an_answer_made_of_the_handlers_own_objects_is_the_same_answer() -> None:
    pairs = [("content-type", "application/json"), ("x-trace", "\u00e9t\u00e9")]
    body = b'{"ok":true}'
    done = _answer_to(pairs, body)
    assert (done.kind, done.status, done.outcome, done.handler_ran) == (
        "respond", 201, "stored", True)
    assert done.headers == pairs and done.body == body
    assert done.headers is pairs and done.body is body  # the handler's own objects
    # Other shapes: the same values, in the answer's own shape (tuples of str, bytes).
    for headers, given in [
        ([(b"content-type", b"application/json")], None),
        (tuple(pairs[:1]), None),
        ([(Str("content-type"), "application/json")], None),
        (pairs[:1], bytearray(body)),
    ]:
        other = _answer_to(headers, body if given is None else given)
        assert other.headers == [("content-type", "application/json")], headers
        assert all(type(n) is str and type(v) is str for n, v in other.headers)
        assert type(other.body) is bytes and other.body == body
        assert other.headers is not headers


def test_a_lock_of_another_kind_is_asked_at_each_step() -> None:
    """The extension takes a ``threading.Lock``'s methods once; any other lock's are looked up
    (and so can be replaced) at each step, as before."""
    import threading

    calls: List[str] = []

    class Counting:
        def __init__(self) -> None:
            self.inner = threading.Lock()

        def acquire(self) -> bool:
            calls.append("acquire")
            return self.inner.acquire()

        def release(self) -> None:
            calls.append("release")
            self.inner.release()

    store = MemoryStore(clock=lambda: 1_000)
    lock = Counting()
    store._lock = lock  # type: ignore[assignment]
    assert _claimed_lease(store) == 2_000
    assert calls == ["acquire", "release"]
    lock.acquire = lambda: calls.append("replaced") or True  # type: ignore[method-assign]
    memory = inline_memory(store.with_partition(memory_partition("p")))
    ServerFlow.start(b"\x09" * 32, FP, idempo.Config(), b"\x08" * 16, memory)
    assert calls[-2:] == ["replaced", "release"]


def test_admit_by_position_is_admit_by_keyword_and_authenticated_is_required() -> None:
    from idempo._idempo import Admission, Fingerprinter, ScopeRule

    config = idempo.Config()
    key = [b"fast-path-admit-key-0123456789"]
    seen: List[Any] = []

    def principal(argument: Any) -> str:
        seen.append(argument)
        return "tenant-a"

    rule = ScopeRule(function=True)
    for authenticated in (False, True):
        by_keyword = Admission.start(config, key, 7)
        by_position = Admission.start(config, key, 7)
        want = by_keyword.admit(
            Fingerprinter(), rule, "POST", "/p?q", "/p", b'{"a":1}', None, "application/json",
            over_limit=False, authenticated=authenticated, scope_function=principal,
            scope_argument="arg")
        got = by_position.admit(
            Fingerprinter(), rule, "POST", "/p?q", "/p", b'{"a":1}', None, "application/json",
            False, authenticated, principal, "arg")
        assert got == want and got is not None
        assert (by_position.kind, by_position.warning) == (by_keyword.kind, by_keyword.warning)
    assert seen == ["arg"] * 4
    for missing in ({}, {"authenticated": None}):
        admission = Admission.start(config, key, 7)
        with pytest.raises(TypeError, match="authenticated"):
            admission.admit(Fingerprinter(), rule, "POST", "/p", "/p", b"{}", **missing)
        assert admission.kind == "read_body"  # nothing ran


def test_a_response_filled_in_one_call_is_the_response_read_attribute_by_attribute() -> None:
    from dataclasses import fields

    from idempo._flow import Response as FlowResponse
    from idempo._flow import response_of
    from idempo._idempo import unavailable_problem

    done = _answer_to([("content-type", "application/json")], b'{"ok":true}')
    for action in (done, unavailable_problem(idempo.Config())):
        response = response_of(action)
        want = FlowResponse(action.status, list(action.headers), action.body,
                            action.outcome or "", action.handler_ran)
        assert response == want
        assert list(vars(response)) == [f.name for f in fields(FlowResponse)]
        assert response.headers is not action.headers  # a copy, as list(...) made
    memory = inline_memory(MemoryStore().with_partition(memory_partition("p")))
    _, running = ServerFlow.start(b"\x04" * 32, FP, idempo.Config(), b"\x0a" * 16, memory)
    with pytest.raises(AssertionError):
        response_of(running)


def test_the_remembered_running_loop_is_the_running_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``idempo._loop.running_loop`` (``asyncio.get_running_loop`` without its ``getpid()`` on
    3.11) answers what asyncio answers: a new loop in the same thread, another thread (with and
    without a loop of its own), no loop at all, a forked child (RuntimeError, as asyncio)."""
    import os
    import sys
    import threading

    from idempo import _loop

    asked: List[int] = []
    real = asyncio.get_running_loop

    def counted() -> asyncio.AbstractEventLoop:
        asked.append(1)
        return real()

    monkeypatch.setattr(asyncio, "get_running_loop", counted)
    seen: List[Any] = []

    async def both() -> None:
        for _ in range(3):
            seen.append((_loop.running_loop(), real()))

    asyncio.run(both())
    asyncio.run(both())  # a new loop in the same thread: never the stopped one
    assert len({id(loop) for loop, _ in seen}) == 2
    assert all(mine is theirs for mine, theirs in seen)
    if sys.version_info < (3, 12) and sys.platform != "win32":
        assert len(asked) == 2, "the running loop is asked once per loop, then remembered"
    with pytest.raises(RuntimeError):
        _loop.running_loop()  # no loop runs (the last one stopped)

    # Another thread, while this thread's loop runs and is remembered.
    found: Dict[str, Any] = {}

    def other() -> None:
        try:
            _loop.running_loop()
            found["bare"] = "a loop"
        except RuntimeError:
            found["bare"] = None

        async def own() -> None:
            found["own"] = (_loop.running_loop(), real())

        asyncio.run(own())

    async def main() -> None:
        _loop.running_loop()
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert _loop.running_loop() is real()

    asyncio.run(main())
    assert found["bare"] is None, "another thread got this thread's loop"
    assert found["own"][0] is found["own"][1]

    if hasattr(os, "fork"):
        async def forked() -> int:
            assert _loop.running_loop() is real()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child: the parent's loop is not its own
                try:
                    _loop.running_loop()
                    os._exit(1)
                except RuntimeError:
                    os._exit(0 if _loop.PID[0] == os.getpid() else 2)
            return pid

        status = os.waitpid(asyncio.run(forked()), 0)[1]
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


@pytest.mark.parametrize("headers,body", [
    ([], b""),
    ([("content-type", "application/json")], b'{"a":1}'),
    ([("Content-Length", "3"), ("x-a", "\u00e9\u00ff")], b"abc"),
    ([("CONTENT-LENGTH", "9"), ("content-length", "3")], b"abc"),
    ((("content-type", "text/plain"),), b"xyz"),
    ([("idempotent-replayed", "true"), ("content-type", "application/problem+json")], b"{}"),
])
def test_start_headers_encoded_in_the_extension_are_the_hosts(
    headers: Any, body: bytes
) -> None:
    from idempo._host import with_content_length
    from idempo._idempo import asgi_start_headers

    expected = [(n.encode("latin-1"), v.encode("latin-1"))
                for n, v in with_content_length(list(headers), body)]
    got = asgi_start_headers(headers, len(body))
    assert got == expected
    assert all(type(n) is bytes and type(v) is bytes for n, v in got or ())


@pytest.mark.parametrize("headers", [
    [("x-a", "\u0100")],  # not Latin-1: the host's encode raises, as it always did
    [("x-\ud800", "v")],
    [(b"x-a", b"v")],
    [(Str("x-a"), "v")],
    [("x-a", "v", "w")],
    [["x-a", "v"]],
    {"x-a": "v"},
])
def test_start_headers_of_another_shape_are_left_to_the_host(headers: Any) -> None:
    from idempo._idempo import asgi_start_headers

    assert asgi_start_headers(headers, 0) is None


def test_a_body_the_dependency_reads_itself_is_read_as_starlettes_stream_reads_it() -> None:
    """FastAPI's integration reads the body of an endpoint without a body parameter from the
    request's messages (no stream generator): chunks joined, the limit counted across chunks,
    the endpoint's own read finding the body, a disconnect raised as Starlette raises it."""
    from fastapi import Depends, FastAPI

    from idempo.fastapi import Idempotency

    idempotency = Idempotency(store=MemoryStore(), public=True,
                              config=idempo.Config(max_request_body_bytes=8))
    app = FastAPI()
    app.router.route_class = idempotency.route_class
    seen: List[bytes] = []

    @app.post("/raw")
    async def raw(request: Request, execution: idempo.Execution = Depends(idempotency)) -> Any:
        seen.append(await request.body())
        seen.append(b"".join([chunk async for chunk in request.stream()]))
        return {"n": len(seen)}

    async def call(messages: List[Dict[str, Any]], key: bytes) -> List[Dict[str, Any]]:
        sent: List[Dict[str, Any]] = []
        queue = list(messages)

        async def receive() -> Dict[str, Any]:
            return queue.pop(0) if queue else {"type": "http.disconnect"}

        async def send(message: Dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/raw", "raw_path": b"/raw",
                 "query_string": b"", "root_path": "", "scheme": "http",
                 "server": ("t", 80), "client": ("c", 1), "http_version": "1.1",
                 "asgi": {"version": "3.0"},
                 "headers": [(b"idempotency-key", key),
                             (b"content-type", b"application/octet-stream")]}
        await app(scope, receive, send)
        return sent

    def chunks(*parts: bytes) -> List[Dict[str, Any]]:
        return [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                for i, p in enumerate(parts)]

    async def main() -> None:
        ok = await call(chunks(b"ab", b"", b"cd"), b"body-0001")
        assert ok[0]["status"] == 200 and seen == [b"abcd", b"abcd"]
        again = await call(chunks(b"abc", b"d"), b"body-0001")  # the same body: a replay
        assert (b"idempotent-replayed", b"true") in again[0]["headers"]
        mismatch = await call(chunks(b"abcx"), b"body-0001")
        assert mismatch[0]["status"] == 422
        big = await call(chunks(b"12345", b"6789"), b"body-0002")  # 9 bytes over 8
        assert big[0]["status"] == 413
        assert (await call(chunks(b"123456789"), b"body-0004"))[0]["status"] == 413
        from starlette.requests import ClientDisconnect
        with pytest.raises(ClientDisconnect):
            await call([{"type": "http.request", "body": b"ab", "more_body": True}],
                       b"body-0003")
        assert seen == [b"abcd", b"abcd"]

    asyncio.run(main())
