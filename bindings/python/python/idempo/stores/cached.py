"""Redis cache of *completed* records in front of PostgreSQL, for hot replays.

PostgreSQL stays the authority for every write. Only completed records are cached (never an
in-progress one), with their fingerprint and generation, so a different body still gets 422 and
never a replay. The cache entry lives ``min(cache_ttl_ms, expires_at - now)`` with both times from
PostgreSQL, so it never outlives the record (a longer one would replay a dead generation after a
new one was claimed). The cache is filled after the completion committed, and on reads that find
a completed record; a miss or any Redis error falls through to PostgreSQL and never fails the
request (``on_cache_error`` sees the error). ``clock`` replaces Redis ``TIME`` for cache reads
(conformance tests only; give the PostgreSQL store the same clock). Cache entries are hashes
under ``idempo:cache:<64 hex>`` with the record's field names, as the Node binding writes them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from idempo.stores._base import (
    COMPLETED,
    ClaimResult,
    Existing,
    PurgeCounts,
    StoredRecord,
    check_key,
)
from idempo.stores.postgres import AsyncPostgresStore, PostgresStore
from idempo.stores.redis import record_from_hash

try:
    import redis
    import redis.asyncio
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.cached needs redis-py: pip install redis") from exc

DEFAULT_CACHE_PREFIX = b"idempo:cache:"

# KEYS[1]; ARGV[1] clock override ('' = Redis TIME); returns {now, HGETALL}
LUA_CACHE_GET = """
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
return {now, redis.call('HGETALL', KEYS[1])}
"""

# KEYS[1]; ARGV fingerprint, state, token, generation, expires_at, response, px
LUA_CACHE_PUT = """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'state', ARGV[2], 'token', ARGV[3],
  'generation', ARGV[4], 'expires_at', ARGV[5], 'response', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
"""

ErrorHook = Callable[[BaseException], None]


def _ignore(_exc: BaseException) -> None:
    return None


def _put_args(record: StoredRecord, px: int) -> list[Any]:
    return [
        record.fingerprint,
        record.state,
        record.token,
        record.generation,
        record.expires_at,
        record.response or b"",
        px,
    ]


class CachedStore:
    """PostgreSQL (:class:`PostgresStore`) with a Redis cache of completed records (sync)."""

    def __init__(
        self,
        redis_url_or_client: Any,
        postgres: PostgresStore,
        *,
        cache_ttl_ms: int = 60_000,
        prefix: bytes = DEFAULT_CACHE_PREFIX,
        on_cache_error: ErrorHook = _ignore,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        if isinstance(redis_url_or_client, str):
            self.redis = redis.Redis.from_url(redis_url_or_client)
        else:
            self.redis = redis_url_or_client
        self.postgres = postgres
        self.cache_ttl_ms = cache_ttl_ms
        self.prefix = bytes(prefix)
        self.on_cache_error = on_cache_error
        self._get_script = self.redis.register_script(LUA_CACHE_GET)
        self._put_script = self.redis.register_script(LUA_CACHE_PUT)
        self._clock = clock
        self.hits = 0
        self.misses = 0

    def _key(self, scope_key: bytes) -> bytes:
        return self.prefix + scope_key.hex().encode("ascii")

    def _cached(self, scope_key: bytes) -> Optional[Tuple[StoredRecord, int]]:
        try:
            override = "" if self._clock is None else str(self._clock())
            reply = self._get_script(keys=[self._key(scope_key)], args=[override])
            record = record_from_hash(scope_key, reply[1])
        except (redis.RedisError, KeyError, ValueError) as exc:
            self.on_cache_error(exc)
            return None
        now = int(reply[0])
        # Never answer from the cache past the record's expiry, whatever the two clocks say.
        if record is None or record.state != COMPLETED or record.expires_at <= now:
            self.misses += 1
            return None
        self.hits += 1
        return record, now

    def _fill(self, record: StoredRecord, now_ms: int) -> None:
        px = min(self.cache_ttl_ms, record.expires_at - now_ms)
        if record.state != COMPLETED or px <= 0:
            return
        try:
            self._put_script(keys=[self._key(record.scope_key)], args=_put_args(record, px))
        except redis.RedisError as exc:
            self.on_cache_error(exc)

    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """Primitive 1: a cached completed record answers at once; else PostgreSQL claims."""
        key = check_key(scope_key)
        hit = self._cached(key)
        if hit is not None:
            return Existing(hit[0], hit[1])
        result = self.postgres.claim(key, fingerprint, token, lease_ms, ttl_ms)
        if isinstance(result, Existing):
            self._fill(result.record, result.now_ms)
        return result

    def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: from the cache when completed there, else from PostgreSQL."""
        key = check_key(scope_key)
        hit = self._cached(key)
        if hit is not None:
            return hit
        record, now = self.postgres.get(key)
        if record is not None:
            self._fill(record, now)
        return record, now

    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3, on PostgreSQL (in-progress records are never cached)."""
        return self.postgres.takeover(scope_key, seen_token, new_token, lease_ms)

    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4, on PostgreSQL."""
        return self.postgres.mark_unknown(scope_key, seen_token, ttl_ms)

    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        """Primitive 5 on PostgreSQL, then the cache is filled with the committed record."""
        row = self.postgres.complete_returning(scope_key, token, response, ttl_ms)
        if row is None:
            return False
        self._fill(
            StoredRecord(
                scope_key=bytes(scope_key),
                fingerprint=row.fingerprint,
                state=COMPLETED,
                token=bytes(token),
                generation=row.generation,
                lease_until=None,
                expires_at=row.expires_at,
                response=bytes(response),
            ),
            row.now_ms,
        )
        return True

    def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6, on PostgreSQL."""
        return self.postgres.release(scope_key, token)

    def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7, on PostgreSQL."""
        return self.postgres.renew(scope_key, token, lease_ms)

    def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8, on PostgreSQL (cache entries expire no later than their records)."""
        return self.postgres.purge_expired(batch)


class AsyncCachedStore:
    """The asyncio form of :class:`CachedStore` (``redis.asyncio`` + :class:`AsyncPostgresStore`)."""

    def __init__(
        self,
        redis_url_or_client: Any,
        postgres: AsyncPostgresStore,
        *,
        cache_ttl_ms: int = 60_000,
        prefix: bytes = DEFAULT_CACHE_PREFIX,
        on_cache_error: ErrorHook = _ignore,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        if isinstance(redis_url_or_client, str):
            self.redis = redis.asyncio.Redis.from_url(redis_url_or_client)
        else:
            self.redis = redis_url_or_client
        self.postgres = postgres
        self.cache_ttl_ms = cache_ttl_ms
        self.prefix = bytes(prefix)
        self.on_cache_error = on_cache_error
        self._get_script = self.redis.register_script(LUA_CACHE_GET)
        self._put_script = self.redis.register_script(LUA_CACHE_PUT)
        self._clock = clock
        self.hits = 0
        self.misses = 0

    def _key(self, scope_key: bytes) -> bytes:
        return self.prefix + scope_key.hex().encode("ascii")

    async def _cached(self, scope_key: bytes) -> Optional[Tuple[StoredRecord, int]]:
        try:
            override = "" if self._clock is None else str(self._clock())
            reply = await self._get_script(keys=[self._key(scope_key)], args=[override])
            record = record_from_hash(scope_key, reply[1])
        except (redis.RedisError, KeyError, ValueError) as exc:
            self.on_cache_error(exc)
            return None
        now = int(reply[0])
        # Never answer from the cache past the record's expiry, whatever the two clocks say.
        if record is None or record.state != COMPLETED or record.expires_at <= now:
            self.misses += 1
            return None
        self.hits += 1
        return record, now

    async def _fill(self, record: StoredRecord, now_ms: int) -> None:
        px = min(self.cache_ttl_ms, record.expires_at - now_ms)
        if record.state != COMPLETED or px <= 0:
            return
        try:
            await self._put_script(
                keys=[self._key(record.scope_key)], args=_put_args(record, px)
            )
        except redis.RedisError as exc:
            self.on_cache_error(exc)

    async def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """Primitive 1: a cached completed record answers at once; else PostgreSQL claims."""
        key = check_key(scope_key)
        hit = await self._cached(key)
        if hit is not None:
            return Existing(hit[0], hit[1])
        result = await self.postgres.claim(key, fingerprint, token, lease_ms, ttl_ms)
        if isinstance(result, Existing):
            await self._fill(result.record, result.now_ms)
        return result

    async def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: from the cache when completed there, else from PostgreSQL."""
        key = check_key(scope_key)
        hit = await self._cached(key)
        if hit is not None:
            return hit
        record, now = await self.postgres.get(key)
        if record is not None:
            await self._fill(record, now)
        return record, now

    async def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3, on PostgreSQL."""
        return await self.postgres.takeover(scope_key, seen_token, new_token, lease_ms)

    async def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4, on PostgreSQL."""
        return await self.postgres.mark_unknown(scope_key, seen_token, ttl_ms)

    async def complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> bool:
        """Primitive 5 on PostgreSQL, then the cache is filled with the committed record."""
        row = await self.postgres.complete_returning(scope_key, token, response, ttl_ms)
        if row is None:
            return False
        await self._fill(
            StoredRecord(
                scope_key=bytes(scope_key),
                fingerprint=row.fingerprint,
                state=COMPLETED,
                token=bytes(token),
                generation=row.generation,
                lease_until=None,
                expires_at=row.expires_at,
                response=bytes(response),
            ),
            row.now_ms,
        )
        return True

    async def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6, on PostgreSQL."""
        return await self.postgres.release(scope_key, token)

    async def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7, on PostgreSQL."""
        return await self.postgres.renew(scope_key, token, lease_ms)

    async def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8, on PostgreSQL."""
        return await self.postgres.purge_expired(batch)
