"""Pending-key stores for the client's intents (``spec/KEYS.md`` §3.6).

A client that names its user intents (``intent="checkout-<cart id>"``) keeps, per intent, a
:class:`PendingIntent`: the key sent with every attempt, the fingerprint of the request the key
was minted for, and when. The record stays until the server gives a definitive answer, so a retry,
a second click or a restart of the process sends the same key, and a changed request under the
intent is refused instead of becoming a second charge.

A store's one rule: :meth:`PendingKeyStore.get_or_create` is **atomic** (a lock, a transaction),
so two threads or two processes cannot mint two keys for one intent.
:class:`SQLitePendingKeyStore` is the durable store (one file, any number of processes);
:class:`MemoryPendingKeyStore` keeps records for the life of the process.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from dataclasses import dataclass
from typing import Dict, Optional, Protocol, runtime_checkable

__all__ = ["MemoryPendingKeyStore", "PendingIntent", "PendingKeyStore", "SQLitePendingKeyStore"]


@dataclass(frozen=True)
class PendingIntent:
    """The pending record of one intent."""

    #: The key text sent with every attempt of the intent.
    key: str
    #: Core's fingerprint (``v1:…``) of the request the key was minted for
    #: (``idempo.intent_request_fingerprint``).
    fingerprint: str
    #: When the record was created, in unix milliseconds.
    created_ms: int


@runtime_checkable
class PendingKeyStore(Protocol):
    """Where a client keeps its pending intents. ``get_or_create`` must be atomic."""

    def get(self, intent: str) -> Optional[PendingIntent]:
        """The record of ``intent``, or None."""
        ...

    def get_or_create(self, intent: str, candidate: PendingIntent) -> PendingIntent:
        """The record of ``intent``; when there is none, stores ``candidate`` and returns it."""
        ...

    def remove(self, intent: str) -> None:
        """Forgets the record of ``intent`` (no error if there is none)."""
        ...


class MemoryPendingKeyStore:
    """Records in a dict behind a lock (they do not survive the process)."""

    def __init__(self) -> None:
        self._records: Dict[str, PendingIntent] = {}
        self._lock = threading.Lock()

    def get(self, intent: str) -> Optional[PendingIntent]:
        with self._lock:
            return self._records.get(intent)

    def get_or_create(self, intent: str, candidate: PendingIntent) -> PendingIntent:
        with self._lock:
            return self._records.setdefault(intent, candidate)

    def remove(self, intent: str) -> None:
        with self._lock:
            self._records.pop(intent, None)

    def all(self) -> Dict[str, PendingIntent]:
        """Every pending intent (e.g. to reconcile them at start-up)."""
        with self._lock:
            return dict(self._records)


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS idempo_pending_intents ("
    " intent TEXT PRIMARY KEY NOT NULL,"
    " key TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL,"
    " created_ms INTEGER NOT NULL)"
)


class SQLitePendingKeyStore:
    """Records in a SQLite file (table ``idempo_pending_intents``), shared by every thread and
    process that opens the same path. ``get_or_create`` is one ``BEGIN IMMEDIATE`` transaction
    (insert if absent, then read), so concurrent callers read one record.

    Keep the file somewhere durable (not a temp or cache folder): losing it means a retry after
    a restart uses a new key.
    """

    def __init__(self, path: str, *, timeout: float = 30.0) -> None:
        self.path = path
        self._timeout = timeout
        with closing(self._connect()) as db:
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        # Autocommit mode: every transaction below is explicit.
        return sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)

    @staticmethod
    def _row(row: "tuple[str, str, int] | None") -> Optional[PendingIntent]:
        if row is None:
            return None
        return PendingIntent(key=str(row[0]), fingerprint=str(row[1]), created_ms=int(row[2]))

    def get(self, intent: str) -> Optional[PendingIntent]:
        with closing(self._connect()) as db:
            return self._row(
                db.execute(
                    "SELECT key, fingerprint, created_ms FROM idempo_pending_intents WHERE intent = ?",
                    (intent,),
                ).fetchone()
            )

    def get_or_create(self, intent: str, candidate: PendingIntent) -> PendingIntent:
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT INTO idempo_pending_intents (intent, key, fingerprint, created_ms) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (intent) DO NOTHING",
                    (intent, candidate.key, candidate.fingerprint, candidate.created_ms),
                )
                row = db.execute(
                    "SELECT key, fingerprint, created_ms FROM idempo_pending_intents WHERE intent = ?",
                    (intent,),
                ).fetchone()
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        record = self._row(row)
        assert record is not None  # inserted or found in the same transaction
        return record

    def remove(self, intent: str) -> None:
        with closing(self._connect()) as db:
            db.execute("DELETE FROM idempo_pending_intents WHERE intent = ?", (intent,))

    def all(self) -> Dict[str, PendingIntent]:
        """Every pending intent (e.g. to reconcile them at start-up)."""
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT intent, key, fingerprint, created_ms FROM idempo_pending_intents"
            ).fetchall()
        return {str(r[0]): PendingIntent(str(r[1]), str(r[2]), int(r[3])) for r in rows}
