"""Cross-tenant matrix (issue 13, finding 1): two tenants send the same key and the same body;
authentication as a FastAPI dependency, as an outer middleware, as a cookie session; idempo as
the FastAPI dependency and as the ASGI middleware. Never a replay across tenants: each tenant gets
its own answer, or (the middleware cannot see a dependency's tenant) a refusal."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Tuple

import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from pydantic import BaseModel
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import HTTPConnection

from idempo.asgi import IdempotencyMiddleware
from idempo.fastapi import Idempotency
from idempo.stores import AsyncMemoryStore

SCOPE_UNRESOLVED = "urn:idempo:problem:scope-unresolved"


class Payment(BaseModel):
    amount: int


class BearerBackend(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> Optional[Tuple[AuthCredentials, SimpleUser]]:
        auth = conn.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return None
        return AuthCredentials(["authenticated"]), SimpleUser(auth[len("Bearer "):])


async def tenant_from_token(request: Request, authorization: str = Header(default="")) -> str:
    if not authorization.startswith("Bearer "):
        raise HTTPException(401, "unauthenticated")
    tenant = authorization[len("Bearer "):]
    request.state.tenant_id = tenant  # what the README example read, too late
    return tenant


def tenant_from_user(request: Request) -> str:
    if not request.user.is_authenticated:
        raise HTTPException(401, "unauthenticated")
    return str(request.user.display_name)


def tenant_from_session(request: Request) -> str:
    tenant = request.session.get("tenant")
    if not tenant:
        raise HTTPException(401, "log in first")
    return str(tenant)


AUTH = {"dependency": tenant_from_token, "middleware": tenant_from_user,
        "session": tenant_from_session}

# What a middleware-level scope function can read for each style (the middleware runs before
# any dependency: a dependency's tenant is not there yet).
SCOPE_FN = {
    "dependency": lambda s: s["state"].get("tenant_id"),
    "middleware": lambda s: s["user"].display_name if s["user"].is_authenticated else None,
    "session": lambda s: s["session"].get("tenant"),
}


def build(integration: str, auth: str, runs: List[str]) -> FastAPI:
    principal = AUTH[auth]
    app = FastAPI()
    store = AsyncMemoryStore()
    if integration == "dependency":
        idempotency = Idempotency(store=store, principal=principal)
        app.router.route_class = idempotency.route_class
        dependencies = [Depends(idempotency)]
    else:
        dependencies = []

    @app.post("/payments", status_code=201, dependencies=dependencies)
    async def create(payment: Payment, tenant: str = Depends(principal)) -> Dict[str, Any]:
        runs.append(tenant)
        return {"tenant": tenant, "amount": payment.amount, "charge": len(runs)}

    @app.get("/login/{tenant}")
    async def login(tenant: str, request: Request) -> Dict[str, str]:
        request.session["tenant"] = tenant
        return {"tenant": tenant}

    if integration == "middleware":
        app.add_middleware(IdempotencyMiddleware, store=store, scope=SCOPE_FN[auth])
    # Added last, so they run first (outside idempo).
    if auth == "middleware":
        app.add_middleware(AuthenticationMiddleware, backend=BearerBackend())
    app.add_middleware(SessionMiddleware, secret_key="test-secret")
    return app


@pytest.mark.parametrize("auth", ["dependency", "middleware", "session"])
@pytest.mark.parametrize("integration", ["dependency", "middleware"])
def test_two_tenants_same_key_same_body_never_share_an_answer(integration: str, auth: str) -> None:
    runs: List[str] = []
    app = build(integration, auth, runs)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as a, \
                httpx.AsyncClient(transport=transport, base_url="http://api") as b:
            headers = {}
            for client, tenant in ((a, "tenant-a"), (b, "tenant-b")):
                if auth == "session":
                    assert (await client.get(f"/login/{tenant}")).status_code == 200
                else:
                    headers[tenant] = {"authorization": f"Bearer {tenant}"}
            key = {"Idempotency-Key": "same-key-0001"}

            async def pay(client: httpx.AsyncClient, tenant: str) -> httpx.Response:
                return await client.post("/payments", json={"amount": 100},
                                         headers={**key, **headers.get(tenant, {})})

            first_a = await pay(a, "tenant-a")
            first_b = await pay(b, "tenant-b")
            retry_a = await pay(a, "tenant-a")
            retry_b = await pay(b, "tenant-b")
            for tenant, first, retry in (("tenant-a", first_a, retry_a),
                                         ("tenant-b", first_b, retry_b)):
                if integration == "middleware" and auth == "dependency":
                    # The middleware cannot see a dependency's tenant: refused, never shared.
                    assert first.status_code == retry.status_code == 500
                    assert first.json()["type"] == retry.json()["type"] == SCOPE_UNRESOLVED
                    continue
                assert first.status_code == 201, first.text
                assert "idempotent-replayed" not in first.headers
                assert first.json()["tenant"] == tenant
                assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
                assert retry.json() == first.json()

    asyncio.run(main())
    if integration == "middleware" and auth == "dependency":
        assert runs == []
    else:
        assert sorted(runs) == ["tenant-a", "tenant-b"]


def test_readme_state_lambda_under_asgi_transport_is_refused_not_a_key_error() -> None:
    """The issue's example (``s["state"].get(...)``) under ``httpx.ASGITransport``, whose scope has
    no ``state``: core's scope-unresolved refusal, never a KeyError (a bare 500) nor a share."""
    runs: List[str] = []
    app = FastAPI()

    @app.post("/payments")
    async def create(payment: Payment) -> Dict[str, int]:
        runs.append("ran")
        return {"n": len(runs)}

    app.add_middleware(IdempotencyMiddleware, store=AsyncMemoryStore(),
                       scope=lambda s: s["state"].get("tenant_id"))

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            r = await c.post("/payments", json={"amount": 1},
                             headers={"Idempotency-Key": "pay-00000001"})
            assert r.status_code == 500 and r.json()["type"] == SCOPE_UNRESOLVED

    asyncio.run(main())
    assert runs == []
