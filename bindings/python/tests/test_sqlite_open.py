"""SQLiteStore opened at the same moment on one fresh file by several threads and by several
processes (as gunicorn workers or a restart storm open it): every open succeeds and each store can
claim. Before, the switch to WAL and the schema's DDL were refused at once with "database is
locked" (SQLite does not run its busy handler for those), and a worker died at start-up."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path
from typing import List

import pytest

from idempo import StoreUnavailable, stores


def _open_and_close(path: str) -> str:
    try:
        store = stores.SQLiteStore(path)
        store.close()
        return "ok"
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        return repr(exc)


def test_threads_opening_one_fresh_file_together_all_succeed(tmp_path: Path) -> None:
    failures: List[str] = []
    for round_ in range(60):
        path = str(tmp_path / f"r{round_}.sqlite3")
        gate = threading.Barrier(4)

        def worker(p: str = path, g: threading.Barrier = gate) -> None:
            g.wait()
            r = _open_and_close(p)
            if r != "ok":
                failures.append(r)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []


def _gated(path: str, gate: "multiprocessing.synchronize.Barrier") -> str:  # type: ignore[name-defined]
    gate.wait()
    return _open_and_close(path)


def test_processes_opening_one_fresh_file_together_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    failures: List[str] = []
    with ctx.Manager() as manager, ctx.Pool(4) as pool:
        for round_ in range(60):
            path = str(tmp_path / f"p{round_}.sqlite3")
            gate = manager.Barrier(4)
            results = pool.starmap(_gated, [(path, gate)] * 4)
            failures += [r for r in results if r != "ok"]
    assert failures == []


def test_a_file_held_past_busy_timeout_fails_the_open_with_store_unavailable(tmp_path: Path) -> None:
    path = str(tmp_path / "held.sqlite3")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("CREATE TABLE held (x)")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="busy_timeout_ms"):
            stores.SQLiteStore(path, busy_timeout_ms=120)
        assert time.monotonic() - started >= 0.1
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    stores.SQLiteStore(path).close()


def test_a_missing_directory_is_store_unavailable_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "no-such-dir" / "calls.sqlite3"
    with pytest.raises(StoreUnavailable, match="no-such-dir.*does its directory exist"):
        stores.SQLiteStore(path)
