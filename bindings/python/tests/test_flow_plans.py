"""The host loop's store steps and background cleanup are written once (plans) and run by the
thread host and the asyncio host alike: both report the same things the same way."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, List

import pytest

from idempo import Config, StoreUnavailable
from idempo import _flow
from idempo._flow import HandlerResult, Hooks, run_async, run_sync
from idempo.stores import AsyncMemoryStore, MemoryStore
from idempo.stores._base import Existing, StoredRecord

SCOPE = bytes(range(32))
FP = "v1:" + "5" * 64
ROUTE = "/flow-plans"
CORRUPT = StoredRecord(SCOPE, FP, 9, bytes(16), 1, None, 5_000, b"junk")
"""A record with a state code no version of the contract defines."""


def never(_: Any) -> HandlerResult:
    raise AssertionError("the handler must not run")


async def never_async(_: Any) -> HandlerResult:
    raise AssertionError("the handler must not run")


class CorruptStore(MemoryStore):
    def claim(self, *args: Any, **kwargs: Any) -> Any:
        return Existing(CORRUPT, 1_000)


class AsyncCorruptStore(AsyncMemoryStore):
    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        return Existing(CORRUPT, 1_000)


def _corrupt_logs(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "idempo" and r.levelno == logging.ERROR and "corrupt record" in r.getMessage()
    ]


def test_both_hosts_fail_closed_and_log_a_corrupt_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="idempo")
    config = Config(lease_ms=1_000)
    sync = run_sync(store=CorruptStore(), config=config, scope=SCOPE, fingerprint=FP,
                    key="corrupt-key", route=ROUTE, handler=never, hooks=Hooks())
    assert _corrupt_logs(caplog) == ["idempo: corrupt record on /flow-plans: unknown state code 9"]
    caplog.clear()
    asyncio_ = asyncio.run(
        run_async(store=AsyncCorruptStore(), config=config, scope=SCOPE, fingerprint=FP,
                  key="corrupt-key", route=ROUTE, handler=never_async, hooks=Hooks())
    )
    assert _corrupt_logs(caplog) == ["idempo: corrupt record on /flow-plans: unknown state code 9"]
    for response in (sync, asyncio_):
        assert (response.status, response.outcome, response.handler_ran) == (
            503, "store_unavailable", False)


class LostClaimStore(MemoryStore):
    """Applies the claim, then loses its answer; every release raises."""

    def __init__(self) -> None:
        super().__init__()
        self.releases = 0

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        super().claim(*args, **kwargs)
        raise StoreUnavailable("the answer was lost")

    def release(self, scope_key: bytes, token: bytes) -> bool:
        self.releases += 1
        raise StoreUnavailable("still down")


class AsyncLostClaimStore(AsyncMemoryStore):
    """The asyncio twin of :class:`LostClaimStore`."""

    def __init__(self) -> None:
        super().__init__()
        self.releases = 0

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        await super().claim(*args, **kwargs)
        raise StoreUnavailable("the answer was lost")

    async def release(self, scope_key: bytes, token: bytes) -> bool:
        self.releases += 1
        raise StoreUnavailable("still down")


def _cleanup_logs(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "idempo" and f"cleanup on {ROUTE}" in r.getMessage()
    ]


def test_the_async_cleanup_gives_up_quietly_like_the_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The shortest lease core accepts (1 s) and a cleanup budget of 1 s: attempts at 0, 0.1, 0.3
    and 0.7 s (three on a slow machine), each failure logged at DEBUG; then the cleanup ends
    without an error escaping."""
    caplog.set_level(logging.DEBUG, logger="idempo")
    config = Config(lease_ms=1_000, cleanup_budget_ms=1_000)

    sync_store = LostClaimStore()
    before = set(threading.enumerate())
    run_sync(store=sync_store, config=config, scope=SCOPE, fingerprint=FP,
             key="lost-claim-key", route=ROUTE, handler=never, hooks=Hooks())
    # Only this request's cleanup (other tests' may still be running).
    threads = [
        t for t in threading.enumerate() if t.name == "idempo-cleanup" and t not in before
    ]
    assert len(threads) == 1, "one background cleanup per lost claim"
    threads[0].join(10)
    assert not threads[0].is_alive(), "the cleanup thread outlived its budget"
    sync_logs = _cleanup_logs(caplog)
    caplog.clear()

    loop_errors: List[Any] = []

    async def scenario() -> int:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
        store = AsyncLostClaimStore()
        response = await run_async(store=store, config=config, scope=SCOPE, fingerprint=FP,
                                   key="lost-claim-key", route=ROUTE, handler=never_async,
                                   hooks=Hooks())
        assert response.status == 503
        loop = asyncio.get_running_loop()
        tasks = [t for t in _flow._CLEANUP_TASKS if t.get_loop() is loop]
        assert len(tasks) == 1, "one background cleanup per lost claim"
        done, _pending = await asyncio.wait(tasks, timeout=10)
        assert done == set(tasks), "the cleanup task outlived its budget"
        for task in done:
            assert task.exception() is None
        return store.releases

    started = time.monotonic()
    async_releases = asyncio.run(scenario())
    assert time.monotonic() - started < 10
    async_logs = _cleanup_logs(caplog)

    assert loop_errors == []
    assert sync_store.releases in (3, 4), sync_store.releases
    assert async_releases in (3, 4), async_releases
    failed = "idempo: cleanup on /flow-plans failed: still down"
    assert sync_logs == [failed] * sync_store.releases
    assert async_logs == [failed] * async_releases
