"""A claim's result reaches core the same whether it is one of idempo's own result classes
(recognised by type) or any object with the contract's attributes (recognised by them)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from idempo import Config
from idempo._idempo import ServerFlow, encode_response
from idempo.stores import Claimed, Existing, Locked, MemoryStore
from idempo.stores._base import StoredRecord

FP = "v1:" + "4" * 64
SCOPE = bytes([9]) * 32
NOW = 50_000


def completed(fp: str = FP) -> StoredRecord:
    body = encode_response(201, [("content-type", "application/json")], b'{"ok":1}')
    return StoredRecord(SCOPE, fp, 2, b"\x05" * 16, 1, None, NOW + 60_000, body)


def in_progress() -> StoredRecord:
    return StoredRecord(SCOPE, FP, 1, b"\x05" * 16, 1, NOW + 5_000, NOW + 60_000, None)


def first_answer(result: Any) -> Any:
    flow, action = ServerFlow.start(SCOPE, FP, Config(), b"\x01" * 16)
    assert action.kind == "store" and action.op == "claim"
    return flow.store_result(result)


class MyClaimed(Claimed):
    pass


@pytest.mark.parametrize("result", [
    Claimed(3, NOW),
    MyClaimed(3, NOW),
    types.SimpleNamespace(generation=3, now_ms=NOW),
], ids=["Claimed", "subclass", "duck"])
def test_a_claim_is_recognised(result: Any) -> None:
    action = first_answer(result)
    assert action.kind == "run_handler" and action.generation == 3


@pytest.mark.parametrize("make", [
    lambda r: Existing(r, NOW),
    lambda r: types.SimpleNamespace(record=r, now_ms=NOW),
], ids=["Existing", "duck"])
def test_an_existing_record_is_recognised(make: Any) -> None:
    replay = first_answer(make(completed()))
    assert replay.kind == "respond" and replay.outcome == "replayed" and replay.status == 201
    mismatch = first_answer(make(completed("v1:" + "6" * 64)))
    assert mismatch.kind == "respond" and mismatch.status == 422
    busy = first_answer(make(in_progress()))
    assert busy.kind == "respond" and busy.status == 409


@pytest.mark.parametrize("result", [
    Locked(NOW), types.SimpleNamespace(locked=True, now_ms=NOW),
], ids=["Locked", "duck"])
def test_a_lock_wait_is_recognised(result: Any) -> None:
    action = first_answer(result)
    assert action.kind == "respond" and action.status == 409


def test_a_result_without_the_contracts_attributes_is_refused() -> None:
    with pytest.raises(AttributeError):
        first_answer(types.SimpleNamespace(now_ms=NOW))


def test_the_memory_stores_own_results_go_through_the_same_door() -> None:
    store = MemoryStore(clock=lambda: NOW)
    claimed = store.claim(SCOPE, FP, b"\x01" * 16, 5_000, 60_000)
    assert type(claimed) is Claimed
    assert first_answer(claimed).kind == "run_handler"
    again = store.claim(SCOPE, FP, b"\x02" * 16, 5_000, 60_000)
    assert type(again) is Existing and first_answer(again).status == 409
