"""Sans-IO plans: a store primitive written once for its sync and its asyncio form.

A plan is a generator that yields the operations it needs (a SQL statement, a Lua script call)
and receives each one's result, or has the operation's error thrown into it; its return value is
the primitive's result. :func:`drive` runs a plan with a blocking executor, :func:`drive_async`
with an awaitable one, so the sync and async classes keep only their IO.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Generator, Optional, Tuple, Type, TypeVar

from idempo.stores._base import ClaimResult, PurgeCounts, StoredRecord, unavailable

Op = TypeVar("Op")
T = TypeVar("T")

Plan = Generator[Op, Any, T]
"""Yields operations, receives their results, returns the primitive's result."""


def drive(plan: "Plan[Op, T]", execute: Callable[[Op], Any]) -> T:
    """Runs ``plan``, executing every operation it yields with ``execute``."""
    try:
        op = next(plan)
        while True:
            try:
                result = execute(op)
            except Exception as exc:
                op = plan.throw(exc)
            else:
                op = plan.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value


async def drive_async(plan: "Plan[Op, T]", execute: Callable[[Op], Awaitable[Any]]) -> T:
    """Runs ``plan``, awaiting ``execute`` for every operation it yields."""
    try:
        op = next(plan)
        while True:
            try:
                result = await execute(op)
            except Exception as exc:
                op = plan.throw(exc)
            else:
                op = plan.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value


class PlanHooks:
    """What a store supplies to :class:`Primitives` / :class:`AsyncPrimitives`: a plan per
    primitive (the ``_plan_<name>`` hooks), the driver errors that fail closed (``_errors``,
    turned into :class:`~idempo.StoreUnavailable`, 503) and the store's name for messages."""

    _errors: Tuple[Type[BaseException], ...] = ()
    _what = "store"

    def _plan_claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> "Plan[Any, ClaimResult]":
        raise NotImplementedError

    def _plan_get(self, scope_key: bytes) -> "Plan[Any, Tuple[Optional[StoredRecord], int]]":
        raise NotImplementedError

    def _plan_takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> "Plan[Any, Optional[int]]":
        raise NotImplementedError

    def _plan_mark_unknown(
        self, scope_key: bytes, seen_token: bytes, ttl_ms: int
    ) -> "Plan[Any, bool]":
        raise NotImplementedError

    def _plan_complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> "Plan[Any, bool]":
        raise NotImplementedError

    def _plan_release(self, scope_key: bytes, token: bytes) -> "Plan[Any, bool]":
        raise NotImplementedError

    def _plan_renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> "Plan[Any, bool]":
        raise NotImplementedError

    def _plan_purge_expired(self, batch: int) -> "Plan[Any, PurgeCounts]":
        raise NotImplementedError


class Primitives(PlanHooks):
    """The eight primitives of ``spec/STORAGE.md`` §3 for a blocking store, written once: each
    runs its plan with the store's ``_op`` (one operation, blocking)."""

    def _op(self, op: Any) -> Any:
        raise NotImplementedError

    def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        try:
            return drive(plan, self._op)
        except self._errors as exc:
            raise unavailable(f"{self._what} {name} failed", exc) from exc

    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """Primitive 1: insert-if-absent (an expired record counts as absent)."""
        plan = self._plan_claim(scope_key, fingerprint, token, lease_ms, ttl_ms)
        return self._drive("claim", plan)

    def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: the record (expired ones included) and the store's now."""
        return self._drive("get", self._plan_get(scope_key))

    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3: take over an expired lease with a new token."""
        plan = self._plan_takeover(scope_key, seen_token, new_token, lease_ms)
        return self._drive("takeover", plan)

    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4: an abandoned in-progress record becomes outcome-unknown."""
        return self._drive("mark_unknown", self._plan_mark_unknown(scope_key, seen_token, ttl_ms))

    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        """Primitive 5: store the response, only while still holding the token."""
        return self._drive("complete", self._plan_complete(scope_key, token, response, ttl_ms))

    def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6: delete the caller's own in-progress record."""
        return self._drive("release", self._plan_release(scope_key, token))

    def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7: extend the caller's lease (heartbeat)."""
        return self._drive("renew", self._plan_renew(scope_key, token, lease_ms))

    def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records, earliest expiry first."""
        return self._drive("purge_expired", self._plan_purge_expired(batch))


class AsyncPrimitives(PlanHooks):
    """The asyncio form of :class:`Primitives`: the same plans, run by an awaitable ``_op``."""

    async def _op(self, op: Any) -> Any:
        raise NotImplementedError

    async def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        try:
            return await drive_async(plan, self._op)
        except self._errors as exc:
            raise unavailable(f"{self._what} {name} failed", exc) from exc

    async def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """Primitive 1: insert-if-absent (an expired record counts as absent)."""
        plan = self._plan_claim(scope_key, fingerprint, token, lease_ms, ttl_ms)
        return await self._drive("claim", plan)

    async def get(
        self, scope_key: bytes
    ) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: the record (expired ones included) and the store's now."""
        return await self._drive("get", self._plan_get(scope_key))

    async def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3: take over an expired lease with a new token."""
        plan = self._plan_takeover(scope_key, seen_token, new_token, lease_ms)
        return await self._drive("takeover", plan)

    async def mark_unknown(
        self, scope_key: bytes, seen_token: bytes, ttl_ms: int
    ) -> bool:
        """Primitive 4: an abandoned in-progress record becomes outcome-unknown."""
        plan = self._plan_mark_unknown(scope_key, seen_token, ttl_ms)
        return await self._drive("mark_unknown", plan)

    async def complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> bool:
        """Primitive 5: store the response, only while still holding the token."""
        plan = self._plan_complete(scope_key, token, response, ttl_ms)
        return await self._drive("complete", plan)

    async def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6: delete the caller's own in-progress record."""
        return await self._drive("release", self._plan_release(scope_key, token))

    async def renew(
        self, scope_key: bytes, token: bytes, lease_ms: int
    ) -> bool:
        """Primitive 7: extend the caller's lease (heartbeat)."""
        return await self._drive("renew", self._plan_renew(scope_key, token, lease_ms))

    async def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records, earliest expiry first."""
        return await self._drive("purge_expired", self._plan_purge_expired(batch))
