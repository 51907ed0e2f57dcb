"""Redis store (redis-py): Lua scripts make each primitive one atomic step, timed by Redis ``TIME``.

A record is a hash under ``prefix + scope_key`` with the contract's fields (``fp``, ``st``,
``tok``, ``gen``, ``lease``, ``exp``, ``resp``). The key's own expiry is the record's retention
``expires_at`` plus ``grace_ms`` (never the lease: a key that vanished with its lease would let the
next request run again without any takeover decision); within the grace an expired record still
counts as absent and is replaced with ``generation + 1``, as in every other store. Scripts touch
one key each (Cluster-safe) and run by ``EVALSHA`` with an ``EVAL`` fallback on ``NOSCRIPT``.

Redis must run with ``maxmemory-policy noeviction`` (``volatile-*`` policies evict exactly these
keys): the store checks ``CONFIG GET`` on first use and refuses otherwise, unless
``allow_eviction=True``; where ``CONFIG`` is disabled, pass ``assume_noeviction=True`` after
checking it yourself. ``clock`` replaces Redis ``TIME`` (conformance tests only). Redis alone (asynchronous replication, ``appendfsync everysec``) is not the
authority for money; use PostgreSQL there, with :class:`~idempo.stores.CachedStore` for hot replays.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from idempo._idempo import InvalidArgument
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
    fail_closed,
    fail_closed_async,
)

try:
    import redis
    import redis.asyncio
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.redis needs redis-py: pip install redis") from exc

DEFAULT_PREFIX = b"idempo:r:"

# The last ARGV of every script is a clock override for conformance tests ('' = Redis TIME).
_NOW = """
local now
if ARGV[#ARGV] ~= '' then
  now = tonumber(ARGV[#ARGV])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS[1] record; ARGV fp, token, lease_ms, ttl_ms, grace_ms
LUA_CLAIM = (
    _NOW
    + f"""
local lease = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local cur = redis.call('HMGET', KEYS[1], 'exp', 'gen')
local gen = 1
if cur[1] then
  if tonumber(cur[1]) > now then
    return {{0, now, redis.call('HGETALL', KEYS[1])}}
  end
  gen = math.min(tonumber(cur[2]) + 1, 2147483647)
  redis.call('DEL', KEYS[1])
end
local exp = now + math.max(ttl, lease)
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'st', {IN_PROGRESS}, 'tok', ARGV[2], 'gen', gen,
  'lease', now + lease, 'exp', exp)
redis.call('PEXPIREAT', KEYS[1], exp + tonumber(ARGV[5]))
return {{1, now, gen}}
"""
)

LUA_GET = _NOW + "return {now, redis.call('HGETALL', KEYS[1])}\n"

# KEYS[1]; ARGV seen, new, lease_ms, grace_ms
LUA_TAKEOVER = (
    _NOW
    + f"""
local r = redis.call('HMGET', KEYS[1], 'st', 'tok', 'lease', 'exp', 'gen')
if r[1] ~= '{IN_PROGRESS}' or r[2] ~= ARGV[1] or tonumber(r[3]) > now then return {{0, now}} end
local untl = now + tonumber(ARGV[3])
local exp = math.max(tonumber(r[4]), untl)
redis.call('HSET', KEYS[1], 'tok', ARGV[2], 'lease', untl, 'exp', exp)
redis.call('PEXPIREAT', KEYS[1], exp + tonumber(ARGV[4]))
return {{1, now, tonumber(r[5])}}
"""
)

# KEYS[1]; ARGV seen, ttl_ms, grace_ms
LUA_MARK_UNKNOWN = (
    _NOW
    + f"""
local r = redis.call('HMGET', KEYS[1], 'st', 'tok', 'lease')
if r[1] ~= '{IN_PROGRESS}' or r[2] ~= ARGV[1] or tonumber(r[3]) > now then return {{0, now}} end
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'st', {OUTCOME_UNKNOWN}, 'exp', exp)
redis.call('HDEL', KEYS[1], 'lease')
redis.call('PEXPIREAT', KEYS[1], exp + tonumber(ARGV[3]))
return {{1, now}}
"""
)

# KEYS[1]; ARGV token, response, ttl_ms, grace_ms
LUA_COMPLETE = (
    _NOW
    + f"""
local r = redis.call('HMGET', KEYS[1], 'st', 'tok')
if r[1] ~= '{IN_PROGRESS}' or r[2] ~= ARGV[1] then return {{0, now}} end
local exp = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'st', {COMPLETED}, 'resp', ARGV[2], 'exp', exp)
redis.call('HDEL', KEYS[1], 'lease')
redis.call('PEXPIREAT', KEYS[1], exp + tonumber(ARGV[4]))
return {{1, now}}
"""
)

# KEYS[1]; ARGV token
LUA_RELEASE = f"""
local r = redis.call('HMGET', KEYS[1], 'st', 'tok')
if r[1] ~= '{IN_PROGRESS}' or r[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS[1]; ARGV token, lease_ms, grace_ms
LUA_RENEW = (
    _NOW
    + f"""
local r = redis.call('HMGET', KEYS[1], 'st', 'tok', 'exp')
if r[1] ~= '{IN_PROGRESS}' or r[2] ~= ARGV[1] then return {{0, now}} end
local untl = now + tonumber(ARGV[2])
local exp = math.max(tonumber(r[3]), untl)
redis.call('HSET', KEYS[1], 'lease', untl, 'exp', exp)
redis.call('PEXPIREAT', KEYS[1], exp + tonumber(ARGV[3]))
return {{1, now}}
"""
)

# KEYS[1]: delete if expired; returns the deleted state or 0
LUA_PURGE_ONE = (
    _NOW
    + """
local r = redis.call('HMGET', KEYS[1], 'st', 'exp')
if r[1] and tonumber(r[2]) <= now then
  redis.call('DEL', KEYS[1])
  return tonumber(r[1])
end
return 0
"""
)

_SCRIPTS = {
    "claim": LUA_CLAIM,
    "get": LUA_GET,
    "takeover": LUA_TAKEOVER,
    "mark_unknown": LUA_MARK_UNKNOWN,
    "complete": LUA_COMPLETE,
    "release": LUA_RELEASE,
    "renew": LUA_RENEW,
    "purge_one": LUA_PURGE_ONE,
}

_errors = (redis.RedisError,)


def record_from_hash(scope_key: bytes, flat: Sequence[bytes]) -> Optional[StoredRecord]:
    """A :class:`StoredRecord` from an ``HGETALL`` reply (flat field/value list)."""
    if not flat:
        return None
    h: Dict[bytes, bytes] = {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
    lease = h.get(b"lease")
    return StoredRecord(
        scope_key=scope_key,
        fingerprint=h[b"fp"].decode("ascii"),
        state=int(h[b"st"]),
        token=h[b"tok"],
        generation=int(h[b"gen"]),
        lease_until=None if lease is None else int(lease),
        expires_at=int(h[b"exp"]),
        response=h.get(b"resp"),
    )


def _check_client(client: Any) -> None:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if kwargs.get("decode_responses"):
        raise InvalidArgument("the Redis client must use decode_responses=False (binary keys)")


class _PolicyCheck:
    def __init__(self, allow_eviction: bool, assume_noeviction: bool) -> None:
        self.allow_eviction = allow_eviction
        self.assume_noeviction = assume_noeviction
        self.done = allow_eviction or assume_noeviction

    def verify(self, reply: Any) -> None:
        policy = reply.get(b"maxmemory-policy") or reply.get("maxmemory-policy")
        if isinstance(policy, bytes):
            policy = policy.decode()
        if policy != "noeviction":
            raise InvalidArgument(
                f"Redis maxmemory-policy is {policy!r}: idempo needs 'noeviction' (an evicted "
                "claim is a double execution); fix the server or pass allow_eviction=True"
            )
        self.done = True


class RedisStore:
    """The storage contract on Redis (redis-py, sync)."""

    def __init__(
        self,
        url_or_client: Any,
        *,
        prefix: bytes = DEFAULT_PREFIX,
        grace_ms: int = 60_000,
        allow_eviction: bool = False,
        assume_noeviction: bool = False,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        if isinstance(url_or_client, str):
            self.client = redis.Redis.from_url(url_or_client)
            self._owned = True
        else:
            self.client = url_or_client
            self._owned = False
        _check_client(self.client)
        self.prefix = bytes(prefix)
        self.grace_ms = check_ms("grace_ms", grace_ms)
        self._policy = _PolicyCheck(allow_eviction, assume_noeviction)
        self._clock = clock
        self._scripts = {name: self.client.register_script(src) for name, src in _SCRIPTS.items()}

    def _key(self, scope_key: bytes) -> bytes:
        return self.prefix + check_key(scope_key)

    def _run(self, name: str, key: bytes, *args: Any) -> Any:
        if not self._policy.done:
            self._policy.verify(self.client.config_get("maxmemory-policy"))
        override = "" if self._clock is None else str(self._clock())
        return self._scripts[name](keys=[key], args=[*args, override])

    def close(self) -> None:
        """Closes the client if this store created it."""
        if self._owned:
            self.client.close()

    @fail_closed(_errors, "Redis claim failed")
    def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """Primitive 1: insert-if-absent (an expired record counts as absent)."""
        key = self._key(scope_key)
        reply = self._run(
            "claim",
            key,
            fingerprint,
            check_token(token),
            check_ms("lease_ms", lease_ms),
            check_ms("ttl_ms", ttl_ms),
            self.grace_ms,
        )
        if int(reply[0]) == 1:
            return Claimed(int(reply[2]), int(reply[1]))
        record = record_from_hash(bytes(scope_key), reply[2])
        assert record is not None
        return Existing(record, int(reply[1]))

    @fail_closed(_errors, "Redis get failed")
    def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: the record (expired ones within the grace included) and Redis' now."""
        reply = self._run("get", self._key(scope_key))
        return record_from_hash(bytes(scope_key), reply[1]), int(reply[0])

    @fail_closed(_errors, "Redis takeover failed")
    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3: take over an expired lease with a new token."""
        reply = self._run(
            "takeover",
            self._key(scope_key),
            check_token(seen_token),
            check_token(new_token),
            check_ms("lease_ms", lease_ms),
            self.grace_ms,
        )
        return int(reply[2]) if int(reply[0]) == 1 else None

    @fail_closed(_errors, "Redis mark_unknown failed")
    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4: an abandoned in-progress record becomes outcome-unknown."""
        reply = self._run(
            "mark_unknown",
            self._key(scope_key),
            check_token(seen_token),
            check_ms("ttl_ms", ttl_ms),
            self.grace_ms,
        )
        return int(reply[0]) == 1

    @fail_closed(_errors, "Redis complete failed")
    def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> bool:
        """Primitive 5: store the response, only while still holding the token."""
        reply = self._run(
            "complete",
            self._key(scope_key),
            check_token(token),
            bytes(response),
            check_ms("ttl_ms", ttl_ms),
            self.grace_ms,
        )
        return int(reply[0]) == 1

    @fail_closed(_errors, "Redis release failed")
    def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6: delete the caller's own in-progress record."""
        return int(self._run("release", self._key(scope_key), check_token(token))) == 1

    @fail_closed(_errors, "Redis renew failed")
    def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7: extend the caller's lease (heartbeat)."""
        reply = self._run(
            "renew",
            self._key(scope_key),
            check_token(token),
            check_ms("lease_ms", lease_ms),
            self.grace_ms,
        )
        return int(reply[0]) == 1

    @fail_closed(_errors, "Redis purge_expired failed")
    def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records, earliest expiry first.

        Redis keeps no expiry index, so this ``SCAN``s the prefix (O(records)); each deletion is
        re-checked atomically by a script. Redis also drops each key by itself ``grace_ms``
        after its expiry, so running this only frees memory sooner and reports counts.
        """
        check_batch(batch)
        candidates: List[Tuple[int, bytes]] = []
        for key in self.client.scan_iter(match=self.prefix + b"*", count=1000):
            exp = self.client.hget(key, "exp")
            if exp is not None:
                candidates.append((int(exp), key))
        candidates.sort()
        states: List[int] = []
        for _exp, key in candidates:
            if len(states) >= batch:
                break
            state = int(self._run("purge_one", key))
            if state:
                states.append(state)
        return PurgeCounts.from_states(states)


class AsyncRedisStore:
    """The storage contract on Redis with ``redis.asyncio``."""

    def __init__(
        self,
        url_or_client: Any,
        *,
        prefix: bytes = DEFAULT_PREFIX,
        grace_ms: int = 60_000,
        allow_eviction: bool = False,
        assume_noeviction: bool = False,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        if isinstance(url_or_client, str):
            self.client = redis.asyncio.Redis.from_url(url_or_client)
            self._owned = True
        else:
            self.client = url_or_client
            self._owned = False
        _check_client(self.client)
        self.prefix = bytes(prefix)
        self.grace_ms = check_ms("grace_ms", grace_ms)
        self._policy = _PolicyCheck(allow_eviction, assume_noeviction)
        self._clock = clock
        self._scripts = {name: self.client.register_script(src) for name, src in _SCRIPTS.items()}

    def _key(self, scope_key: bytes) -> bytes:
        return self.prefix + check_key(scope_key)

    async def _run(self, name: str, key: bytes, *args: Any) -> Any:
        if not self._policy.done:
            self._policy.verify(await self.client.config_get("maxmemory-policy"))
        override = "" if self._clock is None else str(self._clock())
        return await self._scripts[name](keys=[key], args=[*args, override])

    async def close(self) -> None:
        """Closes the client if this store created it."""
        if self._owned:
            await self.client.aclose()

    @fail_closed_async(_errors, "Redis claim failed")
    async def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> ClaimResult:
        """Primitive 1: insert-if-absent (an expired record counts as absent)."""
        key = self._key(scope_key)
        reply = await self._run(
            "claim",
            key,
            fingerprint,
            check_token(token),
            check_ms("lease_ms", lease_ms),
            check_ms("ttl_ms", ttl_ms),
            self.grace_ms,
        )
        if int(reply[0]) == 1:
            return Claimed(int(reply[2]), int(reply[1]))
        record = record_from_hash(bytes(scope_key), reply[2])
        assert record is not None
        return Existing(record, int(reply[1]))

    @fail_closed_async(_errors, "Redis get failed")
    async def get(self, scope_key: bytes) -> Tuple[Optional[StoredRecord], int]:
        """Primitive 2: the record and Redis' now."""
        reply = await self._run("get", self._key(scope_key))
        return record_from_hash(bytes(scope_key), reply[1]), int(reply[0])

    @fail_closed_async(_errors, "Redis takeover failed")
    async def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Optional[int]:
        """Primitive 3: take over an expired lease with a new token."""
        reply = await self._run(
            "takeover",
            self._key(scope_key),
            check_token(seen_token),
            check_token(new_token),
            check_ms("lease_ms", lease_ms),
            self.grace_ms,
        )
        return int(reply[2]) if int(reply[0]) == 1 else None

    @fail_closed_async(_errors, "Redis mark_unknown failed")
    async def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> bool:
        """Primitive 4: an abandoned in-progress record becomes outcome-unknown."""
        reply = await self._run(
            "mark_unknown",
            self._key(scope_key),
            check_token(seen_token),
            check_ms("ttl_ms", ttl_ms),
            self.grace_ms,
        )
        return int(reply[0]) == 1

    @fail_closed_async(_errors, "Redis complete failed")
    async def complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> bool:
        """Primitive 5: store the response, only while still holding the token."""
        reply = await self._run(
            "complete",
            self._key(scope_key),
            check_token(token),
            bytes(response),
            check_ms("ttl_ms", ttl_ms),
            self.grace_ms,
        )
        return int(reply[0]) == 1

    @fail_closed_async(_errors, "Redis release failed")
    async def release(self, scope_key: bytes, token: bytes) -> bool:
        """Primitive 6: delete the caller's own in-progress record."""
        return int(await self._run("release", self._key(scope_key), check_token(token))) == 1

    @fail_closed_async(_errors, "Redis renew failed")
    async def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> bool:
        """Primitive 7: extend the caller's lease (heartbeat)."""
        reply = await self._run(
            "renew",
            self._key(scope_key),
            check_token(token),
            check_ms("lease_ms", lease_ms),
            self.grace_ms,
        )
        return int(reply[0]) == 1

    @fail_closed_async(_errors, "Redis purge_expired failed")
    async def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records, earliest expiry first (SCAN)."""
        check_batch(batch)
        candidates: List[Tuple[int, bytes]] = []
        async for key in self.client.scan_iter(match=self.prefix + b"*", count=1000):
            exp = await self.client.hget(key, "exp")
            if exp is not None:
                candidates.append((int(exp), key))
        candidates.sort()
        states: List[int] = []
        for _exp, key in candidates:
            if len(states) >= batch:
                break
            state = int(await self._run("purge_one", key))
            if state:
                states.append(state)
        return PurgeCounts.from_states(states)
