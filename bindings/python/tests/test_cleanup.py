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


def test_a_cleanup_that_keeps_failing_gives_up_quietly_within_the_lease() -> None:
    store = LostClaimStore(fail_releases=10_000)
    errors: List[BaseException] = []
    old_hook = threading.excepthook

    def keep(args: Any) -> None:
        errors.append(args.exc_value)

    threading.excepthook = keep
    # Cleanup threads of earlier tests (other stores, other leases) may still run: only the
    # ones this request starts count.
    before = {t for t in threading.enumerate() if t.name == "idempo-cleanup"}
    try:
        # The shortest lease core accepts (1 s): attempts at 0, 0.1, 0.3, 0.7 s; the next would
        # start after 1.5 s, past the lease, so the cleanup stops.
        run_sync(store=store, config=Config(lease_ms=1_000), scope=SCOPE, fingerprint=FP,
                 key="lost-claim-key", route="/pay", handler=never, hooks=Hooks())
        def cleaning() -> bool:
            return any(t.name == "idempo-cleanup" and t not in before
                       for t in threading.enumerate())

        deadline = time.monotonic() + 3
        while cleaning() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cleaning(), "the cleanup thread outlived its budget"
    finally:
        threading.excepthook = old_hook
    assert errors == []
    # Four attempts on time (0, 0.1, 0.3, 0.7 s); three if the machine is slow enough to push
    # the third past 0.6 s. Never more: the next attempt would start after the lease.
    assert store.releases in ([False] * 3, [False] * 4), store.releases
    record, _ = store.get(SCOPE)
    assert record is not None and record.state == 1, "left to its lease, as before the cleanup"
