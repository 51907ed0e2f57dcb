"""The Django middleware: Django's test clients (sync and async chains) and a real WSGI server.

Django is configured here, once, with this module as the URLconf; each test sets its own
``settings.IDEMPO`` (and so its own store) with ``override_settings`` and a fresh client, which
builds a fresh middleware chain.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import socketserver
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import django
import httpx
import pytest
import uvicorn
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path, re_path
from django.utils.decorators import sync_and_async_middleware
from django.views import View

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="idempo-django-tests",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        USE_TZ=True,
        INSTALLED_APPS=[],
        DATABASES={},
        MIDDLEWARE=[f"{__name__}.fake_auth", "idempo.django.IdempotencyMiddleware"],
    )
    django.setup()

from django.core.handlers.asgi import ASGIHandler  # noqa: E402 - needs configured settings
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.test import AsyncClient, Client, override_settings  # noqa: E402

import idempo  # noqa: E402
from idempo.django import IdempotencyMiddleware, user_scope  # noqa: E402
from idempo.stores import MemoryStore, SQLiteStore  # noqa: E402

RUNS: List[Any] = []
ENTERED = threading.Event()
RELEASE = threading.Event()


class FakeUser:
    """Stands in for django.contrib.auth's user (no database here): ``X-User`` authenticates."""

    def __init__(self, pk: Optional[str]) -> None:
        self.pk = pk
        self.is_authenticated = pk is not None


def _set_user(request: Any) -> None:
    request.user = FakeUser(request.META.get("HTTP_X_USER"))


@sync_and_async_middleware
def fake_auth(get_response: Callable[[Any], Any]) -> Callable[[Any], Any]:
    if iscoroutinefunction(get_response):

        async def amiddleware(request: Any) -> Any:
            _set_user(request)
            return await get_response(request)

        return amiddleware

    def middleware(request: Any) -> Any:
        _set_user(request)
        return get_response(request)

    return middleware


# --- views ---------------------------------------------------------------------------------


def pay(request: Any, order: int) -> Any:
    body = json.loads(request.body)
    RUNS.append(body)
    execution = request.idempotency
    dk = None if execution is None else execution.downstream_key
    response = JsonResponse({"order": order, "n": len(RUNS), "dk": dk}, status=201)
    response["Location"] = f"/orders/{order}"
    response.set_cookie("session", "s1")
    return response


@idempo.idempotent(enabled=False)
def free(request: Any) -> Any:
    RUNS.append("free")
    return JsonResponse({"n": len(RUNS)})


@idempo.idempotent(config=idempo.Config(key_required=False))
def optional(request: Any) -> Any:
    RUNS.append("optional")
    return JsonResponse({"n": len(RUNS)}, status=201)


def slow(request: Any) -> Any:
    ENTERED.set()
    RELEASE.wait(10)
    RUNS.append("slow")
    return JsonResponse({"n": len(RUNS)}, status=201)


def stream(request: Any) -> Any:
    RUNS.append("stream")
    return StreamingHttpResponse(iter([b'{"part":', b"1", b"}"]), status=201,
                                 content_type="application/json")


class Refund(View):
    def post(self, request: Any, pk: int) -> Any:
        RUNS.append(("refund", pk))
        return JsonResponse({"refund": pk, "n": len(RUNS)}, status=201)


@idempo.idempotent(enabled=False)
class Exempt(View):
    def post(self, request: Any) -> Any:
        RUNS.append("exempt")
        return JsonResponse({"n": len(RUNS)})


async def aslow(request: Any) -> Any:
    ENTERED.set()
    while not RELEASE.is_set():
        await asyncio.sleep(0.01)
    RUNS.append("aslow")
    return JsonResponse({"n": len(RUNS)}, status=201)


FLAKY: Dict[str, int] = {}


def flaky(request: Any) -> Any:
    """Fails on its first call, then succeeds."""
    FLAKY["calls"] = FLAKY.get("calls", 0) + 1
    if FLAKY["calls"] == 1:
        raise RuntimeError("first call fails")
    RUNS.append("flaky")
    return JsonResponse({"calls": FLAKY["calls"]}, status=201)


def sleepy(request: Any) -> Any:
    time.sleep(float(json.loads(request.body)["sleep"]))
    RUNS.append("sleepy")
    return JsonResponse({"n": len(RUNS)}, status=201)


def txpay(request: Any) -> Any:
    """Writes its business row through the idempotency store's open transaction."""
    body = json.loads(request.body)
    assert request.idempotency.transaction is idempo.current_transaction()
    conn = idempo.current_transaction().connection
    conn.execute("INSERT INTO payment (amount) VALUES (?)", (body["amount"],))
    RUNS.append(("tx", body["amount"]))
    if body.get("fail"):
        raise RuntimeError("fails after writing")
    return JsonResponse({"amount": body["amount"]}, status=201)


@idempo.idempotent()
def marked(request: Any) -> Any:
    RUNS.append("marked")
    return JsonResponse({"n": len(RUNS), "card": "4242"}, status=201)


def legacy(request: Any, id: str) -> Any:  # noqa: A002 - the URL pattern's group name
    RUNS.append(("legacy", id))
    return JsonResponse({"legacy": id}, status=201)


async def apay(request: Any) -> Any:
    RUNS.append(json.loads(request.body))
    await asyncio.sleep(0)
    return JsonResponse({"n": len(RUNS), "dk": request.idempotency.downstream_key}, status=201)


urlpatterns = [
    path("orders/<int:order>/pay", pay),
    path("free", free),
    path("optional", optional),
    path("slow", slow),
    path("stream", stream),
    path("refunds/<int:pk>", Refund.as_view()),
    path("exempt", Exempt.as_view()),
    path("async/pay", apay),
    path("marked", marked),
    path("async/slow", aslow),
    path("flaky", flaky),
    path("sleepy", sleepy),
    path("tx/pay", txpay),
    re_path(r"^legacy/(?P<id>[0-9]+)/$", legacy),
]


# --- helpers -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RUNS.clear()
    FLAKY.clear()
    ENTERED.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


def _post(client: Any, url: str, body: Any, key: Optional[str] = None, **headers: str) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", headers=headers)


def _problem(response: Any) -> Dict[str, Any]:
    assert response["Content-Type"] == "application/problem+json"
    found: Dict[str, Any] = json.loads(response.content)
    assert found["status"] == response.status_code
    return found


class DownStore:
    """A store whose every primitive fails, as an unreachable database would."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> Any:
            raise ConnectionError(f"store down ({name})")

        return fail


# --- sync chain (Django's test client) ----------------------------------------------------


def test_new_replay_mismatch_and_key_problems() -> None:
    outcomes: List[str] = []
    hooks = idempo.Hooks(on_outcome=lambda route, outcome: outcomes.append(f"{route} {outcome}"))
    with override_settings(IDEMPO={"STORE": MemoryStore(), "HOOKS": hooks}):
        c = Client()
        first = _post(c, "/orders/7/pay", {"amount": 3}, "order-key-0001")
        again = _post(c, "/orders/7/pay", {"amount": 3}, "order-key-0001")
        assert first.status_code == again.status_code == 201
        assert first.content == again.content and json.loads(first.content)["n"] == 1
        assert len(json.loads(first.content)["dk"]) > 0
        assert "Idempotent-Replayed" not in first and first.cookies["session"].value == "s1"
        assert again["Idempotent-Replayed"] == "true" and "session" not in again.cookies
        assert again["Location"] == "/orders/7" and again["Content-Type"] == "application/json"

        changed = _post(c, "/orders/7/pay", {"amount": 4}, "order-key-0001")
        assert changed.status_code == 422 and _problem(changed)["type"].endswith("key-reused")
        other_path = _post(c, "/orders/8/pay", {"amount": 3}, "order-key-0001")
        assert other_path.status_code == 422
        missing = _post(c, "/orders/7/pay", {"amount": 3})
        assert missing.status_code == 400 and _problem(missing)["type"].endswith("missing-key")
        bad = _post(c, "/orders/7/pay", {"amount": 3}, "short")
        assert bad.status_code == 400 and _problem(bad)["code"] == "too_short"
        wide = _post(c, "/orders/7/pay", {"amount": 3}, "schl\u00fcssel-\u043a\u043b\u044e\u0447")
        assert wide.status_code == 400 and _problem(wide)["type"].endswith("invalid-key")
        assert len(RUNS) == 1
    assert outcomes[:2] == ["/orders/<int:order>/pay stored", "/orders/<int:order>/pay replayed"]
    assert outcomes[2:] == [f"/orders/<int:order>/pay {o}" for o in
                            ("mismatch", "mismatch", "missing_key", "invalid_key", "invalid_key")]


def test_body_problems_come_from_core() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore(), "CONFIG": {"max_request_body_bytes": 32}}):
        c = Client()
        dup = _post(c, "/orders/1/pay", '{"amount":1,"amount":2}', "dup-key-0001")
        problem = _problem(dup)
        assert dup.status_code == 400 and problem["code"] == "duplicate_member"
        assert problem["type"].endswith("invalid-body") and '"/amount"' in problem["detail"]
        big = _post(c, "/orders/1/pay", {"pad": "x" * 64}, "big-key-0001")
        problem = _problem(big)
        assert big.status_code == 413 and problem["code"] == "input_too_large"
        assert problem["type"].endswith("body-too-large") and "32 bytes" in problem["detail"]
        assert RUNS == []


def test_django_upload_limit_is_a_413_too() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}, DATA_UPLOAD_MAX_MEMORY_SIZE=16):
        big = _post(Client(), "/orders/1/pay", {"pad": "x" * 64}, "upload-key-01")
        assert big.status_code == 413 and _problem(big)["type"].endswith("body-too-large")
        assert RUNS == []


def test_body_problem_api_takes_idempo_errors_only() -> None:
    from idempo._idempo import body_problem

    with pytest.raises(idempo.CanonicalizationError) as exc:
        idempo.canonicalize(b'{"a":[1,]}')
    answer = body_problem(exc.value)
    assert answer is exc.value.problem and answer.status == 400 and answer.outcome == "invalid_body"
    assert json.loads(answer.body or b"")["code"] == exc.value.code == "trailing_comma"
    with pytest.raises(idempo.InvalidArgument, match="expects a CanonicalizationError"):
        body_problem(ValueError("x"))  # type: ignore[arg-type]
    with pytest.raises(idempo.InvalidArgument, match="not raised by idempo"):
        body_problem(idempo.CanonicalizationError("made up"))


def test_in_flight_409_then_replay() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        results: List[Any] = []
        first = threading.Thread(
            target=lambda: results.append(_post(Client(), "/slow", {}, "inflight-key-01"))
        )
        first.start()
        assert ENTERED.wait(10)
        busy = _post(Client(), "/slow", {}, "inflight-key-01")
        assert busy.status_code == 409 and _problem(busy)["type"].endswith("in-flight")
        assert int(busy["Retry-After"]) >= 1
        RELEASE.set()
        first.join(10)
        assert results[0].status_code == 201
        replay = _post(Client(), "/slow", {}, "inflight-key-01")
        assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
        assert replay.content == results[0].content and RUNS == ["slow"]


def test_store_down_fails_closed_503() -> None:
    errors: List[str] = []
    hooks = idempo.Hooks(on_store_error=lambda route, exc: errors.append(str(exc)))
    with override_settings(IDEMPO={"STORE": DownStore(), "HOOKS": hooks}):
        r = _post(Client(), "/orders/1/pay", {"amount": 1}, "down-key-0001")
        assert r.status_code == 503 and r["Retry-After"] == "1"
        assert _problem(r)["type"].endswith("store-unavailable")
        assert RUNS == [] and errors and "store down" in errors[0]


def test_failed_view_releases_the_key_for_a_retry() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        c = Client(raise_request_exception=False)
        failed = _post(c, "/flaky", {}, "flaky-key-0001")
        assert failed.status_code == 500  # Django's 500 is not stored: the key is released
        retried = _post(c, "/flaky", {}, "flaky-key-0001")
        replay = _post(c, "/flaky", {}, "flaky-key-0001")
        assert retried.status_code == 201 and json.loads(retried.content) == {"calls": 2}
        assert replay.content == retried.content and replay["Idempotent-Replayed"] == "true"
        assert FLAKY["calls"] == 2 and RUNS == ["flaky"]


def test_transactional_view_commits_with_its_record(tmp_path: Any) -> None:
    import sqlite3

    db = str(tmp_path / "tx.sqlite3")
    with sqlite3.connect(db) as setup:
        setup.execute("CREATE TABLE payment (amount INTEGER NOT NULL)")
    setup.close()
    store = SQLiteStore(db)

    def rows() -> int:
        conn = sqlite3.connect(db)
        try:
            return int(conn.execute("SELECT count(*) FROM payment").fetchone()[0])
        finally:
            conn.close()

    try:
        with override_settings(IDEMPO={"STORE": store, "CONFIG": {"transactional": True}}):
            c = Client(raise_request_exception=False)
            first = _post(c, "/tx/pay", {"amount": 5}, "tx-key-000001")
            again = _post(c, "/tx/pay", {"amount": 5}, "tx-key-000001")
            assert first.status_code == 201 and again["Idempotent-Replayed"] == "true"
            assert rows() == 1
            failed = _post(c, "/tx/pay", {"amount": 6, "fail": True}, "tx-key-000002")
            assert failed.status_code == 500 and rows() == 1  # the write was rolled back
            retried = _post(c, "/tx/pay", {"amount": 6, "fail": True}, "tx-key-000002")
            assert retried.status_code == 500 and rows() == 1  # and left no record behind
        assert RUNS == [("tx", 5), ("tx", 6), ("tx", 6)]
    finally:
        store.close()
    with override_settings(IDEMPO={"STORE": MemoryStore(), "CONFIG": {"transactional": True}}):
        with pytest.raises(ImproperlyConfigured) as exc:
            IdempotencyMiddleware(lambda request: HttpResponse())
    assert isinstance(exc.value.__cause__, idempo.TransactionalUnsupported)


def test_heartbeat_keeps_a_long_view_in_flight() -> None:
    config = {"lease_ms": 1000, "heartbeat_ms": 250, "takeover": "re_run"}
    with override_settings(IDEMPO={"STORE": MemoryStore(), "CONFIG": config}):
        results: List[Any] = []
        body = {"sleep": 2.0}
        first = threading.Thread(
            target=lambda: results.append(_post(Client(), "/sleepy", body, "sleepy-key-001"))
        )
        first.start()
        time.sleep(1.4)  # beyond the 1 s lease: only the heartbeat keeps the claim live
        busy = _post(Client(), "/sleepy", body, "sleepy-key-001")
        first.join(10)
        assert busy.status_code == 409 and results[0].status_code == 201
        assert RUNS == ["sleepy"]


@pytest.fixture(params=["memory", "sqlite"])
def store(request: Any, tmp_path: Any) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    sqlite = SQLiteStore(str(tmp_path / "idempo.sqlite3"))
    try:
        yield sqlite
    finally:
        sqlite.close()


def test_threads_on_one_key_run_once(store: Any) -> None:
    with override_settings(IDEMPO={"STORE": store}):
        statuses: List[int] = []
        gate = threading.Barrier(8)

        def hit() -> None:
            gate.wait()
            statuses.append(_post(Client(), "/slow", {"same": True}, "same-key-123").status_code)

        threads = [threading.Thread(target=hit) for _ in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(statuses) < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        RELEASE.set()
        for t in threads:
            t.join(10)
        assert sorted(statuses) == [201] + [409] * 7
        assert RUNS == ["slow"]


def test_view_marks_class_views_and_routes() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        c = Client()
        assert _post(c, "/free", {}).status_code == 200
        assert _post(c, "/free", {}).status_code == 200
        assert _post(c, "/exempt", {}).status_code == 200
        assert _post(c, "/optional", {}).status_code == 201  # no key: runs unprotected
        a = _post(c, "/optional", {}, "optional-key-1")
        b = _post(c, "/optional", {}, "optional-key-1")
        assert b["Idempotent-Replayed"] == "true" and a.content == b.content
        r1 = _post(c, "/refunds/5", {}, "refund-key-001")
        r2 = _post(c, "/refunds/5", {}, "refund-key-001")
        assert r1.content == r2.content and r2["Idempotent-Replayed"] == "true"
        assert _post(c, "/nowhere", {}, "nowhere-key-01").status_code == 404
        assert c.get("/refunds/5").status_code == 405  # GET passes through to the view
        assert RUNS == ["free", "free", "exempt", "optional", "optional", ("refund", 5)]


def test_only_marked_redact_and_regex_routes() -> None:
    routes: List[str] = []
    hooks = idempo.Hooks(on_outcome=lambda route, outcome: routes.append(route))
    with override_settings(IDEMPO={
        "STORE": MemoryStore(),
        "ONLY_MARKED": True,
        "CONFIG": idempo.Config(redact=True),
        "REDACT": f"{__name__}.redact_card",
        "HOOKS": hooks,
    }):
        c = Client()
        plain = _post(c, "/orders/1/pay", {"amount": 1})  # not marked: not protected
        assert plain.status_code == 201 and json.loads(plain.content)["dk"] is None
        live = _post(c, "/marked", {}, "marked-key-001")
        replay = _post(c, "/marked", {}, "marked-key-001")
        assert json.loads(live.content)["card"] == "4242"
        assert json.loads(replay.content) == {"card": "****"}
        assert replay["Idempotent-Replayed"] == "true"
    with override_settings(IDEMPO={"STORE": MemoryStore(), "HOOKS": hooks}):
        c = Client()
        a = _post(c, "/legacy/12/", {}, "legacy-key-01")
        b = _post(c, "/legacy/12/", {}, "legacy-key-01")
        assert a.content == b.content and b["Idempotent-Replayed"] == "true"
    assert routes == ["/marked", "/marked", "/legacy/(?P<id>[0-9]+)/$", "/legacy/(?P<id>[0-9]+)/$"]
    assert RUNS == [{"amount": 1}, "marked", ("legacy", "12")]


def redact_card(status: int, headers: Any, body: bytes) -> bytes:
    """The body kept for replays: the card number masked."""
    return json.dumps({"card": "****"}).encode()


def test_streamed_response_is_stored_and_replayed() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        c = Client()
        live = _post(c, "/stream", {}, "stream-key-001")
        assert b"".join(live.streaming_content) == b'{"part":1}'
        replay = _post(c, "/stream", {}, "stream-key-001")
        assert replay.content == b'{"part":1}' and replay["Idempotent-Replayed"] == "true"
        assert RUNS == ["stream"]


def test_scope_from_user_and_unscoped_warning() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore(), "SCOPE": "idempo.django.user_scope"}):
        c = Client()
        a = _post(c, "/orders/1/pay", {"amount": 1}, "user-key-0001", X_User="1")
        b = _post(c, "/orders/1/pay", {"amount": 1}, "user-key-0001", X_User="2")
        again = _post(c, "/orders/1/pay", {"amount": 1}, "user-key-0001", X_User="1")
        assert json.loads(a.content)["n"] == 1 and json.loads(b.content)["n"] == 2
        assert again.content == a.content and again["Idempotent-Replayed"] == "true"
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        with pytest.warns(idempo.UnscopedKeyWarning, match="no scope function"):
            _post(Client(), "/orders/1/pay", {"amount": 1}, "user-key-0002", X_User="1")
    with override_settings(IDEMPO={"STORE": MemoryStore()}):  # token auth: no request.user
        with pytest.warns(idempo.UnscopedKeyWarning, match="POST /orders/<int:order>/pay"):
            _post(Client(), "/orders/1/pay", {"amount": 1}, "user-key-0003",
                  Authorization="Bearer t")
    assert user_scope(type("R", (), {"user": FakeUser("9")})()) == "9"
    assert user_scope(type("R", (), {"user": FakeUser(None)})()) == ""
    assert user_scope(type("R", (), {})()) is None


def test_settings_fingerprint_options() -> None:
    with override_settings(IDEMPO={
        "STORE": "idempo.stores.MemoryStore",  # a dotted path to a class: instantiated
        "EXCLUDE": ["/nonce"],
        "FINGERPRINT_HEADERS": ["X-Tenant"],
        "CONFIG": {"ttl_ms": 60_000, "lease_ms": 5_000, "heartbeat_ms": 0},
    }):
        c = Client()
        a = _post(c, "/orders/1/pay", {"amount": 1, "nonce": 1}, "fp-key-00001", X_Tenant="t1")
        b = _post(c, "/orders/1/pay", {"amount": 1, "nonce": 2}, "fp-key-00001", X_Tenant="t1")
        assert b["Idempotent-Replayed"] == "true" and a.content == b.content
        other = _post(c, "/orders/1/pay", {"amount": 1, "nonce": 1}, "fp-key-00001", X_Tenant="t2")
        assert other.status_code == 422 and len(RUNS) == 1


@pytest.mark.parametrize(
    ("idempo_settings", "message"),
    [
        (None, "must be a dict"),
        ({}, "'STORE'] is required"),
        ({"STORE": MemoryStore(), "TTL": 5}, "unknown option(s) TTL"),
        ({"STORE": MemoryStore(), "CONFIG": {"bogus": 1}}, "CONFIG"),
        ({"STORE": MemoryStore(), "CONFIG": 5}, "must be an idempo.Config"),
        ({"STORE": MemoryStore(), "SCOPE": "no.such.module.fn"}, "cannot import"),
        ({"STORE": MemoryStore(), "CONFIG": {"max_request_body_bytes": 0}},
         "max_request_body_bytes must be positive"),
        ({"STORE": MemoryStore(), "MAX_BODY_BYTES": 32},
         "MAX_BODY_BYTES is now CONFIG['max_request_body_bytes']"),
        ({"STORE": MemoryStore(), "HOOKS": 3}, "must be an idempo.Hooks"),
    ],
)
def test_settings_errors(idempo_settings: Any, message: str) -> None:
    with override_settings(IDEMPO=idempo_settings):
        with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
            IdempotencyMiddleware(lambda request: HttpResponse())


def test_invalid_config_values_name_the_setting() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore(), "CONFIG": {"takeover": "never"}}):
        with pytest.raises(ImproperlyConfigured, match=r"IDEMPO\['CONFIG'\].*takeover") as exc:
            IdempotencyMiddleware(lambda request: HttpResponse())
    assert isinstance(exc.value.__cause__, idempo.InvalidArgument)


# --- async chain (AsyncClient: the middleware runs as a coroutine) -------------------------


def test_async_chain_new_replay_mismatch() -> None:
    async def scenario() -> List[Any]:
        c = AsyncClient()
        h = {"Idempotency-Key": "async-key-0001"}
        out = []
        for amount in (1, 1, 2):
            out.append(await c.post("/async/pay", data=json.dumps({"amount": amount}),
                                    content_type="application/json", headers=h))
        out.append(await c.post("/async/pay", data="{}", content_type="application/json"))
        return out

    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        first, again, changed, missing = asyncio.run(scenario())
    assert first.status_code == again.status_code == 201 and first.content == again.content
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert changed.status_code == 422 and missing.status_code == 400
    assert RUNS == [{"amount": 1}]


def test_async_chain_streamed_response() -> None:
    async def drain(response: Any) -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    async def scenario() -> List[Any]:
        c = AsyncClient()
        h = {"Idempotency-Key": "astream-key-01"}
        live = await c.post("/stream", data="{}", content_type="application/json", headers=h)
        # Teed: until the body has been sent, a retry finds the key in flight.
        busy = await c.post("/stream", data="{}", content_type="application/json", headers=h)
        assert busy.status_code == 409
        body = await drain(live)
        replay = await c.post("/stream", data="{}", content_type="application/json", headers=h)
        return [body, replay]

    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        body, replay = asyncio.run(scenario())
    assert body == b'{"part":1}' and replay.content == b'{"part":1}'
    assert replay["Idempotent-Replayed"] == "true" and RUNS == ["stream"]


def test_async_middleware_is_a_coroutine_function() -> None:
    async def view(request: Any) -> Any:
        return HttpResponse()

    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        assert iscoroutinefunction(IdempotencyMiddleware(view))
        assert not iscoroutinefunction(IdempotencyMiddleware(lambda request: HttpResponse()))


# --- a real server: Django's WSGI handler under wsgiref, driven over HTTP by httpx ---------


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        return


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


@contextmanager
def _serve(app: Any) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer,
                         handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def test_real_server_over_http(store: Any) -> None:
    with override_settings(IDEMPO={"STORE": store, "CONFIG": {"max_request_body_bytes": 256}}):
        app = WSGIHandler()
    with _serve(app) as base, httpx.Client(base_url=base, timeout=10) as http:
        h = {"Idempotency-Key": "http-key-00001"}
        first = http.post("/orders/3/pay", json={"amount": 9}, headers=h)
        again = http.post("/orders/3/pay", json={"amount": 9}, headers=h)
        assert first.status_code == again.status_code == 201 and first.content == again.content
        assert again.headers["idempotent-replayed"] == "true" and "set-cookie" in first.headers
        assert "set-cookie" not in again.headers
        changed = http.post("/orders/3/pay", json={"amount": 10}, headers=h)
        assert changed.status_code == 422
        assert changed.headers["content-type"] == "application/problem+json"
        assert http.post("/orders/3/pay", json={"amount": 9}).status_code == 400
        big = http.post("/orders/3/pay", json={"pad": "x" * 512},
                        headers={"Idempotency-Key": "http-big-0001"})
        assert big.status_code == 413
        assert len(RUNS) == 1

        statuses: List[int] = []
        gate = threading.Barrier(6)

        def hit() -> None:
            gate.wait()
            r = http.post("/slow", json={}, headers={"Idempotency-Key": "http-slow-0001"})
            statuses.append(r.status_code)

        threads = [threading.Thread(target=hit) for _ in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(statuses) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        RELEASE.set()
        for t in threads:
            t.join(10)
        assert sorted(statuses) == [201] + [409] * 5
        replay = http.post("/slow", json={}, headers={"Idempotency-Key": "http-slow-0001"})
        assert replay.headers["idempotent-replayed"] == "true"
        assert RUNS.count("slow") == 1


def test_real_server_store_down() -> None:
    with override_settings(IDEMPO={"STORE": DownStore()}):
        app = WSGIHandler()
    with _serve(app) as base, httpx.Client(base_url=base, timeout=10) as http:
        r = http.post("/orders/1/pay", json={"amount": 1},
                      headers={"Idempotency-Key": "down-key-0002"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and RUNS == []


@contextmanager
def _serve_asgi(app: Any) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_real_asgi_server_async_views() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        app = ASGIHandler()
    with _serve_asgi(app) as base, httpx.Client(base_url=base, timeout=10) as http:
        h = {"Idempotency-Key": "asgi-key-00001"}
        first = http.post("/async/pay", json={"amount": 5}, headers=h)
        again = http.post("/async/pay", json={"amount": 5}, headers=h)
        assert first.status_code == again.status_code == 201 and first.content == again.content
        assert again.headers["idempotent-replayed"] == "true"
        assert http.post("/async/pay", json={"amount": 6}, headers=h).status_code == 422

        statuses: List[int] = []
        gate = threading.Barrier(6)

        def hit() -> None:
            gate.wait()
            r = http.post("/async/slow", json={}, headers={"Idempotency-Key": "asgi-slow-0001"})
            statuses.append(r.status_code)

        threads = [threading.Thread(target=hit) for _ in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(statuses) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        RELEASE.set()
        for t in threads:
            t.join(10)
        assert sorted(statuses) == [201] + [409] * 5
        assert RUNS == [{"amount": 5}, "aslow"]


# --- streamed responses teed by core's capture plan, construction checks, renderer ---------

import http.client  # noqa: E402
import tracemalloc  # noqa: E402
from typing import Tuple  # noqa: E402

from django.http import FileResponse  # noqa: E402

from idempo.stores import AsyncMemoryStore  # noqa: E402

GATE = threading.Event()


def gated(request: Any) -> Any:
    """Streams a first chunk, then the rest only once the client saw it (GATE)."""
    RUNS.append("gated")
    size = int(request.GET.get("size", "3"))
    chunk = int(request.GET.get("chunk", "1"))
    wait = request.GET.get("wait") == "1"

    def body() -> Iterator[bytes]:
        yield b"first;"
        if wait:
            assert GATE.wait(10), "the first chunk never reached the client"
        for _ in range(size):
            yield b"x" * chunk

    return StreamingHttpResponse(body(), content_type="text/plain")


async def agated(request: Any) -> Any:
    RUNS.append("agated")

    async def body() -> AsyncIterator[bytes]:
        yield b"first;"
        for _ in range(1000):
            if GATE.is_set():
                break
            await asyncio.sleep(0.01)
        assert GATE.is_set(), "the first chunk never reached the client"
        yield b"rest"

    return StreamingHttpResponse(body(), content_type="text/plain")


def download(request: Any) -> Any:
    RUNS.append("download")
    path = request.GET["path"]
    return FileResponse(open(path, "rb"), content_type="application/octet-stream")


def echo_len(request: Any) -> Any:
    RUNS.append(len(request.body))
    return JsonResponse({"length": len(request.body)}, status=201)


def declined(request: Any) -> Any:
    RUNS.append("declined")
    response = JsonResponse({"error": "card_declined"}, status=402)
    response.reason_phrase = "Card Declined"
    return response


urlpatterns += [  # noqa: F405
    path("gated", gated),
    path("async/gated", agated),
    path("download", download),
    path("echo-len", echo_len),
    path("declined", declined),
]

from typing import AsyncIterator  # noqa: E402


@pytest.fixture(autouse=True)
def _gate() -> Iterator[None]:
    GATE.clear()
    yield
    GATE.set()


def test_streaming_response_is_teed_over_a_real_wsgi_server() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        app = WSGIHandler()
    with _serve(app) as base:
        port = int(base.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        h = {"Idempotency-Key": "gated-key-0001", "Content-Type": "application/json"}
        conn.request("POST", "/gated?wait=1&size=3&chunk=2", body=b"{}", headers=h)
        response = conn.getresponse()
        assert response.status == 200
        assert response.read(6) == b"first;"  # before the view produced the rest
        GATE.set()
        assert response.read() == b"xxxxxx"
        conn.close()
        with httpx.Client(base_url=base, timeout=10) as client:
            replay = client.post("/gated?wait=1&size=3&chunk=2", content=b"{}", headers=h)
        assert replay.content == b"first;xxxxxx"
        assert replay.headers["idempotent-replayed"] == "true"
    assert RUNS == ["gated"]


def test_streaming_response_is_teed_on_the_async_chain() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        app = ASGIHandler()
    with _serve_asgi(app) as base:
        port = int(base.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        h = {"Idempotency-Key": "agated-key-001", "Content-Type": "application/json"}
        conn.request("POST", "/async/gated", body=b"{}", headers=h)
        response = conn.getresponse()
        assert response.status == 200 and response.read(6) == b"first;"
        GATE.set()
        assert response.read() == b"rest"
        conn.close()
        with httpx.Client(base_url=base, timeout=10) as client:
            replay = client.post("/async/gated", content=b"{}", headers=h)
        assert replay.content == b"first;rest"
        assert replay.headers["idempotent-replayed"] == "true"
    assert RUNS == ["agated"]


def test_file_response_over_the_limit_reaches_the_client_and_is_not_retained(tmp_path: Any) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"b" * 5000)
    with override_settings(IDEMPO={"STORE": MemoryStore(),
                                   "CONFIG": {"max_stored_body_bytes": 1000}}):
        app = WSGIHandler()
    with _serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        h = {"Idempotency-Key": "file-key-00001"}
        first = client.post(f"/download?path={blob}", json={}, headers=h)
        assert first.status_code == 200 and first.content == b"b" * 5000
        for _ in range(2):
            again = client.post(f"/download?path={blob}", json={}, headers=h)
            assert again.status_code == 500 and again.headers["idempotent-replayed"] == "true"
            assert again.json()["type"] == "urn:idempo:problem:response-not-retained"
    assert RUNS == ["download"]


def test_large_streaming_response_memory_stays_within_the_record_limit() -> None:
    limit = 1 << 20
    with override_settings(IDEMPO={"STORE": MemoryStore(),
                                   "CONFIG": {"max_stored_body_bytes": limit}}):
        c = Client()
        tracemalloc.start()
        try:
            response = _post(c, "/gated?size=1024&chunk=65536", {}, "big-stream-key-1")
            seen = sum(len(chunk) for chunk in response.streaming_content)
            response.close()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert seen == 6 + 1024 * 65536
    assert peak < limit + (16 << 20), peak
    print(f"\nDjango 64 MiB stream: peak traced memory {peak / (1 << 20):.1f} MiB")


def test_client_gone_mid_stream_leaves_no_key_in_flight() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        c = Client()
        response = _post(c, "/gated?size=100", {}, "gone-key-00001")
        next(iter(response.streaming_content))
        response.close()  # the server closes the response early: the client went away
        retry = _post(c, "/gated?size=100", {}, "gone-key-00001")
    assert retry.status_code == 500
    assert _problem(retry)["type"] == "urn:idempo:problem:response-not-retained"
    assert RUNS == ["gated"]


def test_post_without_length_over_a_real_socket_has_no_body() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        app = WSGIHandler()
    with _serve(app) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /echo-len HTTP/1.1\r\nHost: t\r\n"
                         b"Idempotency-Key: nolen-key-001\r\nConnection: keep-alive\r\n\r\n")
            data = b""
            while b"}" not in data:
                chunk = sock.recv(4096)
                assert chunk, data
                data += chunk
    assert data.startswith(b"HTTP/1.") and b" 201 " in data.split(b"\r\n", 1)[0]
    assert data.endswith(b'{"length": 0}') and RUNS == [0]


def test_reason_phrase_of_the_view_passes_through() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore()}):
        c = Client()
        live = _post(c, "/declined", {}, "declined-key-01")
        replay = _post(c, "/declined", {}, "declined-key-01")
    assert live.status_code == 402 and live.reason_phrase == "Card Declined"
    assert replay.status_code == 402 and replay.reason_phrase == "Payment Required"
    assert replay["Idempotent-Replayed"] == "true"


def _factory() -> Any:
    return MemoryStore()


@pytest.mark.parametrize(
    "store, message",
    [
        ("idempo.sqlite3", "not a file name or DSN"),
        (SQLiteStore, "store=SQLiteStore(...)"),
        (_factory, "call it"),
        (AsyncMemoryStore(), "synchronous twin (MemoryStore)"),
        ("idempo.stores.SQLiteStore", "takes no arguments and returns one"),
    ],
)
def test_store_setting_that_is_not_a_store_is_improperly_configured(store: Any, message: str) -> None:
    with override_settings(IDEMPO={"STORE": store}):
        with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
            IdempotencyMiddleware(lambda request: HttpResponse())


def test_async_chain_accepts_both_store_kinds() -> None:
    async def get_response(request: Any) -> Any:
        return HttpResponse()

    for store in (MemoryStore(), AsyncMemoryStore()):
        with override_settings(IDEMPO={"STORE": store}):
            IdempotencyMiddleware(get_response)


def envelope(problem: idempo.Problem) -> Tuple[bytes, str]:
    return (json.dumps({"error": {"type": problem.slug, "retry_after": problem.retry_after}})
            .encode(), "application/vnd.acme.error+json")


def test_problem_renderer_setting() -> None:
    with override_settings(IDEMPO={"STORE": MemoryStore(),
                                   "PROBLEM_RENDERER": f"{__name__}.envelope"}):
        c = Client()
        missing = _post(c, "/orders/1/pay", {"amount": 1})
        assert missing.status_code == 400
        assert missing["Content-Type"] == "application/vnd.acme.error+json"
        assert json.loads(missing.content) == {"error": {"type": "missing-key", "retry_after": None}}
        assert _post(c, "/orders/1/pay", {"amount": 1}, "render-key-001").status_code == 201
        reused = _post(c, "/orders/1/pay", {"amount": 2}, "render-key-001")
        assert reused.status_code == 422
        assert json.loads(reused.content)["error"]["type"] == "key-reused"
    with override_settings(IDEMPO={"STORE": DownStore(), "PROBLEM_RENDERER": envelope}):
        down = _post(Client(), "/orders/1/pay", {"amount": 1}, "render-key-002")
    assert down.status_code == 503 and down["Retry-After"] == "1"
    assert json.loads(down.content) == {"error": {"type": "store-unavailable", "retry_after": 1}}


def gone_pay(request: Any) -> Any:
    """Writes through the transaction; the first call's INSERT is slow and announced (GATE)."""
    conn = idempo.current_transaction().connection
    if GATE.is_set():
        conn.execute("INSERT INTO gone_payment (note) VALUES ('d')")
    else:
        GATE.set()
        conn.execute("INSERT INTO gone_payment (note) SELECT 'd' FROM pg_sleep(5)")
    RUNS.append("gone")
    return JsonResponse({"ok": True}, status=201)


urlpatterns += [path("tx/gone", gone_pay)]  # noqa: F405


def test_transactional_view_on_a_server_gone_mid_insert_is_503(own_pg: Any) -> None:
    """PostgreSQL restarts (every connection terminated) during the view's own INSERT: Django
    turns the view's error into its 500, the rollback fails on the dead connection, and core
    answers 503 with Retry-After; the retry runs anew once the server is back."""
    import psycopg

    from idempo.stores import PostgresStore

    store = PostgresStore(own_pg.dsn)
    store.create_schema()
    with psycopg.connect(own_pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS gone_payment (id bigserial, note text)")
        conn.execute("TRUNCATE idempo_record, gone_payment")

    def restart() -> None:
        assert GATE.wait(30)
        time.sleep(0.3)
        own_pg.restart()

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    with override_settings(IDEMPO={"STORE": store, "CONFIG": {"transactional": True}}):
        c = Client(raise_request_exception=False)
        first = _post(c, "/tx/gone", {}, "gone-django-01")
        thread.join(90)
        again = _post(c, "/tx/gone", {}, "gone-django-01")
    assert first.status_code == 503 and first["Retry-After"] == "1"
    assert _problem(first)["type"] == "urn:idempo:problem:store-unavailable"
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    with psycopg.connect(own_pg.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM gone_payment").fetchone()
    assert row is not None and row[0] == 1 and RUNS == ["gone"]  # the first never finished
    store.close()
