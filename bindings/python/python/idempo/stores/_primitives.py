"""The eight store primitives written once as plans (:mod:`idempo._plan`) for a store's sync
and asyncio classes: a store supplies a plan per primitive and the IO that runs its operations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Optional, Tuple, Type, TypeVar

from idempo._plan import Plan, drive, drive_async
from idempo.stores._base import PURGE_BATCH, ClaimResult, PurgeCounts, StoredRecord, unavailable

T = TypeVar("T")

__all__ = [
    "AsyncPrimitives", "AsyncPrimitivesBase", "Plan", "PlanHooks", "Primitives", "PrimitivesBase",
]


class PlanHooks(ABC):
    """What a store supplies to :class:`Primitives` / :class:`AsyncPrimitives`: a plan per
    primitive (the ``_plan_<name>`` hooks), the driver errors that fail closed (``_errors``,
    turned into :class:`~idempo.StoreUnavailable`, 503) and the store's name for messages.

    The hooks are abstract: a store class that lacks one cannot be instantiated (``TypeError``
    naming the missing hooks), rather than failing on the first request that needs it."""

    _errors: Tuple[Type[BaseException], ...] = ()
    _what = "store"

    @abstractmethod
    def _plan_claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> "Plan[Any, ClaimResult]":
        """Primitive 1's plan (validates its arguments before the first operation)."""

    @abstractmethod
    def _plan_get(self, scope_key: bytes) -> "Plan[Any, Tuple[Optional[StoredRecord], int]]":
        """Primitive 2's plan."""

    @abstractmethod
    def _plan_takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> "Plan[Any, Optional[int]]":
        """Primitive 3's plan."""

    @abstractmethod
    def _plan_mark_unknown(
        self, scope_key: bytes, seen_token: bytes, ttl_ms: int
    ) -> "Plan[Any, bool]":
        """Primitive 4's plan."""

    @abstractmethod
    def _plan_complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> "Plan[Any, bool]":
        """Primitive 5's plan."""

    @abstractmethod
    def _plan_release(self, scope_key: bytes, token: bytes) -> "Plan[Any, bool]":
        """Primitive 6's plan."""

    @abstractmethod
    def _plan_renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> "Plan[Any, bool]":
        """Primitive 7's plan."""

    @abstractmethod
    def _plan_purge_expired(self, batch: int) -> "Plan[Any, PurgeCounts]":
        """Primitive 8's plan."""


class PrimitivesBase(PlanHooks):
    """The eight primitives of ``spec/STORAGE.md`` §3 for a blocking store, written once: each
    runs its plan with the store's ``_drive`` (which also maps driver errors to 503). A store
    whose operations are independent of each other uses :class:`Primitives` and supplies only
    ``_op``; one that must choose a connection or transaction per primitive (SQLite) supplies
    ``_drive`` itself."""

    @abstractmethod
    def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        """Runs the plan of primitive ``name`` and returns its result."""

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

    def purge_expired(self, batch: int = PURGE_BATCH) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records, earliest expiry first."""
        return self._drive("purge_expired", self._plan_purge_expired(batch))


class AsyncPrimitivesBase(PlanHooks):
    """The asyncio form of :class:`PrimitivesBase`: the same plans, run by an awaitable
    ``_drive``."""

    @abstractmethod
    async def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        """Runs the plan of primitive ``name`` and returns its result."""

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

    async def purge_expired(self, batch: int = PURGE_BATCH) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records, earliest expiry first."""
        return await self._drive("purge_expired", self._plan_purge_expired(batch))


class Primitives(PrimitivesBase):
    """:class:`PrimitivesBase` for a store that runs every operation alike: each plan runs with
    the store's ``_op`` (one operation, blocking); errors of the types in ``_errors`` fail
    closed."""

    @abstractmethod
    def _op(self, op: Any) -> Any:
        """Executes one operation a plan yielded and returns its result."""

    def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        try:
            return drive(plan, self._op)
        except self._errors as exc:
            raise unavailable(f"{self._what} {name} failed", exc) from exc


class AsyncPrimitives(AsyncPrimitivesBase):
    """The asyncio form of :class:`Primitives`: the same plans, run by an awaitable ``_op``."""

    @abstractmethod
    async def _op(self, op: Any) -> Any:
        """Executes one operation a plan yielded and returns its result."""

    async def _drive(self, name: str, plan: "Plan[Any, T]") -> T:
        try:
            return await drive_async(plan, self._op)
        except self._errors as exc:
            raise unavailable(f"{self._what} {name} failed", exc) from exc
