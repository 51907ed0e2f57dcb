from typing import Any, Dict

from fastapi import Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel

import idempo
from idempo.fastapi import Idempotency
from idempo.stores import SQLiteStore

API_KEYS = {"sk_test_tenant_a": "tenant-a", "sk_test_tenant_b": "tenant-b"}


class Payment(BaseModel):
    account: str
    amount: int


async def current_tenant(authorization: str = Header(default="")) -> str:
    """Your authentication dependency: the caller's tenant, or 401."""
    tenant = API_KEYS.get(authorization.removeprefix("Bearer "))
    if tenant is None:
        raise HTTPException(401, "invalid API key")
    return tenant


idempotency = Idempotency(
    store=SQLiteStore("idempo.sqlite3"),  # PostgresStore / RedisStore / CachedStore
    config=idempo.Config(lease_ms=30_000, ttl_ms=86_400_000),
    principal=current_tenant,  # keys are per tenant, from your own auth dependency
)
app = FastAPI()
app.router.route_class = idempotency.route_class  # claims after auth and validation


@app.post("/payments", status_code=201)
async def create_payment(
    payment: Payment, execution: idempo.Execution = Depends(idempotency)
) -> Dict[str, Any]:
    # Runs once per key and tenant; pass the downstream key to your payment provider.
    return {"status": "succeeded", "amount": payment.amount, "charge_key": execution.downstream_key}
