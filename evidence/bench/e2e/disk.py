"""The disk's own synchronous commit rate, the physical limit of a durable embedded store.

``commit_rate(directory)``: a loop of one-row SQLite transactions (``BEGIN IMMEDIATE``, one
``INSERT``, ``COMMIT``) in WAL mode with ``synchronous=FULL`` (what idempo's SQLiteStore uses), in
a file of that directory, for ``seconds``; returns commits per second.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path


def commit_rate(directory: Path, seconds: float = 2.0) -> float:
    path = directory / "disk-commit-rate.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v BLOB)")
        row = b"x" * 200
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", (row,))
            conn.execute("COMMIT")
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                return n / (now - t0)
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
