"""Test helpers for the ASGI suites: a real uvicorn server on 127.0.0.1, an in-process client, and
a store that counts its claims (a real memory store, instrumented)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator, Optional

import httpx
import uvicorn

from idempo.stores import AsyncMemoryStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Runs ``app`` under uvicorn in a thread; yields its base URL."""
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                        lifespan="off"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)


def run(app: Any, fn: Callable[[httpx.AsyncClient], Awaitable[None]],
        raise_app_exceptions: bool = True) -> None:
    """Runs ``fn(client)`` against ``app`` through ``httpx.ASGITransport`` (no ``state`` in the
    scope, as FastAPI apps are usually tested)."""

    async def main() -> None:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            await fn(c)

    asyncio.run(main())


class CountingStore(AsyncMemoryStore):
    """An :class:`AsyncMemoryStore` that counts the claims made on it."""

    partitioned = False  # every claim comes here (no per-partition view)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.claims = 0

    async def claim(self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int,
                    ttl_ms: int, partition: Optional[bytes] = None) -> Any:
        self.claims += 1
        return await super().claim(scope_key, fingerprint, token, lease_ms, ttl_ms, partition)
