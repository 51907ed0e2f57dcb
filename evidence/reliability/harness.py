"""The reliability suite's harness: the summary row, the app's effects database, one store
under test, and the request and outcome helpers every scenario uses (run.py, topologies.py)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from evidence.lib.http import Client, Reply
from evidence.lib.services import Server, Services

APPS = {
    "python": "evidence.reliability.app:app",
    "node": str(Path(__file__).resolve().parent / "node_app.cjs"),
}
STORE_TIMEOUT_MS = 2000
"""Client-side store deadline given to the apps (``EV_STORE_TIMEOUT_MS``): a hung store must be
answered with 503 within it (plus HUNG_SLACK_MS for a loaded machine)."""
HUNG_SLACK_MS = 1000
NODE_PURGE = str(Path(__file__).resolve().parent / "node_purge.cjs")
LEASE_MS = 1000
SHORT_TTL_MS = 3000
TTL_MARGIN_MS = 1000
"""Replays are required until expiry minus this margin, a new run from expiry plus half of it
(a loaded machine can delay a request by hundreds of milliseconds)."""
SQLITE_BUSY_MS = 5000
"""SQLite busy_timeout of the app (the store's default): the bound on a 503 when the file is locked."""
STEPS = ("after_claim", "in_handler", "after_effect", "before_complete", "after_complete")
MODES = ("ou", "rerun", "keyed")


@dataclass
class Row:
    """One line of the summary table."""

    store: str
    scenario: str
    app: str = "python"
    trials: int = 0
    executions: int = 0
    outcomes: Counter = field(default_factory=Counter)
    violations: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    seconds: float = 0.0

    def bad(self, msg: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(msg)
        else:
            self.violations[-1] = f"... and more ({msg})"


def classify(r: Reply) -> str:
    """A short outcome label for a reply."""
    if r.replayed:
        return f"{r.status} replay"
    t = r.problem_type.rsplit(":", 1)[-1]
    return f"{r.status} {t}" if t else f"{r.status}"


def body(tag: str, amount: int = 100) -> bytes:
    return json.dumps({"amount": amount, "currency": "EUR", "tag": tag}).encode()


def new_key() -> str:
    return uuid.uuid4().hex


class Effects:
    """Read access to the app's effects database."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _q(self, sql: str, args: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def rows(self, key: str) -> List[Tuple[Any, ...]]:
        return self._q("SELECT id, route, generation, downstream_key, tag, pid FROM effects WHERE key = ?", (key,))

    def per_key(self, keys: List[str]) -> Dict[str, List[Tuple[Any, ...]]]:
        out: Dict[str, List[Tuple[Any, ...]]] = {k: [] for k in keys}
        for i in range(0, len(keys), 500):
            chunk = keys[i:i + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._q(
                f"SELECT key, id, route, generation, downstream_key, tag FROM effects WHERE key IN ({marks})",
                tuple(chunk),
            ):
                out[row[0]].append(row[1:])
        return out

    def downstream(self, dkey: str) -> int:
        return int(self._q("SELECT count(*) FROM downstream WHERE downstream_key = ?", (dkey,))[0][0])

    def started_pid(self, key: str) -> Optional[int]:
        rows = self._q("SELECT pid FROM started WHERE key = ?", (key,))
        return int(rows[0][0]) if rows else None

    def total(self) -> int:
        return int(self._q("SELECT count(*) FROM effects")[0][0])


@dataclass
class Target:
    """One store under test: its server, client and effects."""

    name: str
    url: str
    workers: int
    server: Server
    effects: Effects
    svc: Optional[Services]
    app: str = "python"
    mem_dir: Optional[Path] = None
    """Node app: where its workers log ``process.memoryUsage()`` (node_app.cjs, EV_MEM_DIR)."""

    def row(self, scenario: str) -> Row:
        return Row(self.name, scenario, self.app)

    def client(self) -> Client:
        return Client("127.0.0.1", self.server.port, timeout=30)


async def post(c: Client, route: str, key: Optional[str], data: bytes, *, extra: Optional[List[Tuple[str, str]]] = None,
               fresh: bool = False, timeout: Optional[float] = None) -> Reply:
    headers: List[Tuple[Any, Any]] = [("content-type", "application/json")]
    if key is not None:
        headers.append(("idempotency-key", key))
    headers.extend(extra or [])
    return await c.request("POST", route, headers=headers, body=data, fresh=fresh, timeout=timeout)


TX_TABLE = {
    "postgres": "CREATE TABLE IF NOT EXISTS ev_effects_tx (id bigserial PRIMARY KEY, key text, generation integer, "
                "tag text, pid integer)",
    "sqlite": "CREATE TABLE IF NOT EXISTS ev_effects_tx (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, "
              "generation INTEGER, tag TEXT, pid INTEGER)",
}
"""The transactional route's execution table, in the store's own database (``/pay/tx`` of app.py and node_app.cjs)."""


def store_sql(t: Target, sql: str, args: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """One statement on the store's database (PostgreSQL or SQLite), autocommit."""
    if t.name == "postgres":
        import psycopg

        with psycopg.connect(t.url, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), args)
            return list(cur.fetchall()) if cur.description else []
    lite = sqlite3.connect(t.url, timeout=30, isolation_level=None)
    try:
        return list(lite.execute(sql, args).fetchall())
    finally:
        lite.close()


def print_table(rows: List[Row], header: str) -> None:
    print()
    print(header)
    cols = ("app", "store", "scenario", "trials", "executions", "violations", "time", "outcomes / figures")
    print(f"{cols[0]:<7} {cols[1]:<9} {cols[2]:<31} {cols[3]:>8} {cols[4]:>10} {cols[5]:>10} {cols[6]:>7}  {cols[7]}")
    print("-" * 140)
    for r in rows:
        outs = ", ".join(f"{k}: {v}" for k, v in sorted(r.outcomes.items(), key=lambda kv: -kv[1]))
        extra = "; ".join([outs, *r.notes]) if outs else "; ".join(r.notes)
        print(f"{r.app:<7} {r.store:<9} {r.scenario:<31} {r.trials:>8} {r.executions:>10} {len(r.violations):>10} "
              f"{r.seconds:>6.1f}s  {extra}")
    bad = [r for r in rows if r.violations]
    totals: Dict[str, int] = Counter()
    for r in rows:
        totals[f"{r.app} {r.store}"] += r.trials
    print("-" * 140)
    print("trials per app and store: " + ", ".join(f"{k} {v:,}" for k, v in totals.items()))
    if bad:
        print("\nVIOLATIONS:")
        for r in bad:
            for v in r.violations:
                print(f"  {r.app} / {r.store} / {r.scenario}: {v}")
