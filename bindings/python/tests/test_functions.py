"""Idempotent functions and message consumers (idempo.functions) against real stores."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest
from pydantic import BaseModel

import idempo
from idempo import stores
from idempo.functions import (
    CallInFlight,
    CallOutcomeUnknown,
    PayloadMismatch,
    StoredError,
    current_call,
    idempotent_call,
    idempotent_function,
)

from storekit import _flush_redis, _truncate_pg


@dataclass
class Receipt:
    order: str
    cents: int


class Charge(BaseModel):
    order: str
    cents: int
    tags: List[str]


def make_store(kind: str, tmp_path: Path, services: Any) -> Any:
    if kind == "memory":
        return stores.MemoryStore()
    if kind == "sqlite":
        return stores.SQLiteStore(tmp_path / "calls.sqlite3")
    if kind == "redis":
        return stores.RedisStore(services.redis_url)
    if kind == "postgres":
        return stores.PostgresStore(services.pg_dsn)
    raise AssertionError(kind)


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_factory(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    services = None
    if kind in ("redis", "postgres"):
        services = request.getfixturevalue("services")
        if kind == "redis":
            _flush_redis(services.redis_url)
        else:
            _truncate_pg(services.pg_dsn)
    made: List[Any] = []
    shared = stores.MemoryStore() if kind == "memory" else None

    def factory() -> Any:
        if shared is not None:
            return shared
        s = make_store(kind, tmp_path, services)
        made.append(s)
        return s

    yield factory
    for s in made:
        s.close()


def test_runs_once_and_replays_the_stored_result(store_factory: Callable[[], Any]) -> None:
    runs: List[str] = []
    keys: List[str] = []

    @idempotent_function(store=store_factory(), key=lambda msg: msg["id"])
    def handle(msg: dict) -> Receipt:
        ctx = current_call()
        assert ctx is not None
        keys.append(ctx.downstream_key)
        runs.append(msg["id"])
        return Receipt(msg["order"], msg["cents"])

    msg = {"id": "m-1", "order": "o-1", "cents": 250}
    first = handle(msg)
    again = handle(dict(msg))
    assert first == again == Receipt("o-1", 250)
    assert isinstance(again, Receipt)
    assert runs == ["m-1"]
    assert len(keys[0]) == 64 and current_call() is None


def test_many_deliveries_to_concurrent_consumers_run_once(store_factory: Callable[[], Any]) -> None:
    runs: List[int] = []
    lock = threading.Lock()
    results: List[Any] = []
    errors: List[BaseException] = []

    def consumer() -> None:
        @idempotent_function(store=store_factory(), key=lambda m: m["id"], name="consume",
                             wait=10.0)
        def consume(m: dict) -> dict:
            with lock:
                runs.append(m["n"])
            time.sleep(0.2)
            return {"done": m["n"]}

        for _ in range(5):
            try:
                results.append(consume({"id": "job-7", "n": 7}))
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

    threads = [threading.Thread(target=consumer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert runs == [7]
    assert results == [{"done": 7}] * 20


def test_changed_payload_under_the_same_key_raises_mismatch(store_factory: Callable[[], Any]) -> None:
    @idempotent_function(store=store_factory(), key=lambda m: m["id"], name="pay")
    def pay(m: dict) -> int:
        return int(m["cents"])

    assert pay({"id": "k", "cents": 1}) == 1
    with pytest.raises(PayloadMismatch) as info:
        pay({"id": "k", "cents": 2})
    assert isinstance(info.value, idempo.IdempotencyError)
    assert info.value.key == "k"


def test_pydantic_results_round_trip(store_factory: Callable[[], Any]) -> None:
    runs = []

    @idempotent_function(store=store_factory(), name="charge")
    def charge(order: str, cents: int) -> Charge:
        runs.append(order)
        return Charge(order=order, cents=cents, tags=["a", "b"])

    live = charge("o-9", cents=5)
    replay = charge("o-9", cents=5)
    assert isinstance(replay, Charge) and replay == live
    assert runs == ["o-9"]
    charge("o-9", cents=6)  # another payload is another key (derived from the payload)
    assert runs == ["o-9", "o-9"]


def test_payload_key_leaves_excluded_pointers_out() -> None:
    runs = []
    store = stores.MemoryStore()

    @idempotent_function(store=store, name="ingest", exclude=("/sent_at",))
    def ingest(event: dict) -> None:
        runs.append(event["id"])

    ingest({"id": 1, "sent_at": "10:00"})
    ingest({"id": 1, "sent_at": "10:05"})
    ingest({"id": 2, "sent_at": "10:05"})
    assert runs == [1, 2]


def test_error_dispositions() -> None:
    store = stores.MemoryStore()
    runs: List[str] = []

    class Declined(Exception):
        pass

    @idempotent_function(
        store=store, key=lambda k: k, name="dispo",
        on_error={Declined: "store", ValueError: "release", Exception: "unknown"},
    )
    def act(k: str) -> None:
        runs.append(k)
        if k.startswith("store"):
            raise Declined("card declined")
        if k.startswith("release"):
            raise ValueError("bad input")
        raise RuntimeError("crashed midway")

    with pytest.raises(Declined):
        act("store-1")
    with pytest.raises(StoredError) as stored:
        act("store-1")
    assert stored.value.error_type == "test_error_dispositions.<locals>.Declined"
    assert stored.value.error_message == "card declined"

    with pytest.raises(ValueError):
        act("release-1")
    with pytest.raises(ValueError):
        act("release-1")  # released: runs again

    with pytest.raises(RuntimeError):
        act("unknown-1")
    with pytest.raises(CallOutcomeUnknown):
        act("unknown-1")  # outcome_unknown takeover policy: never run twice
    assert runs == ["store-1", "release-1", "release-1", "unknown-1"]


def test_in_flight_raises_or_waits() -> None:
    store = stores.MemoryStore()
    inside = threading.Event()
    go = threading.Event()

    @idempotent_function(store=store, key=lambda k: k, name="slow")
    def slow(k: str) -> str:
        inside.set()
        go.wait(5)
        return "ok"

    @idempotent_function(store=store, key=lambda k: k, name="slow", wait=5.0)
    def slow_waiting(k: str) -> str:
        raise AssertionError("must not run")

    t = threading.Thread(target=slow, args=("a",))
    t.start()
    assert inside.wait(5)
    with pytest.raises(CallInFlight) as busy:
        slow("a")
    assert busy.value.retry_after > 0
    threading.Timer(0.3, go.set).start()
    assert slow_waiting("a") == "ok"
    t.join()


def test_async_functions_and_blocks() -> None:
    store = stores.MemoryStore()
    runs: List[int] = []

    @idempotent_function(store=store, key=lambda n: str(n), name="aio")
    async def work(n: int) -> Receipt:
        await asyncio.sleep(0.01)
        runs.append(n)
        return Receipt("o", n)

    async def main() -> None:
        got = await asyncio.gather(*(work(1) for _ in range(5)), return_exceptions=True)
        done = [g for g in got if isinstance(g, Receipt)]
        assert done and all(d == Receipt("o", 1) for d in done)
        assert all(isinstance(g, (Receipt, CallInFlight)) for g in got)
        assert await work(1) == Receipt("o", 1)

    asyncio.run(main())
    assert runs == [1]

    with idempotent_call("block", key="b-1", payload={"x": 1}, store=store) as call:
        assert not call.replayed and call.context is not None
        call.set_result({"sent": True})
    with idempotent_call("block", key="b-1", payload={"x": 1}, store=store) as call:
        assert call.replayed and call.result == {"sent": True}


CONSUMER = textwrap.dedent(
    """
    import sys, time, json
    from idempo import stores
    from idempo.functions import idempotent_function, current_call
    kind, target, log, takeover = sys.argv[1:5]
    store = (stores.SQLiteStore(target) if kind == "sqlite" else
             stores.RedisStore(target) if kind == "redis" else stores.PostgresStore(target))

    @idempotent_function(store=store, key=lambda m: m["id"], payload=lambda m: {"id": m["id"]},
                         name="crashy", lease_ms=1000,
                         heartbeat_ms=300, takeover=takeover)
    def run(m):
        with open(log, "a") as f:
            f.write(json.dumps({"pid": __import__("os").getpid(),
                                "downstream": current_call().downstream_key}) + "\\n")
        if m.get("hang"):
            time.sleep(60)
        return "done"

    print(run(json.loads(sys.argv[5])), flush=True)
    """
)


@pytest.mark.parametrize("takeover", ["outcome_unknown", "re_run"])
@pytest.mark.parametrize("crash_kind", ["sqlite", "redis", "postgres"])
def test_kill_9_mid_function_then_redelivery(
    crash_kind: str, takeover: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if crash_kind == "sqlite":
        target = str(tmp_path / "crash.sqlite3")
    else:
        services = request.getfixturevalue("services")
        if crash_kind == "redis":
            _flush_redis(services.redis_url)
            target = services.redis_url
        else:
            _truncate_pg(services.pg_dsn)
            target = services.pg_dsn
    log = tmp_path / "runs.log"
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)

    def deliver(hang: bool) -> subprocess.Popen[str]:
        msg = '{"id": "m-1", "hang": %s}' % ("true" if hang else "false")
        return subprocess.Popen(
            [sys.executable, str(script), crash_kind, target, str(log), takeover, msg],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    first = deliver(hang=True)
    deadline = time.monotonic() + 20
    while not (log.exists() and log.read_text().strip()):
        assert time.monotonic() < deadline, first.communicate(timeout=5)
        time.sleep(0.05)
    # Redelivered while the first consumer's heartbeats keep its lease: in flight, not run.
    busy = deliver(hang=False)
    _, err = busy.communicate(timeout=30)
    assert "CallInFlight" in err, err
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=30)
    time.sleep(1.5)  # the lease (1 s) expires without heartbeats
    second = deliver(hang=False)
    out, err = second.communicate(timeout=30)
    lines = [line for line in log.read_text().splitlines() if line]
    if takeover == "outcome_unknown":
        assert "CallOutcomeUnknown" in err, err
        assert len(lines) == 1  # never run twice
    else:
        assert out.strip() == "done", err
        assert len(lines) == 2
        import json

        a, b = (json.loads(line) for line in lines)
        assert a["downstream"] == b["downstream"]  # a downstream-keyed effect deduplicates
    third = deliver(hang=False)
    out, err = third.communicate(timeout=30)
    if takeover == "outcome_unknown":
        assert "CallOutcomeUnknown" in err, err
    if takeover == "re_run":
        assert out.strip() == "done"
        assert len([x for x in log.read_text().splitlines() if x]) == 2


TX_CONSUMER = textwrap.dedent(
    """
    import sys, time, json
    from idempo import stores
    from idempo.functions import idempotent_function, current_call
    kind, target, hang = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    store = stores.SQLiteStore(target) if kind == "sqlite" else stores.PostgresStore(target)
    mark = "?" if kind == "sqlite" else "%s"

    @idempotent_function(store=store, key=lambda m: m["id"], name="tx.job", transactional=True)
    def run(m):
        conn = current_call().transaction.connection
        conn.execute(f"INSERT INTO job_effect (job) VALUES ({mark})", (m["id"],))
        print("inside", flush=True)
        if hang:
            time.sleep(60)
        return "done"

    print(run({"id": "j-1"}), flush=True)
    """
)


@pytest.mark.parametrize("tx_kind", ["sqlite", "postgres"])
def test_transactional_call_killed_mid_function_leaves_nothing_and_runs_once(
    tx_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The job's write shares the store's transaction: a kill -9 rolls it back with the claim,
    the redelivery runs it (at once: the claim was never committed), and the effect exists once."""
    import sqlite3

    import psycopg

    if tx_kind == "sqlite":
        target = str(tmp_path / "tx.sqlite3")
        stores.SQLiteStore(target).close()

        def effects() -> int:
            with sqlite3.connect(target) as c:
                return int(c.execute("SELECT count(*) FROM job_effect").fetchone()[0])

        with sqlite3.connect(target) as c:
            c.execute("CREATE TABLE job_effect (job TEXT)")
    else:
        services = request.getfixturevalue("services")
        _truncate_pg(services.pg_dsn)
        target = services.pg_dsn

        def effects() -> int:
            with psycopg.connect(target) as c:
                row = c.execute("SELECT count(*) FROM job_effect").fetchone()
                assert row is not None
                return int(row[0])

        with psycopg.connect(target) as c:
            c.execute("DROP TABLE IF EXISTS job_effect")
            c.execute("CREATE TABLE job_effect (job text)")
    script = tmp_path / "tx_consumer.py"
    script.write_text(TX_CONSUMER)

    def deliver(hang: bool) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(script), tx_kind, target, "1" if hang else "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    first = deliver(hang=True)
    assert first.stdout is not None
    assert first.stdout.readline().strip() == "inside"
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=30)
    assert effects() == 0  # rolled back with the claim
    out, err = deliver(hang=False).communicate(timeout=60)
    assert out.splitlines()[-1] == "done", err
    out, err = deliver(hang=False).communicate(timeout=60)
    assert out.strip() == "done", err  # replayed: no "inside"
    assert effects() == 1


def test_call_vectors() -> None:
    """spec/vectors/call/call.json (generated by an independent model) through the extension."""
    import json

    from conftest import VECTORS
    from idempo._idempo import Call, call_raised, call_returned, call_wait_delay

    doc = json.loads((VECTORS / "call" / "call.json").read_text())
    for case in doc["cases"]:
        call = Call(case["function"])
        assert call.scope(case["principal"], case["key"]).hex() == case["scope_hex"], case["name"]
        fp = idempo.Fingerprinter(
            exclude=case["exclude"],
            hmac_key=case["hmac_key"].encode() if case["hmac_key"] else None,
        )
        assert call.fingerprint(fp, case["payload"].encode()) == case["fingerprint"], case["name"]
    result = doc["result"]
    status, headers, body = call_returned(result["serializer"], result["body"].encode())
    assert (status, headers[0][1], body) == (
        result["status"], result["content_type"], result["body"].encode()
    )
    stored = call_raised("store", b"{}")
    assert stored[0] == "finished" and stored[1] == doc["stored_error"]["status"]
    for w in doc["wait_delay"]:
        got = call_wait_delay(w["attempt"], w["retry_after_ms"], w["elapsed_ms"], w["budget_ms"],
                              w["jitter"])
        assert got == w["delay_ms"], w
