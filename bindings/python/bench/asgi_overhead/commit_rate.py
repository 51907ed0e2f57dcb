"""The disk's own synchronous commit rate: SQLite in WAL mode with synchronous=FULL (what
SQLiteStore runs), one row per BEGIN IMMEDIATE ... COMMIT, one connection. A durable store's
physical limit: a fresh request needs two such commits (the claim, then the completion).
"""
import sqlite3
import time
import os
import tempfile
d = tempfile.mkdtemp(dir="/tmp")
c = sqlite3.connect(os.path.join(d, "c.db"), isolation_level=None)
c.execute("PRAGMA journal_mode=WAL")
c.execute("PRAGMA synchronous=FULL")
c.execute("CREATE TABLE t(x)")
n = 300
t = time.perf_counter()
for i in range(n):
    c.execute("BEGIN IMMEDIATE")
    c.execute("INSERT INTO t VALUES (?)", (i,))
    c.execute("COMMIT")
dt = time.perf_counter() - t
print(f"synchronous=FULL WAL commits/s: {n/dt:.0f} ({dt/n*1e3:.2f} ms each)")
