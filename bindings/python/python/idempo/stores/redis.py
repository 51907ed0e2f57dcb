"""Redis store (redis-py): Lua scripts make each primitive one atomic step, timed by Redis ``TIME``.

A record is a hash under ``prefix + hex(scope_key)`` (default prefix ``idempo:``) with the
contract's column names as fields (``fingerprint``, ``state``, ``token``, ``generation``,
``lease_until``, ``expires_at``, ``response``), exactly as ``spec/STORAGE.md`` §5, so Python and
Node services share records. The key's own expiry is the record's retention
``expires_at`` plus ``grace_ms`` (never the lease: a key that vanished with its lease would let the
next request run again without any takeover decision); within the grace an expired record still
counts as absent and is replaced with ``generation + 1``, as in every other store. Scripts touch
one key each (Cluster-safe) and run by ``EVALSHA`` with an ``EVAL`` fallback on ``NOSCRIPT``; they
are core's (``idempo_core::recipes``, ``spec/STORAGE.md`` §5.2), shared with the Node binding.

Redis must run with ``maxmemory-policy noeviction`` (``volatile-*`` policies evict exactly these
keys): the store checks ``CONFIG GET`` on first use and refuses otherwise, unless
``allow_eviction=True``; where ``CONFIG`` is disabled, pass ``assume_noeviction=True`` after
checking it yourself. ``clock`` replaces Redis ``TIME`` (conformance tests only). Redis alone (asynchronous replication, ``appendfsync everysec``) is not the
authority for money; use PostgreSQL there, with :class:`~idempo.stores.CachedStore` for hot replays.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Type, Union

from idempo._idempo import InvalidArgument
from idempo.stores._base import (
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
from idempo.stores._plan import AsyncPrimitives, Plan, PlanHooks, Primitives
from idempo.stores._recipes import PRIMITIVES, family

try:
    import redis
    import redis.asyncio
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.redis needs redis-py: pip install redis") from exc

DEFAULT_PREFIX = b"idempo:"

# The scripts of spec/STORAGE.md §5.2 (and the optional purge of one record), from core, where
# each one's ARGV is documented. KEYS[1] is the record; the last ARGV of every script is the clock
# override ('' = Redis TIME, spec/STORAGE.md §6).
_SCRIPTS = family("redis", (*PRIMITIVES, "purge_one"))

SPEC_GRACE_MS = 60_000
"""The grace the scripts carry (``PEXPIRE`` to ``expires_at - now + 60000``, §5.1)."""
_GRACE_TEXT = f"int(exp - now + {SPEC_GRACE_MS}))"

_errors: Tuple[Type[BaseException], ...] = (redis.RedisError,)


def _scripts(grace_ms: int) -> Dict[str, str]:
    """The scripts with the store's ``grace_ms`` in place of the spec's 60000."""
    if grace_ms == SPEC_GRACE_MS:
        return dict(_SCRIPTS)
    return {
        name: src.replace(_GRACE_TEXT, f"int(exp - now + {grace_ms}))")
        for name, src in _SCRIPTS.items()
    }


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


class _Call(NamedTuple):
    """Run one of the store's scripts on one key."""

    script: str
    key: bytes
    args: Tuple[Any, ...] = ()


class _Scan(NamedTuple):
    """All keys matching ``match`` (``SCAN``)."""

    match: bytes


class _HGet(NamedTuple):
    """One field of a hash."""

    key: bytes
    field: str


_Op = Union[_Call, _Scan, _HGet]


def _then(op: _Op, decode: Callable[[Any], Any]) -> "Plan[_Op, Any]":
    reply = yield op
    return decode(reply)


def _claim_reply(scope_key: bytes, reply: Any) -> ClaimResult:
    if int(reply[0]) == 1:
        return Claimed(int(reply[2]), int(reply[1]))
    record = record_from_hash(scope_key, reply[2])
    assert record is not None
    return Existing(record, int(reply[1]))


def _applied(reply: Any) -> bool:
    return int(reply) == 1


class _Plans(PlanHooks):
    """The Redis plans behind :class:`RedisStore` and :class:`AsyncRedisStore`."""

    _errors = _errors
    _what = "Redis"

    _from_url: Callable[[str], Any]

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
        """A URL (the store creates and owns a client) or a redis-py client of the store's
        kind; ``grace_ms`` replaces the spec's 60000 ms of physical expiry after the logical
        one; ``clock`` replaces Redis ``TIME`` (conformance tests only)."""
        owned = isinstance(url_or_client, str)
        client = self._from_url(url_or_client) if owned else url_or_client
        self.client = client
        self._owned = owned
        _check_client(client)
        self.prefix = bytes(prefix)
        self.grace_ms = check_ms("grace_ms", grace_ms)
        self._policy = _PolicyCheck(allow_eviction, assume_noeviction)
        self._clock = clock
        self._scripts = {
            name: client.register_script(src) for name, src in _scripts(self.grace_ms).items()
        }

    def _key(self, scope_key: bytes) -> bytes:
        return self.prefix + check_key(scope_key).hex().encode("ascii")

    def _override(self) -> str:
        return "" if self._clock is None else str(self._clock())

    def _plan_claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> "Plan[_Op, ClaimResult]":
        args = (
            fingerprint,
            check_token(token),
            check_ms("lease_ms", lease_ms),
            check_ms("ttl_ms", ttl_ms),
        )
        call = _Call("claim", self._key(scope_key), args)
        return _then(call, lambda reply: _claim_reply(bytes(scope_key), reply))

    def _plan_get(self, scope_key: bytes) -> "Plan[_Op, Tuple[Optional[StoredRecord], int]]":
        call = _Call("get", self._key(scope_key))
        return _then(call, lambda r: (record_from_hash(bytes(scope_key), r[1]), int(r[0])))

    def _plan_takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> "Plan[_Op, Optional[int]]":
        args = (check_token(seen_token), check_token(new_token), check_ms("lease_ms", lease_ms))
        call = _Call("takeover", self._key(scope_key), args)
        return _then(call, lambda reply: None if reply is None else int(reply))

    def _plan_mark_unknown(
        self, scope_key: bytes, seen_token: bytes, ttl_ms: int
    ) -> "Plan[_Op, bool]":
        args = (check_token(seen_token), check_ms("ttl_ms", ttl_ms))
        return _then(_Call("mark_unknown", self._key(scope_key), args), _applied)

    def _plan_complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int
    ) -> "Plan[_Op, bool]":
        args = (check_token(token), bytes(response), check_ms("ttl_ms", ttl_ms))
        return _then(_Call("complete", self._key(scope_key), args), _applied)

    def _plan_release(self, scope_key: bytes, token: bytes) -> "Plan[_Op, bool]":
        return _then(_Call("release", self._key(scope_key), (check_token(token),)), _applied)

    def _plan_renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> "Plan[_Op, bool]":
        args = (check_token(token), check_ms("lease_ms", lease_ms))
        return _then(_Call("renew", self._key(scope_key), args), _applied)

    def _plan_purge_expired(self, batch: int) -> "Plan[_Op, PurgeCounts]":
        """Redis keeps no expiry index, so this ``SCAN``s the prefix (O(records)); each deletion
        is re-checked atomically by a script. Redis also drops each key by itself ``grace_ms``
        after its expiry, so running this only frees memory sooner and reports counts."""
        check_batch(batch)
        return self._purge_steps(batch)

    def _purge_steps(self, batch: int) -> "Plan[_Op, PurgeCounts]":
        keys = yield _Scan(self.prefix + b"*")
        candidates: List[Tuple[int, bytes]] = []
        for key in keys:
            if not _is_record_key(key, self.prefix):
                continue
            exp = yield _HGet(key, "expires_at")
            if exp is not None:
                candidates.append((int(exp), key))
        candidates.sort()
        states: List[int] = []
        for _exp, key in candidates:
            if len(states) >= batch:
                break
            state = int((yield _Call("purge_one", key)))
            if state:
                states.append(state)
        return PurgeCounts.from_states(states)


class RedisStore(_Plans, Primitives):
    """The storage contract on Redis (redis-py, sync)."""

    _from_url = staticmethod(redis.Redis.from_url)

    def _op(self, op: _Op) -> Any:
        if isinstance(op, _Scan):
            return list(self.client.scan_iter(match=op.match, count=1000))
        if isinstance(op, _HGet):
            return self.client.hget(op.key, op.field)
        if not self._policy.done:
            self._policy.verify(self.client.config_get("maxmemory-policy"))
        return self._scripts[op.script](keys=[op.key], args=[*op.args, self._override()])

    def close(self) -> None:
        """Closes the client if this store created it."""
        if self._owned:
            self.client.close()


class AsyncRedisStore(_Plans, AsyncPrimitives):
    """The storage contract on Redis with ``redis.asyncio``."""

    _from_url = staticmethod(redis.asyncio.Redis.from_url)

    async def _op(self, op: _Op) -> Any:
        if isinstance(op, _Scan):
            return [key async for key in self.client.scan_iter(match=op.match, count=1000)]
        if isinstance(op, _HGet):
            return await self.client.hget(op.key, op.field)
        if not self._policy.done:
            self._policy.verify(await self.client.config_get("maxmemory-policy"))
        return await self._scripts[op.script](keys=[op.key], args=[*op.args, self._override()])

    async def close(self) -> None:
        """Closes the client if this store created it."""
        if self._owned:
            await self.client.aclose()
