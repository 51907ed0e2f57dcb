"""FastAPI: the middleware and the per-route mark with pydantic bodies and dependencies."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import httpx
from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import AsyncMemoryStore


class Payment(BaseModel):
    account: str
    amount: int


def test_fastapi_endpoint_with_dependencies() -> None:
    charges: List[Dict[str, Any]] = []
    app = FastAPI()

    def current_tenant(request: Request) -> str:
        return request.headers.get("x-tenant", "anonymous")

    @app.post("/payments", status_code=201)
    async def create(payment: Payment, request: Request,
                     tenant: str = Depends(current_tenant)) -> Dict[str, Any]:
        execution = request.state.idempotency
        charges.append({"tenant": tenant, **payment.model_dump()})
        return {"id": len(charges), "downstream_key": execution.downstream_key}

    @app.post("/refunds", status_code=201)
    # Refunds carry no tenant: the route says its keys are shared (the middleware's scope
    # function, which would return None here and refuse the request, is not called for it).
    @idempo.idempotent(config=idempo.Config(key_required=False), exclude=["/note"], public=True)
    async def refund(body: Dict[str, Any]) -> Dict[str, Any]:
        charges.append({"refund": body})
        return {"refund": len(charges)}

    app.add_middleware(
        IdempotencyMiddleware, store=AsyncMemoryStore(),
        scope=lambda s: dict(s["headers"]).get(b"x-tenant", b"").decode() or None)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            h = {"Idempotency-Key": '"pay-0000001"', "x-tenant": "t1"}
            a = await c.post("/payments", json={"account": "a", "amount": 5}, headers=h)
            b = await c.post("/payments", json={"amount": 5, "account": "a"}, headers=h)
            assert a.status_code == b.status_code == 201 and a.json() == b.json()
            assert b.headers["idempotent-replayed"] == "true"
            other_tenant = await c.post("/payments", json={"account": "a", "amount": 5},
                                        headers={**h, "x-tenant": "t2"})
            assert other_tenant.status_code == 201 and "idempotent-replayed" not in other_tenant.headers
            # the per-route mark: optional key, and an excluded member does not change the fingerprint
            r1 = await c.post("/refunds", json={"amount": 1, "note": "first"},
                              headers={"Idempotency-Key": "refund-0001"})
            r2 = await c.post("/refunds", json={"amount": 1, "note": "second try"},
                              headers={"Idempotency-Key": "refund-0001"})
            assert r2.headers["idempotent-replayed"] == "true" and r1.json() == r2.json()
            assert (await c.post("/refunds", json={"amount": 2})).status_code == 201  # no key

    asyncio.run(main())
    assert len(charges) == 4
