"""In-process store: tests, demos and single-process services only.

Records live in a dict keyed by the 32-byte scope key (Python's per-process randomized hashing, so
clients cannot steer buckets). A lock makes every primitive one atomic step for threads; the async
wrapper never awaits inside a primitive. The store is bounded by entries and bytes: it evicts
expired records first, then *completed* records with the earliest expiry (``evicted_live``), and
never an in-progress or outcome-unknown record (losing a claim would be a double execution); when
nothing can be evicted a new claim fails closed with :class:`~idempo.StoreUnavailable`.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from idempo._idempo import InvalidArgument, StoreUnavailable
from idempo.stores._base import (
    COMPLETED,
    IN_PROGRESS,
    OUTCOME_UNKNOWN,
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

_RECORD_OVERHEAD = 160


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _size(record: StoredRecord) -> int:
    return _RECORD_OVERHEAD + len(record.fingerprint) + len(record.response or b"")


class MemoryStore:
    """A bounded in-memory store for one process.

    ``allow_multiprocess=True`` is required to use it after a ``fork`` (gunicorn workers, a
    multiprocessing pool): separate processes hold separate dicts, so duplicates on different
    workers would both run. ``clock`` returns milliseconds (default: the monotonic clock).
    """

    def __init__(
        self,
        *,
        max_entries: int = 100_000,
        max_bytes: int = 64 * 1024 * 1024,
        allow_multiprocess: bool = False,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        if max_entries <= 0 or max_bytes <= 0:
            raise InvalidArgument("max_entries and max_bytes must be positive")
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._allow_multiprocess = allow_multiprocess
        self._clock = clock or _monotonic_ms
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._records: Dict[bytes, StoredRecord] = {}
        self._bytes = 0
        # (expires_at, seq, scope_key); stale entries are skipped when popped.
        self._heap: List[Tuple[int, int, bytes]] = []
        self._seq = 0
        self.evicted_live = 0
        """Completed records evicted before their expiry to make room (shortened retention)."""

    def __len__(self) -> int:
        return len(self._records)

    def _check_process(self) -> None:
        if not self._allow_multiprocess and os.getpid() != self._pid:
            err = StoreUnavailable(
                "MemoryStore used from a forked process: each worker would keep its own records "
                "and duplicates on different workers would both run; use SQLiteStore, "
                "PostgresStore or RedisStore, or pass allow_multiprocess=True"
            )
            err.retry_after = None
            raise err

    @contextmanager
    def _atomic(self) -> Iterator[int]:
        """One primitive's atomic step: holds the lock, refuses a forked process (unless allowed)
        and gives the store's now."""
        with self._lock:
            self._check_process()
            yield self._clock()

    def _put(self, record: StoredRecord) -> None:
        old = self._records.get(record.scope_key)
        if old is not None:
            self._bytes -= _size(old)
        self._records[record.scope_key] = record
        self._bytes += _size(record)
        self._seq += 1
        heapq.heappush(self._heap, (record.expires_at, self._seq, record.scope_key))

    def _delete(self, scope_key: bytes) -> StoredRecord:
        record = self._records.pop(scope_key)
        self._bytes -= _size(record)
        return record

    def _make_room(self, now: int, incoming: int) -> None:
        """Evicts expired, then completed records (earliest expiry first) until one more fits."""
        kept: List[Tuple[int, int, bytes]] = []

        def full() -> bool:
            return (
                len(self._records) + 1 > self._max_entries
                or self._bytes + incoming > self._max_bytes
            )

        while full() and self._heap:
            expires_at, seq, key = heapq.heappop(self._heap)
            record = self._records.get(key)
            if record is None or record.expires_at != expires_at:
                continue  # stale heap entry
            if expires_at <= now:
                self._delete(key)
            elif record.state == COMPLETED:
                self._delete(key)
                self.evicted_live += 1
            else:
                kept.append((expires_at, seq, key))
        for entry in kept:
            heapq.heappush(self._heap, entry)
        if full():
            err = StoreUnavailable(
                "MemoryStore is full of in-progress and outcome-unknown records"
            )
            err.retry_after = 1.0
            raise err

    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """Primitive 1: insert-if-absent (an expired record counts as absent)."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("lease_ms", lease_ms)
        check_ms("ttl_ms", ttl_ms)
        with self._atomic() as now:
            current = self._records.get(key)
            if current is not None and current.expires_at > now:
                return Existing(current, now)
            generation = 1 if current is None else min(current.generation + 1, 2**31 - 1)
            record = StoredRecord(
                scope_key=key,
                fingerprint=fingerprint,
                state=IN_PROGRESS,
                token=tok,
                generation=generation,
                lease_until=now + lease_ms,
                expires_at=now + max(ttl_ms, lease_ms),
                response=None,
            )
            if current is not None:
                self._delete(key)
            self._make_room(now, _size(record))
            self._put(record)
            return Claimed(generation, now)

    def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: the record (expired ones included) and the store's now."""
        key = check_key(scope_key)
        with self._atomic() as now:
            return self._records.get(key), now

    def _owned(self, key: bytes, token: bytes) -> Optional[StoredRecord]:
        """The in-progress record ``token`` holds, if any."""
        record = self._records.get(key)
        if record is None or record.state != IN_PROGRESS or record.token != token:
            return None
        return record

    def _lapsed(self, key: bytes, token: bytes, now: int) -> Optional[StoredRecord]:
        """The in-progress record ``token`` holds, if its lease has run out by ``now``."""
        record = self._owned(key, token)
        if record is None or record.lease_until is None or record.lease_until > now:
            return None
        return record

    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3: take over an expired lease with a new token."""
        key = check_key(scope_key)
        seen = check_token(seen_token)
        new = check_token(new_token)
        check_ms("lease_ms", lease_ms)
        with self._atomic() as now:
            record = self._lapsed(key, seen, now)
            if record is None:
                return None
            until = now + lease_ms
            self._put(
                replace(
                    record,
                    token=new,
                    lease_until=until,
                    expires_at=max(record.expires_at, until),
                )
            )
            return record.generation

    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4: an abandoned in-progress record becomes outcome-unknown."""
        key = check_key(scope_key)
        seen = check_token(seen_token)
        check_ms("ttl_ms", ttl_ms)
        with self._atomic() as now:
            record = self._lapsed(key, seen, now)
            if record is None:
                return False
            self._put(
                replace(record, state=OUTCOME_UNKNOWN, lease_until=None, expires_at=now + ttl_ms)
            )
            return True

    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        """Primitive 5: store the response, only while still holding the token."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("ttl_ms", ttl_ms)
        body = bytes(response)
        with self._atomic() as now:
            record = self._owned(key, tok)
            if record is None:
                return False
            self._put(
                replace(
                    record,
                    state=COMPLETED,
                    response=body,
                    lease_until=None,
                    expires_at=now + ttl_ms,
                )
            )
            return True

    def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6: delete the caller's own in-progress record."""
        key = check_key(scope_key)
        tok = check_token(token)
        with self._atomic():
            if self._owned(key, tok) is None:
                return False
            self._delete(key)
            return True

    def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7: extend the caller's lease (heartbeat)."""
        key = check_key(scope_key)
        tok = check_token(token)
        check_ms("lease_ms", lease_ms)
        with self._atomic() as now:
            record = self._owned(key, tok)
            if record is None:
                return False
            until = now + lease_ms
            self._put(replace(record, lease_until=until, expires_at=max(record.expires_at, until)))
            return True

    def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records (earliest expiry first), per state."""
        check_batch(batch)
        states: List[int] = []
        with self._atomic() as now:
            while self._heap and len(states) < batch and self._heap[0][0] <= now:
                expires_at, _seq, key = heapq.heappop(self._heap)
                record = self._records.get(key)
                if record is None or record.expires_at != expires_at:
                    continue
                states.append(self._delete(key).state)
        return PurgeCounts.from_states(states)


class AsyncMemoryStore:
    """The asyncio face of :class:`MemoryStore` (primitives never await inside their step)."""

    def __init__(self, store: Optional[MemoryStore] = None, **kwargs: Any) -> None:
        self.sync = store if store is not None else MemoryStore(**kwargs)

    async def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        return self.sync.claim(scope_key, fingerprint, token, lease_ms, ttl_ms)

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

    async def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        return self.sync.purge_expired(batch)
