"""Core's bounded memory store through Python: the shared memory vectors
(spec/vectors/memory/), the cache-rule vectors (spec/vectors/cache/), and the guarantee through
the real middleware (WSGI via Flask, ASGI): filling a bounded store with other principals' fresh
keys never makes a completed record's retry run the handler again, and a full store answers 503
store-unavailable with Retry-After without running the handler."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from conftest import VECTORS
from flask import Flask, jsonify, request

import idempo
from idempo._idempo import cache_fill_px, cache_servable
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import AsyncMemoryStore, Claimed, Existing, MemoryStore, memory_partition
from idempo.wsgi import FlaskIdempotency

T0 = 1_700_000_000_000
MEMORY = sorted((VECTORS / "memory").glob("*.json"))


def _check_record(v: Dict[str, Any], got: Any, want: Any, ctx: str) -> None:
    if want is None:
        assert got is None, ctx
        return
    assert got is not None, ctx
    assert got.fingerprint == want["fingerprint"], ctx
    assert got.state == want["state"], ctx
    assert got.token == bytes.fromhex(v["tokens"][want["token"]]), ctx
    assert got.generation == want["generation"], ctx
    lease = None if got.lease_until is None else got.lease_until - T0
    assert lease == want["lease_until_ms"], ctx
    assert got.expires_at - T0 == want["expires_at_ms"], ctx
    resp = want["response"]
    assert got.response == (None if resp is None else bytes.fromhex(v["responses"][resp])), ctx


def _check_refusal(exc: idempo.StoreUnavailable, want: Dict[str, Any], ctx: str) -> None:
    reason = {"full": "store_full", "quota_exceeded": "partition_quota"}[want["error"]]
    assert exc.reason == reason, ctx  # type: ignore[attr-defined]
    assert exc.retry_after == want["retry_after_ms"] / 1000, ctx  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", MEMORY, ids=[p.stem for p in MEMORY])
def test_memory_vectors(path: Path) -> None:
    v = json.loads(path.read_text())
    limits = v["limits"]
    now = [T0]
    store = MemoryStore(
        max_entries=limits["max_entries"],
        max_bytes=limits["max_bytes"],
        max_entries_per_partition=limits["max_entries_per_partition"],
        max_bytes_per_partition=limits["max_bytes_per_partition"],
        clock=lambda: now[0],
    )
    parts = {}
    for name, p in v["principals"].items():
        parts[name] = memory_partition(p["principal"])
        assert parts[name].hex() == p["partition"], name
    scope = {k: bytes.fromhex(h) for k, h in v["scopes"].items()}
    tok = {k: bytes.fromhex(h) for k, h in v["tokens"].items()}
    for i, step in enumerate(v["steps"]):
        ctx = f"{v['name']} step {i}"
        if "advance_ms" in step:
            now[0] += step["advance_ms"]
            continue
        op, want = step["op"], step["expect"]
        if op == "claim":
            assert now[0] - T0 == want["now_ms"], ctx
            partition = parts[step["principal"]] if "principal" in step else None
            try:
                got = store.claim(scope[step["scope"]], step["fingerprint"], tok[step["token"]],
                                  step["lease_ms"], step["ttl_ms"], partition=partition)
            except idempo.StoreUnavailable as exc:
                assert "refused" in want, f"{ctx}: refused {exc}"
                _check_refusal(exc, want["refused"], ctx)
                continue
            if isinstance(got, Claimed):
                assert got.generation == want["claimed"]["generation"], ctx
            else:
                assert isinstance(got, Existing) and "existing" in want, ctx
                _check_record(v, got.record, want["existing"], ctx)
        elif op == "get":
            _check_record(v, store.get(scope[step["scope"]])[0], want["record"], ctx)
        elif op == "complete":
            response = bytes.fromhex(v["responses"][step["response"]])
            try:
                applied = store.complete(scope[step["scope"]], tok[step["token"]], response,
                                         step["ttl_ms"])
            except idempo.StoreUnavailable as exc:
                assert "refused" in want, f"{ctx}: refused {exc}"
                _check_refusal(exc, want["refused"], ctx)
                continue
            assert applied is want["applied"], ctx
        elif op == "release":
            assert store.release(scope[step["scope"]], tok[step["token"]]) is want["applied"], ctx
        elif op == "purge_expired":
            c = store.purge_expired(step["batch"])
            assert (c.in_progress, c.completed, c.outcome_unknown) == (
                want["in_progress"], want["completed"], want["outcome_unknown"]), ctx
        elif op == "len":
            assert len(store) == want["entries"], ctx
            if "bytes" in want:
                assert store.bytes_used == want["bytes"], ctx
        else:
            raise AssertionError(f"{ctx}: unknown op {op}")


def _cases(name: str) -> List[Dict[str, Any]]:
    cases: List[Dict[str, Any]] = json.loads((VECTORS / "cache" / f"{name}.json").read_text())["cases"]
    assert len(cases) >= 5
    return cases


def test_cache_serve_vectors() -> None:
    for c in _cases("serve"):
        assert cache_servable(c["state"], c["expires_at_ms"], c["cache_now_ms"]) is c["expect"], c


def test_cache_fill_vectors() -> None:
    for c in _cases("fill"):
        px = cache_fill_px(c["state"], c["expires_at_ms"], c["cache_ttl_ms"], c["read_now_ms"],
                           c["elapsed_ms"])
        assert px == c["expect"], c


# --- through the middleware --------------------------------------------------------------------


def _flask(store: MemoryStore, runs: List[str]) -> Flask:
    app = Flask(__name__)

    @app.post("/pay")
    def pay() -> Any:
        runs.append(request.headers["X-User"])
        return jsonify({"n": len(runs)}), 201

    FlaskIdempotency(app, store=store, scope=lambda environ: environ["HTTP_X_USER"])
    return app


def test_wsgi_flood_of_other_principals_never_reruns_a_completed_record() -> None:
    runs: List[str] = []
    store = MemoryStore(max_entries=8, max_entries_per_partition=3)
    c = _flask(store, runs).test_client()
    victim = {"X-User": "victim", "Idempotency-Key": "victim-key-0001"}
    first = c.post("/pay", json={"amount": 5}, headers=victim)
    assert first.status_code == 201 and runs == ["victim"]
    refused = []
    for attacker in range(6):
        for n in range(4):
            h = {"X-User": f"mallory-{attacker}", "Idempotency-Key": f"flood-{attacker}-{n:04d}"}
            r = c.post("/pay", json={"n": n}, headers=h)
            if r.status_code == 503:
                refused.append(r)
    # The quota (3 per principal) and the store (8 records) refused the rest: 503, Retry-After,
    # the store-unavailable problem, and no handler run.
    assert refused and len(runs) == 1 + 7
    for r in refused:
        assert r.headers["Retry-After"].isdigit() and r.content_type == "application/problem+json"
        assert r.get_json()["type"] == "urn:idempo:problem:store-unavailable"
    again = c.post("/pay", json={"amount": 5}, headers=victim)
    assert again.status_code == 201 and again.data == first.data
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs.count("victim") == 1, "the victim's retry must not run the handler again"


def test_asgi_full_store_answers_503_and_keeps_the_victims_record() -> None:
    runs: List[str] = []

    async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        runs.append(dict(scope["headers"])[b"x-user"].decode())
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok":true}'})

    def principal(scope: Dict[str, Any]) -> Optional[str]:
        return dict(scope["headers"])[b"x-user"].decode()

    store = AsyncMemoryStore(max_entries=3, max_entries_per_partition=3)
    wrapped = IdempotencyMiddleware(app, store=store, scope=principal)

    async def post(user: str, key: str) -> Dict[str, Any]:
        sent: List[Dict[str, Any]] = []

        async def receive() -> Dict[str, Any]:
            return {"type": "http.request", "body": b'{"a":1}', "more_body": False}

        async def send(msg: Dict[str, Any]) -> None:
            sent.append(msg)

        scope = {"type": "http", "method": "POST", "path": "/pay", "raw_path": b"/pay",
                 "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                                  (b"idempotency-key", key.encode()),
                                                  (b"x-user", user.encode())]}
        await wrapped(scope, receive, send)
        start = sent[0]
        return {"status": start["status"], "headers": dict(start["headers"]),
                "body": b"".join(m.get("body", b"") for m in sent[1:])}

    async def main() -> None:
        first = await post("victim", "victim-key-0001")
        assert first["status"] == 201
        assert (await post("mallory", "flood-0001"))["status"] == 201
        assert (await post("trudy", "flood-0002"))["status"] == 201
        full = await post("eve", "flood-0003")
        assert full["status"] == 503 and full["headers"][b"retry-after"].isdigit()
        assert json.loads(full["body"])["type"] == "urn:idempo:problem:store-unavailable"
        again = await post("victim", "victim-key-0001")
        assert again["status"] == 201 and again["body"] == first["body"]
        assert again["headers"][b"idempotent-replayed"] == b"true"

    asyncio.run(main())
    assert runs == ["victim", "mallory", "trudy"]
