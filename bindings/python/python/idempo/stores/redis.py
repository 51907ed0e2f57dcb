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
keys): the store checks ``CONFIG GET`` on first use (on every primary of a cluster, again whenever
the cluster's set of primaries changes) and refuses otherwise, unless ``allow_eviction=True``;
where ``CONFIG`` is disabled, pass ``assume_noeviction=True`` after checking it yourself. Call
:meth:`RedisStore.check` at startup to have a misconfiguration refused before the first request.

Redis Cluster is supported by design (``spec/STORAGE.md`` §5.3): pass a
``redis.cluster.RedisCluster`` (``redis.asyncio.cluster.RedisCluster``) client, or a URL of any
node with ``cluster=True``. Every script touches the one key of its record, so a record lives in
one slot and records spread over the slots by their scope key. A single-node client or URL pointed
at a cluster node is refused with :class:`~idempo.InvalidArgument` naming the fix (it would get
``MOVED`` for about two thirds of the keys). ``clock`` replaces Redis ``TIME`` (conformance tests only). Redis alone (asynchronous replication, ``appendfsync everysec``) is not the
authority for money; use PostgreSQL there, with :class:`~idempo.stores.CachedStore` for hot replays.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

from idempo._idempo import (
    InvalidArgument,
    redis_cluster_node_refusal,
    redis_config_get_refusal,
    redis_hash_row,
    redis_policy_refusal,
)
from idempo._options import default
from idempo.stores._base import (
    ClaimResult,
    Claimed,
    Existing,
    PurgeCounts,
    StoredRecord,
    StoreStats,
    check_batch,
    check_key,
    check_ms,
    check_token,
)
from idempo.stores._primitives import AsyncPrimitives, Plan, PlanHooks, Primitives
from idempo.stores._recipes import PRIMITIVES, family

try:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster
except ImportError as exc:  # pragma: no cover - import guard for the optional dependency
    raise ImportError("idempo.stores.redis needs redis-py: pip install redis") from exc

DEFAULT_PREFIX: bytes = default("redis_store", "prefix").encode()

# The scripts of spec/STORAGE.md §5.2 (and the optional purge of one record), from core, where
# each one's ARGV is documented. KEYS[1] is the record; the last ARGV of every script is the clock
# override ('' = Redis TIME, spec/STORAGE.md §6).
_SCRIPTS = family("redis", (*PRIMITIVES, "purge_one"))

SPEC_GRACE_MS: int = default("redis_store", "grace_ms")
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
    """A :class:`StoredRecord` from an ``HGETALL`` reply (flat field/value list), decoded by core
    (:class:`RecordCorrupt` for a hash that lacks a field or holds a number that is not one)."""
    row = redis_hash_row(list(flat))
    if row is None:
        return None
    fingerprint, state, token, generation, lease, expires_at, response = row
    return StoredRecord(
        scope_key=scope_key,
        fingerprint=fingerprint,
        state=state,
        token=token,
        generation=generation,
        lease_until=lease,
        expires_at=expires_at,
        response=response,
    )


def _is_record_key(key: bytes, prefix: bytes) -> bool:
    """True for ``prefix + 64 hex`` (not, e.g., a cache entry under ``idempo:cache:``)."""
    rest = key[len(prefix):]
    return len(rest) == 64 and all(c in b"0123456789abcdef" for c in rest)


_CLUSTER_TYPES: Tuple[type, ...] = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)


def _is_cluster(client: Any) -> bool:
    return isinstance(client, _CLUSTER_TYPES)


def _decodes_responses(client: Any) -> bool:
    """True when the client decodes replies to ``str`` (any client type: single node, cluster,
    sync or asyncio)."""
    get_encoder = getattr(client, "get_encoder", None)
    if callable(get_encoder):
        try:
            return bool(getattr(get_encoder(), "decode_responses", False))
        except Exception:  # noqa: BLE001 - fall back to the pool's options
            pass
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return bool(kwargs.get("decode_responses"))


def _check_client(client: Any) -> None:
    if _decodes_responses(client):
        raise InvalidArgument(
            "the Redis client must use decode_responses=False: records hold binary tokens and "
            "responses (create the client without decode_responses, or pass a URL)"
        )


def _policy(reply: Any) -> Optional[str]:
    """``maxmemory-policy`` from one node's ``CONFIG GET`` reply."""
    policy = reply.get(b"maxmemory-policy") or reply.get("maxmemory-policy")
    if isinstance(policy, bytes):
        policy = policy.decode()
    return None if policy is None else str(policy)


def _node_policies(reply: Any) -> Dict[str, Optional[str]]:
    """Per node, from a cluster's ``CONFIG GET`` sent to every primary (redis-py answers a dict
    keyed by node name, or the plain reply when one node answered)."""
    if reply and all(isinstance(v, dict) for v in reply.values()):
        return {str(node): _policy(r) for node, r in reply.items()}
    return {"the cluster": _policy(reply)}


def _refuse_policies(policies: Dict[str, Optional[str]]) -> None:
    """Raises core's refusal when a node's policy is not ``noeviction``."""
    refusal = redis_policy_refusal(list(policies.items()))
    if refusal is not None:
        raise InvalidArgument(refusal)


def _config_refused(exc: redis.ResponseError) -> Optional[InvalidArgument]:
    """The configuration error for a refused ``CONFIG GET`` (an unknown command or an ACL
    denial, as core tells them apart), or None for any other error (a store error)."""
    text = str(exc)
    if isinstance(exc, redis.exceptions.NoPermissionError) and "NOPERM" not in text:
        text = f"NOPERM {text}"
    refusal = redis_config_get_refusal(text)
    return None if refusal is None else InvalidArgument(refusal)


@contextmanager
def _config_refusal() -> Iterator[None]:
    """Around one ``CONFIG GET`` (sync or awaited inside): a refused command becomes the
    configuration error that names the fix; any other error passes as it is (a store error)."""
    try:
        yield
    except redis.ResponseError as exc:
        refused = _config_refused(exc)
        if refused is not None:
            raise refused from exc
        raise


def _refuse_cluster_node(info: Any) -> None:
    """Refuses a single-node client whose server is a cluster node (``INFO cluster``)."""
    refusal = redis_cluster_node_refusal(int(info.get("cluster_enabled", 0) or 0) == 1)
    if refusal is not None:
        raise InvalidArgument(refusal)


def _primaries(client: Any) -> FrozenSet[str]:
    return frozenset(str(n.name) for n in client.get_primaries())


class _ServerCheck:
    """The start-up checks of the server (or of every cluster primary): not a cluster node behind
    a single-node client, and ``noeviction``. Cluster checks run again whenever the client's set
    of primaries changes (a failover or a resharding that added a node)."""

    def __init__(self, allow_eviction: bool, assume_noeviction: bool) -> None:
        self.check_policy = not (allow_eviction or assume_noeviction)
        self.checked: Optional[FrozenSet[str]] = None

    def due(self, client: Any) -> bool:
        if self.checked is None:
            return True
        return _is_cluster(client) and _primaries(client) != self.checked

    def run(self, client: Any) -> None:
        if _is_cluster(client):
            nodes = _primaries(client)
            if self.check_policy:
                target = redis.cluster.RedisCluster.PRIMARIES
                with _config_refusal():
                    reply = client.config_get("maxmemory-policy", target_nodes=target)
                _refuse_policies(_node_policies(reply))
            self.checked = nodes
            return
        try:
            info = client.info("cluster")
        except redis.ResponseError:
            info = {}  # INFO disabled: nothing to learn
        _refuse_cluster_node(info)
        if self.check_policy:
            with _config_refusal():
                reply = client.config_get("maxmemory-policy")
            _refuse_policies({"the server": _policy(reply)})
        self.checked = frozenset()

    async def run_async(self, client: Any) -> None:
        if _is_cluster(client):
            nodes = _primaries(client)
            if self.check_policy:
                target = redis.asyncio.cluster.RedisCluster.PRIMARIES
                with _config_refusal():
                    reply = await client.config_get("maxmemory-policy", target_nodes=target)
                _refuse_policies(_node_policies(reply))
            self.checked = nodes
            return
        try:
            info = await client.info("cluster")
        except redis.ResponseError:
            info = {}
        _refuse_cluster_node(info)
        if self.check_policy:
            with _config_refusal():
                reply = await client.config_get("maxmemory-policy")
            _refuse_policies({"the server": _policy(reply)})
        self.checked = frozenset()


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


class _Time(NamedTuple):
    """The server's clock in unix ms (``TIME``, or the override)."""


_Op = Union[_Call, _Scan, _HGet, _Time]


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
    _cluster_from_url: Callable[[str], Any]

    def __init__(
        self,
        url_or_client: Any,
        *,
        prefix: bytes = DEFAULT_PREFIX,
        grace_ms: int = SPEC_GRACE_MS,
        allow_eviction: bool = False,
        assume_noeviction: bool = False,
        cluster: bool = False,
        clock: Optional[Callable[[], int]] = None,
    ) -> None:
        """A URL (the store creates and owns a client; ``cluster=True`` makes it a Redis Cluster
        client seeded by that node) or a redis-py client of the store's kind, single-node or
        cluster; ``grace_ms`` replaces the spec's 60000 ms of physical expiry after the logical
        one; ``clock`` replaces Redis ``TIME`` (conformance tests only)."""
        if not isinstance(cluster, bool):
            raise InvalidArgument("cluster must be True or False")
        owned = isinstance(url_or_client, str)
        if owned:
            make = self._cluster_from_url if cluster else self._from_url
            client = make(url_or_client)
        else:
            client = url_or_client
            if cluster and not _is_cluster(client):
                raise InvalidArgument(
                    "cluster=True needs a URL or a redis.cluster.RedisCluster client, not "
                    f"{type(client).__name__}"
                )
        self.client = client
        self._owned = owned
        _check_client(client)
        self.cluster = _is_cluster(client)
        self.prefix = bytes(prefix)
        self.grace_ms = check_ms("grace_ms", grace_ms)
        self._check = _ServerCheck(allow_eviction, assume_noeviction)
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

    def _plan_stats(self) -> "Plan[_Op, StoreStats]":
        """``SCAN`` of the prefix and two fields per record (O(records)); Redis keeps no size
        per prefix, so ``size_bytes`` is None."""
        now = yield _Time()
        keys = yield _Scan(self.prefix + b"*")
        records: List[Tuple[int, int]] = []
        for key in keys:
            if not _is_record_key(key, self.prefix):
                continue
            state = yield _HGet(key, "state")
            exp = yield _HGet(key, "expires_at")
            if state is not None and exp is not None:
                records.append((int(state), int(exp)))
        return _stats_from(int(now), records)


def _stats_from(now: int, records: "List[Tuple[int, int]]") -> StoreStats:
    """Stats from (state, expires_at) of every record at ``now`` (a hash within its grace after
    expiry still counts as expired)."""
    expired = [exp for _state, exp in records if exp <= now]
    return StoreStats(
        in_progress=sum(1 for st, _ in records if st == 1),
        completed=sum(1 for st, _ in records if st == 2),
        outcome_unknown=sum(1 for st, _ in records if st == 3),
        expired=len(expired),
        purge_lag_ms=(now - min(expired)) if expired else None,
        size_bytes=None,
        now_ms=now,
    )


def _time_ms(reply: Any) -> int:
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


class RedisStore(_Plans, Primitives):
    """The storage contract on Redis (redis-py, sync)."""

    _from_url = staticmethod(redis.Redis.from_url)
    _cluster_from_url = staticmethod(redis.cluster.RedisCluster.from_url)

    _check_lock = threading.Lock()

    def check(self) -> None:
        """Runs the server checks now (call it at startup): raises
        :class:`~idempo.InvalidArgument` for a policy other than ``noeviction`` on any node, or a
        single-node client pointed at a cluster node."""
        self._check.run(self.client)

    def stats(self) -> StoreStats:
        """The keyspace's figures for metrics (``spec/STORAGE.md`` §4.7), by ``SCAN``."""
        return self._drive("stats", self._plan_stats())

    def _op(self, op: _Op) -> Any:
        if isinstance(op, _Time):
            return self._clock() if self._clock is not None else _time_ms(self.client.time())
        if isinstance(op, _Scan):
            return list(self.client.scan_iter(match=op.match, count=1000))
        if isinstance(op, _HGet):
            return self.client.hget(op.key, op.field)
        if self._check.due(self.client):
            with self._check_lock:  # one check at a time, not one per waiting thread
                if self._check.due(self.client):
                    self._check.run(self.client)
        return self._scripts[op.script](keys=[op.key], args=[*op.args, self._override()])

    def close(self) -> None:
        """Closes the client if this store created it."""
        if self._owned:
            self.client.close()


class AsyncRedisStore(_Plans, AsyncPrimitives):
    """The storage contract on Redis with ``redis.asyncio``."""

    _from_url = staticmethod(redis.asyncio.Redis.from_url)
    _cluster_from_url = staticmethod(redis.asyncio.cluster.RedisCluster.from_url)

    async def check(self) -> None:
        """As :meth:`RedisStore.check`."""
        await self._check.run_async(self.client)

    async def stats(self) -> StoreStats:
        """As :meth:`RedisStore.stats`."""
        return await self._drive("stats", self._plan_stats())

    async def _op(self, op: _Op) -> Any:
        if isinstance(op, _Time):
            if self._clock is not None:
                return self._clock()
            return _time_ms(await self.client.time())
        if isinstance(op, _Scan):
            return [key async for key in self.client.scan_iter(match=op.match, count=1000)]
        if isinstance(op, _HGet):
            return await self.client.hget(op.key, op.field)
        if self._check.due(self.client):
            await self._check.run_async(self.client)
        return await self._scripts[op.script](keys=[op.key], args=[*op.args, self._override()])

    async def close(self) -> None:
        """Closes the client if this store created it."""
        if self._owned:
            await self.client.aclose()
