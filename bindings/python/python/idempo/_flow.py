"""The host loop around core's sans-IO server flow, shared by the ASGI and WSGI integrations.

Nothing here decides anything: the loop executes the store primitive each action names, runs the
handler when told to (feeding heartbeats while it runs), and returns the response core chose.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import (
    Any, Awaitable, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple, TypeVar, Union,
)

from idempo._idempo import Action, Cleanup, Config, InlineMemory, ServerFlow
from idempo._loop import running_loop
from idempo._render import ProblemRenderer, render
from idempo._plan import Plan, drive, drive_async
from idempo.stores._tx import ThreadedSession, Transaction, enter, leave, require_transactions
from idempo.stores.memory import PartitionMemories, inline_memory, partition_memory
from idempo.stores.sqlite import Unstarted, loop_group

log = logging.getLogger("idempo")

_DEADLINE_MARGIN_S = 0.25
"""Added to a store's own operation timeout for the thread hop."""


def _store_deadline(store: Any) -> Optional[float]:
    """Seconds a synchronous store call may take when awaited, counted from the request's point
    of view: the store's own per-operation ``timeout`` (e.g. ``PostgresStore``) plus a margin, or
    None when the store declares none."""
    timeout = getattr(store, "timeout", None)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return float(timeout) + _DEADLINE_MARGIN_S
    return None


async def _in_thread(store: Any, action: Action) -> Any:
    """Runs a synchronous store primitive in a worker thread, within the store's deadline counted
    from now: a call queued behind others blocked by a hung store (asyncio's default pool has a
    handful of threads) still answers in time.

    Past the deadline the call is reported as failed (core answers 503 and, for a claim, hands
    back a cleanup); the thread finishes on its own and its late result is ignored, which core's
    ambiguous-failure rules (PROTOCOL §7.4) already cover.

    idempo's own :class:`~idempo.stores.SQLiteStore` runs its writes on the loop instead, in the
    loop's group commit (:func:`idempo.stores.sqlite.loop_group`), and comes here only for what
    the group hands back unstarted."""
    group = loop_group(store, action.op)
    if group is not None:
        try:
            return await group.submit_call(action.op or "", action.args)
        except Unstarted:
            pass
    call = asyncio.to_thread(_execute, store, action)
    deadline = _store_deadline(store)
    if deadline is None:
        return await call
    try:
        return await asyncio.wait_for(call, deadline)
    except asyncio.TimeoutError:
        raise StoreDeadline(f"the store did not answer within {deadline:g} s") from None


class StoreDeadline(Exception):
    """A synchronous store call awaited from asyncio outlived its deadline."""


Headers = List[Tuple[str, str]]


@dataclass(frozen=True)
class HandlerResult:
    """What the application answered: status, headers, body (and the redacted body to store)."""

    status: int
    headers: Headers
    body: bytes
    body_to_store: Optional[bytes] = None
    framework: bool = False
    """The framework rejected the request before the handler ran (never stored, PROTOCOL §9)."""
    body_truncated: bool = False
    """The host stopped recording the body at core's capture limit (PROTOCOL §7.5)."""


@dataclass(frozen=True)
class Execution:
    """Passed to the handler: the claim it runs under."""

    key: str
    generation: int
    downstream_key: str
    """Idempotency key for downstream side effects; the same across takeovers of one generation."""
    transaction: Optional[Transaction] = None
    """In transactional mode, the open database transaction to write through (else None)."""


@dataclass(frozen=True)
class Response:
    """The answer to send: status, headers (lowercase names), body, and how the request ended."""

    status: int
    headers: Headers
    body: bytes
    outcome: str
    handler_ran: bool


@dataclass
class Hooks:
    """Plain callbacks for metrics and logs; each receives the route template first.

    ``on_outcome(route, outcome)``: every answered request (``"stored"``, ``"replayed"``,
    ``"in_flight"``, ``"mismatch"``, ``"store_unavailable"``, ...).
    ``on_lease_lost(route)``: a running handler lost its claim to a takeover.
    ``on_store_error(route, exc)``: a store primitive raised (the request fails closed).
    ``on_store_op(route, op, seconds, failed)``: every store primitive the flow asked for
    (``op`` is core's name: ``"claim"``, ``"get"``, ``"takeover"``, ``"complete"``, ...), with
    its duration and whether it raised.
    ``on_takeover(route)``: a request took over an expired lease and runs the handler again.

    :mod:`idempo.metrics` builds these for ``prometheus_client`` and OpenTelemetry
    (``spec/METRICS.md``); :meth:`Hooks.chain` runs several sets in order. A hook that raises is
    logged and ignored: metrics never change an answer.
    """

    on_outcome: Optional[Callable[[str, str], None]] = None
    on_lease_lost: Optional[Callable[[str], None]] = None
    on_store_error: Optional[Callable[[str, BaseException], None]] = None
    on_store_op: Optional[Callable[[str, str, float, bool], None]] = None
    on_takeover: Optional[Callable[[str], None]] = None

    @staticmethod
    def chain(*hooks: "Hooks") -> "Hooks":
        """One set of hooks that calls each of ``hooks`` in order."""
        parts = list(hooks)

        def each(name: str) -> Any:
            fns = [getattr(h, name) for h in parts if getattr(h, name) is not None]
            if not fns:
                return None

            def call(*args: Any) -> None:
                for fn in fns:
                    fn(*args)

            return call

        return Hooks(
            on_outcome=each("on_outcome"),
            on_lease_lost=each("on_lease_lost"),
            on_store_error=each("on_store_error"),
            on_store_op=each("on_store_op"),
            on_takeover=each("on_takeover"),
        )

    def _safely(self, fn: Optional[Callable[..., None]], *args: Any) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a metrics hook never changes an answer
            log.exception("idempo: a hook raised (ignored)")

    def outcome(self, route: str, outcome: str) -> None:
        self._safely(self.on_outcome, route, outcome)

    def lease_lost(self, route: str) -> None:
        log.warning("idempo: lease lost on %s: another request took the key over", route)
        self._safely(self.on_lease_lost, route)

    def store_error(self, route: str, exc: BaseException) -> None:
        log.error("idempo: store failed on %s: %s", route, exc)
        self._safely(self.on_store_error, route, exc)

    def store_op(self, route: str, op: str, seconds: float, failed: bool) -> None:
        self._safely(self.on_store_op, route, op, seconds, failed)

    def takeover(self, route: str) -> None:
        self._safely(self.on_takeover, route)


def logging_hooks(logger: logging.Logger = log) -> Hooks:
    """Hooks that log every outcome at INFO (an example of wiring metrics)."""
    return Hooks(
        on_outcome=lambda route, outcome: logger.info("idempo %s: %s", route, outcome),
        on_lease_lost=lambda route: logger.warning("idempo %s: lease lost", route),
        on_store_error=lambda route, exc: logger.error("idempo %s: store error: %s", route, exc),
    )


_new = object.__new__
"""Builds the frozen dataclasses of every request (:class:`Response`, :class:`Execution`,
:class:`HandlerResult`) without their generated ``__init__`` (one ``object.__setattr__`` per
field): the same object, its fields set in the same order (none has a ``__post_init__``)."""


def response_of(action: Action) -> Response:
    """A :class:`Response` from a ``"respond"`` action."""
    response: Response = _new(Response)
    # status, headers (a copy), body, outcome (or ""), handler_ran, in one call (AssertionError
    # for an action that is not a response).
    action.fill_response(response.__dict__)
    return response


def new_handler_result(
    status: int,
    headers: Headers,
    body: bytes,
    body_to_store: Optional[bytes] = None,
    framework: bool = False,
    body_truncated: bool = False,
) -> HandlerResult:
    """``HandlerResult(status, headers, body, body_to_store, framework, body_truncated)``, built
    as :func:`response_of` builds its response."""
    result: HandlerResult = _new(HandlerResult)
    fields = result.__dict__
    fields["status"] = status
    fields["headers"] = headers
    fields["body"] = body
    fields["body_to_store"] = body_to_store
    fields["framework"] = framework
    fields["body_truncated"] = body_truncated
    return result


_ASYNC_TYPES: Dict[type, bool] = {}


def is_async_store(store: Any) -> bool:
    """True when the store's primitives are coroutine functions (known per class, unless the
    instance sets its own ``claim``)."""
    kind = type(store)
    known = _ASYNC_TYPES.get(kind)
    if known is not None and "claim" not in getattr(store, "__dict__", ()):
        return known
    found = inspect.iscoroutinefunction(getattr(store, "claim", None))
    if "claim" not in getattr(store, "__dict__", ()):
        _ASYNC_TYPES[kind] = found
    return found


def _execute(store: Any, action: Action) -> Any:
    op = action.op
    if op == "commit":
        # Transactional mode: the session's ``COMMIT``; a failure raises StoreUnavailable, which
        # core answers 503 (outcome ``not_committed``).
        return store.commit()
    return getattr(store, op or "")(*action.args)


class _Request:
    """What one request brings to the flow, the same for both hosts (set once, read only)."""

    __slots__ = ("config", "scope", "fingerprint", "key", "route", "hooks", "renderer")

    def __init__(
        self,
        config: Config,
        scope: bytes,
        fingerprint: str,
        key: str,
        route: str,
        hooks: Hooks,
        renderer: Optional[ProblemRenderer] = None,
    ) -> None:
        self.config = config
        self.scope = scope
        self.fingerprint = fingerprint
        self.key = key
        self.route = route
        self.hooks = hooks
        self.renderer = renderer


T = TypeVar("T")


class _Run:
    """One request's flow once started, with what its steps report to."""

    __slots__ = ("flow", "route", "hooks", "renderer", "memory", "lock", "lease_lost")

    def __init__(
        self,
        flow: ServerFlow,
        route: str,
        hooks: Hooks,
        renderer: Optional[ProblemRenderer] = None,
        memory: Optional[InlineMemory] = None,
    ) -> None:
        self.flow = flow
        self.route = route
        self.hooks = hooks
        self.renderer = renderer
        self.memory = memory
        """The request's memory store, when the flow's calls run its primitives
        (:func:`_memory`)."""
        self.lock: Optional[threading.Lock] = None
        """The thread host's: one store step at a time between the request and its heartbeat
        thread (set by :meth:`SyncRequest.begin`; asyncio needs none)."""
        self.lease_lost = False
        """Reported to ``hooks.lease_lost`` (once per request: at a heartbeat or at the end)."""

    def lost(self) -> None:
        if not self.lease_lost:
            self.lease_lost = True
            self.hooks.lease_lost(self.route)


def _memory(store: Any, hooks: Hooks) -> Optional[InlineMemory]:
    """The memory store whose claim, completion and release core's flow runs within its own
    calls (:func:`idempo.stores.memory.inline_memory`: idempo's ``MemoryStore``, unpatched), or
    None: every other store, and any store when ``on_store_op`` times each primitive."""
    if hooks.on_store_op is not None:
        return None
    return inline_memory(store)


_ENTROPY_BLOCK = 4096
"""Bytes of the OS's random generator read at once for flow tokens (256 tokens)."""
_ENTROPY: List[Iterator[bytes]] = []
"""The current block's unused 16-byte parts (a ``map`` of the block's ``__getitem__`` over
:data:`_PARTS`: each ``next`` runs in C only, so it is atomic, and slices on demand)."""
_PARTS = tuple(slice(i, i + 16) for i in range(0, _ENTROPY_BLOCK, 16))


def _entropy() -> bytes:
    """16 bytes from ``os.urandom`` for a flow's token: one system call per 256 flows instead of
    one each. Every part of a block is handed out once (threads included); a forked child starts
    a block of its own (``os.register_at_fork``), so parent and child never share a part."""
    try:
        return next(_ENTROPY[0])
    except (IndexError, StopIteration):
        block = os.urandom(_ENTROPY_BLOCK)
        parts = map(block.__getitem__, _PARTS)
        _ENTROPY[:] = [parts]
        return next(parts)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ENTROPY.clear)


_UNRESOLVED: Any = object()
"""A flow's InlineMemory before :func:`_start` looked it up."""


def _start(
    request: _Request, session: Any, store: Any = None, memory: Any = _UNRESOLVED
) -> Tuple[_Run, Action]:
    """Starts core's flow for the request (transactional when it runs in a ``session``);
    ``memory``: the store's InlineMemory when the host resolved it (:func:`_memory`)."""
    if memory is _UNRESOLVED:
        memory = None if session is not None or store is None else _memory(store, request.hooks)
    flow, action = ServerFlow.start(
        request.scope,
        request.fingerprint,
        request.config,
        _entropy(),
        memory,
    )
    return _Run(flow, request.route, request.hooks, request.renderer, memory), action


def _execution(request: _Request, action: Action, session: Any) -> Execution:
    """What the handler of a ``"run_handler"`` action is passed."""
    generation, downstream_key = action.generation, action.downstream_key
    assert generation is not None and downstream_key is not None
    execution: Execution = _new(Execution)
    fields = execution.__dict__
    fields["key"] = request.key
    fields["generation"] = generation
    fields["downstream_key"] = downstream_key
    fields["transaction"] = None if session is None else session.transaction
    return execution


def _handler_finished(run: _Run, result: HandlerResult) -> Action:
    """Tells the flow what the handler answered."""
    return run.flow.handler_finished(  # by position: no keyword dictionary per call
        result.status,
        result.headers,
        result.body,
        result.body_to_store,
        result.framework,
        result.body_truncated,
        run.memory,
    )


def _respond(run: _Run, action: Action, result: Optional[HandlerResult] = None) -> Response:
    """The response of the flow's final action, counted in the outcome hook; a problem idempo
    answers (anything but the handler's own ``result``) goes through the run's renderer."""
    response = response_of(action)
    if response.outcome == "lease_lost":
        run.lost()
    hooks = run.hooks
    if hooks.on_outcome is not None or type(hooks) is not Hooks:  # nothing to call: no call
        hooks.outcome(run.route, response.outcome)
    live = (
        result is not None
        and response.handler_ran
        and response.status == result.status
        and response.body == result.body
    )
    return response if live else render(response, run.renderer)


async def _execute_async(store: Any, action: Action, sync: bool) -> Any:
    """Executes a store action from asyncio: a ``sync`` store's in a worker thread (within its
    deadline, see :func:`_in_thread`), an async store's awaited."""
    if sync:
        return await _in_thread(store, action)
    return await _execute(store, action)


INLINE, THREAD, AWAIT = "inline", "thread", "await"
"""How a store's primitives run from asyncio (:func:`store_mode`)."""


def store_mode(store: Any) -> str:
    """How asyncio drives ``store``: ``"await"`` for an asyncio store, ``"inline"`` for a
    synchronous store that declares ``blocking = False`` (its primitives never wait on IO or a
    lock held across IO: the in-process :class:`~idempo.stores.MemoryStore`), called on the event
    loop without a thread hop; ``"thread"`` for every other synchronous store (a worker thread,
    within the store's deadline)."""
    if is_async_store(store):
        return AWAIT
    return INLINE if getattr(store, "blocking", True) is False else THREAD


def _store_plan(run: _Run, action: Action) -> "Plan[Action, Action]":
    """The store steps of a request, written once for both hosts: yields every store action
    until the flow asks for something else (receiving its result, or its error thrown in: any
    store failure fails closed) and returns that next action."""
    took_over = False
    timed = run.hooks.on_store_op is not None
    started = 0.0
    while action.kind == "store":
        op = action.op or ""
        if timed:
            started = time.perf_counter()
        try:
            result = yield action
        except Exception as exc:  # noqa: BLE001 - any store failure fails closed
            if timed:
                run.hooks.store_op(run.route, op, time.perf_counter() - started, True)
            run.hooks.store_error(run.route, exc)
            action = run.flow.store_failed()
            continue
        if timed:
            run.hooks.store_op(run.route, op, time.perf_counter() - started, False)
        took_over = op == "takeover"
        action = run.flow.store_result(result)
        if run.flow.corrupt_record is not None and action.kind != "store":
            log.error("idempo: corrupt record on %s: %s", run.route, run.flow.corrupt_record)
    if took_over and action.kind == "run_handler":
        run.hooks.takeover(run.route)
    return action


def _store_step(run: _Run, store: Any, action: Action) -> Action:
    """Executes store actions until the flow asks for something else."""
    if action.kind != "store":
        return action  # nothing to execute (the plan would return it as it is)
    return drive(_store_plan(run, action), lambda op: _execute(store, op))


def _for_partition(store: Any, partition: Optional[bytes]) -> Any:
    """The store whose claims count against ``partition`` (the principal's), for a store with
    per-partition quotas (``store.partitioned``, the memory store); else the store itself."""
    if partition is None or getattr(store, "partitioned", False) is not True:
        return store
    return store.with_partition(partition)


def run_sync(
    *,
    store: Any,
    config: Config,
    scope: bytes,
    fingerprint: str,
    key: str,
    route: str,
    handler: Callable[[Execution], HandlerResult],
    hooks: Hooks,
    partition: Optional[bytes] = None,
    renderer: Optional[ProblemRenderer] = None,
) -> Response:
    """Drives one request through the flow with a synchronous store and handler.

    The handler runs in the calling thread; heartbeats (lease renewals) run in a helper thread
    while it does. A handler exception is re-raised after core decided what to record.
    With ``config.transactional`` the store's session runs the claim, the handler and the completion in
    one database transaction (see :mod:`idempo.stores._tx`); core's transactional flow says
    when to roll back (``release``) and commit, and which response may be sent. The session is
    closed (rolling back whatever is still open) when the request ends. Problems idempo answers
    go through ``renderer`` (:mod:`idempo._render`).
    """
    flow = SyncRequest(
        store=store, config=config, scope=scope, fingerprint=fingerprint, key=key,
        route=route, hooks=hooks, partition=partition, renderer=renderer,
    )
    try:
        started = flow.begin()
        if isinstance(started, Response):
            return started
        try:
            result = flow.call(handler, started)
        except BaseException as exc:
            answer = flow.failed()
            if answer is None or not isinstance(exc, Exception):
                raise
            failed_log(route, exc)
            return answer
        return flow.finished(result)
    finally:
        flow.close()


def failed_log(route: str, exc: BaseException) -> None:
    """Logs a handler error that core answered itself (transactional mode: its rollback failed
    too, so the answer is the store's 503) instead of letting it propagate."""
    log.error("idempo: the handler on %s failed and its transaction could not be rolled back; "
              "answered 503: %s", route, exc, exc_info=exc)


class _Steps:
    """What :class:`SyncRequest` and :class:`AsyncRequest` share: the request, its store (the
    transactional session in transactional mode, else the store for the principal's partition),
    its run once begun, and the request's transaction made current around handler code."""

    def __init__(
        self,
        store: Any,
        config: Config,
        scope: bytes,
        fingerprint: str,
        key: str,
        route: str,
        hooks: Hooks,
        partition: Optional[bytes] = None,
        renderer: Optional[ProblemRenderer] = None,
        memories: Optional[PartitionMemories] = None,
    ) -> None:
        """``memories``: the host's remembered partition views of its memory store
        (:func:`idempo.stores.memory.partition_memory`), for a flow that would make the same.
        (The arguments may be passed by position: a host's call per request then builds no
        keyword dictionary.)"""
        self._request = _Request(config, scope, fingerprint, key, route, hooks, renderer)
        if config.transactional:
            require_transactions(store)
            self._session = self._open_session(store.transaction())
            self._store = self._session
        else:
            found = (
                None
                if memories is None or partition is None or hooks.on_store_op is not None
                else partition_memory(store, partition, memories)
            )
            if found is None:
                self._store = _for_partition(store, partition)
            else:
                self._store, self._memory = found[0], found[1]
        self._init_host()

    # Class-level defaults (no ``__slots__``): a request's flow sets only what differs.
    _session: Any = None
    """The transactional session (None: not transactional)."""
    _memory: Any = _UNRESOLVED
    """The InlineMemory the flow's calls run its store's primitives on (None: none), once
    known."""
    _run: Optional[_Run] = None
    _closed = False

    def _open_session(self, session: Any) -> Any:
        """The session as this host drives it."""
        return session

    def _init_host(self) -> None:
        """The host's own state (its heartbeat's), once the store is known."""

    @property
    def route(self) -> str:
        """The request's route template."""
        return self._request.route

    @staticmethod
    def enter(execution: Execution) -> Any:
        """Makes the request's transaction current (:func:`idempo.current_transaction`) until
        :meth:`leave` with the returned token."""
        tx = execution.transaction
        return enter(tx) if tx is not None else None

    @staticmethod
    def leave(token: Any) -> None:
        if token is not None:
            leave(token)


class SyncRequest(_Steps):
    """One request's flow driven in steps, for a host whose response outlives one call (a WSGI
    iterable or a Django streaming response teed to the client, PROTOCOL §7.5.1):
    :meth:`begin` claims (a :class:`Response` when the handler is not to run, else its
    :class:`Execution`), :meth:`call` runs handler code in the request's transaction, then exactly
    one of :meth:`finished` (the response's status, headers and recorded body) or :meth:`failed`
    (re-raise afterwards). Heartbeats run in a helper thread from :meth:`begin` until then.
    :meth:`close` (idempotent) closes the transactional session; :meth:`finished` and
    :meth:`failed` call it."""

    def _init_host(self) -> None:
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None

    def begin(self) -> Union[Response, Execution]:
        run, action = _start(self._request, self._session, self._store, self._memory)
        run.lock = threading.Lock()
        self._run = run
        action = _store_step(run, self._store, action)
        if action.kind != "run_handler":
            return self._end(action, None)
        info = _execution(self._request, action, self._session)
        if action.heartbeat_ms:
            self._beat = threading.Thread(
                target=_heartbeat_sync,
                args=(run, self._store, action.heartbeat_ms / 1000, self._stop),
                name="idempo-heartbeat",
                daemon=True,
            )
            self._beat.start()
        return info

    def call(self, fn: Callable[[Execution], T], execution: Execution) -> T:
        """``fn(execution)`` inside the request's transaction (:func:`idempo.current_transaction`)."""
        token = self.enter(execution)
        try:
            return fn(execution)
        finally:
            self.leave(token)

    def _stop_beat(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()

    def finished(self, result: HandlerResult) -> Response:
        """Records the handler's response as core says; core's answer."""
        assert self._run is not None
        self._stop_beat()
        run = self._run
        assert run.lock is not None
        with run.lock:
            action = _store_step(run, self._store, _handler_finished(run, result))
        return self._end(action, result)

    def failed(self, maybe_side_effect: bool = True) -> Optional[Response]:
        """The handler raised: core decides what to record (``maybe_side_effect=False``: it
        certainly had no effect, so the key is released). None: the caller re-raises; a
        :class:`Response`: core answers instead (transactional mode, when the rollback failed
        too: the store's 503). None when the flow already ended (the failure came after
        :meth:`finished`)."""
        if self._closed:
            return None
        assert self._run is not None
        self._stop_beat()
        run = self._run
        assert run.lock is not None
        try:
            with run.lock:
                action = _store_step(
                    run, self._store, run.flow.handler_failed(maybe_side_effect, memory=run.memory)
                )
            if action.kind == "respond":
                return self._end(action, None)
            run.hooks.outcome(run.route, action.outcome or "handler_failed")
            assert action.kind == "propagate_error", action
            return None
        finally:
            self.close()

    def _end(self, action: Action, result: Optional[HandlerResult]) -> Response:
        assert self._run is not None
        try:
            response = _respond(self._run, action, result)
            cleanup = self._run.flow.cleanup
            if cleanup is not None:
                threading.Thread(
                    target=_cleanup_sync,
                    args=(cleanup, self._store, self._run.route),
                    name="idempo-cleanup",
                    daemon=True,
                ).start()
            return response
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_beat()
        if self._session is not None:
            self._session.close()


def _applied(result: Any) -> Optional[bool]:
    """A cleanup primitive's boolean result (anything else counts as not applied)."""
    return result is True


class _Wait(NamedTuple):
    """A cleanup's pause before its next attempt."""

    seconds: float


def _cleanup_plan(cleanup: Cleanup, route: str) -> "Plan[Union[Action, _Wait], None]":
    """The decisions of a background cleanup of a claim whose answer was lost, written once for
    the thread and the task: yields the store action to execute (receiving its result, or its
    error thrown in) and the :class:`_Wait` before each retry core asks for; logs what happened
    and never raises."""
    try:
        start = time.monotonic()
        attempt = 0
        while True:
            applied: Optional[bool]
            try:
                applied = _applied((yield cleanup.action))
            except Exception as exc:  # noqa: BLE001 - retried, then given up quietly
                log.debug("idempo: cleanup on %s failed: %s", route, exc)
                applied = None
            elapsed_ms = int((time.monotonic() - start) * 1000)
            delay = cleanup.next(attempt, elapsed_ms, applied)
            if applied:
                log.info("idempo: released the unconfirmed claim on %s", route)
            if delay is None:
                return
            attempt += 1
            yield _Wait(delay / 1000)
    except Exception as exc:  # noqa: BLE001 - a background cleanup never raises
        log.warning("idempo: cleanup on %s stopped: %s", route, exc)


def _cleanup_sync(cleanup: Cleanup, store: Any, route: str) -> None:
    """Runs core's cleanup of a claim whose answer was lost: retried as core says, never raises.

    Runs in a daemon thread after the response was returned (see ``ServerFlow.cleanup``).
    """

    def io(op: Union[Action, _Wait]) -> Any:
        if isinstance(op, _Wait):
            time.sleep(op.seconds)
            return None
        return _execute(store, op)

    drive(_cleanup_plan(cleanup, route), io)


_CLEANUP_TASKS: "set[asyncio.Task[None]]" = set()
"""Strong references to running cleanup tasks (the event loop keeps only weak ones)."""


async def _cleanup_async(cleanup: Cleanup, store: Any, route: str) -> None:
    """As :func:`_cleanup_sync`, as an asyncio task (sync stores run in worker threads)."""
    sync = not is_async_store(store)

    async def io(op: Union[Action, _Wait]) -> Any:
        if isinstance(op, _Wait):
            await asyncio.sleep(op.seconds)
            return None
        return await _execute_async(store, op, sync)

    await drive_async(_cleanup_plan(cleanup, route), io)


def _spawn_cleanup_async(cleanup: Cleanup, store: Any, route: str) -> None:
    task = asyncio.ensure_future(_cleanup_async(cleanup, store, route))
    _CLEANUP_TASKS.add(task)
    task.add_done_callback(_CLEANUP_TASKS.discard)


def _heartbeat_sync(run: _Run, store: Any, interval: float, stop: threading.Event) -> None:
    lock = run.lock
    assert lock is not None
    while not stop.wait(interval):
        with lock:
            if stop.is_set():
                return
            action = _store_step(run, store, run.flow.heartbeat_due())
        if action.kind == "lease_lost":
            run.lost()


async def _store_step_async(
    run: _Run, store: Any, action: Action, mode: Optional[str] = None
) -> Action:
    """As :func:`_store_step`, from asyncio, as ``mode`` (:func:`store_mode`) says: inline on the
    loop, in worker threads, or awaited."""
    if action.kind != "store":
        return action  # nothing to execute (the plan would return it as it is)
    mode = mode or store_mode(store)
    if mode == INLINE:
        return _store_step(run, store, action)
    sync = mode == THREAD
    return await drive_async(
        _store_plan(run, action), lambda op: _execute_async(store, op, sync)
    )


async def run_async(
    *,
    store: Any,
    config: Config,
    scope: bytes,
    fingerprint: str,
    key: str,
    route: str,
    handler: Callable[[Execution], Awaitable[HandlerResult]],
    hooks: Hooks,
    partition: Optional[bytes] = None,
    renderer: Optional[ProblemRenderer] = None,
) -> Response:
    """Drives one request through the flow from asyncio (sync stores run in worker threads).

    ``config.transactional`` and ``renderer``: as for :func:`run_sync`.
    """
    flow = AsyncRequest(
        store=store, config=config, scope=scope, fingerprint=fingerprint, key=key,
        route=route, hooks=hooks, partition=partition, renderer=renderer,
    )
    try:
        started = await flow.begin()
        if isinstance(started, Response):
            return started
        token = flow.enter(started)
        try:
            result = await handler(started)
        except BaseException as exc:
            flow.leave(token)
            answer = await flow.failed()
            if answer is None or not isinstance(exc, Exception):
                raise
            failed_log(route, exc)
            return answer
        flow.leave(token)
        return await flow.finished(result)
    finally:
        await flow.close()


class AsyncRequest(_Steps):
    """:class:`SyncRequest` for asyncio: the same steps, awaited; heartbeats run in a task."""

    def _open_session(self, session: Any) -> Any:
        return session if is_async_store(session) else ThreadedSession(session)

    # Class-level defaults, as :class:`_Steps`'s: what a flow on a memory store the host
    # resolved (``memories``) keeps; :meth:`_init_host` sets the others.
    mode = INLINE
    """How the store's primitives run (:func:`store_mode`); ``"inline"`` never suspends."""
    inline = True
    """Every step of this flow runs without suspending (an inline store, no transaction): the
    host may call the ``*_now`` twins of the steps instead of awaiting them."""
    _lock: Optional[asyncio.Lock] = None
    _beats: "Optional[_Beats]" = None
    """The loop's heartbeat timer this request waits in (until its first renewal is due)."""
    _beat: "Optional[asyncio.Future[None]]" = None

    def _init_host(self) -> None:
        # A memory store the host resolved (``memories``) never blocks: its steps run inline
        # (the class's defaults).
        if self._memory is _UNRESOLVED:
            self.mode = store_mode(self._store)
            self.inline = self.mode == INLINE and self._session is None

    async def begin(self) -> Union[Response, Execution]:
        if self.inline:
            return self.begin_now()
        run, action = _start(self._request, self._session, self._store, self._memory)
        self._run = run
        action = await _store_step_async(run, self._store, action, self.mode)
        if action.kind != "run_handler":
            return await self._end(action, None)
        return self._started(action)

    def begin_now(self) -> Union[Response, Execution]:
        """:meth:`begin` of an :attr:`inline` flow, without suspending."""
        request = self._request
        memory = self._memory
        if memory is _UNRESOLVED:
            run, action = _start(request, self._session, self._store, memory)
        else:  # _start with the memory the host resolved, in this frame
            flow, action = ServerFlow.start(
                request.scope, request.fingerprint, request.config, _entropy(), memory)
            run = _Run(flow, request.route, request.hooks, request.renderer, memory)
        self._run = run
        kind = action.kind
        if kind == "store":  # the claim, when the flow did not run it inline
            action = _store_step(run, self._store, action)
            kind = action.kind
        if kind == "run_handler":
            return self._started(action)
        try:  # _end_now, in this frame
            response = _respond(run, action, None)
            cleanup = run.flow.cleanup
            if cleanup is not None:
                _spawn_cleanup_async(cleanup, self._store, run.route)
            return response
        finally:
            self.close_now()

    def _started(self, action: Action) -> Execution:
        info = _execution(self._request, action, self._session)
        heartbeat_ms = action.heartbeat_ms
        if heartbeat_ms:
            # Most handlers end before their first heartbeat is due: the request waits in its
            # loop's one heartbeat timer, and the heartbeat task (with its lock) is created only
            # for a handler that outlives the interval.
            beats = self._beats = _beats(running_loop())
            beats.add(self, heartbeat_ms / 1000)
        return info

    def _start_beat(self, interval: float) -> None:
        self._beats = None
        if self._closed or self._run is None:
            return
        self._lock = asyncio.Lock()
        self._beat = asyncio.ensure_future(
            _heartbeat_async(self._run, self._store, interval, self._lock, self.mode))

    def _stop_timer(self) -> None:
        if self._beats is not None:
            self._beats.remove(self)
            self._beats = None

    async def _step(self, event: Callable[[], Action]) -> Action:
        """The store steps after the handler: with the heartbeat stopped first (waiting for a
        renewal under way, never cancelling one mid-step). ``event`` feeds the flow the
        handler's end only then: core takes one event at a time, and a renewal in flight is one
        (PROTOCOL.md §7.1: after a store action the next event is its result)."""
        assert self._run is not None
        self._stop_timer()
        if self._beat is None or self._lock is None:
            return await _store_step_async(self._run, self._store, event(), self.mode)
        async with self._lock:
            # Cancelled only while sleeping or waiting for the lock: never mid-renewal.
            self._beat.cancel()
            return await _store_step_async(self._run, self._store, event(), self.mode)

    def _step_now(self, event: Callable[[], Action]) -> Action:
        """:meth:`_step` of an :attr:`inline` flow. Its heartbeat task holds the lock only
        within one renewal, which never suspends on an inline store, so the lock is free here
        (asserted) and the task is cancelled while it sleeps, as :meth:`_step` does."""
        assert self._run is not None
        self._stop_timer()
        if self._beat is not None:
            assert self._lock is None or not self._lock.locked()
            self._beat.cancel()
        return _store_step(self._run, self._store, event())

    async def finished(self, result: HandlerResult) -> Response:
        if self.inline:
            return self.finished_now(result)
        assert self._run is not None
        run = self._run
        action = await self._step(lambda: _handler_finished(run, result))
        return await self._end(action, result)

    def finished_now(self, result: HandlerResult) -> Response:
        """:meth:`finished` of an :attr:`inline` flow, without suspending (:meth:`_step_now`
        with the handler's end, then :meth:`_end_now`, in one frame)."""
        run = self._run
        assert run is not None
        if self._beats is not None:  # _stop_timer, in this frame
            self._stop_timer()
        if self._beat is not None:
            assert self._lock is None or not self._lock.locked()
            self._beat.cancel()
        action = _handler_finished(run, result)
        if action.kind == "store":
            action = _store_step(run, self._store, action)
        try:
            response = _respond(run, action, result)  # _answer, in this frame
            cleanup = run.flow.cleanup
            if cleanup is not None:
                _spawn_cleanup_async(cleanup, self._store, run.route)
            return response
        finally:
            self.close_now()

    async def failed(self, maybe_side_effect: bool = True) -> Optional[Response]:
        """As :meth:`SyncRequest.failed`."""
        if self.inline:
            return self.failed_now(maybe_side_effect)
        if self._closed:
            return None
        assert self._run is not None
        run = self._run
        try:
            action = await self._step(lambda: run.flow.handler_failed(maybe_side_effect, memory=run.memory))
            if action.kind == "respond":
                return await self._end(action, None)
            run.hooks.outcome(run.route, action.outcome or "handler_failed")
            return None
        finally:
            await self.close()

    def failed_now(self, maybe_side_effect: bool = True) -> Optional[Response]:
        """:meth:`failed` of an :attr:`inline` flow, without suspending."""
        if self._closed:
            return None
        assert self._run is not None
        run = self._run
        try:
            action = self._step_now(
                lambda: run.flow.handler_failed(maybe_side_effect, memory=run.memory))
            if action.kind == "respond":
                return self._end_now(action, None)
            run.hooks.outcome(run.route, action.outcome or "handler_failed")
            return None
        finally:
            self.close_now()

    def _answer(self, action: Action, result: Optional[HandlerResult]) -> Response:
        assert self._run is not None
        response = _respond(self._run, action, result)
        cleanup = self._run.flow.cleanup
        if cleanup is not None:
            _spawn_cleanup_async(cleanup, self._store, self._run.route)
        return response

    async def _end(self, action: Action, result: Optional[HandlerResult]) -> Response:
        try:
            return self._answer(action, result)
        finally:
            await self.close()

    def _end_now(self, action: Action, result: Optional[HandlerResult]) -> Response:
        try:
            return self._answer(action, result)
        finally:
            self.close_now()

    async def close(self) -> None:
        if self._closed:
            return
        self.close_now()
        if self._session is not None:
            await _maybe_await(self._session.close)

    def close_now(self) -> None:
        """Ends the flow's heartbeat (:meth:`close` without the transactional session's close,
        which an :attr:`inline` flow does not have)."""
        if self._closed:
            return
        self._closed = True
        if self._beats is not None:
            self._stop_timer()
        if self._beat is not None:
            self._beat.cancel()


class _Beats:
    """One event loop's heartbeat timer: the requests whose handler runs, each with the loop
    time its first renewal is due, and one timer handle at the earliest of them. A request that
    ends before its time leaves without touching the loop's scheduler; one that is due gets its
    heartbeat task."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.due: "Dict[AsyncRequest, Tuple[float, float]]" = {}
        self.handle: Optional[asyncio.TimerHandle] = None
        self.at = 0.0

    def add(self, request: "AsyncRequest", interval: float) -> None:
        when = self.loop.time() + interval
        self.due[request] = (when, interval)
        if self.handle is None or when < self.at:
            self._arm(when)

    def remove(self, request: "AsyncRequest") -> None:
        # The timer stays armed (it finds nothing due and stops): requests arriving one after
        # another reuse it instead of arming and cancelling a timer each.
        self.due.pop(request, None)

    def _arm(self, when: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.at = when
        self.handle = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.handle = None
        if not self.due:
            return
        now = self.loop.time()
        ready = [(r, iv) for r, (when, iv) in self.due.items() if when <= now]
        for request, _ in ready:
            del self.due[request]
        if self.due:
            self._arm(min(when for when, _ in self.due.values()))
        for request, interval in ready:
            request._start_beat(interval)


_BEATS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Beats]" = (
    weakref.WeakKeyDictionary())
_LAST_BEATS: List[_Beats] = []


def _beats(loop: asyncio.AbstractEventLoop) -> _Beats:
    """The heartbeat timer of ``loop`` (created with its first request)."""
    if _LAST_BEATS and _LAST_BEATS[0].loop is loop:
        return _LAST_BEATS[0]
    beats = _BEATS.get(loop)
    if beats is None:
        beats = _BEATS[loop] = _Beats(loop)
    _LAST_BEATS[:] = [beats]
    return beats


async def _maybe_await(fn: Callable[[], Any]) -> None:
    if inspect.iscoroutinefunction(fn):
        await fn()
    else:
        await asyncio.to_thread(fn)


async def _heartbeat_async(
    run: _Run, store: Any, interval: float, lock: asyncio.Lock, mode: str
) -> None:
    """Renews the lease every ``interval`` seconds, the first time at once (the request's timer
    started this task when the first renewal was due)."""
    while True:
        async with lock:
            action = await _store_step_async(run, store, run.flow.heartbeat_due(), mode)
        if action.kind == "lease_lost":
            run.lost()
        await asyncio.sleep(interval)
