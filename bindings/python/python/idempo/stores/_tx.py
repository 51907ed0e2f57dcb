"""Transactional mode (``spec/STORAGE.md`` §4.4, ``spec/PROTOCOL.md`` §11).

The handler's business writes and the idempotency record commit in one database transaction:
``BEGIN``; claim; the handler writes on the same connection; complete; ``COMMIT``; only then is the
response sent. A handler error or a release rolls everything back; a crash before ``COMMIT``
leaves nothing (the key is claimable at once, no lease to wait for). Duplicates block on the
record's row lock until the first transaction ends, then replay its response; one that waits
longer than the lock timeout is answered like an in-flight request (409 with ``Retry-After``).

Core decides everything as usual: a store that supports the mode hands out a *session*
(``store.transaction()``) with the same primitives, bound to one connection and one
transaction: ``claim`` opens the transaction, every later primitive (``complete`` included) only
writes inside it, and the transaction ends where core's transactional flow says
(``spec/PROTOCOL.md`` §7.6): ``commit`` runs ``COMMIT`` (core's ``commit`` operation),
``release`` is ``ROLLBACK``. Nothing a session does after its claim touches the database outside
that transaction.
The running handler reaches the connection with :func:`current_transaction`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Type

from idempo._idempo import IdempotencyError, InvalidArgument
from idempo.stores._base import PURGE_BATCH, unavailable


class TransactionalUnsupported(InvalidArgument):
    """Transactional mode was asked of a store that cannot run the handler in its transaction
    (only the SQL stores can: PostgreSQL and SQLite, sync and async)."""


class NoTransaction(IdempotencyError):
    """:func:`current_transaction` was called outside a handler running in transactional mode."""


@dataclass(frozen=True)
class Transaction:
    """The open database transaction a transactional handler runs in.

    ``connection`` is the store's connection with the transaction open on it: a
    ``psycopg.Connection`` (:class:`~idempo.stores.PostgresStore`), a
    ``psycopg.AsyncConnection`` (:class:`~idempo.stores.AsyncPostgresStore`) or a
    ``sqlite3.Connection`` (the SQLite stores). Write through it and do not commit or roll back:
    idempo commits after storing the response, or rolls back when the handler raises.
    """

    connection: Any
    store: Any


_current: ContextVar[Optional[Transaction]] = ContextVar("idempo_transaction", default=None)


def current_transaction() -> Transaction:
    """The transaction of the running transactional handler (raises :class:`NoTransaction`
    outside one)."""
    found = _current.get()
    if found is None:
        raise NoTransaction(
            "no idempo transaction here: the route is not transactional, or this code does not "
            "run inside its handler"
        )
    return found


def enter(transaction: Transaction) -> "Token[Optional[Transaction]]":
    """Makes ``transaction`` current (the host does this around the handler)."""
    return _current.set(transaction)


def leave(token: "Token[Optional[Transaction]]") -> None:
    """Restores what was current before :func:`enter`."""
    _current.reset(token)


def supports_transactions(store: Any) -> bool:
    """True when the store can open a transactional session."""
    return callable(getattr(store, "transaction", None))


def require_transactions(store: Any) -> None:
    """Raises :class:`TransactionalUnsupported` unless the store supports the mode."""
    if not supports_transactions(store):
        raise TransactionalUnsupported(
            f"{type(store).__name__} does not support transactional mode (use PostgresStore, "
            "AsyncPostgresStore, SQLiteStore or AsyncSQLiteStore)"
        )
    check = getattr(store, "check_transactional", None)
    if callable(check):
        check()


class ThreadedSession:
    """Runs a synchronous transactional session from asyncio on a thread of its own.

    A claim may block on a duplicate's lock for the whole lock timeout; on the shared
    ``asyncio.to_thread`` pool enough blocked duplicates would starve the very completion they
    wait for. One thread per session cannot starve: the session's steps run on it in order.
    """

    def __init__(self, sync: Any) -> None:
        import concurrent.futures

        self.sync = sync
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="idempo-tx"
        )

    @property
    def transaction(self) -> Optional[Transaction]:
        """The open transaction (after ``claim`` opened it)."""
        found: Optional[Transaction] = self.sync.transaction
        return found

    @property
    def committed(self) -> bool:
        """True once the transaction committed."""
        return bool(self.sync.committed)

    async def _call(self, name: str, *args: Any) -> Any:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(
            self._thread, getattr(self.sync, name), *args
        )

    async def claim(
        self, scope_key: bytes, fingerprint: str, token: bytes, lease_ms: int, ttl_ms: int
    ) -> Any:
        """``claim`` of the wrapped session."""
        return await self._call("claim", scope_key, fingerprint, token, lease_ms, ttl_ms)

    async def get(self, scope_key: bytes) -> Any:
        """``get`` of the wrapped session."""
        return await self._call("get", scope_key)

    async def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int
    ) -> Any:
        """``takeover`` of the wrapped session."""
        return await self._call("takeover", scope_key, seen_token, new_token, lease_ms)

    async def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int) -> Any:
        """``mark_unknown`` of the wrapped session."""
        return await self._call("mark_unknown", scope_key, seen_token, ttl_ms)

    async def complete(self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int) -> Any:
        """``complete`` (inside the open transaction) of the wrapped session."""
        return await self._call("complete", scope_key, token, response, ttl_ms)

    async def release(self, scope_key: bytes, token: bytes) -> Any:
        """``release`` (``ROLLBACK``) of the wrapped session."""
        return await self._call("release", scope_key, token)

    async def renew(self, scope_key: bytes, token: bytes, lease_ms: int) -> Any:
        """``renew`` of the wrapped session."""
        return await self._call("renew", scope_key, token, lease_ms)

    async def commit(self) -> None:
        """``COMMIT`` of the wrapped session (core's ``commit``)."""
        await self._call("commit")

    async def close(self) -> None:
        """Rolls back what is still open, gives the connection back, ends the thread."""
        try:
            await self._call("close")
        finally:
            self._thread.shutdown(wait=False)


class SessionEnds(ABC):
    """``release``, ``commit`` and ``close`` of a blocking transactional session, written once in
    terms of the session's ``open``, ``store`` and ``_end(commit=...)`` (abstract: a session
    class lacking one cannot be instantiated); driver errors of the types in ``_errors`` fail
    closed."""

    store: Any
    _errors: Tuple[Type[BaseException], ...]
    _what: str

    @property
    @abstractmethod
    def open(self) -> bool:
        """True while the transaction is open."""

    @abstractmethod
    def _end(self, *, commit: bool) -> None:
        """Ends the transaction (``COMMIT`` or ``ROLLBACK``) and gives its connection back."""

    def _ends(self, what: str, *, commit: bool) -> None:
        try:
            self._end(commit=commit)
        except self._errors as exc:
            raise unavailable(f"{self._what} {what} failed", exc) from exc

    def release(self, scope_key: bytes, token: bytes) -> bool:
        """``ROLLBACK``: the claim and the handler's writes vanish together. Without an open
        transaction there is nothing to roll back (False); nothing is deleted outside one."""
        if not self.open:
            return False
        self._ends("release", commit=False)
        return True

    def commit(self) -> None:
        """``COMMIT`` (core's ``commit``): the record and the handler's writes become durable
        together. A failed ``COMMIT``, or no open transaction to commit, raises
        :class:`~idempo.StoreUnavailable` (core answers 503, outcome ``not_committed``)."""
        if not self.open:
            raise no_open_transaction(self._what)
        self._ends("commit", commit=True)

    def close(self) -> None:
        """Rolls back what is still open and gives the connection back."""
        self._end(commit=False)

    def purge_expired(self, batch: int = PURGE_BATCH) -> Any:
        """Primitive 8 on the store itself (a background batch, never part of a request)."""
        return self.store.purge_expired(batch)


def no_open_transaction(what: str) -> BaseException:
    """The error of a session step that needs the transaction after it ended (fails closed)."""
    return unavailable(
        f"{what} transaction", RuntimeError("no open transaction (it ended or never began)")
    )
