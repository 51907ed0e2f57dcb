"""The purge process (``python -m idempo.purge``) against real stores, scraped over HTTP.

Each test fills a store with expired and live records, runs the process as users run it (a
subprocess with flags), reads ``/metrics`` and compares the figures with the store's own.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Tuple

import psycopg
import pytest
import redis

import idempo
from idempo.stores import PostgresStore, RedisStore, SQLiteStore

from storekit import _flush_redis, _truncate_pg

prom_parser = pytest.importorskip("prometheus_client.parser")

EXPIRED = 10_000
LIVE = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key(i: int) -> bytes:
    return hashlib.sha256(b"purge-%d" % i).digest()


def _rows(now_ms: int, count: int = EXPIRED) -> List[Tuple[Any, ...]]:
    """``count`` expired records (states cycling) and LIVE live completed ones."""
    response = idempo.encode_response(201, [], b"{}")
    rows: List[Tuple[Any, ...]] = []
    for i in range(count + LIVE):
        expired = i < count
        state = (i % 3) + 1 if expired else 2
        exp = now_ms - 1_000 - i if expired else now_ms + 3_600_000
        lease = exp if state == 1 else None
        rows.append((_key(i), "v1:" + "a" * 64, state, os.urandom(16), 1, lease, exp,
                     response if state == 2 else None))
    return rows


def _expected_states(count: int = EXPIRED) -> Dict[str, int]:
    states = [(i % 3) + 1 for i in range(count)]
    return {
        "in_progress": states.count(1),
        "completed": states.count(2),
        "outcome_unknown": states.count(3),
    }


class Proc:
    def __init__(self, url: str, *extra: str) -> None:
        self.port = _free_port()
        self._out = ""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "idempo.purge", "--store-url", url, "--metrics-port",
             str(self.port), "--metrics-addr", "127.0.0.1", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )

    def metrics(self) -> Dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read()
        out: Dict[str, float] = {}
        for family in prom_parser.text_string_to_metric_families(text.decode()):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def wait_for(self, predicate: Any, timeout: float = 60) -> Dict[str, float]:
        end = time.monotonic() + timeout
        last: Dict[str, float] = {}
        while time.monotonic() < end:
            if self.p.poll() is not None:
                raise AssertionError(f"purge process exited {self.p.returncode}: {self.output()}")
            try:
                last = self.metrics()
            except OSError:
                time.sleep(0.1)
                continue
            if predicate(last):
                return last
            time.sleep(0.1)
        raise AssertionError(f"metrics never matched: {last}")

    def stop(self) -> Tuple[int, str]:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        code = self.p.wait(timeout=30)
        return code, self.output()

    def output(self) -> str:
        if self.p.poll() is None:
            return ""
        assert self.p.stdout is not None
        if self.p.stdout.closed:
            return self._out
        self._out: str = self.p.stdout.read()
        self.p.stdout.close()
        return self._out


def _ok_runs(m: Dict[str, float]) -> float:
    return m.get("idempo_purge_runs_total{result=ok}", 0)


def _purged(m: Dict[str, float]) -> Dict[str, float]:
    return {s: m.get(f"idempo_purged_records_total{{state={s}}}", 0) for s in _expected_states()}


def _check_after_purge(
    m: Dict[str, float], started: float, sized: bool, count: int = EXPIRED
) -> None:
    assert _purged(m) == _expected_states(count)
    assert m["idempo_records{state=completed}"] == LIVE
    assert m["idempo_records{state=in_progress}"] == 0
    assert m["idempo_records{state=outcome_unknown}"] == 0
    assert m["idempo_records_expired"] == 0
    assert m["idempo_purge_lag_seconds"] == 0
    assert m["idempo_purge_last_success_timestamp_seconds"] >= started - 1
    assert m["idempo_purge_batch_duration_seconds_count"] >= count / 1000
    if sized:
        assert m["idempo_store_size_bytes"] > 0


def _fill_pg(dsn: str) -> None:
    _truncate_pg(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        now = int(conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
                  .fetchone()[0])  # type: ignore[index]
        with conn.cursor() as cur:
            with cur.copy(
                "COPY idempo_record (scope_key, fingerprint, state, token, generation, "
                "lease_until, expires_at, response) FROM STDIN"
            ) as copy:
                for row in _rows(now):
                    copy.write_row(row)


def test_stats_before_and_after_a_purge_match_the_store(services: Any) -> None:
    _fill_pg(services.pg_dsn)
    store = PostgresStore(services.pg_dsn)
    try:
        before = store.stats()
        assert (before.in_progress, before.completed, before.outcome_unknown) == (
            _expected_states()["in_progress"],
            _expected_states()["completed"] + LIVE,
            _expected_states()["outcome_unknown"],
        )
        assert before.expired == EXPIRED
        assert before.purge_lag_ms is not None and before.purge_lag_ms >= 1_000 + EXPIRED - 1
        assert before.size_bytes is not None and before.size_bytes > 0
        idempo.stores.purge_all(store, batch=1000)
        after = store.stats()
        assert (after.expired, after.purge_lag_ms, after.total) == (0, None, LIVE)
    finally:
        store.close()


def test_postgres_purge_process_purges_and_exports_the_figures(services: Any) -> None:
    _fill_pg(services.pg_dsn)
    started = time.time()
    proc = Proc(services.pg_dsn, "--interval", "0.3", "--batch", "1000")
    try:
        m = proc.wait_for(lambda m: _ok_runs(m) >= 1 and sum(_purged(m).values()) >= EXPIRED)
        _check_after_purge(m, started, sized=True)
    finally:
        code, out = proc.stop()
    assert code == 0, out
    assert "run ok: purged" in out and "run failed" not in out


def test_two_purge_processes_on_postgres_share_the_work(services: Any) -> None:
    _fill_pg(services.pg_dsn)
    a = Proc(services.pg_dsn, "--interval", "0.2", "--batch", "200")
    b = Proc(services.pg_dsn, "--interval", "0.2", "--batch", "200")
    try:
        def done(m: Dict[str, float]) -> bool:
            return _ok_runs(m) >= 2 and m.get("idempo_records_expired", 1) == 0

        ma = a.wait_for(done)
        mb = b.wait_for(done)
        total = {s: _purged(ma)[s] + _purged(mb)[s] for s in _expected_states()}
        assert total == _expected_states(), (total, _purged(ma), _purged(mb))
    finally:
        ca, oa = a.stop()
        cb, ob = b.stop()
    assert (ca, cb) == (0, 0), (oa, ob)
    assert "run failed" not in oa + ob, oa + ob


def test_sigterm_mid_run_stops_between_batches_and_leaves_nothing_locked(services: Any) -> None:
    _fill_pg(services.pg_dsn)
    proc = Proc(services.pg_dsn, "--interval", "0.1", "--batch", "10", "--max-batches", "100000")
    try:
        proc.wait_for(lambda m: sum(_purged(m).values()) > 0)
    finally:
        code, out = proc.stop()
    assert code == 0, out
    assert "SIGTERM: stopping after the batch under way" in out
    with psycopg.connect(services.pg_dsn, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM idempo_record").fetchone()
        assert left is not None and LIVE < left[0] < EXPIRED + LIVE  # stopped mid-run
        locks = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON l.relation = c.oid "
            "WHERE c.relname = 'idempo_record' AND l.pid <> pg_backend_pid()"
        ).fetchone()
        assert locks == (0,)
        # Every remaining row is intact and purgeable by the next run.
        store = PostgresStore(services.pg_dsn)
        try:
            idempo.stores.purge_all(store, batch=1000)
            assert store.stats().total == LIVE
        finally:
            store.close()


def test_sqlite_purge_process(tmp_path: Path) -> None:
    path = tmp_path / "idempo.sqlite3"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    now = int(time.time() * 1000)
    conn.executemany("INSERT INTO idempo_record VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _rows(now))
    conn.commit()
    conn.close()
    started = time.time()
    proc = Proc(f"sqlite://{path}", "--interval", "0.3")
    try:
        m = proc.wait_for(lambda m: _ok_runs(m) >= 1 and sum(_purged(m).values()) >= EXPIRED)
        _check_after_purge(m, started, sized=True)
    finally:
        code, out = proc.stop()
    assert code == 0, out


REDIS_EXPIRED = 2_000
"""Redis keeps no expiry index: each run scans every key (fewer records keep the test short)."""


def test_redis_purge_process(services: Any) -> None:
    _flush_redis(services.redis_url)
    client = redis.Redis.from_url(services.redis_url)
    now = int(client.time()[0]) * 1000
    pipe = client.pipeline(transaction=False)
    names = ("fingerprint", "state", "token", "generation", "lease_until", "expires_at", "response")
    for row in _rows(now, REDIS_EXPIRED):
        fields = {n: v for n, v in zip(names, row[1:]) if v is not None}
        pipe.hset(b"idempo:" + row[0].hex().encode(), mapping=fields)  # type: ignore[arg-type]
    pipe.execute()
    started = time.time()
    proc = Proc(services.redis_url, "--interval", "0.3")
    try:
        m = proc.wait_for(
            lambda m: _ok_runs(m) >= 1 and sum(_purged(m).values()) >= REDIS_EXPIRED
        )
        _check_after_purge(m, started, sized=False, count=REDIS_EXPIRED)
        assert "idempo_store_size_bytes" not in m or m["idempo_store_size_bytes"] == 0
    finally:
        code, out = proc.stop()
        client.close()
    assert code == 0, out
    store = RedisStore(services.redis_url)
    try:
        assert store.stats().total == LIVE
    finally:
        store.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no store"),
        (["--store-url", "mysql://db/app"], "unknown store URL scheme 'mysql'"),
        (["--store-url", "sqlite://"], "needs a path"),
        (["--store-url", "sqlite:///tmp/x.sqlite3", "--interval", "0"], "--interval must be positive"),
        (["--store-url", "sqlite:///tmp/x.sqlite3", "--batch", "0"], "at least 1"),
    ],
)
def test_configuration_errors_exit_2_before_anything_runs(args: List[str], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMPO_")}
    p = subprocess.run([sys.executable, "-m", "idempo.purge", "--once", *args],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr, p.stderr


@pytest.mark.parametrize("make", ["missing", "no-table"])
def test_a_sqlite_url_that_names_no_idempo_database_exits_2(tmp_path: Path, make: str) -> None:
    path = tmp_path / "wrong.sqlite3"
    if make == "no-table":
        sqlite3.connect(path).close()
    p = subprocess.run([sys.executable, "-m", "idempo.purge", "--once", "--store-url",
                        f"sqlite://{path}"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "is this the service's file?" in p.stderr
    assert path.exists() == (make == "no-table")  # nothing was created


def test_a_failed_run_is_reported_and_once_exits_1(services: Any) -> None:
    # A PostgreSQL server that does not answer: the run fails (logged), --once exits 1.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run(
        [sys.executable, "-m", "idempo.purge", "--once", "--store-url",
         f"postgresql://postgres@127.0.0.1:{port}/postgres"],
        capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 1, p.stderr
    assert "run failed" in p.stderr


def test_environment_configures_the_process(tmp_path: Path) -> None:
    path = tmp_path / "env.sqlite3"
    SQLiteStore(path).close()
    env = {**os.environ, "IDEMPO_STORE_URL": f"sqlite://{path}", "IDEMPO_PURGE_BATCH": "7"}
    p = subprocess.run([sys.executable, "-m", "idempo.purge", "--once"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "batches of 7" in p.stderr and "run ok: purged 0" in p.stderr
