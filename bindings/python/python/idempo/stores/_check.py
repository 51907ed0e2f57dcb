"""Construction-time check of a ``store=`` argument: every integration calls :func:`check_store`
when it is built, so a string, a class, a factory or a store of the wrong kind (an asyncio store
under a synchronous host) is a ``TypeError`` naming the fix at startup, not a 503 on every keyed
request later."""

from __future__ import annotations

import inspect
import os
from typing import Any, List

PRIMITIVES = ("claim", "get", "takeover", "mark_unknown", "complete", "release", "renew")
"""The store primitives a flow calls (``spec/STORAGE.md``)."""


def _missing(store: Any) -> List[str]:
    return [name for name in PRIMITIVES if not callable(getattr(store, name, None))]


def _async_primitives(store: Any) -> List[str]:
    return [name for name in PRIMITIVES if inspect.iscoroutinefunction(getattr(store, name))]


def check_store(store: Any, *, host: str, sync_only: bool) -> None:
    """Raises ``TypeError`` unless ``store`` is a store instance that ``host`` can drive.

    ``sync_only``: the host calls the store synchronously (WSGI, Flask, Django's sync chain), so an
    asyncio store is refused. An asyncio host accepts both kinds (a sync store runs in worker
    threads).
    """
    if isinstance(store, (str, bytes, os.PathLike)):
        raise TypeError(
            f"{host}: store={store!r} is a {type(store).__name__}, not a store; pass a store "
            f"instance, e.g. store=SQLiteStore({store!r}) or store=PostgresStore(dsn) "
            "(from idempo.stores)"
        )
    if isinstance(store, type):
        raise TypeError(
            f"{host}: store={store.__name__} is a class, not a store; pass an instance: "
            f"store={store.__name__}(...)"
        )
    missing = _missing(store)
    if missing:
        if callable(store):
            name = getattr(store, "__qualname__", None) or type(store).__name__
            raise TypeError(
                f"{host}: store={name} is a callable (a factory?), not a store: it has no "
                f"{', '.join(missing)}; call it and pass the store it returns: store={name}()"
            )
        raise TypeError(
            f"{host}: store= got a {type(store).__name__}, which is not an idempotency store "
            f"(no {', '.join(missing)}); use a store from idempo.stores (MemoryStore, "
            "SQLiteStore, PostgresStore, RedisStore, CachedStore or their Async twins)"
        )
    coroutines = _async_primitives(store)
    if coroutines and sync_only:
        name = type(store).__name__
        twin = name[len("Async"):] if name.startswith("Async") else "a synchronous store"
        raise TypeError(
            f"{host} calls its store synchronously, but {name} is an asyncio store; use its "
            f"synchronous twin ({twin}), or serve the app from an ASGI server"
        )
