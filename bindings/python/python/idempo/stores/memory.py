"""In-process store: tests, demos and single-process services only.

The records live in core's bounded memory store (``idempo_core::machine::memory``,
``spec/STORAGE.md`` §8) through the ``MemoryStoreCore`` extension class, the same store Node's
``MemoryStore`` wraps: capacity, eviction and quotas are written once, in Rust. A lock makes every
primitive one atomic step for threads; the async wrapper never awaits inside a primitive.

What a full store does: it never evicts an unexpired record (completed, in progress or
outcome-unknown) to make room for another key, so nobody can flush a victim's completed record
with fresh keys and make the victim's retry run the handler again. It removes expired records only;
each partition (the request's principal, passed by the middleware) is held to a quota
(``max_entries_per_partition``, ``max_bytes_per_partition``: a tenth of the store by default), so
one principal cannot fill it for everyone; and a claim that does not fit raises
:class:`~idempo.StoreUnavailable` (``reason`` ``"store_full"`` or ``"partition_quota"``), which
the middleware answers 503 with ``Retry-After`` without running the handler.
"""

from __future__ import annotations

import operator
import os
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from idempo._idempo import (
    InlineMemory, InvalidArgument, MemoryStoreCore, StoreUnavailable, memory_partition,
)
from idempo._options import default
from idempo.stores._base import (
    PURGE_BATCH,
    ClaimResult,
    Claimed,
    Existing,
    PurgeCounts,
    StoredRecord,
    check_batch,
    check_key,
    check_ms,
    check_token,
)

__all__ = ["AsyncMemoryStore", "MemoryStore", "memory_partition"]


_PID = [os.getpid()]
"""This process's id, renewed in a forked child (``os.register_at_fork``): ``os.getpid()`` is a
system call, and every primitive checks it."""
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _record(scope_key: bytes, row: Tuple[Any, ...]) -> StoredRecord:
    fingerprint, state, token, generation, lease_until, expires_at, response = row
    return StoredRecord(
        scope_key=scope_key,
        fingerprint=fingerprint,
        state=state,
        token=token,
        generation=generation,
        lease_until=lease_until,
        expires_at=expires_at,
        response=response,
    )


DEFAULT_MAX_ENTRIES: int = default("memory_store", "max_entries")
"""Records a memory store keeps at most, by default (from core)."""
DEFAULT_MAX_BYTES: int = default("memory_store", "max_bytes")
"""Bytes a memory store keeps at most, by default (from core)."""


class MemoryStore:
    """A bounded in-memory store for one process (core's memory store).

    ``max_entries`` records and ``max_bytes`` bytes at most (160 per record plus its fingerprint
    and stored response); each partition at most ``max_entries_per_partition`` records and
    ``max_bytes_per_partition`` bytes (default: a tenth of the global limit, at least 1).
    ``allow_multiprocess=True`` is required to use it after a ``fork`` (gunicorn workers, a
    multiprocessing pool): separate processes hold separate stores, so duplicates on different
    workers would both run. ``clock`` returns milliseconds (default: the monotonic clock).
    """

    partitioned = True
    """Claims take a ``partition`` (:func:`memory_partition` of the principal); the middleware
    passes it."""

    blocking = False
    """Its primitives never wait on IO (one short lock around core's step): asyncio hosts call
    them on the event loop, without a worker thread."""

    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_entries_per_partition: Optional[int] = None,
        max_bytes_per_partition: Optional[int] = None,
        allow_multiprocess: bool = False,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        if max_entries <= 0 or max_bytes <= 0:
            raise InvalidArgument("max_entries and max_bytes must be positive")
        self._core = MemoryStoreCore(
            max_entries, max_bytes, max_entries_per_partition, max_bytes_per_partition
        )
        self._allow_multiprocess = allow_multiprocess
        self._clock = clock or _monotonic_ms
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._core)

    @property
    def bytes_used(self) -> int:
        """Bytes held (160 per record plus its fingerprint and stored response)."""
        return self._core.bytes_used

    @property
    def max_entries_per_partition(self) -> int:
        """The per-partition record quota in force."""
        return self._core.max_entries_per_partition

    def with_partition(self, partition: bytes) -> "MemoryStore":
        """This store with every ``claim`` made for ``partition`` (the middleware's view)."""
        return _PartitionView(self, partition)  # type: ignore[return-value]

    def _check_process(self) -> None:
        if not self._allow_multiprocess and os.getpid() != self._pid:
            err = StoreUnavailable(
                "MemoryStore used from a forked process: each worker would keep its own records "
                "and duplicates on different workers would both run; use SQLiteStore, "
                "PostgresStore or RedisStore, or pass allow_multiprocess=True"
            )
            err.retry_after = None
            raise err

    def _step(self) -> int:
        """Called holding the lock at the start of each primitive (one atomic step for threads):
        refuses a forked process (unless allowed) and gives the store's now."""
        if self._pid != _PID[0] and not self._allow_multiprocess:
            self._check_process()
        return self._clock()

    def claim(
        self,
        scope_key: bytes,
        fingerprint: str,
        token: bytes,
        lease_ms: int,
        ttl_ms: int,
        partition: Optional[bytes] = None,
    ) -> ClaimResult:
        """Primitive 1: insert-if-absent (an expired record counts as absent); ``partition`` is
        held to its quota. Raises :class:`~idempo.StoreUnavailable` when the record does not
        fit."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("lease_ms", lease_ms)
        check_ms("ttl_ms", ttl_ms)
        with self._lock:
            now = self._step()
            claimed, generation, row = self._core.claim(
                key, fingerprint, tok, lease_ms, ttl_ms, now, partition
            )
        if claimed:
            return Claimed(generation, now)
        if row is None:  # not reachable: core answers the live record with every refusal-free
            raise StoreUnavailable("the memory store answered neither a claim nor a record")
        return Existing(_record(key, row), now)

    def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: the record (expired ones included) and the store's now."""
        key = check_key(scope_key)
        with self._lock:
            now = self._step()
            row = self._core.get(key)
        return (None if row is None else _record(key, row)), now

    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3: take over an expired lease with a new token."""
        key = check_key(scope_key)
        seen = check_token(seen_token)
        new = check_token(new_token)
        check_ms("lease_ms", lease_ms)
        with self._lock:
            now = self._step()
            return self._core.takeover(key, seen, new, lease_ms, now)

    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4: an abandoned in-progress record becomes outcome-unknown."""
        key = check_key(scope_key)
        seen = check_token(seen_token)
        check_ms("ttl_ms", ttl_ms)
        with self._lock:
            now = self._step()
            return self._core.mark_unknown(key, seen, ttl_ms, now)

    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        """Primitive 5: store the response, only while still holding the token. Raises
        :class:`~idempo.StoreUnavailable` when the response does not fit."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("ttl_ms", ttl_ms)
        body = bytes(response)
        with self._lock:
            now = self._step()
            return self._core.complete(key, tok, body, ttl_ms, now)

    def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6: delete the caller's own in-progress record."""
        key = check_key(scope_key)
        tok = check_token(token)
        with self._lock:
            self._step()
            return self._core.release(key, tok)

    def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7: extend the caller's lease (heartbeat)."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("lease_ms", lease_ms)
        with self._lock:
            now = self._step()
            return self._core.renew(key, tok, lease_ms, now)

    def purge_expired(self, batch: int = PURGE_BATCH) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records (earliest expiry first), per state."""
        check_batch(batch)
        with self._lock:
            now = self._step()
            in_progress, completed, unknown = self._core.purge_expired(batch, now)
        return PurgeCounts(in_progress, completed, unknown)


class _PartitionView:
    """A store whose claims are made for one partition; everything else is the store's."""

    def __init__(self, store: Any, partition: bytes) -> None:
        self._store = store
        self._partition = partition

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @property
    def blocking(self) -> Any:
        """The store's (read by every asyncio request: found here, not after a failed lookup)."""
        return getattr(self._store, "blocking", True)

    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        return self._store.claim(  # type: ignore[no-any-return]
            scope_key, fingerprint, token, lease_ms, ttl_ms, partition=self._partition
        )

    # The primitives a request's flow calls after its claim, delegated directly (a lookup that
    # falls through to ``__getattr__`` costs a failed attribute search first).
    def get(self, *args: Any) -> Any:
        return self._store.get(*args)

    def complete(self, *args: Any) -> Any:
        return self._store.complete(*args)

    def release(self, *args: Any) -> Any:
        return self._store.release(*args)

    def renew(self, *args: Any) -> Any:
        return self._store.renew(*args)


class _AsyncPartitionView(_PartitionView):
    async def claim(  # type: ignore[override]
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        return self._store.sync.claim(  # type: ignore[no-any-return]
            scope_key, fingerprint, token, lease_ms, ttl_ms, partition=self._partition
        )


_OWN = ("claim", "get", "takeover", "mark_unknown", "complete", "release", "renew", "_step")
"""The methods whose behaviour the flow's inline calls reproduce (:func:`inline_memory`)."""
_OWN_METHODS = tuple(MemoryStore.__dict__[name] for name in _OWN)
_OWN_OF = operator.attrgetter(*_OWN)
"""The class's methods by those names, in one call (what :func:`inline_memory` compares)."""
_VIEW_OWN = tuple(name for name in _OWN if name in _PartitionView.__dict__)
_VIEW_METHODS = tuple(_PartitionView.__dict__[name] for name in _VIEW_OWN)
_VIEW_OF = operator.attrgetter(*_VIEW_OWN)
_VIEW_REST = tuple(name for name in _OWN if name not in _PartitionView.__dict__)
"""The primitives the view leaves to its store (through ``__getattr__``): none may be set on it."""


def inline_memory(store: Any) -> Optional[InlineMemory]:
    """The parts of ``store`` the flow's own calls run its claim, completion and release on
    (``ServerFlow.start(memory=...)``), or None: only for idempo's :class:`MemoryStore` itself
    (or its partition view) with none of its methods replaced, on the class or the instance (a
    subclass or a patched store goes through its methods, as every other store does)."""
    partition = None
    if type(store) is _PartitionView:
        if len(store.__dict__) != 2 or not _own_view():
            return None
        partition = store._partition
        store = store._store
    if type(store) is not MemoryStore or type(store._core) is not MemoryStoreCore:
        return None
    try:
        if _OWN_OF(MemoryStore) != _OWN_METHODS:
            return None  # a method replaced on the class (functions compare by identity)
    except AttributeError:
        return None  # a method deleted from the class
    if not store.__dict__.keys().isdisjoint(_OWN):
        return None  # a method replaced on the instance
    try:
        # The store itself too: its unreplaced ``_step``'s usual case is read without a call.
        return InlineMemory(store._core, store._lock, store._step, partition, store)
    except InvalidArgument:  # not a partition core takes: the claim refuses it as usual
        return None


_FAST = (*_OWN, "with_partition")
_FAST_METHODS = tuple(MemoryStore.__dict__[name] for name in _FAST)
_FAST_OF = operator.attrgetter(*_FAST)

PartitionMemories = Dict[bytes, Tuple[Any, InlineMemory, Any, Any]]
"""A host's remembered partition views of its memory store: ``(view, its InlineMemory, the
store's core, the store's lock)`` per partition (:func:`partition_memory`)."""

_MAX_PARTITIONS_CACHED = 1024


def partition_memory(
    store: Any, partition: bytes, cache: PartitionMemories
) -> Optional[Tuple[Any, InlineMemory, Any, Any]]:
    """What a request's flow makes of ``store`` for ``partition`` (``store.with_partition``,
    then :func:`inline_memory` of the view), remembered per partition in ``cache`` (a host's,
    for its one store), as ``(view, memory, core, lock)``; None: the flow makes them itself.
    Only for idempo's own :class:`MemoryStore` that does not block, with none of its methods
    (``with_partition`` included) nor its view's replaced, on the class or the instance, and the
    core and lock it was remembered with (what the ordinary path would make of it each time)."""
    try:
        if (
            type(store) is not MemoryStore
            or _FAST_OF(MemoryStore) != _FAST_METHODS
            or _VIEW_OF(_PartitionView) != _VIEW_METHODS
        ):
            return None
    except AttributeError:
        return None  # a method deleted from a class
    if (
        not store.__dict__.keys().isdisjoint(_FAST)
        or not _PartitionView.__dict__.keys().isdisjoint(_VIEW_REST)
        or store.blocking is not False
    ):
        return None
    found = cache.get(partition)
    if found is not None and found[2] is store._core and found[3] is store._lock:
        return found
    view = store.with_partition(partition)
    memory = inline_memory(view)
    if memory is None:
        return None
    if len(cache) >= _MAX_PARTITIONS_CACHED:
        cache.clear()
    found = cache[partition] = (view, memory, store._core, store._lock)
    return found


def _own_view() -> bool:
    """The partition view's own methods are its own (none replaced, none added on the class)."""
    try:
        if _VIEW_OF(_PartitionView) != _VIEW_METHODS:
            return False
    except AttributeError:
        return False
    return _PartitionView.__dict__.keys().isdisjoint(_VIEW_REST)


class AsyncMemoryStore:
    """The asyncio face of :class:`MemoryStore` (primitives never await inside their step)."""

    partitioned = True
    """As :attr:`MemoryStore.partitioned`."""

    def __init__(self, store: Optional[MemoryStore] = None, **kwargs: Any) -> None:
        self.sync = store if store is not None else MemoryStore(**kwargs)

    def with_partition(self, partition: bytes) -> "AsyncMemoryStore":
        """This store with every ``claim`` made for ``partition`` (the middleware's view)."""
        return _AsyncPartitionView(self, partition)  # type: ignore[return-value]

    async def claim(
        self,
        scope_key: bytes,
        fingerprint: str,
        token: bytes,
        lease_ms: int,
        ttl_ms: int,
        partition: Optional[bytes] = None,
    ) -> ClaimResult:
        return self.sync.claim(scope_key, fingerprint, token, lease_ms, ttl_ms, partition)

    async def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        return self.sync.get(scope_key)

    async def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        return self.sync.takeover(scope_key, seen_token, new_token, lease_ms)

    async def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        return self.sync.mark_unknown(scope_key, seen_token, ttl_ms)

    async def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        return self.sync.complete(scope_key, token, response, ttl_ms)

    async def release(self, scope_key: bytes, token: bytes) -> bool:
        return self.sync.release(scope_key, token)

    async def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        return self.sync.renew(scope_key, token, lease_ms)

    async def purge_expired(self, batch: int = PURGE_BATCH) -> PurgeCounts:
        return self.sync.purge_expired(batch)
