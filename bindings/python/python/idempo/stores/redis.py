"""Redis store (redis-py): Lua scripts make each primitive one atomic step, timed by Redis ``TIME``.

A record is a hash under ``prefix + hex(scope_key)`` (default prefix ``idempo:``) with the
contract's column names as fields (``fingerprint``, ``state``, ``token``, ``generation``,
``lease_until``, ``expires_at``, ``response``), exactly as ``spec/STORAGE.md`` §5, so Python and
Node services share records. The key's own expiry is the record's retention
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

DEFAULT_PREFIX = b"idempo:"

# The last ARGV of every script is the clock override ('' = Redis TIME), spec/STORAGE.md §6.
_PRELUDE = """
local function clock()
  local o = ARGV[#ARGV]
  if o ~= '' then return tonumber(o) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%d', n) end
"""

# ARGV fingerprint, token, lease_ms, ttl_ms, grace_ms, now_override
LUA_CLAIM = _PRELUDE + """
local now = clock()
local lease, ttl, grace = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cur = redis.call('HMGET', KEYS[1], 'expires_at', 'generation')
local gen = 1
if cur[1] then
  if tonumber(cur[1]) > now then
    return {0, int(now), redis.call('HGETALL', KEYS[1])}
  end
  gen = math.min(tonumber(cur[2]) + 1, 2147483647)
  redis.call('DEL', KEYS[1])
end
local exp = now + math.max(ttl, lease)
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'state', '1', 'token', ARGV[2],
           'generation', int(gen), 'lease_until', int(now + lease), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + grace))
return {1, int(now), int(gen)}
"""

# ARGV now_override
LUA_GET = _PRELUDE + "return {int(clock()), redis.call('HGETALL', KEYS[1])}\n"

# ARGV seen_token, new_token, lease_ms, grace_ms, now_override
LUA_TAKEOVER = _PRELUDE + """
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'expires_at', 'generation')
if r[1] ~= '1' or r[2] ~= ARGV[1] or tonumber(r[3]) > now then return false end
local lease_until = now + tonumber(ARGV[3])
local exp = math.max(tonumber(r[4]), lease_until)
redis.call('HSET', KEYS[1], 'token', ARGV[2], 'lease_until', int(lease_until), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + tonumber(ARGV[4])))
return r[5]
"""

# ARGV seen_token, ttl_ms, grace_ms, now_override
LUA_MARK_UNKNOWN = _PRELUDE + """
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until')
if r[1] ~= '1' or r[2] ~= ARGV[1] or tonumber(r[3]) > now then return 0 end
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'state', '3', 'expires_at', int(exp))
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('PEXPIRE', KEYS[1], int(exp - now + tonumber(ARGV[3])))
return 1
"""

# ARGV token, response, ttl_ms, grace_ms, now_override
LUA_COMPLETE = _PRELUDE + """
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
local exp = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'state', '2', 'response', ARGV[2], 'expires_at', int(exp))
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('PEXPIRE', KEYS[1], int(exp - now + tonumber(ARGV[4])))
return 1
"""

# ARGV token, now_override (unused)
LUA_RELEASE = """
local r = redis.call('HMGET', KEYS[1], 'state', 'token')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# ARGV token, lease_ms, grace_ms, now_override
LUA_RENEW = _PRELUDE + """
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'expires_at')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
local lease_until = now + tonumber(ARGV[2])
local exp = math.max(tonumber(r[3]), lease_until)
redis.call('HSET', KEYS[1], 'lease_until', int(lease_until), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + tonumber(ARGV[3])))
return 1
"""

# ARGV now_override: delete the record if expired; returns its state or 0
LUA_PURGE_ONE = _PRELUDE + """
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'expires_at')
if r[1] and r[2] and tonumber(r[2]) <= now then
  redis.call('DEL', KEYS[1])
  return tonumber(r[1])
end
return 0
"""

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
    lease = h.get(b"lease_until")
    return StoredRecord(
        scope_key=scope_key,
        fingerprint=h[b"fingerprint"].decode("ascii"),
        state=int(h[b"state"]),
        token=h[b"token"],
        generation=int(h[b"generation"]),
        lease_until=None if lease is None else int(lease),
        expires_at=int(h[b"expires_at"]),
        response=h.get(b"response"),
    )


def _is_record_key(key: bytes, prefix: bytes) -> bool:
    """True for ``prefix + 64 hex`` (not, e.g., a cache entry under ``idempo:cache:``)."""
    rest = key[len(prefix):]
    return len(rest) == 64 and all(c in b"0123456789abcdef" for c in rest)


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
        return self.prefix + check_key(scope_key).hex().encode("ascii")

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
        return None if reply is None else int(reply)

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
        return int(reply) == 1

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
        return int(reply) == 1

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
        return int(reply) == 1

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
            if not _is_record_key(key, self.prefix):
                continue
            exp = self.client.hget(key, "expires_at")
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
        return self.prefix + check_key(scope_key).hex().encode("ascii")

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
        return None if reply is None else int(reply)

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
        return int(reply) == 1

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
        return int(reply) == 1

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
        return int(reply) == 1

    @fail_closed_async(_errors, "Redis purge_expired failed")
    async def purge_expired(self, batch: int = 1000) -> PurgeCounts:
        """Primitive 8: delete up to ``batch`` expired records, earliest expiry first (SCAN)."""
        check_batch(batch)
        candidates: List[Tuple[int, bytes]] = []
        async for key in self.client.scan_iter(match=self.prefix + b"*", count=1000):
            if not _is_record_key(key, self.prefix):
                continue
            exp = await self.client.hget(key, "expires_at")
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
