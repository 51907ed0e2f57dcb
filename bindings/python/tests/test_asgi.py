"""The ASGI middleware on Starlette, driven through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from storekit import ALL_KINDS, SERVICE_KINDS, open_store

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import MemoryStore


class Effects:
    def __init__(self) -> None:
        self.runs: List[Dict[str, Any]] = []
        self.lock = threading.Lock()

    def record(self, item: Dict[str, Any]) -> int:
        with self.lock:
            self.runs.append(item)
            return len(self.runs)


def make_app(store: Any, effects: Effects, delay: float = 0.0, **options: Any) -> Starlette:
    async def pay(request: Request) -> Response:
        body = await request.json()
        if delay or body.get("sleep"):
            await asyncio.sleep(body.get("sleep", delay))
        if body.get("fail"):
            effects.record({"failed": True})
            raise RuntimeError("handler failed after its side effect")
        n = effects.record(body)
        status = int(body.get("status", 201))
        return JSONResponse(
            {"payment": n, "amount": body.get("amount"),
             "downstream": request.state.idempotency.downstream_key},
            status_code=status,
            headers={"location": f"/payments/{n}", "set-cookie": "session=secret"},
        )

    @idempo.idempotent(enabled=False)
    async def exempt(request: Request) -> Response:
        effects.record({"exempt": True})
        return JSONResponse({"ok": True})

    @idempo.idempotent(config=idempo.Config(key_required=False))
    async def optional(request: Request) -> Response:
        n = effects.record({"optional": True})
        return JSONResponse({"n": n}, status_code=201)

    app = Starlette(routes=[
        Route("/payments/{account}", pay, methods=["POST"]),
        Route("/exempt", exempt, methods=["POST"]),
        Route("/optional", optional, methods=["POST"]),
    ])
    app.add_middleware(IdempotencyMiddleware, store=store, **options)
    return app


def client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def key(n: int) -> Dict[str, str]:
    return {"Idempotency-Key": f'"key-{n:08d}"'}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_new_replay_mismatch_and_problems() -> None:
    effects = Effects()
    outcomes: List[str] = []
    app = make_app(MemoryStore(), effects,
                   hooks=idempo.Hooks(on_outcome=lambda route, o: outcomes.append(f"{route} {o}")))

    async def main() -> None:
        async with client(app) as c:
            first = await c.post("/payments/a1", json={"amount": 10}, headers=key(1))
            assert first.status_code == 201 and "idempotent-replayed" not in first.headers
            assert first.headers["set-cookie"] == "session=secret"  # the live client gets it all
            again = await c.post("/payments/a1", json={"amount": 10}, headers=key(1))
            assert again.status_code == 201 and again.content == first.content
            assert again.headers["idempotent-replayed"] == "true"
            assert again.headers["location"] == first.headers["location"]
            assert "set-cookie" not in again.headers  # never stored
            # key order and whitespace do not matter: same canonical body
            same = await c.post("/payments/a1", content=b'{ "amount" : 10 }', headers={
                **key(1), "content-type": "application/json"})
            assert same.status_code == 201 and same.headers["idempotent-replayed"] == "true"
            other = await c.post("/payments/a1", json={"amount": 11}, headers=key(1))
            assert other.status_code == 422
            assert other.headers["content-type"] == "application/problem+json"
            assert other.json()["type"] == "urn:idempo:problem:key-reused"
            # same template, another concrete path: the fingerprint differs -> 422, not a replay
            moved = await c.post("/payments/a2", json={"amount": 10}, headers=key(1))
            assert moved.status_code == 422
            fresh = await c.post("/payments/a2", json={"amount": 10}, headers=key(2))
            assert fresh.status_code == 201 and fresh.json()["payment"] == 2
            missing = await c.post("/payments/a1", json={"amount": 10})
            assert missing.status_code == 400 and missing.json()["type"].endswith("missing-key")
            invalid = await c.post("/payments/a1", json={"amount": 10}, headers={"Idempotency-Key": "short"})
            assert invalid.status_code == 400 and invalid.json()["code"] == "too_short"
            dup = await c.post("/payments/a1", content=b'{"a":1,"a":2}', headers={
                **key(3), "content-type": "application/json"})
            assert dup.status_code == 400 and dup.json()["code"] == "duplicate_member"
            lossy = await c.post("/payments/a1", content=b'{"amount":9007199254740993}', headers={
                **key(4), "content-type": "application/json"})
            assert lossy.status_code == 400 and lossy.json()["code"] == "precision_loss"
            get = await c.get("/payments/a1")
            assert get.status_code == 405  # not protected: passes through

    run(main())
    assert len(effects.runs) == 2
    assert "/payments/{account} stored" in outcomes and "/payments/{account} replayed" in outcomes
    assert "/payments/{account} mismatch" in outcomes


def test_route_marks_and_optional_key() -> None:
    effects = Effects()
    app = make_app(MemoryStore(), effects)

    async def main() -> None:
        async with client(app) as c:
            assert (await c.post("/exempt", json={})).status_code == 200
            assert (await c.post("/exempt", json={})).status_code == 200
            a = await c.post("/optional", json={})
            b = await c.post("/optional", json={})
            assert a.status_code == b.status_code == 201 and a.json() != b.json()  # unprotected
            k1 = await c.post("/optional", json={}, headers=key(9))
            k2 = await c.post("/optional", json={}, headers=key(9))
            assert k2.headers["idempotent-replayed"] == "true" and k1.content == k2.content

    run(main())
    assert len(effects.runs) == 5


def test_body_limit_413() -> None:
    effects = Effects()
    app = make_app(MemoryStore(), effects, config=idempo.Config(max_request_body_bytes=64))

    async def main() -> None:
        async with client(app) as c:
            big = await c.post("/payments/a", json={"amount": 1, "pad": "x" * 100}, headers=key(1))
            assert big.status_code == 413 and big.json()["type"].endswith("body-too-large")
            ok = await c.post("/payments/a", json={"amount": 1}, headers=key(2))
            assert ok.status_code == 201

    run(main())
    assert len(effects.runs) == 1


class BrokenStore(MemoryStore):
    def claim(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("store is down")


def test_store_down_fails_closed_503() -> None:
    effects = Effects()
    errors: List[BaseException] = []
    app = make_app(BrokenStore(), effects,
                   hooks=idempo.Hooks(on_store_error=lambda route, e: errors.append(e)))

    async def main() -> None:
        async with client(app) as c:
            r = await c.post("/payments/a", json={"amount": 1}, headers=key(1))
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["type"].endswith("store-unavailable")

    run(main())
    assert effects.runs == [] and len(errors) == 1


def test_failed_handler_leaves_outcome_unknown() -> None:
    effects = Effects()
    app = make_app(MemoryStore(), effects, config=idempo.Config(lease_ms=1000))

    async def main() -> None:
        async with client(app) as c:
            with pytest.raises(RuntimeError, match="after its side effect"):
                await c.post("/payments/a", json={"fail": True}, headers=key(1))
            again = await c.post("/payments/a", json={"fail": True}, headers=key(1))
            assert again.status_code == 500
            assert again.json()["type"].endswith("outcome-unknown")

    run(main())
    assert len(effects.runs) == 1  # never re-run


def test_transient_status_is_not_stored() -> None:
    effects = Effects()
    app = make_app(MemoryStore(), effects)

    async def main() -> None:
        async with client(app) as c:
            a = await c.post("/payments/a", json={"status": 503}, headers=key(1))
            b = await c.post("/payments/a", json={"status": 503}, headers=key(1))
            assert a.status_code == b.status_code == 503 and "idempotent-replayed" not in b.headers

    run(main())
    assert len(effects.runs) == 2  # released: a retry runs again


def test_heartbeat_keeps_long_handler_owned() -> None:
    effects = Effects()
    app = make_app(MemoryStore(), effects, config=idempo.Config(lease_ms=1000, takeover="re_run"))

    async def main() -> None:
        async with client(app) as c:
            slow = asyncio.ensure_future(
                c.post("/payments/a", json={"sleep": 1.6}, headers=key(1)))
            await asyncio.sleep(1.3)  # past the first lease: only heartbeats keep it
            dup = await c.post("/payments/a", json={"sleep": 1.6}, headers=key(1))
            assert dup.status_code == 409
            assert (await slow).status_code == 201

    run(main())
    assert len(effects.runs) == 1


def test_unscoped_authenticated_request_warns() -> None:
    effects = Effects()
    app = make_app(MemoryStore(), effects)

    async def main() -> None:
        async with client(app) as c:
            with pytest.warns(idempo.UnscopedKeyWarning):
                await c.post("/payments/a", json={}, headers={**key(1), "Authorization": "Bearer x"})

    run(main())
    scoped = make_app(MemoryStore(), effects, scope=lambda s: "user-1")

    async def quiet() -> None:
        async with client(scoped) as c:
            r = await c.post("/payments/a", json={}, headers={**key(1), "Authorization": "Bearer x"})
            assert r.status_code == 201

    run(quiet())


def test_scope_function_separates_principals() -> None:
    effects = Effects()

    def principal(scope: Any) -> Optional[str]:
        for n, v in scope["headers"]:
            if n == b"x-user":
                return str(v.decode())
        return None

    app = make_app(MemoryStore(), effects, scope=principal)

    async def main() -> None:
        async with client(app) as c:
            a = await c.post("/payments/x", json={"amount": 1}, headers={**key(1), "x-user": "alice"})
            b = await c.post("/payments/x", json={"amount": 2}, headers={**key(1), "x-user": "bob"})
            assert a.status_code == b.status_code == 201 and "idempotent-replayed" not in b.headers

    run(main())
    assert len(effects.runs) == 2


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_concurrent_duplicates_run_once(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Many concurrent requests with one key, on every store: the handler runs exactly once."""
    services = request.getfixturevalue("services") if kind in SERVICE_KINDS else None
    effects = Effects()

    async def main() -> None:
        async with open_store(kind, tmp_path, services) as store:
            target = getattr(store, "store", store)  # the real store behind the test facade
            app = make_app(target, effects, delay=0.3)
            async with client(app) as c:
                rs = await asyncio.gather(*(
                    c.post("/payments/a", json={"amount": 5}, headers=key(77)) for _ in range(16)))
                statuses = sorted(r.status_code for r in rs)
                assert statuses.count(201) == 1 and statuses.count(409) == 15, statuses
                await asyncio.sleep(0.4)
                after = await c.post("/payments/a", json={"amount": 5}, headers=key(77))
                assert after.status_code == 201 and after.headers["idempotent-replayed"] == "true"

    run(main())
    assert len(effects.runs) == 1


def test_mounted_routes_use_the_full_template() -> None:
    from starlette.routing import Mount

    effects = Effects()
    seen: List[str] = []

    async def item(request: Request) -> Response:
        effects.record({})
        return JSONResponse({"n": len(effects.runs)}, status_code=201)

    app = Starlette(routes=[Mount("/api", routes=[Route("/items/{id}", item, methods=["POST"])])])
    app.add_middleware(IdempotencyMiddleware, store=MemoryStore(),
                       hooks=idempo.Hooks(on_outcome=lambda route, o: seen.append(route)))

    async def main() -> None:
        async with client(app) as c:
            assert (await c.post("/api/items/1", json={}, headers=key(1))).status_code == 201
            assert (await c.post("/api/nothing", json={}, headers=key(1))).status_code == 404

    run(main())
    assert seen == ["/api/items/{id}"]


class _ThreadNoted(MemoryStore):
    """A memory store that notes the thread each claim and completion ran on."""

    def __init__(self, blocking: bool) -> None:
        super().__init__()
        self.blocking = blocking  # type: ignore[misc]
        self.threads: List[str] = []

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return super().claim(*args, **kwargs)

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return super().complete(*args, **kwargs)


@pytest.mark.parametrize("blocking", [False, True])
def test_a_store_that_cannot_block_runs_on_the_loop(blocking: bool) -> None:
    """MemoryStore (``blocking = False``) runs on the event loop's thread, without a worker
    thread per primitive; a store that can block (any other) runs in worker threads."""
    effects = Effects()
    store = _ThreadNoted(blocking)
    app = make_app(store, effects)
    loop_thread: List[str] = []

    async def main() -> None:
        loop_thread.append(threading.current_thread().name)
        async with client(app) as c:
            r = await c.post("/payments/a", json={"amount": 1}, headers=key(1))
            assert r.status_code == 201

    run(main())
    assert len(store.threads) == 2  # the claim and the completion
    if blocking:
        assert loop_thread[0] not in store.threads
    else:
        assert store.threads == [loop_thread[0]] * 2


def test_routes_found_per_path_follow_the_app_and_its_host_routes() -> None:
    """The middleware remembers the route of each (method, path): a route added later is found
    (and protected at once), and an app with a ``Host`` route (whose match reads a header) is
    matched on every request."""
    from starlette.routing import Host, Router

    effects = Effects()
    app = make_app(MemoryStore(), effects)

    async def late(request: Request) -> Response:
        effects.record({"late": True})
        return JSONResponse({"late": True}, status_code=201)

    async def main() -> None:
        async with client(app) as c:
            first = await c.post("/late", json={}, headers=key(1))
            assert first.status_code == 404  # no such route yet: the app answers
            app.router.routes.append(Route("/late", late, methods=["POST"]))
            again = [await c.post("/late", json={}, headers=key(1)) for _ in range(2)]
            assert [r.status_code for r in again] == [201, 201]
            assert again[1].headers.get("idempotent-replayed") == "true"

    run(main())
    assert sum(1 for r in effects.runs if r.get("late")) == 1

    hosted = Effects()
    inner = make_app(MemoryStore(), hosted)
    plain = Router(routes=[Route("/payments/{account}", inner.routes[0].endpoint, methods=["POST"])])

    @idempo.idempotent(enabled=False)
    async def on_admin(request: Request) -> Response:
        hosted.record({"admin": True})
        return JSONResponse({"admin": True})

    admin = Router(routes=[Route("/payments/{account}", on_admin, methods=["POST"])])
    app2 = Starlette(routes=[Host("admin.test", admin), Host("{any}", plain)])
    app2.add_middleware(IdempotencyMiddleware, store=MemoryStore())

    async def hosts() -> None:
        async with client(app2) as c:
            for _ in range(2):
                r = await c.post("/payments/a", json={}, headers={**key(2), "host": "admin.test"})
                assert r.status_code == 200
            ran = await c.post("/payments/a", json={"amount": 1}, headers=key(2))
            again = await c.post("/payments/a", json={"amount": 1}, headers=key(2))
            assert again.headers.get("idempotent-replayed") == "true", (ran.status_code, again.text)

    run(hosts())
    assert sum(1 for r in hosted.runs if r.get("admin")) == 2  # exempt on admin.test


def test_an_app_that_sends_no_response_does_not_leave_its_key_in_flight() -> None:
    """An application that returns without starting a response failed: the error reaches the
    server and core settles the claim (a retry is not answered 409 in flight)."""
    calls: List[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            return  # no response at all
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    wrapped = IdempotencyMiddleware(app, store=MemoryStore())

    async def main() -> None:
        transport = httpx.ASGITransport(app=wrapped)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            with pytest.raises(RuntimeError, match="without starting a response"):
                await c.post("/payments", json={}, headers=key(1))
            retry = await c.post("/payments", json={}, headers=key(1))
            assert retry.status_code != 409, retry.text

    run(main())


def test_handler_ending_during_a_renewal_waits_for_it() -> None:
    """The handler ends while a heartbeat's renewal is still at the store (a slow store, a
    failover): its end is fed to the flow after the renewal's answer, never beside it (the
    flow takes one event at a time; feeding both was a plain 500 under a Redis failover)."""
    from idempo.stores import AsyncMemoryStore

    renewals: List[str] = []

    class SlowRenewals(AsyncMemoryStore):
        async def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
            renewals.append("start")
            await asyncio.sleep(0.4)
            renewals.append("end")
            return await super().renew(scope_key, token, lease_ms)

    effects = Effects()
    app = make_app(SlowRenewals(), effects,
                   config=idempo.Config(lease_ms=1000, heartbeat_ms=150))

    async def main() -> None:
        async with client(app) as c:
            # Due at 150 ms, the renewal answers at ~550 ms; the handler ends at 250 ms.
            first = await c.post("/payments/a", json={"sleep": 0.25}, headers=key(1))
            assert first.status_code == 201, first.text
            again = await c.post("/payments/a", json={"sleep": 0.25}, headers=key(1))
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"

    run(main())
    assert renewals[:2] == ["start", "end"]
    assert len(effects.runs) == 1
