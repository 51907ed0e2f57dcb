"""A PostgreSQL primary that crashes and a standby that is promoted (``spec/STORAGE.md`` §4.6).

``scripts/test-services.sh start-pair`` starts a primary and a synchronous streaming standby; the
stores connect with a multi-host DSN (``host=a,b``, ``target_session_attrs=read-write``, libpq's
own failover). Across ``promote`` (the primary stopped at once, the standby promoted) the store
fails closed while no primary answers and then works against the new primary, and every
completed record is still there: a retry replays, nothing runs twice.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

import idempo
from idempo.stores import AsyncPostgresStore, PostgresStore
from idempo.stores._base import COMPLETED, Claimed, Existing

from conftest import REPO

SCRIPT = REPO / "scripts" / "test-services.sh"
FP = "v1:" + "f" * 64
TTL_MS = 600_000


class Pair:
    def __init__(self, work: Path, env: Dict[str, str]) -> None:
        self.work = work
        self.primary = env["IDEMPO_TEST_PG_PRIMARY_DSN"]
        self.multihost = env["IDEMPO_TEST_PG_MULTIHOST_DSN"]

    def promote(self) -> None:
        subprocess.run(
            ["bash", str(SCRIPT), "promote", str(self.work)], check=True, capture_output=True,
            timeout=120,
        )


@pytest.fixture
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if os.environ.get("IDEMPO_SKIP_SERVICES") == "1":
        pytest.skip("IDEMPO_SKIP_SERVICES=1: PostgreSQL tests skipped")
    work = tmp_path_factory.mktemp("pg-pair")
    proc = subprocess.run(
        ["bash", str(SCRIPT), "start-pair", str(work)], capture_output=True, text=True, timeout=180
    )
    if proc.returncode != 0:
        raise RuntimeError(f"could not start the primary and standby:\n{proc.stdout}{proc.stderr}")
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    try:
        yield Pair(work, env)
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(work)], capture_output=True, timeout=60)


def _scope(i: int) -> bytes:
    return idempo.scope_id("tenant", "POST", "/payments", f"failover-{i:03d}")


def _until_available(call: Any, deadline_s: float) -> Any:
    """Calls ``call`` until it stops failing closed; every failure must be StoreUnavailable."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return call()
        except idempo.StoreUnavailable:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_completed_records_survive_a_promotion_and_retries_replay(pair: Pair) -> None:
    store = PostgresStore(pair.multihost, timeout_ms=2000)
    try:
        store.create_schema()
        tokens = {}
        for i in range(20):
            tokens[i] = os.urandom(16)
            assert isinstance(store.claim(_scope(i), FP, tokens[i], 30_000, TTL_MS), Claimed)
            body = b'{"charge":%d}' % i
            assert store.complete(_scope(i), tokens[i], idempo.encode_response(201, [], body), TTL_MS)
        pair.promote()
        # While no primary answers, the store fails closed (StoreUnavailable, never another error);
        # then libpq's multi-host DSN reaches the promoted standby.
        record, _now = _until_available(lambda: store.get(_scope(0)), deadline_s=60)
        for i in range(20):
            record, _now = _until_available(lambda: store.get(_scope(i)), deadline_s=30)
            assert record is not None and record.state == COMPLETED, i
            assert record.token == tokens[i]
            # A retry of the same key finds the record: it replays, the handler does not run again.
            again = store.claim(_scope(i), FP, os.urandom(16), 30_000, TTL_MS)
            assert isinstance(again, Existing) and again.record.state == COMPLETED
        # New keys are claimed on the new primary.
        assert isinstance(store.claim(_scope(99), FP, os.urandom(16), 30_000, TTL_MS), Claimed)
    finally:
        store.close()


def test_async_store_follows_a_promotion(pair: Pair) -> None:
    async def run() -> None:
        store = AsyncPostgresStore(pair.multihost, timeout_ms=2000)
        try:
            await store.create_schema()
            token = os.urandom(16)
            assert isinstance(await store.claim(_scope(1), FP, token, 30_000, TTL_MS), Claimed)
            assert await store.complete(_scope(1), token, idempo.encode_response(200, [], b"{}"), TTL_MS)
            await asyncio.to_thread(pair.promote)
            end = time.monotonic() + 60
            while True:
                try:
                    record, _now = await store.get(_scope(1))
                    break
                except idempo.StoreUnavailable:
                    assert time.monotonic() < end, "no primary within 60 s"
                    await asyncio.sleep(0.2)
            assert record is not None and record.state == COMPLETED and record.token == token
        finally:
            await store.close()

    asyncio.run(run())
