"""Admission (spec/PROTOCOL.md §7.2.1) through the ASGI and WSGI middleware: the vectors of
spec/vectors/admission/ (format: spec/vectors/README.md, "Admission vectors"), and the scope
rule (a scope function that gives nothing usable refuses the request, the handler never runs)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
from conftest import VECTORS

import idempo
from idempo.asgi import IdempotencyMiddleware as AsgiMiddleware
from idempo.stores import MemoryStore
from idempo.wsgi import IdempotencyMiddleware as WsgiMiddleware

CASES = json.loads((VECTORS / "admission" / "admission.json").read_text(encoding="utf-8"))["cases"]


def scope_fn(spec: Dict[str, Any]) -> Optional[Callable[[Any], Any]]:
    if not spec["function"]:
        return None
    returns = spec["returns"]

    def fn(_request: Any) -> Any:
        if "raises" in returns:
            raise LookupError(returns["raises"])
        if "number" in returns:
            return returns["number"]
        if returns.get("nothing"):
            return None
        return returns["principal"]

    return fn


def options(case: Dict[str, Any]) -> Dict[str, Any]:
    spec = case["scope"]
    return {
        "store": MemoryStore(),
        "config": idempo.Config(**case["config"]),
        "scope": scope_fn(spec),
        "public": spec["public"],
        "empty_scope_is_anonymous": spec["empty_is_anonymous"],
    }


def request_headers(req: Dict[str, Any]) -> List[Tuple[str, str]]:
    headers = [("content-type", req["content_type"])]
    headers += [("idempotency-key", k) for k in req["key_fields"]]
    if req["declared_length"] is not None:
        headers.append(("content-length", str(req["declared_length"])))
    if req["authenticated"]:
        headers.append(("authorization", "Bearer test"))
    return headers


Answer = Tuple[int, Dict[str, str], bytes, bool, List[str], List[str]]


def via_asgi(case: Dict[str, Any], caplog: pytest.LogCaptureFixture) -> Answer:
    req = case["request"]
    ran: List[bool] = []

    async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        while True:  # the handler reads the body it is given
            message = await receive()
            if not message.get("more_body"):
                break
        ran.append(True)
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    mw = AsgiMiddleware(app, route=lambda s: req["route"], **options(case))
    path, _, query = req["target"].partition("?")
    scope = {
        "type": "http", "method": req["method"], "path": path, "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in request_headers(req)],
    }
    body = req["body"].encode()
    chunks = [body[i:i + 8] for i in range(0, len(body), 8)] or [b""]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    sent: List[Dict[str, Any]] = []

    async def receive() -> Dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Dict[str, Any]) -> None:
        sent.append(message)

    caplog.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(mw(scope, receive, send))
    start = sent[0]
    headers = {bytes(n).decode().lower(): bytes(v).decode() for n, v in start["headers"]}
    out = b"".join(m.get("body", b"") for m in sent[1:])
    logs = [r.getMessage() for r in caplog.records if r.name == "idempo" and r.levelno >= logging.ERROR]
    return start["status"], headers, out, bool(ran), [str(w.message) for w in caught
                                                       if issubclass(w.category, idempo.UnscopedKeyWarning)], logs


def via_wsgi(case: Dict[str, Any], caplog: pytest.LogCaptureFixture) -> Answer:
    req = case["request"]
    ran: List[bool] = []

    def app(environ: Dict[str, Any], start_response: Any) -> List[bytes]:
        environ["wsgi.input"].read()
        ran.append(True)
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b"{}"]

    mw = WsgiMiddleware(app, resolve=lambda environ: (req["route"], None), **options(case))
    path, _, query = req["target"].partition("?")
    environ: Dict[str, Any] = {
        "REQUEST_METHOD": req["method"], "PATH_INFO": path, "QUERY_STRING": query,
        "wsgi.input": io.BytesIO(req["body"].encode()),
    }
    if req.get("declared_length") is None and req["body"]:
        # A body without a declared length arrives chunked: the server reads it to its end and
        # says so (PEP 3333's wsgi.input_terminated); without that flag a WSGI body is empty.
        environ["wsgi.input_terminated"] = True
    for name, value in request_headers(req):
        if name == "content-type":
            environ["CONTENT_TYPE"] = value
        elif name == "content-length":
            environ["CONTENT_LENGTH"] = value
        else:  # repeated fields are joined, as WSGI servers do
            env = "HTTP_" + name.upper().replace("-", "_")
            environ[env] = f"{environ[env]}, {value}" if env in environ else value
    got: Dict[str, Any] = {}

    def start_response(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Any:
        got["status"] = int(status.split(" ", 1)[0])
        got["headers"] = {n.lower(): v for n, v in headers}
        return lambda chunk: None

    caplog.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = b"".join(mw(environ, start_response))
    logs = [r.getMessage() for r in caplog.records if r.name == "idempo" and r.levelno >= logging.ERROR]
    return got["status"], got["headers"], out, bool(ran), [str(w.message) for w in caught
                                                         if issubclass(w.category, idempo.UnscopedKeyWarning)], logs


@pytest.mark.parametrize("host", [via_asgi, via_wsgi], ids=["asgi", "wsgi"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_admission_vector(case: Dict[str, Any], host: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="idempo")
    status, headers, body, ran, warned, logs = host(case, caplog)
    expect = case["expect"]
    name = case["name"]
    if expect["result"] == "refuse":
        assert status == expect["status"], (name, body)
        assert headers["content-type"] == "application/problem+json", name
        problem = json.loads(body)
        assert problem["type"] == expect["type"], name
        if "code" in expect:
            assert problem["code"] == expect["code"], name
        assert not ran, f"{name}: the handler ran"
        assert bool(logs) == expect["log"], (name, logs)
        if expect["log"]:
            assert len(logs) == 1 and case["request"]["route"] in logs[0], logs
    else:
        assert status == 201 and ran, (name, status, body)
        if expect["result"] == "admitted":
            assert bool(warned) == expect["warning"], (name, warned)
            if expect["warning"]:
                assert "no scope function configured" in warned[0] and case["request"]["route"] in warned[0]


@pytest.mark.parametrize("returned", [None, "", 42])
def test_scope_function_giving_nothing_refuses_asgi_and_wsgi(
    returned: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A configured scope function returning None, '' or a number: 500 scope-unresolved, the
    handler never runs, one log line naming the route (ASGI and WSGI alike)."""
    case = {
        "config": {},
        "request": {"method": "POST", "route": "/payments", "target": "/payments",
                    "key_fields": ["scope-key-0001"], "content_type": "application/json",
                    "body": "{}", "declared_length": 2, "authenticated": True},
        "scope": {"function": True, "public": False, "empty_is_anonymous": False,
                  "returns": {"nothing": True} if returned is None else
                  {"principal": returned} if isinstance(returned, str) else {"number": returned}},
    }
    caplog.set_level(logging.ERROR, logger="idempo")
    for host in (via_asgi, via_wsgi):
        status, headers, body, ran, _warned, logs = host(case, caplog)
        assert status == 500 and not ran
        assert json.loads(body)["type"] == "urn:idempo:problem:scope-unresolved"
        assert len(logs) == 1 and "POST /payments" in logs[0]


def test_public_with_a_scope_function_is_a_configuration_error() -> None:
    with pytest.raises(idempo.InvalidArgument, match="public"):
        AsgiMiddleware(lambda *a: None, store=MemoryStore(), scope=lambda s: "u", public=True)


def _admission_state(a: Any) -> Tuple[Any, ...]:
    problem = a.problem
    return (
        a.kind, a.log, a.warning, a.key, a.scope_id, a.fingerprint, a.partition,
        None if problem is None else (problem.status, tuple(problem.headers), problem.body,
                                      problem.outcome),
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
@pytest.mark.parametrize("over_limit", [False, True])
def test_the_one_call_admission_answers_as_the_staged_calls(
    case: Dict[str, Any], over_limit: bool
) -> None:
    """``Admission.admit`` (stages 2 and 3 in one call, what the hosts use) against ``body`` then
    ``scope`` (the scope function called in between, as the hosts did): the same state, the same
    answer, and the scope function called exactly when the staged path calls it."""
    from idempo._idempo import Admission, Fingerprinter, ScopeRule

    req, spec = case["request"], case["scope"]
    config = idempo.Config(**case["config"])
    rule = ScopeRule(function=spec["function"], public=spec["public"],
                     empty_scope_is_anonymous=spec["empty_is_anonymous"])
    fp = Fingerprinter()
    body = req["body"].encode()
    fields = [k.encode("latin-1") for k in req["key_fields"]]
    staged = Admission.start(config, fields, req["declared_length"])
    fused = Admission.start(config, fields, req["declared_length"])
    if staged.kind != "read_body":
        return  # stage 1 is the same call on both paths
    fn = scope_fn(spec)
    calls: List[str] = []

    def counted(tag: str) -> Optional[Callable[[Any], Any]]:
        if fn is None:
            return None

        def inner(request: Any) -> Any:
            calls.append(tag)
            return fn(request)

        return inner

    args = (req["method"], req["target"])
    staged.body(fp, *args, body, [], req["content_type"], over_limit=over_limit)
    if staged.kind == "resolve_scope":
        staged_fn = counted("staged")
        if staged_fn is None:
            staged.scope(rule, req["method"], req["route"], authenticated=req["authenticated"])
        else:
            try:
                returned = staged_fn(None)
            except Exception as exc:  # noqa: BLE001 - as the hosts did
                staged.scope(rule, req["method"], req["route"], authenticated=req["authenticated"],
                             raised=f"{type(exc).__name__}: {exc}")
            else:
                staged.scope(rule, req["method"], req["route"], authenticated=req["authenticated"],
                             returned=returned)
    admitted = fused.admit(fp, rule, *args, req["route"], body, [], req["content_type"],
                           over_limit=over_limit, authenticated=req["authenticated"],
                           scope_function=counted("fused"), scope_argument=None)
    assert _admission_state(fused) == _admission_state(staged)
    assert calls.count("fused") == calls.count("staged")
    if staged.kind == "admitted":
        assert admitted == (staged.key, staged.scope_id, staged.fingerprint, staged.partition,
                            staged.warning)
    else:
        assert admitted is None


def test_the_one_call_admission_lets_a_cancellation_through() -> None:
    from idempo._idempo import Admission, Fingerprinter, ScopeRule

    def cancelled(_request: Any) -> Any:
        raise asyncio.CancelledError()  # a BaseException: never the scope function's refusal

    a = Admission.start(idempo.Config(), [b"key-000001"], None)
    with pytest.raises(asyncio.CancelledError):
        a.admit(Fingerprinter(), ScopeRule(function=True), "POST", "/p", "/p", b"{}",
                authenticated=False, scope_function=cancelled, scope_argument=None)


_RAW_HEADERS: Dict[str, Any] = {
    "the usual": [(b"host", b"h"), (b"content-type", b"application/json"),
                  (b"content-length", b"7"), (b"idempotency-key", b"key-000001")],
    "no key": [(b"content-type", b"application/json"), (b"content-length", b"7")],
    "two key fields, mixed case": [(b"Idempotency-Key", b"key-000001"),
                                   (b"IDEMPOTENCY-KEY", b"key-000002")],
    "a sf-string key, last content-type wins, authorization": [
        (b"idempotency-key", b'"key-000001"'), (b"Content-Type", b"text/plain"),
        (b"content-type", b"application/json; charset=utf-8"),
        (b"Authorization", b"Bearer x")],
    "fingerprinted headers, Latin-1": [(b"X-Tenant", b"caf\xe9"), (b"x-tenant", b"b"),
                                       (b"idempotency-key", b"key-000001"),
                                       (b"x-other", b"c")],
    "a key too short": [(b"idempotency-key", b"k")],
    "a large declared length": [(b"idempotency-key", b"key-000001"),
                                (b"content-length", b"99999999999")],
    "a length with spaces": [(b"idempotency-key", b"key-000001"),
                             (b"content-length", b" 12 ")],
    "a length of other digits": [(b"idempotency-key", b"key-000001"),
                                 (b"content-length", b"\xb2")],
    "a length past 64 bits": [(b"idempotency-key", b"key-000001"),
                              (b"content-length", b"1" * 30)],
    "an empty length": [(b"idempotency-key", b"key-000001"), (b"content-length", b"")],
    "bytearray values": [(b"idempotency-key", bytearray(b"key-000001"))],
    "str names": [("idempotency-key", b"key-000001")],
    "a tuple of headers": ((b"idempotency-key", b"key-000001"),),
    "list pairs": [[b"idempotency-key", b"key-000001"]],
    "a generator": None,
    "no headers": [],
}


@pytest.mark.parametrize("name", sorted(_RAW_HEADERS))
@pytest.mark.parametrize("key_required", [True, False])
def test_start_asgi_reads_the_headers_as_request_headers_does(
    name: str, key_required: bool
) -> None:
    """``Admission.start_asgi`` (the headers read in the extension, what the asyncio hosts use)
    against ``request_headers``, ``declared_length`` and ``start``: the same admission, the same
    fingerprint from the pairs and content-type it kept; None (the host reads them itself) for
    any other shape, or a length that is not ASCII digits within 64 bits."""
    from idempo._host import declared_length, request_headers
    from idempo._idempo import Admission, Fingerprinter, ScopeRule

    raw = _RAW_HEADERS[name]
    if raw is None:
        raw = (h for h in [(b"idempotency-key", b"key-000001")])
    config = idempo.Config(key_required=key_required, max_request_body_bytes=1000)
    fingerprinted = frozenset([b"x-tenant"])
    fast = Admission.start_asgi(config, raw, b"idempotency-key", fingerprinted)
    plain_length = all(
        n.lower() != b"content-length" or (v.isdigit() and int(v) < 2**64)
        for n, v in (raw if isinstance(raw, (list, tuple)) else [])
        if isinstance(n, bytes) and isinstance(v, bytes)
    )
    shaped = (
        type(raw) in (list, tuple)
        and all(type(p) is tuple and len(p) == 2 and type(p[0]) is bytes and type(p[1]) is bytes
                for p in raw)
    )
    if not (shaped and plain_length):
        assert fast is None, name
        return
    assert fast is not None, name
    headers, lower, key_fields = request_headers(raw, b"idempotency-key", fingerprinted)
    try:
        length = declared_length(lower.get("content-length"))
    except ValueError:  # pragma: no cover - not a shape start_asgi takes
        raise
    plain = Admission.start(config, key_fields, length)
    assert _admission_state(fast) == _admission_state(plain), name
    assert (fast.body_limit, fast.authorization) == (plain.body_limit, "authorization" in lower)
    if plain.kind != "read_body":
        return
    rule = ScopeRule(function=False, public=True)
    fp = Fingerprinter(header_names=["x-tenant"])
    got = fast.admit(fp, rule, "POST", "/p", "/p", b'{"a":1}', authenticated=False)
    want = plain.admit(fp, rule, "POST", "/p", "/p", b'{"a":1}', headers,
                       lower.get("content-type"), authenticated=False)
    assert got == want and _admission_state(fast) == _admission_state(plain), name
