from typing import Any, MutableMapping, Optional, Tuple

from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import SQLiteStore

API_KEYS = {"sk_test_tenant_a": "tenant-a", "sk_test_tenant_b": "tenant-b"}


class ApiKeyBackend(AuthenticationBackend):
    async def authenticate(
        self, conn: HTTPConnection
    ) -> Optional[Tuple[AuthCredentials, SimpleUser]]:
        tenant = API_KEYS.get(conn.headers.get("authorization", "").removeprefix("Bearer "))
        return None if tenant is None else (AuthCredentials(["authenticated"]), SimpleUser(tenant))


def tenant_of(scope: MutableMapping[str, Any]) -> Optional[str]:
    """The principal, from what the ASGI scope holds when idempo runs (None: refused)."""
    user = scope.get("user")
    return str(user.display_name) if user is not None and user.is_authenticated else None


async def create_payment(request: Request) -> JSONResponse:
    execution: idempo.Execution = request.state.idempotency
    return JSONResponse({"status": "succeeded", "charge_key": execution.downstream_key}, 201)


app = Starlette(
    routes=[Route("/payments", create_payment, methods=["POST"])],
    middleware=[
        # In this order: authentication runs first and sets scope["user"] for idempo.
        Middleware(AuthenticationMiddleware, backend=ApiKeyBackend()),
        Middleware(IdempotencyMiddleware, store=SQLiteStore("idempo.sqlite3"), scope=tenant_of),
    ],
)
