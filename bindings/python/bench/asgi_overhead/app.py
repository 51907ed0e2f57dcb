"""The app of run.py and inproc.py: one FastAPI POST route, wrapped as the variant says.

bare: no idempotency. dep: idempo.fastapi (Depends) on MemoryStore. dep_sqlite: the same on
SQLiteStore($IDEMPO_SQLITE). mw: idempo.asgi.IdempotencyMiddleware on MemoryStore. peer:
asgi-idempotency-header's middleware with its in-memory backend (when importable).
"""

import os
from typing import Any

from fastapi import Depends, FastAPI
from pydantic import BaseModel


class Payment(BaseModel):
    amount: int
    currency: str
    customer: str
    description: str
    metadata: dict


def build(variant: str, sqlite_path: str = "") -> Any:
    app = FastAPI()
    if variant in ("dep", "dep_sqlite"):
        import idempo
        from idempo.fastapi import Idempotency
        from idempo.stores import MemoryStore, SQLiteStore

        store = MemoryStore() if variant == "dep" else SQLiteStore(sqlite_path)
        idem = Idempotency(store=store, public=True)
        app.router.route_class = idem.route_class

        @app.post("/payments", status_code=201)
        async def create(payment: Payment, execution: idempo.Execution = Depends(idem)) -> dict:
            return {"id": "pay_1", "amount": payment.amount, "status": "created"}

        return app

    @app.post("/payments", status_code=201)
    async def create_bare(payment: Payment) -> dict:
        return {"id": "pay_1", "amount": payment.amount, "status": "created"}

    if variant == "mw":
        from idempo.asgi import IdempotencyMiddleware
        from idempo.stores import MemoryStore

        app.add_middleware(IdempotencyMiddleware, store=MemoryStore(), public=True)
    elif variant == "peer":
        from idempotency_header_middleware import IdempotencyHeaderMiddleware
        from idempotency_header_middleware.backends.memory import MemoryBackend

        app.add_middleware(IdempotencyHeaderMiddleware, backend=MemoryBackend())
    return app


app = build(os.environ.get("IDEMPO_VARIANT", "bare"), os.environ.get("IDEMPO_SQLITE", ""))
