"""The SQLite store's group commit on the asyncio event loop (``idempo.stores.sqlite._LoopGroup``):
the writes asked for during one loop turn share one ``BEGIN IMMEDIATE ... COMMIT``, each in a
savepoint of its own, every one answered after the commit; a failure answers only its own
primitive; anything the group cannot start runs in a worker thread as before."""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, List

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from idempo import StoreUnavailable
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import AsyncSQLiteStore, Claimed, SQLiteStore
from idempo.stores.sqlite import _LoopGroup, loop_group

LEASE_MS, TTL_MS = 30_000, 3_600_000


def scope(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


def token(i: int) -> bytes:
    return i.to_bytes(4, "big") * 4


async def ready_group(store: SQLiteStore) -> _LoopGroup:
    """The running loop's group, once its connection (opened in a worker thread) is open."""
    for _ in range(500):
        group = loop_group(store, "claim")
        if group is not None:
            return group
        await asyncio.sleep(0.01)
    raise AssertionError("the loop's group commit never became ready")


def rows(path: Path) -> List[Any]:
    """What a separate connection sees: only committed rows."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT scope_key, state FROM idempo_record ORDER BY scope_key").fetchall()
    finally:
        conn.close()


def refuse_inserting(path: Path, key: bytes) -> None:
    """A trigger that makes every insert of the record ``key`` fail (``refused by test``)."""
    setup = sqlite3.connect(path)
    setup.execute(
        "CREATE TRIGGER refuse_key BEFORE INSERT ON idempo_record "
        f"WHEN NEW.scope_key = x'{key.hex()}' BEGIN SELECT RAISE(ABORT, 'refused by test'); END"
    )
    setup.commit()
    setup.close()


def app_on(store: Any, runs: List[int]) -> Starlette:
    async def pay(request: Request) -> Response:
        runs.append(1)
        return JSONResponse({"n": len(runs)}, status_code=201)

    app = Starlette(routes=[Route("/pay", pay, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=store)
    return app


def test_concurrent_requests_share_commits_and_each_handler_runs_once(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path)
    runs: List[int] = []
    app = app_on(store, runs)

    async def scenario() -> None:
        group = await ready_group(store)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            async def one(i: int) -> httpx.Response:
                return await client.post(
                    "/pay", json={"i": i}, headers={"Idempotency-Key": f"group-key-{i:04d}"}
                )

            first = await asyncio.gather(*(one(i) for i in range(40)))
            assert [r.status_code for r in first] == [201] * 40
            assert len(runs) == 40
            # 80 write primitives (40 claims, 40 completions) in fewer transactions.
            assert 2 <= group.batches < 80, group.batches
            assert [state for _, state in rows(path)] == [2] * 40  # completed, durable

            again = await asyncio.gather(*(one(i) for i in range(40)))
            assert [r.json() for r in again] == [r.json() for r in first]
            assert {r.headers.get("idempotent-replayed") for r in again} == {"true"}
            assert len(runs) == 40, "a replay ran the handler"

    asyncio.run(scenario())
    store.close()


def test_a_failing_primitive_fails_alone_and_the_rest_commit(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path)
    bad = scope(7)
    refuse_inserting(path, bad)

    async def scenario() -> None:
        group = await ready_group(store)
        before = group.batches
        calls = [
            group.submit_call("claim", (scope(i), "fp", token(i), LEASE_MS, TTL_MS))
            for i in range(12)
        ]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        assert group.batches == before + 1, "the twelve claims were not one group"
        failed = answers[7]
        assert isinstance(failed, StoreUnavailable), failed
        assert "refused by test" in str(failed.__cause__)
        assert all(isinstance(a, Claimed) for i, a in enumerate(answers) if i != 7), answers

    asyncio.run(scenario())
    assert [key for key, _ in rows(path)] == [scope(i) for i in range(12) if i != 7]
    store.close()


def test_a_group_of_one_that_fails_rolls_back_and_the_next_group_works(tmp_path: Path) -> None:
    """A lone primitive runs without a savepoint: its failure rolls the transaction back."""
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path)
    bad = scope(7)
    refuse_inserting(path, bad)

    async def scenario() -> None:
        group = await ready_group(store)
        with pytest.raises(StoreUnavailable, match="refused by test"):
            await group.submit_call("claim", (bad, "fp", token(7), LEASE_MS, TTL_MS))
        assert group.conn is not None and not group.conn.in_transaction
        claimed = await group.submit_call("claim", (scope(8), "fp", token(8), LEASE_MS, TTL_MS))
        assert isinstance(claimed, Claimed)

    asyncio.run(scenario())
    assert [key for key, _ in rows(path)] == [scope(8)]
    store.close()


def test_a_failed_commit_answers_every_primitive_of_the_group_and_keeps_none(
    tmp_path: Path,
) -> None:
    """A deferred foreign key broken by one claim fails the group's ``COMMIT`` itself."""
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path)
    setup = sqlite3.connect(path)
    setup.executescript(
        "CREATE TABLE parent (id INTEGER PRIMARY KEY);"
        "CREATE TABLE child (pid INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);"
        f"CREATE TRIGGER orphan AFTER INSERT ON idempo_record WHEN NEW.scope_key = x'{scope(3).hex()}'"
        " BEGIN INSERT INTO child VALUES (99); END;"
    )
    setup.close()

    async def scenario() -> None:
        group = await ready_group(store)
        assert group.conn is not None
        group.conn.execute("PRAGMA foreign_keys = ON")
        calls = [
            group.submit_call("claim", (scope(i), "fp", token(i), LEASE_MS, TTL_MS))
            for i in range(6)
        ]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(a, StoreUnavailable) for a in answers), answers
        assert "group commit failed" in str(answers[0])
        assert not group.conn.in_transaction

    asyncio.run(scenario())
    assert rows(path) == []
    store.close()


def test_a_lock_held_elsewhere_hands_the_writes_to_worker_threads(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path, busy_timeout_ms=5_000)
    runs: List[int] = []
    app = app_on(store, runs)

    async def scenario() -> None:
        await ready_group(store)
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.4, lambda: holder.execute("COMMIT"))
        release.start()
        transport = httpx.ASGITransport(app=app)
        ran_while_held: List[int] = []

        async def probe() -> None:
            await asyncio.sleep(0.2)
            ran_while_held.append(len(runs))

        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            probing = asyncio.ensure_future(probe())
            answers = await asyncio.gather(*(
                client.post("/pay", json={"i": i}, headers={"Idempotency-Key": f"held-{i:04d}"})
                for i in range(5)
            ))
            await probing
        release.join()
        holder.close()
        # The claims waited for the lock (in worker threads): no handler ran while it was held.
        assert ran_while_held == [0]
        assert [r.status_code for r in answers] == [201] * 5
        assert len(runs) == 5

    asyncio.run(scenario())
    assert [state for _, state in rows(path)] == [2] * 5
    store.close()


def test_a_caller_that_gave_up_before_the_group_ran_is_not_applied(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path)

    async def scenario() -> None:
        group = await ready_group(store)
        kept = group.submit_call("claim", (scope(1), "fp", token(1), LEASE_MS, TTL_MS))
        dropped = group.submit_call("claim", (scope(2), "fp", token(2), LEASE_MS, TTL_MS))
        dropped.cancel()
        assert isinstance(await kept, Claimed)

    asyncio.run(scenario())
    assert [key for key, _ in rows(path)] == [scope(1)]
    store.close()


def test_only_idempos_own_unpatched_store_and_its_writes_take_the_group(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"

    class Mine(SQLiteStore):
        pass

    async def scenario() -> None:
        store = SQLiteStore(path)
        await ready_group(store)
        assert loop_group(store, "complete") is not None
        assert loop_group(store, "get") is None  # a read keeps its worker thread
        assert loop_group(store, "purge_expired") is None
        assert loop_group(store, "commit") is None
        store.claim = store.claim  # type: ignore[method-assign]  # replaced on the instance
        assert loop_group(store, "claim") is None
        store.close()
        sub = Mine(path)
        assert loop_group(sub, "claim") is None
        sub.close()

    asyncio.run(scenario())


def test_the_async_store_groups_its_writes_too(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    store = AsyncSQLiteStore(path)

    async def scenario() -> None:
        group = await ready_group(store.sync)
        before = group.batches
        answers = await asyncio.gather(*(
            store.claim(scope(i), "fp", token(i), LEASE_MS, TTL_MS) for i in range(10)
        ))
        assert all(isinstance(a, Claimed) for a in answers)
        assert group.batches == before + 1
        done = await asyncio.gather(*(
            store.complete(scope(i), token(i), b"stored", TTL_MS) for i in range(10)
        ))
        assert done == [True] * 10
        record, _ = await store.get(scope(4))
        assert record is not None and record.response == b"stored"

    asyncio.run(scenario())
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_use_its_parents_loop_connection(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path)
    loop = asyncio.new_event_loop()
    try:
        group = loop.run_until_complete(ready_group(store))
        assert group.ready(loop)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            os._exit(0 if not group.ready(loop) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
    finally:
        loop.close()
        store.close()


def test_a_finished_loop_leaves_no_group_nor_connection_behind(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    store = SQLiteStore(path)
    opened = len(store._all)
    conns: List[sqlite3.Connection] = []

    async def scenario(i: int) -> None:
        group = await ready_group(store)
        assert group.conn is not None
        conns.append(group.conn)
        assert isinstance(
            await group.submit_call("claim", (scope(i), "fp", token(i), LEASE_MS, TTL_MS)), Claimed
        )

    for i in range(3):
        asyncio.run(scenario(i))
    gc.collect()
    assert len(store._groups) == 0
    assert len(store._all) == opened, "a finished loop's connection is still held"
    with pytest.raises(sqlite3.ProgrammingError):
        conns[0].execute("SELECT 1")  # closed
    store.close()
