"""Redis Cluster as a topology of its own (``spec/STORAGE.md`` §5.3).

The three-primary cluster comes from ``scripts/test-services.sh``. The conformance scenarios and
the contract suite run against the ``redis-cluster`` store kinds (``storekit.py``); this module
checks what only a cluster has: every primary's eviction policy, clients that would corrupt or
misroute records refused up front, records spread over the slots, and a duplicate storm.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Dict, Iterator, List

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster

import idempo
from idempo.stores import AsyncRedisStore, RedisStore
from idempo.stores._base import Claimed, Existing

from storekit import _flush_cluster, cluster_url

FP = "v1:" + "d" * 64


def _nodes(services: Any) -> List[str]:
    return str(services.redis_cluster_nodes).split(",")


def _node_client(node: str) -> "redis.Redis[bytes]":
    return redis.Redis.from_url("redis://" + node)


@pytest.fixture
def cluster(services: Any) -> Iterator[Any]:
    _flush_cluster(services)
    yield services
    for node in _nodes(services):
        client = _node_client(node)
        client.config_set("maxmemory-policy", "noeviction")
        client.close()


def _scope(i: int) -> bytes:
    return idempo.scope_id("tenant", "POST", "/payments", f"cluster-key-{i:04d}")


def test_a_single_node_client_pointed_at_a_cluster_node_is_refused(cluster: Any) -> None:
    store = RedisStore(cluster_url(cluster))
    try:
        with pytest.raises(idempo.InvalidArgument, match="cluster=True"):
            store.check()
        with pytest.raises(idempo.InvalidArgument, match="Redis Cluster node"):
            store.claim(_scope(1), FP, os.urandom(16), 30_000, 60_000)
    finally:
        store.close()


def test_an_async_single_node_client_pointed_at_a_cluster_node_is_refused(cluster: Any) -> None:
    async def run() -> None:
        store = AsyncRedisStore(cluster_url(cluster))
        try:
            with pytest.raises(idempo.InvalidArgument, match="cluster=True"):
                await store.check()
        finally:
            await store.close()

    asyncio.run(run())


def test_every_primary_is_checked_for_noeviction(cluster: Any) -> None:
    last = _nodes(cluster)[-1]
    client = _node_client(last)
    client.config_set("maxmemory-policy", "volatile-lru")
    client.close()
    store = RedisStore(cluster_url(cluster), cluster=True)
    try:
        with pytest.raises(idempo.InvalidArgument, match=f"{last} has 'volatile-lru'"):
            store.check()
        with pytest.raises(idempo.InvalidArgument, match="noeviction"):
            store.claim(_scope(2), FP, os.urandom(16), 30_000, 60_000)
    finally:
        store.close()
    # allow_eviction is the explicit way out (documented as unsafe).
    lax = RedisStore(cluster_url(cluster), cluster=True, allow_eviction=True)
    try:
        assert isinstance(lax.claim(_scope(2), FP, os.urandom(16), 30_000, 60_000), Claimed)
    finally:
        lax.close()


def test_async_cluster_checks_every_primary(cluster: Any) -> None:
    middle = _nodes(cluster)[1]
    client = _node_client(middle)
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.close()

    async def run() -> None:
        store = AsyncRedisStore(cluster_url(cluster), cluster=True)
        try:
            with pytest.raises(idempo.InvalidArgument, match=f"{middle} has 'allkeys-lru'"):
                await store.check()
        finally:
            await store.close()

    asyncio.run(run())


def test_the_check_runs_again_when_the_primaries_change(cluster: Any) -> None:
    store = RedisStore(cluster_url(cluster), cluster=True)
    try:
        assert isinstance(store.claim(_scope(3), FP, os.urandom(16), 30_000, 60_000), Claimed)
        # A policy changed on a node while the topology stays the same is not re-read ...
        node = _nodes(cluster)[0]
        client = _node_client(node)
        client.config_set("maxmemory-policy", "volatile-ttl")
        client.close()
        assert isinstance(store.claim(_scope(4), FP, os.urandom(16), 30_000, 60_000), Claimed)
        # ... but a new set of primaries (failover, resharding) is checked before the next call.
        store._check.checked = frozenset({"127.0.0.1:1"})  # noqa: SLF001 - simulate a change
        with pytest.raises(idempo.InvalidArgument, match=f"{node} has 'volatile-ttl'"):
            store.claim(_scope(5), FP, os.urandom(16), 30_000, 60_000)
    finally:
        store.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_clients_that_decode_responses_are_refused_whatever_their_type(
    cluster: Any, flavour: str
) -> None:
    nodes = [redis.cluster.ClusterNode(*n.split(":")) for n in _nodes(cluster)]
    if flavour == "sync":
        client: Any = redis.cluster.RedisCluster(startup_nodes=nodes, decode_responses=True)
        with pytest.raises(idempo.InvalidArgument, match="decode_responses=False"):
            RedisStore(client)
        client.close()
    else:

        async def run() -> None:
            anodes = [redis.asyncio.cluster.ClusterNode(*n.split(":")) for n in _nodes(cluster)]
            aclient = redis.asyncio.cluster.RedisCluster(startup_nodes=anodes, decode_responses=True)
            with pytest.raises(idempo.InvalidArgument, match="decode_responses=False"):
                AsyncRedisStore(aclient)
            await aclient.aclose()

        asyncio.run(run())


def test_cluster_true_needs_a_cluster_client(cluster: Any) -> None:
    client = redis.Redis.from_url(cluster.redis_url)
    with pytest.raises(idempo.InvalidArgument, match="RedisCluster"):
        RedisStore(client, cluster=True)
    client.close()


def test_a_cluster_client_is_accepted_and_records_spread_over_the_primaries(cluster: Any) -> None:
    nodes = [redis.cluster.ClusterNode(*n.split(":")) for n in _nodes(cluster)]
    client = redis.cluster.RedisCluster(startup_nodes=nodes)
    store = RedisStore(client)
    try:
        store.check()
        for i in range(60):
            assert isinstance(store.claim(_scope(i), FP, os.urandom(16), 30_000, 60_000), Claimed)
        per_node = {}
        for node in _nodes(cluster):
            c = _node_client(node)
            per_node[node] = len(c.keys(b"idempo:*"))
            c.close()
        assert sum(per_node.values()) == 60
        assert sum(1 for n in per_node.values() if n > 0) >= 2, per_node
    finally:
        client.close()


def test_duplicate_storm_on_the_cluster_has_one_winner_per_key(cluster: Any) -> None:
    keys, clients_per_key = 12, 6
    store = RedisStore(cluster_url(cluster), cluster=True)
    winners: Dict[int, int] = {i: 0 for i in range(keys)}
    errors: List[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(keys * clients_per_key)

    def client(i: int) -> None:
        token = os.urandom(16)
        try:
            start.wait(timeout=30)
            result = store.claim(_scope(100 + i), FP, token, 30_000, 60_000)
            if isinstance(result, Claimed):
                assert store.complete(
                    _scope(100 + i), token, idempo.encode_response(201, [], b"{}"), 60_000
                )
                with lock:
                    winners[i] += 1
            else:
                assert isinstance(result, Existing)
        except BaseException as exc:  # noqa: BLE001 - reported below
            with lock:
                errors.append(exc)

    threads = [
        threading.Thread(target=client, args=(i,))
        for i in range(keys)
        for _ in range(clients_per_key)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert errors == [], errors[:3]
        assert winners == {i: 1 for i in range(keys)}
    finally:
        store.close()
