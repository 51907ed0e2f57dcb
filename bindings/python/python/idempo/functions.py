"""Idempotent functions and message consumers: the same guarantee past the HTTP edge.

``@idempotent_function(store=..., key=lambda msg: msg["id"])`` runs the decorated function at
most once per key (per ``scope``) through core's own server flow (``spec/PROTOCOL.md`` §14): a
duplicate delivery while the first runs raises :class:`CallInFlight` (or waits, ``wait=``), a
completed call returns the stored result without running, and the same key with another payload
raises :class:`PayloadMismatch`. Without ``key`` the key is the payload's fingerprint (core's
canonical JSON, ``exclude`` pointers left out). Results are encoded by a serializer (JSON by
default; dataclasses and Pydantic models round-trip through the return annotation), and an error
the function raises is stored, releases the key, or goes to the takeover policy, as ``on_error``
says. :func:`current_call` gives the running call's downstream key for the function's own effects.

This module decides nothing: core's ``Call`` frames the scope and fingerprint, says what to feed
the flow for a result or an error, and what the flow's end means for the caller.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import json
import os
import time
import typing
from dataclasses import dataclass
from types import SimpleNamespace
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Iterator,
    AsyncIterator,
    Mapping,
    Optional,
    Protocol,
    Tuple,
    Type,
    TypeVar,
    Union,
    cast,
)
from contextlib import asynccontextmanager, contextmanager

from idempo._flow import AsyncRequest, HandlerResult, Hooks, Response, SyncRequest
from idempo._idempo import (
    Call,
    CallAnswer,
    Config,
    Fingerprinter,
    IdempotencyError,
    KeyInUse,
    KeyReusedWithDifferentRequest,
    OutcomeUnknown,
    StoreUnavailable,
    call_answer,
    call_raised,
    call_returned,
    call_wait_delay,
)
from idempo.stores._tx import Transaction, enter, leave

__all__ = [
    "CallContext",
    "CallInFlight",
    "CallOutcomeUnknown",
    "CallStoreUnavailable",
    "JSONSerializer",
    "PayloadMismatch",
    "ResultNotRetained",
    "Serializer",
    "StoredError",
    "current_call",
    "idempotent_call",
    "idempotent_call_async",
    "idempotent_function",
]


class _Rebuildable(Exception):
    """A typed error whose ``args`` are its constructor's, so that ``pickle`` (a process pool, a
    Celery prefork worker handing the error to its parent) and a task queue's JSON result backend
    (Celery's rebuilds ``cls(*args)``) give the same class back; ``str`` is the message alone."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class PayloadMismatch(_Rebuildable, KeyReusedWithDifferentRequest):
    """The key was already used with a different payload: a bug in the producer (two messages
    share an id) or a key function that is not specific enough. ``key`` names it."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message, key)
        self.key = key


class CallInFlight(_Rebuildable, KeyInUse):
    """Another call with this key is running (not yet finished): nack or redeliver later, after
    ``retry_after`` seconds, or pass ``wait=`` to poll."""

    def __init__(self, message: str, key: str, retry_after: float) -> None:
        super().__init__(message, key, retry_after)
        self.key = key
        self.retry_after = retry_after


class CallOutcomeUnknown(_Rebuildable, OutcomeUnknown):
    """A call with this key may have acted but never finished (``on_error="unknown"`` or a crash,
    under the ``outcome_unknown`` takeover policy): it is not run again. Reconcile by hand."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message, key)
        self.key = key


class CallStoreUnavailable(_Rebuildable, StoreUnavailable):
    """The store failed or is contended: nothing this call did was recorded. Redeliver later."""

    def __init__(self, message: str, key: str, retry_after: float, outcome: str) -> None:
        super().__init__(message, key, retry_after, outcome)
        self.key = key
        self.retry_after = retry_after
        self.outcome = outcome


class ResultNotRetained(_Rebuildable, IdempotencyError):
    """The call ran earlier but its result was too large to keep (``max_stored_body_bytes``)."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message, key)
        self.key = key


class StoredError(IdempotencyError):
    """The replay of an error stored under ``on_error="store"``: the function is not run again.
    ``error_type`` and ``error_message`` are those of the original exception."""

    def __init__(self, key: str, error_type: str, error_message: str) -> None:
        super().__init__(key, error_type, error_message)  # pickles and rebuilds (see _Rebuildable)
        self.key = key
        self.error_type = error_type
        self.error_message = error_message

    def __str__(self) -> str:
        return f"{self.error_type}: {self.error_message}"


class Serializer(Protocol):
    """Encodes a function's result into the record, and back. ``name`` (``A-Z a-z 0-9 . _ -``)
    is stored with the bytes; a replay by another serializer raises rather than misread them."""

    name: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # Pydantic v2
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class JSONSerializer:
    """JSON with dataclasses and Pydantic models: ``loads`` rebuilds ``result_type`` (Pydantic's
    ``TypeAdapter`` when installed, else a dataclass's constructor; None: plain JSON values)."""

    name = "json"

    def __init__(self, result_type: Any = None) -> None:
        self.result_type = result_type

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, default=_jsonable, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        value = json.loads(data)
        tp = self.result_type
        if tp is None or tp is Any:
            return value
        try:
            from pydantic import TypeAdapter
        except ImportError:  # pragma: no cover - pydantic is optional
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                return tp(**value)
            return value
        return TypeAdapter(tp).validate_python(value)


def _payload_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return json.dumps(value, default=_jsonable, separators=(",", ":")).encode()


@dataclass(frozen=True)
class CallContext:
    """The running call: pass ``downstream_key`` to the services the function calls (the same
    across a takeover re-run of one generation, so they deduplicate)."""

    name: str
    key: str
    generation: int
    downstream_key: str
    transaction: Optional[Transaction] = None
    """In transactional mode, the store's open transaction: write the job's rows through it."""


_CURRENT: "contextvars.ContextVar[Optional[CallContext]]" = contextvars.ContextVar(
    "idempo_call", default=None
)


def current_call() -> Optional[CallContext]:
    """The idempotent call running in this context (None outside one)."""
    return _CURRENT.get()


Disposition = str
OnError = Union[
    Disposition,
    Mapping[Type[BaseException], Disposition],
    Callable[[BaseException], Disposition],
]


def _disposition(on_error: OnError, exc: BaseException) -> str:
    if isinstance(on_error, str):
        return on_error
    if isinstance(on_error, Mapping):
        for tp in type(exc).__mro__:
            if tp in on_error:
                return on_error[tp]
        return "unknown"
    return on_error(exc)


def _error_body(exc: BaseException) -> bytes:
    return json.dumps(
        {"type": type(exc).__qualname__, "message": str(exc)}, separators=(",", ":")
    ).encode()


@dataclass
class _Spec:
    """One function's options, prepared once."""

    store: Any
    call: Call
    config: Config
    fingerprinter: Fingerprinter
    serializer: Serializer
    on_error: OnError
    hooks: Hooks
    wait: float

    def identity(self, payload: bytes, key: Optional[str], principal: str) -> Tuple[bytes, str, str]:
        fingerprint = self.call.fingerprint(self.fingerprinter, payload)
        key = fingerprint if key is None else key
        return self.call.scope(principal, key), fingerprint, key


def _request(spec: _Spec, scope: bytes, fingerprint: str, key: str, cls: Any) -> Any:
    return cls(
        store=spec.store, config=spec.config, scope=scope, fingerprint=fingerprint, key=key,
        route=spec.call.name, hooks=spec.hooks,
    )


def _as_action(response: Response) -> Any:
    return SimpleNamespace(
        kind="respond", outcome=response.outcome, status=response.status,
        headers=response.headers, body=response.body,
    )


_PROPAGATE = SimpleNamespace(kind="propagate_error", outcome="handler_failed")


def _returned(spec: _Spec, answer: CallAnswer, key: str) -> Any:
    assert answer.body is not None
    if answer.serializer != spec.serializer.name:
        raise IdempotencyError(
            f"the result of {spec.call.name!r} key {key!r} was stored by serializer "
            f"{answer.serializer!r}, not {spec.serializer.name!r}"
        )
    return spec.serializer.loads(answer.body)


def _stored_error(spec: _Spec, answer: CallAnswer, key: str) -> Any:
    data = json.loads(answer.body or b"{}")
    raise StoredError(key, str(data.get("type", "")), str(data.get("message", "")))


def _in_flight(spec: _Spec, answer: CallAnswer, key: str) -> Any:
    retry = (answer.retry_after_ms or 1000) / 1000
    raise CallInFlight(f"{spec.call.name}: key {key!r} is in flight", key, retry)


def _mismatch(spec: _Spec, answer: CallAnswer, key: str) -> Any:
    raise PayloadMismatch(f"{spec.call.name}: key {key!r} was used with a different payload", key)


def _unknown(spec: _Spec, answer: CallAnswer, key: str) -> Any:
    raise CallOutcomeUnknown(f"{spec.call.name}: key {key!r}: outcome unknown", key)


def _not_retained(spec: _Spec, answer: CallAnswer, key: str) -> Any:
    raise ResultNotRetained(f"{spec.call.name}: key {key!r}: result not retained", key)


def _unavailable(spec: _Spec, answer: CallAnswer, key: str) -> Any:
    retry = (answer.retry_after_ms or 1000) / 1000
    raise CallStoreUnavailable(
        f"{spec.call.name}: key {key!r}: store unavailable ({answer.outcome})",
        key, retry, answer.outcome,
    )


_READERS: Dict[str, Callable[[_Spec, CallAnswer, str], Any]] = {
    "returned": _returned,
    "stored_error": _stored_error,
    "in_flight": _in_flight,
    "mismatch": _mismatch,
    "outcome_unknown": _unknown,
    "not_retained": _not_retained,
    "unavailable": _unavailable,
}
"""What each of core's call answers (``CallAnswer.kind``) returns or raises to the caller."""


def _read(spec: _Spec, answer: CallAnswer, key: str) -> Any:
    """The value a non-running answer returns, or raises its typed error."""
    reader = _READERS.get(answer.kind)
    if reader is None:
        raise IdempotencyError(
            f"{spec.call.name}: key {key!r}: unexpected record ({answer.kind})"
        )
    return reader(spec, answer, key)


def _live(spec: _Spec, answer: CallAnswer, key: str, value: Any, exc: Optional[BaseException]) -> Any:
    """The caller's value after this call ran the function."""
    if answer.kind in ("returned", "stored_error") and not answer.replayed:
        if exc is not None:
            raise exc
        return value
    if answer.kind == "propagate":
        assert exc is not None
        raise exc
    return _read(spec, answer, key)


def _jitter() -> int:
    return int.from_bytes(os.urandom(2), "big")


def _run_sync(spec: _Spec, fn: Callable[[], Any], scope: bytes, fingerprint: str, key: str) -> Any:
    started_at = time.monotonic()
    attempt = 0
    while True:
        try:
            return _once_sync(spec, fn, scope, fingerprint, key)
        except CallInFlight as busy:
            delay = _wait_delay(spec, attempt, busy, started_at)
            if delay is None:
                raise
            time.sleep(delay)
            attempt += 1


def _wait_delay(spec: _Spec, attempt: int, busy: CallInFlight, started_at: float) -> Optional[float]:
    if spec.wait <= 0:
        return None
    elapsed = int((time.monotonic() - started_at) * 1000)
    ms = call_wait_delay(
        attempt, int((busy.retry_after or 1.0) * 1000), elapsed, int(spec.wait * 1000), _jitter()
    )
    return None if ms is None else ms / 1000


def _settle_sync(spec: _Spec, req: SyncRequest, value: Any, exc: Optional[BaseException]) -> Response | None:
    if exc is None:
        status, headers, body = call_returned(spec.serializer.name, spec.serializer.dumps(value))
        return req.finished(HandlerResult(status, headers, body))
    plan = call_raised(_disposition(spec.on_error, exc), _error_body(exc))
    if plan[0] == "finished":
        return req.finished(HandlerResult(plan[1], plan[2], plan[3]))
    return req.failed(maybe_side_effect=plan[1])


def _once_sync(spec: _Spec, fn: Callable[[], Any], scope: bytes, fingerprint: str, key: str) -> Any:
    with _block_sync(spec, scope, fingerprint, key) as block:
        if not block.replayed:
            block.set_result(fn())
    return block.result


async def _run_async(
    spec: _Spec, fn: Callable[[], Awaitable[Any]], scope: bytes, fingerprint: str, key: str
) -> Any:
    started_at = time.monotonic()
    attempt = 0
    while True:
        try:
            return await _once_async(spec, fn, scope, fingerprint, key)
        except CallInFlight as busy:
            delay = _wait_delay(spec, attempt, busy, started_at)
            if delay is None:
                raise
            await asyncio.sleep(delay)
            attempt += 1


async def _settle_async(
    spec: _Spec, req: AsyncRequest, value: Any, exc: Optional[BaseException]
) -> Response | None:
    if exc is None:
        status, headers, body = call_returned(spec.serializer.name, spec.serializer.dumps(value))
        return await req.finished(HandlerResult(status, headers, body))
    plan = call_raised(_disposition(spec.on_error, exc), _error_body(exc))
    if plan[0] == "finished":
        return await req.finished(HandlerResult(plan[1], plan[2], plan[3]))
    return await req.failed(maybe_side_effect=plan[1])


async def _once_async(
    spec: _Spec, fn: Callable[[], Awaitable[Any]], scope: bytes, fingerprint: str, key: str
) -> Any:
    async with _block_async(spec, scope, fingerprint, key) as block:
        if not block.replayed:
            block.set_result(await fn())
    return block.result


F = TypeVar("F", bound=Callable[..., Any])


def _default_payload(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and not kwargs:
        return args[0]
    return {"args": list(args), "kwargs": kwargs}


def _spec(
    *,
    store: Any,
    name: str,
    config: Optional[Config],
    exclude: Tuple[str, ...],
    hmac_key: Optional[bytes],
    serializer: Optional[Serializer],
    result_type: Any,
    on_error: OnError,
    hooks: Optional[Hooks],
    wait: float,
    options: Dict[str, Any],
) -> _Spec:
    if store is None:
        raise IdempotencyError("an idempotency store is required (store=)")
    given = {k: v for k, v in options.items() if v is not None}
    if config is not None and given:
        raise IdempotencyError(f"pass either config= or {', '.join(given)}, not both")
    return _Spec(
        store=store,
        call=Call(name),
        config=config or Config(**given),
        fingerprinter=Fingerprinter(exclude=list(exclude), hmac_key=hmac_key),
        serializer=serializer or JSONSerializer(result_type),
        on_error=on_error,
        hooks=hooks or Hooks(),
        wait=wait,
    )


def idempotent_function(
    *,
    store: Any,
    key: Optional[Callable[..., str]] = None,
    payload: Optional[Callable[..., Any]] = None,
    scope: Union[None, str, Callable[..., str]] = None,
    name: Optional[str] = None,
    exclude: Tuple[str, ...] = (),
    hmac_key: Optional[bytes] = None,
    serializer: Optional[Serializer] = None,
    on_error: OnError = "unknown",
    wait: float = 0.0,
    hooks: Optional[Hooks] = None,
    config: Optional[Config] = None,
    ttl_ms: Optional[int] = None,
    lease_ms: Optional[int] = None,
    heartbeat_ms: Optional[int] = None,
    takeover: Optional[str] = None,
    transactional: Optional[bool] = None,
) -> Callable[[F], F]:
    """Makes a function (sync or ``async``) idempotent per key; see the module docs.

    ``key(*args, **kwargs)``: the call's key (a message or job id); None: the fingerprint of the
    payload. ``payload(*args, **kwargs)``: the JSON value fingerprinted (default: the only
    positional argument, else ``{"args": [...], "kwargs": {...}}``); ``exclude``: RFC 6901
    pointers left out of it. ``scope``: the tenant (a string, or a function of the arguments).
    ``name``: the record namespace (default: the function's module and qualified name; keep it
    stable across deploys). ``on_error``: ``"store"``, ``"release"`` or ``"unknown"`` (default),
    a mapping from exception classes to those, or a function of the exception. ``wait``: seconds
    to poll a call in flight (bounded, jittered) before raising :class:`CallInFlight`.
    ``ttl_ms``, ``lease_ms``, ``heartbeat_ms``, ``takeover`` (``"outcome_unknown"`` or
    ``"re_run"``), ``transactional``: as :class:`idempo.Config` (or pass ``config``).
    """
    options = {"ttl_ms": ttl_ms, "lease_ms": lease_ms, "heartbeat_ms": heartbeat_ms,
               "takeover": takeover, "transactional": transactional}

    def wrap(fn: F) -> F:
        hints: Dict[str, Any] = {}
        if serializer is None:
            try:
                hints = typing.get_type_hints(fn)
            except Exception:  # noqa: BLE001 - an unresolvable annotation: plain JSON values
                hints = {}
        spec = _spec(
            store=store, name=name or f"{fn.__module__}.{fn.__qualname__}", config=config,
            exclude=tuple(exclude), hmac_key=hmac_key, serializer=serializer,
            result_type=hints.get("return"), on_error=on_error, hooks=hooks, wait=wait,
            options=options,
        )
        pick = payload or _default_payload

        def identity(args: Any, kwargs: Any) -> Tuple[bytes, str, str]:
            principal = scope(*args, **kwargs) if callable(scope) else (scope or "")
            explicit = None if key is None else str(key(*args, **kwargs))
            return spec.identity(_payload_bytes(pick(*args, **kwargs)), explicit, principal)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                s, fp, k = identity(args, kwargs)
                return await _run_async(spec, lambda: fn(*args, **kwargs), s, fp, k)

            return cast(F, run_async)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            s, fp, k = identity(args, kwargs)
            return _run_sync(spec, lambda: fn(*args, **kwargs), s, fp, k)

        return cast(F, run)

    return wrap


class CallBlock:
    """The body of an :func:`idempotent_call` block: when :attr:`replayed`, :attr:`result` is the
    stored result and the body must not act; else act, then :meth:`set_result`."""

    def __init__(self, context: Optional[CallContext], result: Any, replayed: bool) -> None:
        self.context = context
        self.result = result
        self.replayed = replayed

    def set_result(self, value: Any) -> None:
        self.result = value


def _block_options(kwargs: Dict[str, Any], name: str) -> _Spec:
    return _spec(
        store=kwargs.pop("store"), name=name, config=kwargs.pop("config", None),
        exclude=tuple(kwargs.pop("exclude", ())), hmac_key=kwargs.pop("hmac_key", None),
        serializer=kwargs.pop("serializer", None), result_type=kwargs.pop("result_type", None),
        on_error=kwargs.pop("on_error", "unknown"), hooks=kwargs.pop("hooks", None),
        wait=0.0, options=kwargs,
    )


@contextmanager
def _block_sync(spec: _Spec, s: bytes, fp: str, k: str) -> Iterator[CallBlock]:
    """One call as a block: yields the replay, or runs the body under the claim, then records
    its result (or error) as core says."""
    req = _request(spec, s, fp, k, SyncRequest)
    try:
        started = req.begin()
        if isinstance(started, Response):
            yield CallBlock(None, _read(spec, call_answer(_as_action(started)), k), True)
            return
        ctx = CallContext(spec.call.name, k, started.generation, started.downstream_key,
                          started.transaction)
        block = CallBlock(ctx, None, False)
        token = _CURRENT.set(ctx)
        error: Optional[BaseException] = None
        tx = enter(started.transaction) if started.transaction is not None else None
        try:
            yield block
        except Exception as exc:  # noqa: BLE001 - core decides what to record, then re-raised
            error = exc
        except BaseException:
            req.failed()
            raise
        finally:
            if tx is not None:
                leave(tx)
            _CURRENT.reset(token)
        response = _settle_sync(spec, req, block.result, error)
        action = _PROPAGATE if response is None else _as_action(response)
        _live(spec, call_answer(action), k, block.result, error)
    finally:
        req.close()


@asynccontextmanager
async def _block_async(spec: _Spec, s: bytes, fp: str, k: str) -> AsyncIterator[CallBlock]:
    """:func:`_block_sync` for asyncio."""
    req = _request(spec, s, fp, k, AsyncRequest)
    try:
        started = await req.begin()
        if isinstance(started, Response):
            yield CallBlock(None, _read(spec, call_answer(_as_action(started)), k), True)
            return
        ctx = CallContext(spec.call.name, k, started.generation, started.downstream_key,
                          started.transaction)
        block = CallBlock(ctx, None, False)
        token = _CURRENT.set(ctx)
        tx = req.enter(started)
        error: Optional[BaseException] = None
        try:
            yield block
        except Exception as exc:  # noqa: BLE001 - core decides what to record, then re-raised
            error = exc
        except BaseException:
            req.leave(tx)
            _CURRENT.reset(token)
            await req.failed()
            raise
        req.leave(tx)
        _CURRENT.reset(token)
        response = await _settle_async(spec, req, block.result, error)
        action = _PROPAGATE if response is None else _as_action(response)
        _live(spec, call_answer(action), k, block.result, error)
    finally:
        await req.close()


@contextmanager
def idempotent_call(
    name: str, *, key: Optional[str] = None, payload: Any = None, scope: str = "",
    **options: Any,
) -> Iterator[CallBlock]:
    """A block run at most once per key: ``with idempotent_call("ship", key=msg_id, payload=msg,
    store=store) as call:`` then ``if call.replayed: return call.result`` else act and
    ``call.set_result(...)``. Options as :func:`idempotent_function` (``store`` required)."""
    spec = _block_options(dict(options), name)
    s, fp, k = spec.identity(_payload_bytes(payload), key, scope)
    with _block_sync(spec, s, fp, k) as block:
        yield block


@asynccontextmanager
async def idempotent_call_async(
    name: str, *, key: Optional[str] = None, payload: Any = None, scope: str = "",
    **options: Any,
) -> AsyncIterator[CallBlock]:
    """:func:`idempotent_call` for ``async with``."""
    spec = _block_options(dict(options), name)
    s, fp, k = spec.identity(_payload_bytes(payload), key, scope)
    async with _block_async(spec, s, fp, k) as block:
        yield block
