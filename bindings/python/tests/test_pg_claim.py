"""PostgreSQL's claim statement (``spec/STORAGE.md`` §4.3) on a real server: one round trip when it
finds a live record, and the record it reports is the one its conflict arm locked (the newest
committed version), not an older one from the statement's snapshot."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Iterator, List, Tuple

import psycopg
import pytest
from conftest import Services

from idempo._plan import drive
from idempo.stores import PostgresStore
from idempo.stores._base import Claimed, Existing
from idempo.stores.postgres._plans import SQL_COMPLETE, _bind, _claim, _execute

pytestmark = pytest.mark.services

FP = "v1:" + "a" * 64
OTHER_FP = "v1:" + "b" * 64


@pytest.fixture()
def dsn(services: Services) -> Iterator[str]:
    store = PostgresStore(services.pg_dsn)
    store.create_schema()
    store.close()
    yield services.pg_dsn


def claim_counting(dsn: str, key: bytes, fingerprint: str = FP) -> Tuple[Any, List[str]]:
    """Primitive 1 driven on its own autocommit connection; the statements it sent."""
    sent: List[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:

        def run(op: Any) -> Any:
            sent.append(op.sql)
            return _execute(conn, op, _bind(op, None), False)

        result = drive(_claim(key, fingerprint, os.urandom(16), 30_000, 60_000), run)
    return result, sent


def test_a_fresh_claim_and_a_duplicate_are_one_statement_each(dsn: str) -> None:
    key = os.urandom(32)
    first, sent = claim_counting(dsn, key)
    assert isinstance(first, Claimed) and first.generation == 1 and len(sent) == 1
    again, sent = claim_counting(dsn, key, OTHER_FP)
    assert isinstance(again, Existing) and len(sent) == 1
    assert again.record.fingerprint == FP and again.record.state == 1


def test_a_replay_reads_the_stored_response_in_the_claim_itself(dsn: str) -> None:
    store = PostgresStore(dsn)
    try:
        key, tok = os.urandom(32), os.urandom(16)
        assert isinstance(store.claim(key, FP, tok, 30_000, 60_000), Claimed)
        assert store.complete(key, tok, b"stored answer", 60_000)
    finally:
        store.close()
    replay, sent = claim_counting(dsn, key)
    assert isinstance(replay, Existing) and len(sent) == 1
    assert replay.record.state == 2 and replay.record.response == b"stored answer"


def test_a_completion_committed_while_the_claim_waits_is_what_it_reports(dsn: str) -> None:
    """The owner's completion holds the row when the duplicate's claim begins and commits while
    the claim waits on the row lock: the claim reports the completed record (a replay), not the
    in-progress version its snapshot holds."""
    store = PostgresStore(dsn)
    key, tok = os.urandom(32), os.urandom(16)
    try:
        assert isinstance(store.claim(key, FP, tok, 30_000, 60_000), Claimed)
    finally:
        store.close()
    owner = psycopg.connect(dsn)  # a transaction: the completion is not yet committed
    try:
        owner.execute(SQL_COMPLETE, {"p1": key, "p2": tok, "p3": b"done", "p4": 60_000, "p5": None})
        got: List[Any] = []
        waiter = threading.Thread(target=lambda: got.append(claim_counting(dsn, key)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive(), "the claim did not wait on the owner's row lock"
        owner.commit()
        waiter.join(10)
    finally:
        owner.close()
    result, sent = got[0]
    assert isinstance(result, Existing) and len(sent) == 1
    assert result.record.state == 2 and result.record.response == b"done"


def test_a_row_inserted_after_the_claim_began_is_read_by_a_second_statement(dsn: str) -> None:
    """The conflicting row is not in the claim statement's snapshot (its inserter committed while
    the claim waited): no row comes back, and the claim runs again and reports it."""
    key = os.urandom(32)
    other = psycopg.connect(dsn)
    try:
        other.execute(
            "INSERT INTO idempo_record VALUES (%s, %s, 1, %s, 1, %s, %s, NULL)",
            (key, OTHER_FP, os.urandom(16), 2**52, 2**52),
        )
        got: List[Any] = []
        waiter = threading.Thread(target=lambda: got.append(claim_counting(dsn, key)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive(), "the claim did not wait on the inserter's row"
        other.commit()
        waiter.join(10)
    finally:
        other.close()
    result, sent = got[0]
    assert isinstance(result, Existing) and result.record.fingerprint == OTHER_FP
    assert len(sent) == 2
