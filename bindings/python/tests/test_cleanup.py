"""Core's cleanup of a claim whose answer was lost, run by the host loop (no server needed).

A store whose ``claim`` applies and then raises (the answer lost, as with a frozen PostgreSQL that
resumes) must not leave the key held: the request is answered 503 at once, the handler never
runs, and the background cleanup releases the claim, retrying while the release fails or does not
apply yet. A cleanup that keeps failing never raises into anything.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List

from idempo import Config, StoreUnavailable
from idempo._flow import HandlerResult, Hooks, run_async, run_sync
from idempo.stores import AsyncMemoryStore, MemoryStore

SCOPE = bytes(range(32))
FP = "v1:" + "5" * 64


class LostClaimStore(MemoryStore):
    """Applies the claim, then loses its answer; the first ``fail_releases`` releases raise."""

    def __init__(self, fail_releases: int) -> None:
        super().__init__()
        self.fail_releases = fail_releases
        self.releases: List[bool] = []
        self.released = threading.Event()

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        super().claim(*args, **kwargs)
        raise StoreUnavailable("the answer was lost")

    def release(self, scope_key: bytes, token: bytes) -> bool:
        if self.fail_releases > 0:
            self.fail_releases -= 1
            self.releases.append(False)
            raise StoreUnavailable("still down")
        ok = super().release(scope_key, token)
        self.releases.append(ok)
        if ok:
            self.released.set()
        return ok


class AsyncLostClaimStore(AsyncMemoryStore):
    """The asyncio twin of :class:`LostClaimStore` (the first release raises)."""

    def __init__(self) -> None:
        super().__init__()
        self.releases: List[bool] = []

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        await super().claim(*args, **kwargs)
        raise StoreUnavailable("the answer was lost")

    async def release(self, scope_key: bytes, token: bytes) -> bool:
        if not self.releases:
            self.releases.append(False)
            raise StoreUnavailable("still down")
        ok = await super().release(scope_key, token)
        self.releases.append(ok)
        return ok


def never(_: Any) -> HandlerResult:
    raise AssertionError("the handler must not run after a store failure")


async def never_async(_: Any) -> HandlerResult:
    raise AssertionError("the handler must not run after a store failure")


def test_a_lost_claim_is_released_in_the_background_after_the_503() -> None:
    store = LostClaimStore(fail_releases=2)
    response = run_sync(store=store, config=Config(lease_ms=5_000), scope=SCOPE, fingerprint=FP,
                        key="lost-claim-key", route="/pay", handler=never, hooks=Hooks())
    assert (response.status, response.outcome, response.handler_ran) == (
        503, "store_unavailable", False)
    # The 503 does not wait for the cleanup (which cannot succeed before its third attempt).
    assert not store.released.is_set()
    assert store.released.wait(5), f"not released: {store.releases}"
    # Two failures (retried after 100 and 200 ms), then the release that applied.
    assert store.releases == [False, False, True]
    assert store.get(SCOPE)[0] is None


def test_the_async_host_releases_a_lost_claim_too() -> None:
    async def scenario() -> None:
        store = AsyncLostClaimStore()
        response = await run_async(
            store=store, config=Config(lease_ms=5_000), scope=SCOPE, fingerprint=FP,
            key="lost-claim-key", route="/pay", handler=never_async, hooks=Hooks())
        assert (response.status, response.outcome) == (503, "store_unavailable")
        record, _ = await store.get(SCOPE)
        assert record is not None and record.state == 1, "the lost claim was applied"
        deadline = time.monotonic() + 5
        while (await store.get(SCOPE))[0] is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert (await store.get(SCOPE))[0] is None
        assert store.releases == [False, True]

    asyncio.run(scenario())


def _cleanup_threads() -> "set[threading.Thread]":
    return {t for t in threading.enumerate() if t.name == "idempo-cleanup"}


def test_a_cleanup_that_keeps_failing_gives_up_quietly_within_its_budget() -> None:
    store = LostClaimStore(fail_releases=10_000)
    errors: List[BaseException] = []
    old_hook = threading.excepthook

    def keep(args: Any) -> None:
        errors.append(args.exc_value)

    threading.excepthook = keep
    # Cleanup threads of earlier tests (other stores, other leases) may still run: only the
    # ones this request starts count.
    before = _cleanup_threads()
    # The shortest lease core accepts (1 s) and a short cleanup budget (1.5 s): delays 100, 200,
    # 400, then 500 ms (half the lease), so attempts start at 0, 0.1, 0.3, 0.7 and 1.2 s; the
    # next would start after 1.7 s, past the budget, so the cleanup stops.
    config = Config(lease_ms=1_000, cleanup_budget_ms=1_500)
    assert config.cleanup_budget_ms == 1_500
    try:
        run_sync(store=store, config=config, scope=SCOPE, fingerprint=FP,
                 key="lost-claim-key", route="/pay", handler=never, hooks=Hooks())
        def cleaning() -> bool:
            return bool(_cleanup_threads() - before)

        deadline = time.monotonic() + 10
        while cleaning() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cleaning(), "the cleanup thread outlived its budget"
    finally:
        threading.excepthook = old_hook
    assert errors == []
    # Each attempt starts at least the sum of the delays before it after the first, so at most
    # five fit in the budget whatever the machine's speed (fewer if it is slow).
    assert 1 <= len(store.releases) <= 5 and not any(store.releases), store.releases
    record, _ = store.get(SCOPE)
    assert record is not None and record.state == 1, "left to its lease, as before the cleanup"


class OutageStore(MemoryStore):
    """Applies the claim, then loses its answer; releases raise until :meth:`recover`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True
        self.failed_at: List[float] = []
        self.released = threading.Event()
        self.lock = threading.Lock()

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        super().claim(*args, **kwargs)
        raise StoreUnavailable("the answer was lost")

    def recover(self) -> None:
        with self.lock:
            self.down = False

    def release(self, scope_key: bytes, token: bytes) -> bool:
        with self.lock:
            if self.down:
                self.failed_at.append(time.monotonic())
                raise StoreUnavailable("still down")
        ok = super().release(scope_key, token)
        if ok:
            self.released.set()
        return ok


def test_a_default_cleanup_keeps_retrying_past_a_short_lease() -> None:
    """The store stays down for more than twice the 1 s lease: the default budget (30 s) keeps
    the cleanup going, and the release applies once the store is back."""
    store = OutageStore()
    config = Config(lease_ms=1_000)
    assert config.cleanup_budget_ms == 30_000
    response = run_sync(store=store, config=config, scope=SCOPE, fingerprint=FP,
                        key="lost-claim-key", route="/pay", handler=never, hooks=Hooks())
    assert (response.status, response.outcome, response.handler_ran) == (
        503, "store_unavailable", False)
    # Wait (generously) until an attempt has failed at least 2 s after the first one: with the
    # lease as the budget, the last attempt would have started before 1 s.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with store.lock:
            times = list(store.failed_at)
        if times and times[-1] - times[0] >= 2.0:
            break
        time.sleep(0.05)
    assert times and times[-1] - times[0] >= 2.0, f"the cleanup stopped: {times}"
    assert store.get(SCOPE)[0] is not None, "still held while the store is down"
    store.recover()
    assert store.released.wait(20), "the release never applied after the store recovered"
    assert store.get(SCOPE)[0] is None
