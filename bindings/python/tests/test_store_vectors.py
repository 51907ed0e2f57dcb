"""spec/vectors/store/: the shared conformance scenarios, against every store (sync and async).

Each store runs with its clock replaced by the scenario's virtual clock (the clock override of
spec/STORAGE.md), so expectations match to the millisecond.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from conftest import VECTORS
from storekit import ALL_KINDS, SERVICE_KINDS, open_store

from idempo.stores import Claimed, Existing, StoredRecord

SCENARIOS = sorted((VECTORS / "store").glob("*.json"))


class VirtualClock:
    def __init__(self) -> None:
        # A real origin: Redis key expiries (real time) then stay in the future.
        self.t0 = int(time.time() * 1000)
        self.offset = 0

    def __call__(self) -> int:
        return self.t0 + self.offset


def check_record(
    got: Optional[StoredRecord], want: Optional[Dict[str, Any]], sc: Dict[str, Any], t0: int
) -> None:
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got.fingerprint == want["fingerprint"]
    assert got.state == want["state"]
    assert got.token == bytes.fromhex(sc["tokens"][want["token"]])
    if want.get("generation_restart_allowed"):
        assert got.generation in (want["generation"], 1)
    else:
        assert got.generation == want["generation"]
    lease = want["lease_until_ms"]
    assert got.lease_until == (None if lease is None else t0 + lease)
    assert got.expires_at == t0 + want["expires_at_ms"]
    resp = want["response"]
    assert got.response == (None if resp is None else bytes.fromhex(sc["responses"][resp]))


async def play(store: Any, sc: Dict[str, Any], clock: VirtualClock) -> None:
    scope = {n: bytes.fromhex(h) for n, h in sc["scopes"].items()}
    tok = {n: bytes.fromhex(h) for n, h in sc["tokens"].items()}
    resp = {n: bytes.fromhex(h) for n, h in sc["responses"].items()}
    t0 = clock.t0
    for i, step in enumerate(sc["steps"]):
        where = f"step {i}: {json.dumps(step)[:200]}"
        if "advance_ms" in step:
            clock.offset += step["advance_ms"]
            continue
        op, expect = step["op"], step["expect"]
        if op == "claim":
            got = await store.claim(
                scope[step["scope"]], step["fingerprint"], tok[step["token"]],
                step["lease_ms"], step["ttl_ms"],
            )
            assert got.now_ms == t0 + expect["now_ms"], where
            if "claimed" in expect:
                assert isinstance(got, Claimed), where
                want = expect["claimed"]
                allowed = {want["generation"], 1} if want.get("restart_allowed") else {want["generation"]}
                assert got.generation in allowed, where
            else:
                assert isinstance(got, Existing), where
                check_record(got.record, expect["existing"], sc, t0)
        elif op == "get":
            record, now = await store.get(scope[step["scope"]])
            assert now == clock(), where
            check_record(record, expect["record"], sc, t0)
        elif op == "takeover":
            got = await store.takeover(
                scope[step["scope"]], tok[step["seen_token"]], tok[step["new_token"]], step["lease_ms"]
            )
            assert got == expect["generation"], where
        elif op == "mark_unknown":
            got = await store.mark_unknown(scope[step["scope"]], tok[step["seen_token"]], step["ttl_ms"])
            assert got is expect["applied"], where
        elif op == "complete":
            got = await store.complete(
                scope[step["scope"]], tok[step["token"]], resp[step["response"]], step["ttl_ms"]
            )
            assert got is expect["applied"], where
        elif op == "release":
            got = await store.release(scope[step["scope"]], tok[step["token"]])
            assert got is expect["applied"], where
        elif op == "renew":
            got = await store.renew(scope[step["scope"]], tok[step["token"]], step["lease_ms"])
            assert got is expect["applied"], where
        elif op == "purge_expired":
            counts = await store.purge_expired(batch=step["batch"])
            assert (counts.in_progress, counts.completed, counts.outcome_unknown) == (
                expect["in_progress"], expect["completed"], expect["outcome_unknown"]
            ), where
        else:
            raise AssertionError(f"unknown op {op!r} in {sc['name']}")


def _params() -> List[Any]:
    assert SCENARIOS, "spec/vectors/store is empty"
    return [
        pytest.param(kind, path, id=f"{kind}-{path.stem}") for path in SCENARIOS for kind in ALL_KINDS
    ]


@pytest.mark.parametrize(("kind", "path"), _params())
def test_store_scenario(kind: str, path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    sc = json.loads(path.read_text(encoding="utf-8"))
    services = request.getfixturevalue("services") if kind in SERVICE_KINDS else None
    clock = VirtualClock()

    async def main() -> None:
        async with open_store(kind, tmp_path, services, clock=clock) as store:
            await play(store, sc, clock)

    asyncio.run(main())
