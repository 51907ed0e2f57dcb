"""Redis cache of *completed* records in front of PostgreSQL, for hot replays.

PostgreSQL stays the authority for every write. Only completed records are cached (never an
in-progress one), with their fingerprint and generation, so a different body still gets 422 and
never a replay. Both rules are core's (``idempo_core::machine::cache``): a cached entry is served
only when completed and unexpired on the cache's clock, and a fill lives ``min(cache_ttl_ms,
expires_at - now)`` with both times from PostgreSQL, less the time elapsed (host monotonic clock)
from when that read was sent to when the cache ``SET`` is sent, and no ``SET`` is sent when
nothing is left (``spec/STORAGE.md`` §9): it never outlives the record (a longer one, or a delayed fill, would replay a dead generation after
a new one was claimed). The cache is filled after the completion committed, and on reads that find
a completed record; a miss or any Redis error falls through to PostgreSQL and never fails the
request (``on_cache_error`` sees the error). ``clock`` replaces Redis ``TIME`` for cache reads
(conformance tests only; give the PostgreSQL store the same clock). Cache entries are hashes
under ``idempo:cache:<64 hex>`` with the record's field names, as the Node binding writes them;
the two scripts are core's (``idempo_core::recipes``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, List, NamedTuple, Optional, Tuple, Union

from idempo._idempo import cache_fill_px, cache_servable
from idempo._options import default
from idempo.stores._base import (
    COMPLETED,
    ClaimResult,
    Existing,
    PurgeCounts,
    StoredRecord,
    StoreStats,
    check_key,
)
from idempo.stores._primitives import AsyncPrimitives, Plan, PlanHooks, Primitives
from idempo.stores._recipes import recipe
from idempo.stores.postgres import AsyncPostgresStore, CompletedRow, PostgresStore
from idempo.stores.redis import record_from_hash

try:
    import redis
    import redis.asyncio
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.cached needs redis-py: pip install redis") from exc

DEFAULT_CACHE_PREFIX: bytes = default("cached_store", "prefix").encode()

LUA_CACHE_GET = recipe("redis_cache_get")
"""KEYS[1] the entry; ARGV[1] clock override ('' = Redis TIME); returns {now, HGETALL}."""
LUA_CACHE_PUT = recipe("redis_cache_put")
"""KEYS[1] the entry; ARGV fingerprint, state, token, generation, expires_at, response, px."""

ErrorHook = Callable[[BaseException], None]


def _ignore(_exc: BaseException) -> None:
    return None


def _put_args(record: StoredRecord) -> List[Any]:
    """``LUA_CACHE_PUT``'s arguments but the last (``px``, computed when the ``SET`` is sent)."""
    return [
        record.fingerprint,
        record.state,
        record.token,
        record.generation,
        record.expires_at,
        record.response or b"",
    ]


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


class _CacheGet(NamedTuple):
    """Read the cache entry of a scope key (with the cache's clock)."""

    scope_key: bytes


class _CachePut(NamedTuple):
    """Write a cache entry (``LUA_CACHE_PUT``) of a record read at ``now_ms`` by a request sent
    at ``asked``: the PX is core's (:func:`~idempo._idempo.cache_fill_px`) when the ``SET`` is
    sent."""

    scope_key: bytes
    args: List[Any]
    """The script's arguments but ``px``."""
    state: int
    expires_at: int
    now_ms: int
    """The authority's time of the read."""
    asked: float
    """Host monotonic ms at which the read was sent."""


class _Authority(NamedTuple):
    """Call a method of the PostgreSQL store."""

    method: str
    args: Tuple[Any, ...]


_Op = Union[_CacheGet, _CachePut, _Authority]


def _authority(method: str, *args: Any) -> "Plan[_Op, Any]":
    result = yield _Authority(method, args)
    return result


def _completed(scope_key: bytes, token: bytes, response: bytes, row: CompletedRow) -> StoredRecord:
    return StoredRecord(
        scope_key=bytes(scope_key),
        fingerprint=row.fingerprint,
        state=COMPLETED,
        token=bytes(token),
        generation=row.generation,
        lease_until=None,
        expires_at=row.expires_at,
        response=bytes(response),
    )


class _Plans(PlanHooks):
    """The cache-aside plans behind :class:`CachedStore` and :class:`AsyncCachedStore`. Writes
    go to PostgreSQL (in-progress records are never cached); cache errors never fail a request."""

    _what = "cached"

    _from_url: Callable[[str], Any]

    def __init__(
        self,
        redis_url_or_client: Any,
        postgres: Any,
        *,
        cache_ttl_ms: int = default("cached_store", "cache_ttl_ms"),
        prefix: bytes = DEFAULT_CACHE_PREFIX,
        on_cache_error: ErrorHook = _ignore,
        clock: Optional[Callable[[], int]] = None,
        monotonic: Callable[[], float] = _monotonic_ms,
    ) -> None:
        """A Redis URL or client (of the store's kind) and the PostgreSQL store (sync or async
        to match); ``clock`` replaces Redis ``TIME`` for cache reads (conformance tests only);
        ``monotonic`` is the host's monotonic clock in ms that times a fill (tests only)."""
        client = (
            self._from_url(redis_url_or_client)
            if isinstance(redis_url_or_client, str)
            else redis_url_or_client
        )
        self.redis = client
        self.postgres = postgres
        self.cache_ttl_ms = cache_ttl_ms
        self.prefix = bytes(prefix)
        self.on_cache_error = on_cache_error
        self._get_script = client.register_script(LUA_CACHE_GET)
        self._put_script = client.register_script(LUA_CACHE_PUT)
        self._clock = clock
        self._monotonic = monotonic
        self.hits = 0
        self.misses = 0

    def _key(self, scope_key: bytes) -> bytes:
        return self.prefix + scope_key.hex().encode("ascii")

    def _override(self) -> str:
        return "" if self._clock is None else str(self._clock())

    def _cached(self, scope_key: bytes) -> "Plan[_Op, Optional[Tuple[StoredRecord, int]]]":
        try:
            reply = yield _CacheGet(scope_key)
            record = record_from_hash(scope_key, reply[1])
        except (redis.RedisError, KeyError, ValueError) as exc:
            self.on_cache_error(exc)
            return None
        now = int(reply[0])
        # Core's serve rule: only a completed record, unexpired on the cache's clock.
        if record is None or not cache_servable(record.state, record.expires_at, now):
            self.misses += 1
            return None
        self.hits += 1
        return record, now

    def _fill(self, record: StoredRecord, now_ms: int, asked: float) -> "Plan[_Op, None]":
        """Caches a completed record read at ``now_ms`` (the authority's clock) by a request
        sent at ``asked`` (host monotonic ms), for core's PX (``spec/STORAGE.md`` §9)."""
        if cache_fill_px(record.state, record.expires_at, self.cache_ttl_ms, now_ms, 0) is None:
            return
        try:
            yield _CachePut(
                record.scope_key, _put_args(record), record.state, record.expires_at, now_ms, asked
            )
        except redis.RedisError as exc:
            self.on_cache_error(exc)

    def _put_px(self, op: _CachePut) -> Optional[List[Any]]:
        """The put's arguments with core's PX now: ``min(cache_ttl, expires_at - now)`` less the
        time since the read was sent, rounded up (None: nothing is left, skip the ``SET``)."""
        elapsed = max(0, math.ceil(self._monotonic() - op.asked))
        px = cache_fill_px(op.state, op.expires_at, self.cache_ttl_ms, op.now_ms, elapsed)
        if px is None:
            return None
        return [*op.args, px]

    def _plan_claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> "Plan[_Op, ClaimResult]":
        """A cached completed record answers at once; else PostgreSQL claims."""
        return self._claim_steps(check_key(scope_key), fingerprint, token, lease_ms, ttl_ms)

    def _claim_steps(
        self, key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> "Plan[_Op, ClaimResult]":
        hit = yield from self._cached(key)
        if hit is not None:
            return Existing(hit[0], hit[1])
        asked = self._monotonic()
        result = yield _Authority("claim", (key, fingerprint, token, lease_ms, ttl_ms))
        if isinstance(result, Existing):
            yield from self._fill(result.record, result.now_ms, asked)
        return result

    def _plan_get(self, scope_key: bytes) -> "Plan[_Op, Tuple[Optional[StoredRecord], int]]":
        """From the cache when completed there, else from PostgreSQL."""
        return self._get_steps(check_key(scope_key))

    def _get_steps(self, key: bytes) -> "Plan[_Op, Tuple[Optional[StoredRecord], int]]":
        hit = yield from self._cached(key)
        if hit is not None:
            return hit
        asked = self._monotonic()
        record, now = yield _Authority("get", (key,))
        if record is not None:
            yield from self._fill(record, now, asked)
        return record, now

    def _plan_takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> "Plan[_Op, Optional[int]]":
        return _authority("takeover", scope_key, seen_token, new_token, lease_ms)

    def _plan_mark_unknown(
        self, scope_key: bytes, seen_token: bytes, ttl_ms: int
    ) -> "Plan[_Op, bool]":
        return _authority("mark_unknown", scope_key, seen_token, ttl_ms)

    def _plan_complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> "Plan[_Op, bool]":
        """On PostgreSQL, then the cache is filled with the committed record."""
        asked = self._monotonic()
        row = yield _Authority("complete_returning", (scope_key, token, response, ttl_ms))
        if row is None:
            return False
        yield from self._fill(_completed(scope_key, token, response, row), row.now_ms, asked)
        return True

    def _plan_release(self, scope_key: bytes, token: bytes) -> "Plan[_Op, bool]":
        return _authority("release", scope_key, token)

    def _plan_renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> "Plan[_Op, bool]":
        return _authority("renew", scope_key, token, lease_ms)

    def _plan_purge_expired(self, batch: int) -> "Plan[_Op, PurgeCounts]":
        """On PostgreSQL (cache entries expire no later than their records)."""
        return _authority("purge_expired", batch)


class CachedStore(_Plans, Primitives):
    """PostgreSQL (:class:`PostgresStore`) with a Redis cache of completed records (sync)."""

    _from_url = staticmethod(redis.Redis.from_url)
    postgres: PostgresStore

    def stats(self) -> "StoreStats":
        """The authority's figures (cache entries expire no later than their records)."""
        return self.postgres.stats()

    def _op(self, op: _Op) -> Any:
        if isinstance(op, _Authority):
            return getattr(self.postgres, op.method)(*op.args)
        if isinstance(op, _CacheGet):
            return self._get_script(keys=[self._key(op.scope_key)], args=[self._override()])
        args = self._put_px(op)
        if args is None:
            return None
        return self._put_script(keys=[self._key(op.scope_key)], args=args)


class AsyncCachedStore(_Plans, AsyncPrimitives):
    """The asyncio form of :class:`CachedStore` (``redis.asyncio`` + :class:`AsyncPostgresStore`)."""

    _from_url = staticmethod(redis.asyncio.Redis.from_url)
    postgres: AsyncPostgresStore

    async def stats(self) -> "StoreStats":
        """As :meth:`CachedStore.stats`."""
        return await self.postgres.stats()

    async def _op(self, op: _Op) -> Any:
        if isinstance(op, _Authority):
            return await getattr(self.postgres, op.method)(*op.args)
        if isinstance(op, _CacheGet):
            key = self._key(op.scope_key)
            return await self._get_script(keys=[key], args=[self._override()])
        args = self._put_px(op)
        if args is None:
            return None
        return await self._put_script(keys=[self._key(op.scope_key)], args=args)
