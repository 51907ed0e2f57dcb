"""The memory store's claim, completion and release run inside the flow's own calls
(``ServerFlow.start`` / ``handler_finished`` / ``handler_failed`` with ``memory=``): a shortcut
that must answer exactly what the host loop answers through the store's methods, and that is
taken only for idempo's own, unpatched ``MemoryStore``."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from idempo import Config, StoreUnavailable
from idempo import _flow
from idempo._flow import AsyncRequest, HandlerResult, Hooks, Response, SyncRequest
from idempo._idempo import InlineMemory, ServerFlow
from idempo.asgi import IdempotencyMiddleware
from idempo.stores import AsyncMemoryStore, MemoryStore, memory_partition
from idempo.stores.memory import inline_memory

FP = "v1:" + "7" * 64
OTHER_FP = "v1:" + "8" * 64
ROUTE = "/inline"
LEASE = 1_000


def scope_of(n: int) -> bytes:
    return bytes([n]) * 32


class Clock:
    def __init__(self) -> None:
        self.now = 10_000

    def __call__(self) -> int:
        return self.now


def ok(status: int = 201, body: bytes = b'{"ok":true}') -> HandlerResult:
    return HandlerResult(status, [("content-type", "application/json")], body)


def generic_hooks(errors: List[str]) -> Hooks:
    """Hooks that time every store primitive: the flow then never runs them inline."""
    return Hooks(on_store_error=lambda route, exc: errors.append(f"{type(exc).__name__}: {exc}"),
                 on_store_op=lambda *_: None)


def inline_hooks(errors: List[str]) -> Hooks:
    return Hooks(on_store_error=lambda route, exc: errors.append(f"{type(exc).__name__}: {exc}"))


def answer(r: Any) -> Tuple[Any, ...]:
    if isinstance(r, Response):
        return ("response", r.status, tuple(r.headers), r.body, r.outcome, r.handler_ran)
    if r is None:
        return ("none",)
    return ("execution", r.key, r.generation, r.downstream_key)


def rows(store: MemoryStore, scopes: List[bytes]) -> List[Any]:
    return [store._core.get(s) for s in scopes]


Step = Tuple[str, int, str, Optional[Any]]
"""(what, scope number, fingerprint, argument): "begin", "finish" (HandlerResult), "fail"
(maybe_side_effect), "tick" (ms to advance the clock)."""

SCENARIOS: Dict[str, Tuple[Dict[str, Any], List[Step]]] = {
    "fresh, completed, replayed, mismatched": ({}, [
        ("begin", 1, FP, None), ("finish", 1, FP, ok()),
        ("begin", 1, FP, None), ("begin", 1, OTHER_FP, None),
    ]),
    "in flight, then taken over after the lease": ({}, [
        ("begin", 1, FP, None), ("begin", 1, FP, None), ("tick", 0, FP, LEASE + 1),
        ("begin", 1, FP, None), ("finish", 1, FP, ok(200)), ("begin", 1, FP, None),
    ]),
    "taken over and run again (re_run)": ({"takeover": "re_run"}, [
        ("begin", 1, FP, None), ("tick", 0, FP, LEASE + 1), ("begin", 1, FP, None),
        ("finish", 1, FP, ok(200)), ("begin", 1, FP, None),
    ]),
    "failed without a side effect: released": ({}, [
        ("begin", 2, FP, None), ("fail", 2, FP, False), ("begin", 2, FP, None),
        ("finish", 2, FP, ok()),
    ]),
    "failed with a possible side effect": ({}, [
        ("begin", 2, FP, None), ("fail", 2, FP, True), ("begin", 2, FP, None),
    ]),
    "a transient status is not stored": ({}, [
        ("begin", 3, FP, None), ("finish", 3, FP, ok(503)), ("begin", 3, FP, None),
        ("finish", 3, FP, ok()), ("begin", 3, FP, None),
    ]),
    "the store is full: refused claims answer 503": ({"max_entries": 2, "max_entries_per_partition": 2}, [
        ("begin", 1, FP, None), ("finish", 1, FP, ok()), ("begin", 2, FP, None),
        ("begin", 3, FP, None), ("begin", 1, FP, None), ("finish", 2, FP, ok()),
    ]),
    "the completion does not fit": ({"max_bytes": 420, "max_bytes_per_partition": 420}, [
        ("begin", 4, FP, None), ("finish", 4, FP, ok(201, b"x" * 400)), ("begin", 4, FP, None),
    ]),
    "expired records make room": ({"max_entries": 1, "max_entries_per_partition": 1}, [
        ("begin", 1, FP, None), ("finish", 1, FP, ok()), ("tick", 0, FP, 86_400_001),
        ("begin", 2, FP, None), ("finish", 2, FP, ok()), ("begin", 2, FP, None),
    ]),
}


def run_scenario_sync(
    limits: Dict[str, Any], steps: List[Step], inline: bool, partition: Optional[bytes] = None
) -> Tuple[List[Any], List[str], List[Any], int]:
    clock = Clock()
    limits = dict(limits)
    takeover = limits.pop("takeover", None)
    store = MemoryStore(clock=clock, **limits)
    errors: List[str] = []
    takeovers: List[str] = []
    hooks = inline_hooks(errors) if inline else generic_hooks(errors)
    hooks.on_takeover = takeovers.append
    config = Config(lease_ms=LEASE, heartbeat_ms=None, takeover=takeover)
    open_: Dict[int, SyncRequest] = {}
    out: List[Any] = []
    executed = [0]
    real = _flow._execute

    def counted(st: Any, action: Any) -> Any:
        executed[0] += 1
        return real(st, action)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_flow, "_execute", counted)
        mp.setattr(_flow, "_entropy", lambda: b"\x2a" * 16)
        for what, n, fp, arg in steps:
            if what == "tick":
                clock.now += arg
                continue
            if what == "begin":
                req = SyncRequest(store=store, config=config, scope=scope_of(n), fingerprint=fp,
                                  key=f"key-{n}", route=ROUTE, hooks=hooks, partition=partition)
                started = req.begin()
                if not isinstance(started, Response):
                    open_[n] = req
                out.append(answer(started))
            elif what == "finish":
                out.append(answer(open_.pop(n).finished(arg)))
            else:
                out.append(answer(open_.pop(n).failed(arg)))
    errors += takeovers
    return out, errors, rows(store, [scope_of(i) for i in range(1, 5)]), executed[0]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_inline_memory_answers_what_the_store_methods_answer(name: str) -> None:
    limits, steps = SCENARIOS[name]
    for partition in (None, memory_partition("alice")):
        inline = run_scenario_sync(limits, steps, True, partition)
        generic = run_scenario_sync(limits, steps, False, partition)
        assert inline[:3] == generic[:3], name
        # The shortcut was taken: fewer primitives went through the store's methods.
        assert inline[3] < generic[3], name


def test_inline_memory_answers_the_same_from_asyncio() -> None:
    async def scenario(inline: bool) -> Tuple[List[Any], List[Any]]:
        store = MemoryStore(clock=Clock())
        hooks = inline_hooks([]) if inline else generic_hooks([])
        config = Config(lease_ms=LEASE)
        out: List[Any] = []

        def request(n: int, fp: str = FP) -> AsyncRequest:
            return AsyncRequest(store=store, config=config, scope=scope_of(n), fingerprint=fp,
                                key=f"key-{n}", route=ROUTE, hooks=hooks)

        first = request(1)
        started = await first.begin()
        out.append(answer(started))
        out.append(answer(await request(1).begin()))
        out.append(answer(await first.finished(ok())))
        out.append(answer(await request(1).begin()))
        out.append(answer(await request(1, OTHER_FP).begin()))
        second = request(2)
        out.append(answer(await second.begin()))
        out.append(answer(await second.failed(False)))
        return out, rows(store, [scope_of(1), scope_of(2)])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_flow, "_entropy", lambda: b"\x2b" * 16)
        assert asyncio.run(scenario(True)) == asyncio.run(scenario(False))


def test_a_forked_process_fails_closed_as_the_store_methods_do() -> None:
    for inline in (True, False):
        store = MemoryStore()
        store._pid = -1  # as if this process were a fork of the one that built the store
        errors: List[str] = []
        hooks = inline_hooks(errors) if inline else generic_hooks(errors)
        req = SyncRequest(store=store, config=Config(), scope=scope_of(1), fingerprint=FP,
                          key="k", route=ROUTE, hooks=hooks)
        started = req.begin()
        assert isinstance(started, Response) and started.status == 503
        assert started.outcome == "store_unavailable"
        assert len(errors) == 1 and "forked process" in errors[0]


def test_start_with_memory_claims_within_the_call() -> None:
    store = MemoryStore()
    memory = inline_memory(store)
    assert isinstance(memory, InlineMemory)
    flow, action = ServerFlow.start(scope_of(1), FP, Config(), b"\x01" * 16, memory)
    assert action.kind == "run_handler" and action.generation == 1
    done = flow.handler_finished(201, [], b"{}", memory=memory)
    assert done.kind == "respond" and done.status == 201 and done.outcome == "stored"
    _, replay = ServerFlow.start(scope_of(1), FP, Config(), b"\x02" * 16, memory)
    assert replay.kind == "respond" and replay.outcome == "replayed"
    # Without it, the same flow hands the claim to the host.
    _, claim = ServerFlow.start(scope_of(2), FP, Config(), b"\x03" * 16)
    assert claim.kind == "store" and claim.op == "claim"


def test_inline_memory_is_only_for_idempos_own_unpatched_memory_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    assert inline_memory(store) is not None
    assert inline_memory(store.with_partition(memory_partition("bob"))) is not None
    assert _flow._memory(store, Hooks()) is not None
    # A hook that times each primitive needs each primitive to run through the store.
    assert _flow._memory(store, Hooks(on_store_op=lambda *_: None)) is None

    class Sub(MemoryStore):
        pass

    assert inline_memory(Sub()) is None
    assert inline_memory(Sub().with_partition(memory_partition("bob"))) is None
    assert inline_memory(AsyncMemoryStore()) is None
    assert inline_memory(object()) is None
    # A partition core does not take: the claim goes through the store (which refuses it).
    assert inline_memory(store.with_partition(b"short")) is None

    for name in ("claim", "get", "takeover", "mark_unknown", "complete", "release", "renew",
                 "_step"):
        patched = MemoryStore()
        setattr(patched, name, lambda *a, **k: None)
        assert inline_memory(patched) is None, name
        with monkeypatch.context() as mp:
            mp.setattr(MemoryStore, name, lambda *a, **k: None)
            assert inline_memory(MemoryStore()) is None, name
        assert inline_memory(MemoryStore()) is not None, name

    view = store.with_partition(memory_partition("bob"))
    view.complete = lambda *a, **k: None  # type: ignore[attr-defined]
    assert inline_memory(view) is None
    from idempo.stores.memory import _PartitionView

    for name in ("claim", "complete", "release"):
        with monkeypatch.context() as mp:
            mp.setattr(_PartitionView, name, lambda *a, **k: None)
            assert inline_memory(store.with_partition(memory_partition("bob"))) is None, name
    assert inline_memory(store.with_partition(memory_partition("bob"))) is not None


class Recording(MemoryStore):
    """A subclass: its overridden methods must see every primitive."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[str] = []

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.ops.append("claim")
        return super().claim(*args, **kwargs)

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        self.ops.append("complete")
        return super().complete(*args, **kwargs)


def _asgi_post(wrapped: Any, key: str) -> Dict[str, Any]:
    sent: List[Dict[str, Any]] = []

    async def receive() -> Dict[str, Any]:
        return {"type": "http.request", "body": b'{"a":1}', "more_body": False}

    async def send(msg: Dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/pay", "raw_path": b"/pay",
             "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                              (b"idempotency-key", key.encode())]}
    asyncio.run(wrapped(scope, receive, send))
    return {"status": sent[0]["status"], "headers": dict(sent[0]["headers"]),
            "body": b"".join(m.get("body", b"") for m in sent[1:])}


def _app(runs: List[int]) -> Callable[..., Any]:
    async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        runs.append(1)
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body",
                    "body": json.dumps({"n": len(runs)}).encode()})

    return app


def test_a_subclass_sees_every_primitive_and_answers_as_the_store_does() -> None:
    answers = []
    for store in (Recording(), MemoryStore()):
        runs: List[int] = []
        wrapped = IdempotencyMiddleware(_app(runs), store=store, public=True)
        first = _asgi_post(wrapped, "key-0001")
        again = _asgi_post(wrapped, "key-0001")
        assert runs == [1] and again["headers"][b"idempotent-replayed"] == b"true"
        answers.append((first, again))
        if isinstance(store, Recording):
            assert store.ops == ["claim", "complete", "claim"]
    assert answers[0] == answers[1]


def test_a_store_refusal_reaches_the_hooks_as_before() -> None:
    errors: List[str] = []
    store = MemoryStore(max_entries=1)
    runs: List[int] = []
    wrapped = IdempotencyMiddleware(_app(runs), store=store, public=True,
                                    hooks=inline_hooks(errors))
    assert _asgi_post(wrapped, "key-0001")["status"] == 201
    full = _asgi_post(wrapped, "key-0002")
    assert full["status"] == 503 and full["headers"][b"retry-after"].isdigit()
    assert runs == [1] and len(errors) == 1 and errors[0].startswith("StoreUnavailable")
    assert issubclass(StoreUnavailable, Exception)


def test_a_partition_view_runs_as_its_store_does() -> None:
    partition = memory_partition("carol")
    assert _flow.store_mode(MemoryStore().with_partition(partition)) == _flow.INLINE
    assert _flow.store_mode(AsyncMemoryStore().with_partition(partition)) == _flow.AWAIT

    class Blocking(MemoryStore):
        blocking = True

    assert _flow.store_mode(Blocking().with_partition(partition)) == _flow.THREAD


def test_flow_tokens_are_drawn_once_each_across_blocks_and_threads() -> None:
    import threading

    drawn: List[bytes] = []

    def draw() -> None:
        got = [_flow._entropy() for _ in range(700)]  # crosses block boundaries (256 per block)
        drawn.extend(got)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(drawn) == 2800 and all(len(d) == 16 for d in drawn)
    assert len(set(drawn)) == len(drawn)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_draws_its_own_tokens_and_its_memory_store_fails_closed() -> None:
    import os
    import warnings

    store = MemoryStore()
    _flow._entropy()  # the parent holds a block
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns when a process with threads forks (the child only reports here).
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            token = _flow._entropy()
            try:
                store.claim(scope_of(9), FP, b"\x01" * 16, LEASE, LEASE)
                refused = b"0"
            except StoreUnavailable:
                refused = b"1"
            os.write(write, token + refused)
        finally:
            os._exit(0)
    os.close(write)
    got = b""
    while len(got) < 17:
        chunk = os.read(read, 17 - len(got))
        if not chunk:
            break
        got += chunk
    os.close(read)
    os.waitpid(pid, 0)
    assert len(got) == 17
    child_token, refused = got[:16], got[16:]
    assert refused == b"1"  # the store refuses a forked process, as before
    parent = [_flow._entropy() for _ in range(256)]  # the rest of the parent's block and more
    assert child_token not in parent


def test_the_steps_without_suspending_answer_as_the_awaited_steps() -> None:
    """``AsyncRequest`` on a store that runs inline takes its steps without suspending
    (``begin_now``, ``finished_now``, ``failed_now``, ``close_now``: what the ASGI and FastAPI
    hosts call); forced through the awaited steps, every answer, hook and record is the same."""

    async def scenario(awaited: bool) -> Tuple[List[Any], List[Any], List[Any]]:
        store = MemoryStore(clock=Clock())
        seen: List[Any] = []
        hooks = Hooks(on_outcome=lambda route, outcome: seen.append(outcome))
        config = Config(lease_ms=LEASE)
        out: List[Any] = []

        def request(n: int, fp: str = FP) -> AsyncRequest:
            req = AsyncRequest(store=store, config=config, scope=scope_of(n), fingerprint=fp,
                               key=f"key-{n}", route=ROUTE, hooks=hooks,
                               partition=memory_partition("dave"))
            assert req.inline
            if awaited:
                req.inline = False  # the awaited steps, as for a store that can suspend
            return req

        first = request(1)
        out.append(answer(await first.begin()))
        out.append(answer(await request(1).begin()))  # in flight: 409
        out.append(answer(await first.finished(ok())))
        out.append(answer(await request(1).begin()))  # replay
        out.append(answer(await request(1, OTHER_FP).begin()))  # 422
        second = request(2)
        out.append(answer(await second.begin()))
        out.append(answer(await second.failed(False)))  # released
        third = request(2)
        out.append(answer(await third.begin()))
        out.append(answer(await third.failed(True)))  # outcome unknown
        out.append(answer(await request(2).begin()))
        fourth = request(3)
        out.append(answer(await fourth.begin()))
        out.append(answer(await fourth.finished(ok(503))))  # transient: not stored
        out.append(answer(await request(3).begin()))
        await fourth.close()
        return out, seen, rows(store, [scope_of(1), scope_of(2), scope_of(3)])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_flow, "_entropy", lambda: b"\x2c" * 16)
        assert asyncio.run(scenario(False)) == asyncio.run(scenario(True))


def test_a_heartbeat_running_beside_an_inline_flow_stops_at_its_end() -> None:
    """A handler that outlives the heartbeat interval gets its heartbeat task (renewals inline on
    the loop); the step without suspending cancels it, as the awaited step does."""

    async def scenario() -> Tuple[Any, Any, bool]:
        store = MemoryStore()
        req = AsyncRequest(store=store, config=Config(lease_ms=1_000, heartbeat_ms=20),
                           scope=scope_of(5), fingerprint=FP, key="key-5", route=ROUTE,
                           hooks=Hooks())
        started = await req.begin()
        await asyncio.sleep(0.15)  # several renewals
        assert req._beat is not None and not req._beat.done()
        done = req.finished_now(ok())
        await asyncio.sleep(0)
        return answer(started)[0], answer(done), req._beat.cancelled() or req._beat.done()

    kind, done, stopped = asyncio.run(scenario())
    assert kind == "execution" and done[1] == 201 and done[4] == "stored" and stopped


def test_a_hosts_remembered_partition_views_are_only_for_the_unpatched_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from idempo.stores.memory import _PartitionView, partition_memory

    bob = memory_partition("bob")
    store = MemoryStore()
    cache: Dict[bytes, Any] = {}
    first = partition_memory(store, bob, cache)
    assert first is not None and type(first[0]) is _PartitionView and first[0]._partition == bob
    assert isinstance(first[1], InlineMemory)
    assert partition_memory(store, bob, cache) is first  # remembered
    # A new lock or core on the store: made again, as the flow would make them.
    store._lock = threading.Lock()
    again = partition_memory(store, bob, cache)
    assert again is not None and again is not first and again[3] is store._lock

    class Sub(MemoryStore):
        pass

    assert partition_memory(Sub(), bob, {}) is None
    assert partition_memory(AsyncMemoryStore(), bob, {}) is None
    for name in ("claim", "get", "takeover", "mark_unknown", "complete", "release", "renew",
                 "_step", "with_partition"):
        patched = MemoryStore()
        setattr(patched, name, lambda *a, **k: None)
        assert partition_memory(patched, bob, {}) is None, name
        with monkeypatch.context() as mp:
            mp.setattr(MemoryStore, name, lambda *a, **k: None)
            assert partition_memory(MemoryStore(), bob, {}) is None, name
        assert partition_memory(MemoryStore(), bob, {}) is not None, name
    for name in ("claim", "complete", "release"):
        with monkeypatch.context() as mp:
            mp.setattr(_PartitionView, name, lambda *a, **k: None)
            assert partition_memory(store, bob, cache) is None, name
    blocking = MemoryStore()
    blocking.blocking = True  # type: ignore[misc]
    assert partition_memory(blocking, bob, {}) is None


def test_a_flow_on_remembered_views_answers_as_the_ordinary_flow() -> None:
    async def scenario(memories: Optional[Dict[bytes, Any]], hooks: Hooks) -> List[Any]:
        store = MemoryStore(clock=Clock())
        config = Config(lease_ms=LEASE)
        partition = memory_partition("alice")
        out: List[Any] = []

        def request(n: int, fp: str = FP) -> AsyncRequest:
            return AsyncRequest(store=store, config=config, scope=scope_of(n), fingerprint=fp,
                                key=f"key-{n}", route=ROUTE, hooks=hooks, partition=partition,
                                memories=memories)

        first = request(1)
        out.append(first.inline)
        out.append(answer(await first.begin()))
        out.append(answer(await request(1).begin()))
        out.append(answer(await first.finished(ok())))
        out.append(answer(await request(1).begin()))
        out.append(answer(await request(1, OTHER_FP).begin()))
        second = request(2)
        out.append(answer(await second.begin()))
        out.append(answer(await second.failed(False)))
        out.append(rows(store, [scope_of(1), scope_of(2)]))
        return out

    ops: List[str] = []
    timed = Hooks(on_store_op=lambda route, op, seconds, failed: ops.append(op))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_flow, "_entropy", lambda: b"\x2b" * 16)
        remembered = asyncio.run(scenario({}, Hooks()))
        assert remembered == asyncio.run(scenario(None, Hooks()))
        # A hook that times each primitive: every primitive through the store's methods.
        assert asyncio.run(scenario({}, timed)) == remembered
    assert ops.count("claim") == 5 and ops.count("complete") == 1
