"""The store hooks are abstract: a store class missing one fails when it is built, not when a
request first needs the missing primitive; every shipped store class is complete."""

from __future__ import annotations

import inspect
from typing import Any, Iterator, List, Optional, Tuple

import pytest

from idempo.stores import _primitives, _tx
from idempo.stores._base import Claimed, ClaimResult, PurgeCounts, StoredRecord
from idempo.stores._primitives import AsyncPrimitives, Plan, PrimitivesBase, Primitives

# Imported so that every store module's classes are registered as subclasses below.
from idempo.stores import cached, memory, postgres, redis, sqlite  # noqa: F401


class _NoIO:
    """Plans that yield one operation each (its result is the primitive's result)."""

    def _plan_claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> "Plan[Any, ClaimResult]":
        return (yield ("claim", scope_key))

    def _plan_get(self, scope_key: bytes) -> "Plan[Any, Tuple[Optional[StoredRecord], int]]":
        return (yield ("get", scope_key))

    def _plan_takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> "Plan[Any, Optional[int]]":
        return (yield ("takeover", scope_key))

    def _plan_mark_unknown(
        self, scope_key: bytes, seen_token: bytes, ttl_ms: int
    ) -> "Plan[Any, bool]":
        return (yield ("mark_unknown", scope_key))

    def _plan_complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> "Plan[Any, bool]":
        return (yield ("complete", scope_key))

    def _plan_release(self, scope_key: bytes, token: bytes) -> "Plan[Any, bool]":
        return (yield ("release", scope_key))

    def _plan_renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> "Plan[Any, bool]":
        return (yield ("renew", scope_key))

    def _plan_purge_expired(self, batch: int) -> "Plan[Any, PurgeCounts]":
        return (yield ("purge_expired", batch))


class _Complete(_NoIO, Primitives):
    """Every hook supplied: answers each operation from a table and records what ran."""

    def __init__(self) -> None:
        self.ran: List[Any] = []

    def _op(self, op: Any) -> Any:
        self.ran.append(op)
        return {"claim": Claimed(1, 5), "release": True}[op[0]]


def _without(name: str, base: type) -> type:
    """A subclass of ``_NoIO`` + ``base`` whose hook ``name`` is the base's (abstract) one."""
    namespace = {
        attr: value
        for attr, value in vars(_NoIO).items()
        if attr.startswith("_plan_") and attr != name
    }
    if base is Primitives:
        namespace["_op"] = lambda self, op: None
    elif base is AsyncPrimitives:

        async def _op(self: Any, op: Any) -> Any:
            return None

        namespace["_op"] = _op
    return type(f"Missing{name}", (base,), namespace)


def test_a_complete_store_builds_and_runs_its_plans() -> None:
    store = _Complete()
    assert store.claim(bytes(32), "v1:" + "0" * 64, bytes(16), 1000, 2000) == Claimed(1, 5)
    assert store.release(bytes(32), bytes(16)) is True
    assert store.ran == [("claim", bytes(32)), ("release", bytes(32))]


HOOKS = [
    "_plan_claim",
    "_plan_get",
    "_plan_takeover",
    "_plan_mark_unknown",
    "_plan_complete",
    "_plan_release",
    "_plan_renew",
    "_plan_purge_expired",
]


@pytest.mark.parametrize("base", [Primitives, AsyncPrimitives], ids=["sync", "async"])
@pytest.mark.parametrize("hook", HOOKS)
def test_a_store_missing_a_plan_hook_cannot_be_built(base: type, hook: str) -> None:
    cls = _without(hook, base)
    assert inspect.isabstract(cls)
    with pytest.raises(TypeError, match=hook):
        cls()


@pytest.mark.parametrize("base", [Primitives, AsyncPrimitives], ids=["sync", "async"])
def test_a_store_missing_its_op_cannot_be_built(base: type) -> None:
    namespace = {a: v for a, v in vars(_NoIO).items() if a.startswith("_plan_")}
    cls = type("NoOp", (base,), namespace)
    with pytest.raises(TypeError, match="_op"):
        cls()


def test_a_store_driving_its_own_plans_must_supply_drive() -> None:
    namespace = {a: v for a, v in vars(_NoIO).items() if a.startswith("_plan_")}
    cls = type("NoDrive", (PrimitivesBase,), namespace)
    with pytest.raises(TypeError, match="_drive"):
        cls()


def test_a_session_missing_its_end_cannot_be_built() -> None:
    class Session(_tx.SessionEnds):
        @property
        def open(self) -> bool:
            return False

    with pytest.raises(TypeError, match="_end"):
        Session()  # type: ignore[abstract]


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _shipped(base: type) -> List[type]:
    return sorted(
        {
            cls
            for cls in _subclasses(base)
            if cls.__module__.startswith("idempo.stores.") and not cls.__name__.startswith("_")
        },
        key=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
    )


SHIPPED = _shipped(_primitives.PlanHooks)


def test_every_store_class_is_found() -> None:
    names = {cls.__name__ for cls in SHIPPED}
    assert {
        "SQLiteStore",
        "AsyncSQLiteStore",
        "SQLiteTransaction",
        "PostgresStore",
        "AsyncPostgresStore",
        "PostgresTransaction",
        "AsyncPostgresTransaction",
        "RedisStore",
        "AsyncRedisStore",
        "CachedStore",
        "AsyncCachedStore",
    } <= names


@pytest.mark.parametrize(
    "cls", [c for c in SHIPPED if c.__module__ != _primitives.__name__], ids=lambda c: c.__name__
)
def test_every_shipped_store_class_supplies_every_hook(cls: type) -> None:
    assert not inspect.isabstract(cls), sorted(getattr(cls, "__abstractmethods__", ()))
