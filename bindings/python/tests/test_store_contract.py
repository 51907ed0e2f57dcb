"""The storage contract (spec/STORAGE.md), run against every store, sync and async."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from storekit import ALL_KINDS, SERVICE_KINDS, open_store

import idempo
from idempo.stores import COMPLETED, IN_PROGRESS, OUTCOME_UNKNOWN, Claimed, Existing

LEASE = 150  # ms; lease-expiry scenarios sleep past it on the store's clock
SLEEP = 0.25


def key(n: int) -> bytes:
    return bytes([n]) * 32


def tok(n: int) -> bytes:
    return bytes([n]) * 16


FP = "v1:" + "ab" * 32
FP2 = "v1:" + "cd" * 32


def r(body: bytes) -> bytes:
    """A ``response`` column value (core's encoding; the memory store decodes what it keeps)."""
    return idempo.encode_response(200, [], body)


def run(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, body: Callable[[Any], Awaitable[None]]
) -> None:
    services = request.getfixturevalue("services") if kind in SERVICE_KINDS else None

    async def main() -> None:
        async with open_store(kind, tmp_path, services) as store:
            await body(store)

    asyncio.run(main())


kinds = pytest.mark.parametrize("kind", ALL_KINDS)


@kinds
def test_claim_insert_then_existing(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def body(s: Any) -> None:
        res = await s.claim(key(1), FP, tok(1), 10_000, 60_000)
        assert isinstance(res, Claimed) and res.generation == 1
        rec, now = await s.get(key(1))
        assert rec is not None and now >= res.now_ms
        assert (rec.scope_key, rec.fingerprint, rec.state, rec.token) == (key(1), FP, IN_PROGRESS, tok(1))
        assert rec.generation == 1 and rec.response is None
        assert rec.lease_until == res.now_ms + 10_000
        assert rec.expires_at == res.now_ms + 60_000
        again = await s.claim(key(1), FP2, tok(2), 10_000, 60_000)
        assert isinstance(again, Existing)
        assert again.record == rec  # nothing written by the loser
        # expires_at = now + max(ttl, lease)
        short = await s.claim(key(2), FP, tok(3), 5_000, 1_000)
        rec2, _ = await s.get(key(2))
        assert rec2 is not None and rec2.expires_at == short.now_ms + 5_000
        missing, _ = await s.get(key(3))
        assert missing is None

    run(kind, tmp_path, request, body)


@kinds
def test_complete_checks_token(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    payload = bytes(range(256)) * 3  # every byte value survives

    async def body(s: Any) -> None:
        await s.claim(key(1), FP, tok(1), 10_000, 60_000)
        assert await s.complete(key(1), tok(9), r(b"stale"), 60_000) is False
        assert await s.complete(key(1), tok(1), r(payload), 120_000) is True
        rec, now = await s.get(key(1))
        assert rec is not None and rec.state == COMPLETED and rec.response == r(payload)
        assert rec.lease_until is None and rec.token == tok(1)
        assert now <= rec.expires_at <= now + 120_000
        assert await s.complete(key(1), tok(1), r(b"again"), 60_000) is False
        assert await s.release(key(1), tok(1)) is False
        assert await s.renew(key(1), tok(1), 1_000) is False
        existing = await s.claim(key(1), FP, tok(2), 10_000, 60_000)
        assert isinstance(existing, Existing) and existing.record.response == r(payload)
        assert await s.complete(key(7), tok(1), r(b"x"), 1_000) is False  # no record at all

    run(kind, tmp_path, request, body)


@kinds
def test_release_only_own_claim(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def body(s: Any) -> None:
        await s.claim(key(1), FP, tok(1), 10_000, 60_000)
        assert await s.release(key(1), tok(2)) is False
        assert (await s.get(key(1)))[0] is not None
        assert await s.release(key(1), tok(1)) is True
        assert (await s.get(key(1)))[0] is None
        res = await s.claim(key(1), FP2, tok(3), 10_000, 60_000)
        assert isinstance(res, Claimed) and res.generation == 1

    run(kind, tmp_path, request, body)


@kinds
def test_takeover_after_lease_and_stale_owner(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def body(s: Any) -> None:
        await s.claim(key(1), FP, tok(1), LEASE, 60_000)
        assert await s.takeover(key(1), tok(1), tok(2), 10_000) is None  # lease still live
        await asyncio.sleep(SLEEP)
        assert await s.takeover(key(1), tok(9), tok(2), 10_000) is None  # wrong seen token
        assert await s.takeover(key(1), tok(1), tok(2), 10_000) == 1
        rec, now = await s.get(key(1))
        assert rec is not None and rec.token == tok(2) and rec.state == IN_PROGRESS
        assert rec.lease_until is not None and now < rec.lease_until <= now + 10_000
        assert rec.expires_at >= rec.lease_until
        # The paused former owner wakes up: every write of its is refused.
        assert await s.complete(key(1), tok(1), r(b"late"), 60_000) is False
        assert await s.renew(key(1), tok(1), 10_000) is False
        assert await s.release(key(1), tok(1)) is False
        assert await s.takeover(key(1), tok(1), tok(3), 10_000) is None
        assert await s.complete(key(1), tok(2), r(b"ok"), 60_000) is True
        rec, _ = await s.get(key(1))
        assert rec is not None and rec.response == r(b"ok")

    run(kind, tmp_path, request, body)


@kinds
def test_mark_unknown(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def body(s: Any) -> None:
        await s.claim(key(1), FP, tok(1), LEASE, 60_000)
        assert await s.mark_unknown(key(1), tok(1), 60_000) is False  # lease live
        await asyncio.sleep(SLEEP)
        assert await s.mark_unknown(key(1), tok(2), 60_000) is False  # not the seen token
        assert await s.mark_unknown(key(1), tok(1), 90_000) is True
        rec, now = await s.get(key(1))
        assert rec is not None and rec.state == OUTCOME_UNKNOWN and rec.lease_until is None
        assert now <= rec.expires_at <= now + 90_000
        assert await s.complete(key(1), tok(1), r(b"late"), 60_000) is False
        assert await s.takeover(key(1), tok(1), tok(3), 1_000) is None
        res = await s.claim(key(1), FP, tok(4), 1_000, 60_000)
        assert isinstance(res, Existing) and res.record.state == OUTCOME_UNKNOWN

    run(kind, tmp_path, request, body)


@kinds
def test_renew_extends_lease(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def body(s: Any) -> None:
        await s.claim(key(1), FP, tok(1), LEASE, LEASE)
        assert await s.renew(key(1), tok(2), 10_000) is False
        assert await s.renew(key(1), tok(1), 10_000) is True
        rec, now = await s.get(key(1))
        assert rec is not None and rec.lease_until is not None
        assert now < rec.lease_until and rec.expires_at >= rec.lease_until
        await asyncio.sleep(SLEEP)  # past the original lease, within the renewed one
        assert await s.takeover(key(1), tok(1), tok(2), 1_000) is None
        assert isinstance(await s.claim(key(1), FP, tok(3), 1_000, 1_000), Existing)
        # renew(0) expires the caller's own lease at once
        assert await s.renew(key(1), tok(1), 0) is True
        await asyncio.sleep(0.01)
        assert await s.takeover(key(1), tok(1), tok(2), 1_000) == 1

    run(kind, tmp_path, request, body)


@kinds
def test_expired_record_is_replaced(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def body(s: Any) -> None:
        await s.claim(key(1), FP, tok(1), LEASE, LEASE)
        assert await s.complete(key(1), tok(1), r(b"first"), LEASE) is True
        await asyncio.sleep(SLEEP)
        res = await s.claim(key(1), FP2, tok(2), 10_000, 60_000)
        assert isinstance(res, Claimed) and res.generation == 2
        rec, _ = await s.get(key(1))
        assert rec is not None
        assert (rec.fingerprint, rec.state, rec.token, rec.response) == (FP2, IN_PROGRESS, tok(2), None)

    run(kind, tmp_path, request, body)


@kinds
def test_purge_expired_counts(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def body(s: Any) -> None:
        # expired: 2 in progress, 3 completed, 1 outcome unknown; live: 2
        for n in (1, 2):
            await s.claim(key(n), FP, tok(n), 1, LEASE)
        for n in (3, 4, 5):
            await s.claim(key(n), FP, tok(n), 10_000, 60_000)
            assert await s.complete(key(n), tok(n), r(b"r"), LEASE)
        await s.claim(key(6), FP, tok(6), 1, 60_000)
        await asyncio.sleep(0.01)
        assert await s.mark_unknown(key(6), tok(6), LEASE)
        for n in (7, 8):
            await s.claim(key(n), FP, tok(n), 10_000, 60_000)
        await s.complete(key(8), tok(8), r(b"live"), 60_000)
        await asyncio.sleep(SLEEP)
        first = await s.purge_expired(batch=2)
        assert first.total == 2  # one batch per call
        rest = await s.purge_expired(batch=1000)
        counts = first + rest
        assert (counts.in_progress, counts.completed, counts.outcome_unknown) == (2, 3, 1)
        assert counts.total == 6
        for n in range(1, 7):
            assert (await s.get(key(n)))[0] is None
        for n in (7, 8):
            assert (await s.get(key(n)))[0] is not None
        again = await s.purge_expired(batch=1000)
        assert again.total == 0

    run(kind, tmp_path, request, body)


@kinds
def test_concurrent_claims_one_winner(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def body(s: Any) -> None:
        for round_ in range(3):
            k = key(40 + round_)
            results = await asyncio.gather(
                *(s.claim(k, FP, tok(i + 1), 10_000, 60_000) for i in range(24))
            )
            winners = [r for r in results if isinstance(r, Claimed)]
            assert len(winners) == 1
            rec, _ = await s.get(k)
            assert rec is not None
            for r in results:
                if isinstance(r, Existing):
                    assert r.record.token == rec.token

    run(kind, tmp_path, request, body)


@kinds
def test_bad_arguments_are_typed_errors(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async def body(s: Any) -> None:
        with pytest.raises(idempo.InvalidArgument):
            await s.claim(b"short", FP, tok(1), 1_000, 1_000)
        with pytest.raises(idempo.InvalidArgument):
            await s.claim(key(1), FP, b"tok", 1_000, 1_000)
        with pytest.raises(idempo.InvalidArgument):
            await s.claim(key(1), FP, tok(1), -1, 1_000)
        with pytest.raises(idempo.InvalidArgument):
            await s.purge_expired(batch=0)

    run(kind, tmp_path, request, body)


def test_store_down_fails_closed(tmp_path: Path) -> None:
    """Unreachable servers and unusable files raise StoreUnavailable (503), never something else."""
    import socket

    from idempo.stores import PostgresStore, RedisStore, SQLiteStore

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    pg = PostgresStore(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout_ms=2000)
    with pytest.raises(idempo.StoreUnavailable) as exc:
        pg.claim(key(1), FP, tok(1), 1_000, 1_000)
    assert exc.value.retry_after == 1.0
    rs = RedisStore(f"redis://127.0.0.1:{port}/0", assume_noeviction=True)
    with pytest.raises(idempo.StoreUnavailable):
        rs.claim(key(1), FP, tok(1), 1_000, 1_000)
    rs.close()
    with pytest.raises(idempo.StoreUnavailable):
        SQLiteStore(tmp_path / "missing-dir" / "x.sqlite3")


def test_redis_refuses_evicting_policy(services: Any) -> None:
    import redis

    from idempo.stores import RedisStore

    client = redis.Redis.from_url(services.redis_url)
    client.config_set("maxmemory-policy", "volatile-lru")
    try:
        with pytest.raises(idempo.InvalidArgument, match="noeviction"):
            RedisStore(client).claim(key(1), FP, tok(1), 1_000, 1_000)
        RedisStore(client, allow_eviction=True).get(key(1))
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
    with pytest.raises(idempo.InvalidArgument):
        RedisStore(redis.Redis.from_url(services.redis_url, decode_responses=True))


def test_redis_refusing_config_get_is_a_config_error_naming_the_fix(services: Any) -> None:
    """A server (or ACL user) that refuses ``CONFIG`` (managed services do) fails closed with a
    configuration error that names ``assume_noeviction``, not a store outage on every call."""
    import redis

    from idempo.stores import AsyncRedisStore, RedisStore

    admin = redis.Redis.from_url(services.redis_url)
    user = f"idempo_noconfig_{os.getpid()}"
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-config")
    url = services.redis_url.replace("redis://", f"redis://{user}:pw@", 1)
    try:
        with pytest.raises(idempo.InvalidArgument, match="assume_noeviction=True") as exc:
            RedisStore(url).get(key(1))
        assert "config|get" in str(exc.value)

        async def async_store() -> None:
            store = AsyncRedisStore(url)
            try:
                with pytest.raises(idempo.InvalidArgument, match="assume_noeviction=True"):
                    await store.get(key(1))
            finally:
                await store.close()

        asyncio.run(async_store())
        checked_by_hand = RedisStore(url, assume_noeviction=True)
        assert checked_by_hand.get(key(1))[0] is None
        checked_by_hand.close()
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def test_memory_store_bounds_and_fork_guard() -> None:
    from idempo.stores import MemoryStore, memory_partition

    now = [1_000_000]
    s = MemoryStore(max_entries=3, clock=lambda: now[0])
    assert s.max_entries_per_partition == 1  # a tenth of max_entries, at least 1
    for n in (1, 2):
        s.claim(key(n), FP, tok(n), 10_000, 60_000)
        assert s.complete(key(n), tok(n), r(b"x"), 60_000 + n)
    s.claim(key(3), FP, tok(3), 10_000, 120_000)
    # Full of unexpired records: nothing is evicted, the claim is refused with a hint.
    with pytest.raises(idempo.StoreUnavailable, match="full") as info:
        s.claim(key(4), FP, tok(4), 10_000, 60_000)
    assert info.value.reason == "store_full" and info.value.retry_after == 60.001  # type: ignore[attr-defined]
    assert {s.get(key(n))[0].state for n in (1, 2)} == {COMPLETED}  # type: ignore[union-attr]
    now[0] += 60_001  # the first record expired: its room is reused
    assert isinstance(s.claim(key(4), FP, tok(4), 10_000, 60_000), Claimed)
    assert s.get(key(1))[0] is None and s.get(key(2))[0] is not None
    # One partition is held to its quota.
    q = MemoryStore(max_entries=10, max_entries_per_partition=1, clock=lambda: now[0])
    alice = memory_partition("alice")
    q.claim(key(1), FP, tok(1), 10_000, 60_000, partition=alice)
    with pytest.raises(idempo.StoreUnavailable) as info:
        q.claim(key(2), FP, tok(2), 10_000, 60_000, partition=alice)
    assert info.value.reason == "partition_quota"  # type: ignore[attr-defined]
    assert isinstance(q.claim(key(2), FP, tok(2), 10_000, 60_000, partition=memory_partition("bob")), Claimed)
    assert len(q) == 2 and q.bytes_used == 2 * (160 + len(FP))

    forked = MemoryStore()
    forked._pid = os.getpid() + 1  # what a forked child sees  # noqa: SLF001
    with pytest.raises(idempo.StoreUnavailable, match="forked"):
        forked.get(key(1))
    ok = MemoryStore(allow_multiprocess=True)
    ok._pid = os.getpid() + 1  # noqa: SLF001
    assert ok.get(key(1))[0] is None


def test_redis_layout_is_the_spec_layout(services: Any) -> None:
    """spec/STORAGE.md §5: key `idempo:<64 hex>`, the column names as hash fields, so a Node
    service reads what Python wrote; the response column is core's encoding."""
    import redis

    from idempo.stores import RedisStore

    client = redis.Redis.from_url(services.redis_url)
    client.flushdb()
    store = RedisStore(client)
    response = idempo.encode_response(201, [("content-type", "application/json")], b'{"id":1}')
    store.claim(key(5), FP, tok(5), 10_000, 60_000)
    assert store.complete(key(5), tok(5), response, 60_000)
    raw = client.hgetall(b"idempo:" + key(5).hex().encode())
    assert set(raw) == {b"fingerprint", b"state", b"token", b"generation", b"expires_at", b"response"}
    assert raw[b"state"] == b"2" and raw[b"token"] == tok(5) and raw[b"generation"] == b"1"
    assert idempo.decode_response(raw[b"response"]) == (
        201, [("content-type", "application/json")], b'{"id":1}')
    ttl = client.pttl(b"idempo:" + key(5).hex().encode())
    assert 60_000 < ttl <= 120_000  # expires_at plus the one-minute grace, never the lease
    client.close()


def test_postgres_schema_is_the_spec_schema(services: Any) -> None:
    from idempo.stores import PostgresStore

    store = PostgresStore(services.pg_dsn)
    store.create_schema()
    with store._conn() as conn:  # noqa: SLF001 - inspecting the catalog
        cols = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = 'idempo_record' ORDER BY ordinal_position").fetchall()
        idx = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'idempo_record'").fetchall()
    store.close()
    assert cols == [
        ("scope_key", "bytea", "NO"), ("fingerprint", "text", "NO"), ("state", "smallint", "NO"),
        ("token", "bytea", "NO"), ("generation", "integer", "NO"), ("lease_until", "bigint", "YES"),
        ("expires_at", "bigint", "NO"), ("response", "bytea", "YES"),
    ]
    assert ("idempo_record_expires_at",) in idx


def test_purge_all_and_purger() -> None:
    import time as _time

    from idempo.stores import MemoryStore, Purger, purge_all

    now = [1_000_000]
    s = MemoryStore(clock=lambda: now[0])
    for n in range(1, 8):
        s.claim(key(n), FP, tok(n), 10, 10)
    now[0] += 100
    seen = []
    total = purge_all(s, batch=3, on_counts=seen.append)
    assert total.in_progress == 7 and seen == [total] and len(s) == 0
    for n in range(1, 4):
        s.claim(key(n), FP, tok(n), 10, 10)
    now[0] += 100
    got = []
    purger = Purger(s, interval_s=0.05, batch=2, on_counts=got.append).start()
    deadline = _time.monotonic() + 5
    while len(s) and _time.monotonic() < deadline:
        _time.sleep(0.01)
    purger.stop(5)
    assert len(s) == 0 and sum(c.total for c in got) == 3


class _Delayed:
    """The PostgreSQL store with the host's monotonic clock (``now[0]``, ms) moved on by
    ``delay[0]`` each time it answers: a fill that happens that long after the read."""

    def __init__(self, inner: Any, now: list, delay: list) -> None:
        self.inner, self.now, self.delay = inner, now, delay

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def late(*args: Any) -> Any:
            result = method(*args)
            if asyncio.iscoroutine(result):

                async def later() -> Any:
                    value = await result
                    self.now[0] += self.delay[0]
                    return value

                return later()
            self.now[0] += self.delay[0]
            return result

        return late


@pytest.mark.services
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_delayed_cache_fill_gets_a_shorter_px(flavour: str, services: Any) -> None:
    """spec/STORAGE.md §9: the cache PX is min(cache_ttl, expires_at - now) from the authority's
    read, less the time elapsed since that read when the SET is sent; nothing left, no SET."""
    import redis

    from idempo.stores import AsyncCachedStore, AsyncPostgresStore, CachedStore, PostgresStore

    now, delay = [1_000_000.0], [0.0]
    entry = b"idempo:cache:" + key(41).hex().encode()
    probe = redis.Redis.from_url(services.redis_url)
    probe.delete(entry)
    response = idempo.encode_response(201, [], b"{}")
    ttl = 3_600_000

    async def main() -> None:
        if flavour == "sync":
            pg: Any = PostgresStore(services.pg_dsn)
            store: Any = CachedStore(
                services.redis_url, _Delayed(pg, now, delay), monotonic=lambda: now[0]
            )
        else:
            pg = AsyncPostgresStore(services.pg_dsn)
            store = AsyncCachedStore(
                services.redis_url, _Delayed(pg, now, delay), monotonic=lambda: now[0]
            )

        async def call(name: str, *args: Any) -> Any:
            result = getattr(store, name)(*args)
            return await result if asyncio.iscoroutine(result) else result

        try:
            setup = PostgresStore(services.pg_dsn)
            setup.create_schema()
            with setup._conn() as conn:  # noqa: SLF001 - test setup
                conn.execute("DELETE FROM idempo_record WHERE scope_key = %s", (key(41),))
            setup.close()
            assert isinstance(await call("claim", key(41), FP, tok(41), 10_000, ttl), Claimed)
            # The completion's fill comes 45 s after the completion's read: 60 s - 45 s left.
            delay[0] = 45_000.0
            assert await call("complete", key(41), tok(41), response, ttl) is True
            px = probe.pttl(entry)
            assert 14_000 < px <= 15_000, px
            # A read that misses fills again; 10 s late, about 50 s are left.
            probe.delete(entry)
            delay[0] = 10_000.0
            record, _ = await call("get", key(41))
            assert record is not None and record.state == COMPLETED
            px = probe.pttl(entry)
            assert 49_000 < px <= 50_000, px
            # Later than the whole cache TTL: nothing is left, no SET at all.
            probe.delete(entry)
            delay[0] = 60_000.0
            record, _ = await call("get", key(41))
            assert record is not None and record.state == COMPLETED
            assert probe.exists(entry) == 0
        finally:
            closing = store.redis.aclose() if flavour == "async" else store.redis.close()
            if asyncio.iscoroutine(closing):
                await closing
            closed = pg.close()
            if asyncio.iscoroutine(closed):
                await closed

    asyncio.run(main())
    probe.close()
