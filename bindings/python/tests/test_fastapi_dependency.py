"""idempo.fastapi: the dependency claims after authentication and validation (issue 13, findings
1 and 7), its OpenAPI, its answers through the ASGI capture (replays, problems, exceptions)."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel

import idempo
from idempo.fastapi import Idempotency
from idempo.stores import AsyncMemoryStore

from asgi_servers import CountingStore, run

KEY_REUSED = "urn:idempo:problem:key-reused"


class Payment(BaseModel):
    amount: int


async def bearer_tenant(authorization: str = Header(default="")) -> str:
    """The app's own authentication: a bearer token naming the tenant; 401 otherwise."""
    if not authorization.startswith("Bearer "):
        raise HTTPException(401, "missing or expired token")
    tenant = authorization[len("Bearer "):]
    if tenant == "banned":
        raise HTTPException(403, "forbidden")
    return tenant


def payments_app(store: Any, runs: List[str], **options: Any) -> FastAPI:
    idempotency = Idempotency(store=store, principal=bearer_tenant, **options)
    app = FastAPI()
    app.router.route_class = idempotency.route_class

    @app.post("/payments", status_code=201)
    async def create(payment: Payment, execution: idempo.Execution = Depends(idempotency),
                     tenant: str = Depends(bearer_tenant)) -> Dict[str, Any]:
        runs.append(tenant)
        return {"tenant": tenant, "amount": payment.amount, "n": len(runs),
                "downstream_key": execution.downstream_key}

    @app.post("/missing")
    async def missing(payment: Payment, execution: idempo.Execution = Depends(idempotency)) -> Any:
        runs.append("missing")
        raise HTTPException(404, "no such account")

    @app.post("/plain")
    async def plain(payment: Payment) -> Dict[str, int]:  # no dependency: not protected
        runs.append("plain")
        return {"n": len(runs)}

    return app


def test_auth_and_validation_failures_never_claim_and_the_fixed_request_runs() -> None:
    store = CountingStore()
    runs: List[str] = []
    outcomes: List[str] = []
    app = payments_app(store, runs, hooks=idempo.Hooks(on_outcome=lambda r, o: outcomes.append(o)))

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "pay-00000001"}
        unauth = await c.post("/payments", json={"amount": 5}, headers=h)
        assert unauth.status_code == 401 and unauth.json() == {"detail": "missing or expired token"}
        banned = await c.post("/payments", json={"amount": 5},
                              headers={**h, "authorization": "Bearer banned"})
        assert banned.status_code == 403
        invalid = await c.post("/payments", json={"amount": "lots"},
                               headers={**h, "authorization": "Bearer t1"})
        assert invalid.status_code == 422 and invalid.headers["content-type"] == "application/json"
        assert invalid.json()["detail"][0]["loc"] == ["body", "amount"]
        assert store.claims == 0 and outcomes == [] and runs == []  # nothing claimed or stored
        fixed = await c.post("/payments", json={"amount": 5},
                             headers={**h, "authorization": "Bearer t1"})
        assert fixed.status_code == 201 and "idempotent-replayed" not in fixed.headers
        again = await c.post("/payments", json={"amount": 5},
                             headers={**h, "authorization": "Bearer t1"})
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.content == fixed.content
        other = await c.post("/payments", json={"amount": 6},
                             headers={**h, "authorization": "Bearer t1"})
        assert other.status_code == 422 and other.json()["type"] == KEY_REUSED

    run(app, go)
    assert runs == ["t1"] and store.claims == 3
    assert outcomes == ["stored", "replayed", "mismatch"]


def test_problems_and_the_endpoints_own_http_exception() -> None:
    runs: List[str] = []
    app = payments_app(AsyncMemoryStore(), runs)

    async def go(c: httpx.AsyncClient) -> None:
        auth = {"authorization": "Bearer t1"}
        missing = await c.post("/payments", json={"amount": 1}, headers=auth)
        assert missing.status_code == 400
        assert missing.json()["type"] == "urn:idempo:problem:missing-key"
        assert missing.headers["content-type"] == "application/problem+json"
        bad = await c.post("/payments", json={"amount": 1},
                           headers={**auth, "Idempotency-Key": "short"})
        assert bad.status_code == 400 and bad.json()["type"] == "urn:idempo:problem:invalid-key"
        # The endpoint's own HTTPException is its answer: stored (404 is a business answer).
        h = {**auth, "Idempotency-Key": "missing-0001"}
        first = await c.post("/missing", json={"amount": 1}, headers=h)
        second = await c.post("/missing", json={"amount": 1}, headers=h)
        assert first.status_code == second.status_code == 404
        assert second.headers["idempotent-replayed"] == "true" and second.json() == first.json()
        # A route without the dependency is not protected.
        p1 = await c.post("/plain", json={"amount": 1}, headers={"Idempotency-Key": "plain-0001"})
        p2 = await c.post("/plain", json={"amount": 1}, headers={"Idempotency-Key": "plain-0001"})
        assert p1.json() != p2.json() and "idempotent-replayed" not in p2.headers

    run(app, go)
    assert runs == ["missing", "plain", "plain"]


def test_a_principal_that_resolves_to_nothing_is_refused() -> None:
    runs: List[str] = []

    async def nobody() -> Any:
        return None

    idempotency = Idempotency(store=AsyncMemoryStore(), principal=nobody)
    app = FastAPI()
    app.router.route_class = idempotency.route_class

    @app.post("/payments")
    async def create(payment: Payment, execution: idempo.Execution = Depends(idempotency)) -> Any:
        runs.append("ran")
        return {}

    async def go(c: httpx.AsyncClient) -> None:
        r = await c.post("/payments", json={"amount": 1}, headers={"Idempotency-Key": "pay-0000001"})
        assert r.status_code == 500 and r.json()["type"] == "urn:idempo:problem:scope-unresolved"

    run(app, go)
    assert runs == []


def test_construction_needs_a_principal_or_public_and_the_route_class() -> None:
    with pytest.raises(idempo.InvalidArgument, match="principal="):
        Idempotency(store=AsyncMemoryStore())
    idempotency = Idempotency(store=AsyncMemoryStore(), public=True)
    app = FastAPI()  # the route class was not set: fail closed, the endpoint never runs
    runs: List[str] = []

    @app.post("/exports")
    async def export(execution: idempo.Execution = Depends(idempotency)) -> Any:
        runs.append("ran")
        return {}

    async def go(c: httpx.AsyncClient) -> None:
        with pytest.raises(RuntimeError, match="route_class"):
            await c.post("/exports", headers={"Idempotency-Key": "export-0001"})

    run(app, go)
    assert runs == []


def test_router_level_dependency_included_router_and_per_route_config() -> None:
    runs: List[str] = []
    idempotency = Idempotency(store=AsyncMemoryStore(), public=True)
    router = APIRouter(route_class=idempotency.route_class, dependencies=[Depends(idempotency)])

    @router.post("/exports")
    @idempo.idempotent(config=idempo.Config(key_required=False), exclude=["/note"])
    def export(body: Dict[str, Any]) -> Dict[str, int]:  # a sync endpoint
        runs.append("export")
        return {"n": len(runs)}

    app = FastAPI()
    app.include_router(router, prefix="/v1")

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "export-0001"}
        a = await c.post("/v1/exports", json={"x": 1, "note": "a"}, headers=h)
        b = await c.post("/v1/exports", json={"x": 1, "note": "b"}, headers=h)
        assert a.status_code == b.status_code == 200 and a.json() == b.json() == {"n": 1}
        assert b.headers["idempotent-replayed"] == "true"
        c3 = await c.post("/v1/exports", json={"x": 1})  # key optional on this route
        assert c3.json() == {"n": 2}

    run(app, go)
    op = app.openapi()["paths"]["/v1/exports"]["post"]
    key = [p for p in op["parameters"] if p["name"] == "Idempotency-Key"]
    assert key and key[0]["in"] == "header" and key[0]["required"] is False


def test_openapi_documents_the_key_and_the_problems() -> None:
    app = payments_app(AsyncMemoryStore(), [])
    doc = app.openapi()
    op = doc["paths"]["/payments"]["post"]
    key = [p for p in op["parameters"] if p["name"] == "Idempotency-Key"]
    assert len(key) == 1 and key[0]["in"] == "header" and key[0]["required"] is True
    for status in ("400", "409", "413", "422", "500", "503"):
        assert "application/problem+json" in op["responses"][status]["content"], status
    for status in ("409", "503"):
        assert "Retry-After" in op["responses"][status]["headers"]
    # FastAPI's own validation error stays documented next to idempo's key-reused.
    assert "application/json" in op["responses"]["422"]["content"]
    assert "Idempotency-Key" not in str(doc["paths"]["/plain"]["post"].get("parameters", []))


def test_openapi_parts_match_the_contract_document() -> None:
    yaml = pytest.importorskip("yaml")
    from conftest import REPO
    from idempo.fastapi import PROBLEM_RESPONSES, key_parameter

    contract = yaml.safe_load((REPO / "spec" / "openapi" / "idempotency.yaml").read_text())
    components = contract["components"]
    documented = {int(s) for s in contract["paths"]["/payments"]["post"]["responses"]} - {201}
    assert set(PROBLEM_RESPONSES) | {422} == documented
    for response in PROBLEM_RESPONSES.values():
        schema = response["content"]["application/problem+json"]["schema"]
        assert schema == components["schemas"]["Problem"]
        for header in response.get("headers", {}).values():
            assert header == components["headers"]["RetryAfter"]
    param = components["parameters"]["IdempotencyKey"]
    ours = key_parameter()
    assert (ours["name"], ours["in"], ours["required"]) == (param["name"], param["in"], True)
    assert ours["schema"]["pattern"] == param["schema"]["pattern"]
    assert ours["schema"]["maxLength"] == param["schema"]["maxLength"]
    assert ours["schema"]["minLength"] == param["schema"]["minLength"]


def test_an_endpoint_that_raises_follows_cores_rule_and_a_duplicate_in_flight_gets_409() -> None:
    import asyncio

    runs: List[str] = []
    release = asyncio.Event()
    idempotency = Idempotency(store=AsyncMemoryStore(), public=True)
    app = FastAPI()
    app.router.route_class = idempotency.route_class

    @app.post("/crash", dependencies=[Depends(idempotency)])
    async def crash() -> Any:
        runs.append("crash")
        raise RuntimeError("the payment provider timed out")

    @app.post("/slow", dependencies=[Depends(idempotency)])
    async def slow() -> Dict[str, str]:
        runs.append("slow")
        await release.wait()
        return {"done": "yes"}

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "crash-00001"}
        first = await c.post("/crash", headers=h)
        assert first.status_code == 500
        retry = await c.post("/crash", headers=h)  # may have charged: never run again blindly
        assert retry.status_code == 500
        assert retry.json()["type"] == "urn:idempo:problem:outcome-unknown"
        s = {"Idempotency-Key": "slow-000001"}
        running = asyncio.ensure_future(c.post("/slow", headers=s))
        while "slow" not in runs:
            await asyncio.sleep(0.01)
        duplicate = await c.post("/slow", headers=s)
        assert duplicate.status_code == 409 and "retry-after" in duplicate.headers
        release.set()
        assert (await running).json() == {"done": "yes"}
        assert (await c.post("/slow", headers=s)).headers["idempotent-replayed"] == "true"

    run(app, go, raise_app_exceptions=False)
    assert runs == ["crash", "slow"]


def test_transactional_route_writes_through_the_claims_transaction(tmp_path: Any) -> None:
    import sqlite3

    from idempo.stores import AsyncSQLiteStore

    db = tmp_path / "tx.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE payment (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
    idempotency = Idempotency(store=AsyncSQLiteStore(db), principal=bearer_tenant,
                              config=idempo.Config(transactional=True))
    app = FastAPI()
    app.router.route_class = idempotency.route_class
    fail = {"now": True}

    @app.post("/payments", status_code=201)
    async def create(payment: Payment, execution: idempo.Execution = Depends(idempotency)) -> Any:
        assert execution.transaction is idempo.current_transaction()
        execution.transaction.connection.execute(
            "INSERT INTO payment (amount) VALUES (?)", (payment.amount,))
        if fail["now"]:
            fail["now"] = False
            raise RuntimeError("rolled back with the claim")
        return {"amount": payment.amount}

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "tx-pay-00001", "authorization": "Bearer t1"}
        assert (await c.post("/payments", json={"amount": 3}, headers=h)).status_code == 500
        ok = await c.post("/payments", json={"amount": 3}, headers=h)  # rolled back: runs again
        assert ok.status_code == 201, ok.text
        again = await c.post("/payments", json={"amount": 3}, headers=h)
        assert again.headers["idempotent-replayed"] == "true"

    run(app, go, raise_app_exceptions=False)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM payment").fetchone() == (1,)


def test_a_route_rebuilt_from_a_protected_route_claims_once_and_overrides_turn_it_off() -> None:
    runs: List[str] = []
    idempotency = Idempotency(store=AsyncMemoryStore(), public=True)
    app = FastAPI()
    app.router.route_class = idempotency.route_class

    @app.post("/a", dependencies=[Depends(idempotency)])
    async def a() -> Dict[str, int]:
        runs.append("a")
        return {"n": len(runs)}

    # What older FastAPI's include_router does: a new route from the route's endpoint.
    first = [r for r in app.routes if getattr(r, "path", "") == "/a"][0]
    app.router.add_api_route("/b", first.endpoint, methods=["POST"],  # type: ignore[attr-defined]
                             dependencies=[Depends(idempotency)])

    async def go(c: httpx.AsyncClient) -> None:
        h = {"Idempotency-Key": "rebuilt-0001"}
        r1 = await c.post("/b", headers=h)
        r2 = await c.post("/b", headers=h)
        assert r1.status_code == 200 and r2.headers["idempotent-replayed"] == "true"
        app.dependency_overrides[idempotency] = lambda: None  # e.g. in the app's own tests
        r3 = await c.post("/a", headers=h)
        r4 = await c.post("/a", headers=h)
        assert "idempotent-replayed" not in r4.headers and r3.json() != r4.json()

    run(app, go)
    assert runs == ["a", "a", "a"]


def test_problem_renderer_gives_the_apis_own_envelope() -> None:
    def envelope(problem: idempo.Problem) -> Any:
        body = {"error": {"type": problem.slug, "message": problem.detail}}
        return json.dumps(body).encode(), "application/vnd.acme.error+json"

    runs: List[str] = []
    app = payments_app(AsyncMemoryStore(), runs, problem_renderer=envelope)

    async def go(c: httpx.AsyncClient) -> None:
        auth = {"authorization": "Bearer t1"}
        missing = await c.post("/payments", json={"amount": 1}, headers=auth)  # admission refusal
        assert missing.status_code == 400
        assert missing.headers["content-type"] == "application/vnd.acme.error+json"
        assert missing.json()["error"]["type"] == "missing-key"
        h = {**auth, "Idempotency-Key": "render-0001"}
        assert (await c.post("/payments", json={"amount": 1}, headers=h)).status_code == 201
        reused = await c.post("/payments", json={"amount": 2}, headers=h)  # the flow's problem
        assert reused.status_code == 422
        assert reused.headers["content-type"] == "application/vnd.acme.error+json"
        assert reused.json()["error"]["type"] == "key-reused"
        # FastAPI's own validation 422 is the app's, not idempo's: untouched.
        invalid = await c.post("/payments", json={"amount": "x"}, headers=h)
        assert invalid.status_code == 422 and "detail" in invalid.json()

    run(app, go)
    assert runs == ["t1"]


def test_the_handler_without_the_claim_dependency_keeps_its_principal_and_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A route whose own dependencies include Depends(idempotency) runs a handler that does not
    solve it per request (the principal dependency in its place): the principal is the one
    FastAPI solved once for the request (shared with the endpoint's own use of it), keys stay
    per principal, an override of the principal dependency is the principal, an override of
    Depends(idempotency) turns protection off, and a route that uses it inside another
    dependency keeps FastAPI's handler."""
    calls: List[str] = []
    solved: List[str] = []
    real_call = Idempotency.__call__

    async def counted(self: Idempotency, *args: Any, **kwargs: Any) -> Any:
        calls.append("dependency")
        return await real_call(self, *args, **kwargs)

    monkeypatch.setattr(Idempotency, "__call__", counted)

    async def tenant_of(authorization: str = Header(default="")) -> str:
        solved.append(authorization)
        return await bearer_tenant(authorization)

    runs: List[str] = []
    idempotency = Idempotency(store=AsyncMemoryStore(), principal=tenant_of)
    app = FastAPI()
    app.router.route_class = idempotency.route_class

    @app.post("/pay", status_code=201)
    async def pay(payment: Payment, execution: idempo.Execution = Depends(idempotency),
                  tenant: str = Depends(tenant_of)) -> Dict[str, Any]:
        runs.append(tenant)
        return {"tenant": tenant, "n": len(runs),
                "execution": isinstance(execution, idempo.Execution)}

    def via(execution: Any = Depends(idempotency)) -> Any:
        return execution

    @app.post("/nested", status_code=201)
    async def nested(payment: Payment, execution: Any = Depends(via)) -> Dict[str, Any]:
        runs.append("nested")
        return {"n": len(runs), "execution": isinstance(execution, idempo.Execution)}

    def h(tenant: str) -> Dict[str, str]:
        return {"Idempotency-Key": "direct-0001", "Authorization": f"Bearer {tenant}"}

    async def go(c: httpx.AsyncClient) -> None:
        a1 = await c.post("/pay", json={"amount": 1}, headers=h("a"))
        a2 = await c.post("/pay", json={"amount": 1}, headers=h("a"))
        b1 = await c.post("/pay", json={"amount": 1}, headers=h("b"))
        assert (a1.status_code, a2.status_code, b1.status_code) == (201, 201, 201)
        assert a2.headers["idempotent-replayed"] == "true" and a2.json() == a1.json()
        assert "idempotent-replayed" not in b1.headers and b1.json()["tenant"] == "b"
        assert a1.json()["execution"] is True and b1.json()["execution"] is True
        assert calls == [], "Depends(idempotency) was solved per request"
        assert solved == ["Bearer a", "Bearer a", "Bearer b"], "the principal solved once each"
        assert (await c.post("/pay", json={"amount": 1}, headers=h("banned"))).status_code == 403

        app.dependency_overrides[tenant_of] = lambda: "a"  # every caller is tenant a
        c1 = await c.post("/pay", json={"amount": 1}, headers=h("c"))
        assert c1.headers["idempotent-replayed"] == "true" and c1.json() == a1.json()
        del app.dependency_overrides[tenant_of]

        app.dependency_overrides[idempotency] = lambda: None  # unprotected: runs every time
        o1 = await c.post("/pay", json={"amount": 1}, headers=h("a"))
        assert o1.status_code == 201 and "idempotent-replayed" not in o1.headers
        assert o1.json()["n"] == 3 and o1.json()["execution"] is False
        del app.dependency_overrides[idempotency]

        n1 = await c.post("/nested", json={"amount": 1}, headers=h("a"))
        n2 = await c.post("/nested", json={"amount": 1}, headers=h("a"))
        assert n1.json()["execution"] is True  # the placeholder it passed on: the Execution
        assert n2.headers["idempotent-replayed"] == "true" and n2.json() == n1.json()
        assert calls == ["dependency", "dependency"]

    run(app, go)
    assert runs == ["a", "b", "a", "nested"]
