"""A retrying httpx transport: one fresh key per logical operation, the same key on every retry.

::

    import httpx
    from idempo.client import IdempotentTransport

    client = httpx.Client(transport=IdempotentTransport(httpx.HTTPTransport()))
    r = client.post("https://api.example/payments", json={"amount": 10})
    r.extensions["idempo_key"], r.extensions["idempo_attempts"]

Each request with a protected method (default ``POST`` and ``PATCH``) that has no
``Idempotency-Key`` gets a fresh key (16 bytes of ``os.urandom`` through core); a request that
already carries one keeps it (a key that must survive a restart of your process is yours to
persist). Core's retry policy decides after every attempt: idempo's 409 in-flight, 425/429/408/5xx,
timeouts and connection errors are retried with exponential backoff and jitter (``random``),
honouring ``Retry-After``; 2xx, idempo's 422 key-reused (a new intent needs a new key) and other
4xx stop. An application's own 409 or 422 (not idempo's problem type) is its answer: returned at
once, never retried and never reported as key reuse. The final response carries
``extensions["idempo_stop"]``: core's stop reason (``"success"``, ``"client_error"``,
``"key_reused_with_different_request"``, ``"response_not_retained"``, ...). When the policy gives
up after an exception, that exception is raised.

**Intents** (``spec/KEYS.md`` §3.6): name the user intent and the key becomes the intent's, kept
in a :class:`~idempo.pending.PendingKeyStore` (durable: :class:`~idempo.pending.SQLitePendingKeyStore`)
across retries, repeated clicks and restarts until the server gives a definitive answer::

    from idempo.client import IdempotentClient
    from idempo.pending import SQLitePendingKeyStore

    with IdempotentClient(store=SQLitePendingKeyStore("pending.db")) as http:
        r = http.post(url, json={"amount": 100}, intent="checkout-42")

Concurrent sends of one intent (threads with the sync client, tasks with the async one) share one
key and one attempt sequence, and every caller gets the same answer: a double click charges once.
The record is bound to the request (core's fingerprint of method, URL, content type and body): a
different request under an intent whose key is still pending raises
:class:`IntentChangedWhilePendingError` and sends nothing. Without an intent, every request is its
own operation with a fresh key, as before. (The intent travels as the request extension
``"idempo_intent"``; the plain transports accept it too.)

idempo's outcome-unknown answer (a 500 ``application/problem+json`` of type
``urn:idempo:problem:outcome-unknown``, recognised by core) is never retried: retrying that key
cannot change the answer. The transport raises :class:`OutcomeUnknownError` (an
``idempo.OutcomeUnknown``) carrying the key, the attempt count and the response: reconcile (check
the resource's state) before deciding on a new key; do not mint one blindly.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Callable, Iterable, Literal, Mapping, NamedTuple, Optional, Tuple, Union

try:
    import httpx
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "idempo.client needs httpx, which is not installed; install the client extra: "
        "pip install 'idempo[client]'"
    ) from e

from idempo._flights import AsyncFlights, Flights
from idempo._options import default
from idempo._plan import Plan, drive, drive_async
from idempo._idempo import (
    OutcomeUnknown,
    RetryAdvice,
    RetryPolicy,
    generate_key,
    intent_decide_send,
    intent_request_fingerprint,
    key_header_value,
    parse_key,
    parse_retry_after,
    response_body_needed,
)
from idempo.pending import MemoryPendingKeyStore, PendingIntent, PendingKeyStore

DEFAULT_METHODS: Tuple[str, ...] = default("host", "methods")

#: The stop reason core gives for idempo's outcome-unknown answer.
OUTCOME_UNKNOWN_REASON = "outcome_unknown"


class OutcomeUnknownError(OutcomeUnknown):
    """The server answered idempo's outcome-unknown problem: an earlier attempt with ``key`` may
    have taken effect and its outcome was not recorded. No further attempt was made (retrying
    this key cannot change the answer). Reconcile before using a new key.

    ``response`` is the 500 answer (its body already read), ``attempts`` the attempts made.
    """

    def __init__(self, key: str, attempts: int, response: httpx.Response) -> None:
        super().__init__(
            f"outcome unknown after {attempts} attempt(s) with Idempotency-Key {key!r}: an "
            "earlier attempt may have taken effect; reconcile before using a new key"
        )
        self.key = key
        self.attempts = attempts
        self.response = response


#: The request extension that carries the intent name.
INTENT_EXTENSION = "idempo_intent"


class IntentError(Exception):
    """A send under an intent was refused locally; nothing was sent. ``code`` is core's."""

    code = "intent_error"

    def __init__(self, intent: str, pending: PendingIntent, message: str) -> None:
        super().__init__(message)
        self.intent = intent
        #: The intent's pending record (its key stays pending).
        self.pending = pending
        self.key = pending.key


class IntentChangedWhilePendingError(IntentError):
    """The request differs from the one the intent's pending key was minted for (e.g. the amount
    changed). The earlier attempt may have run: reconcile (check the resource), then remove the
    intent's record (``store.remove(intent)``) before sending the changed request, or use a new
    intent name. Nothing was sent."""

    code = "intent_changed_while_pending"

    def __init__(self, intent: str, pending: PendingIntent) -> None:
        super().__init__(
            intent,
            pending,
            f"intent {intent!r} has a pending key minted for a different request; nothing was "
            "sent: reconcile (the earlier attempt may have run), then remove the intent's record "
            "or use a new intent",
        )


class IntentKeyDiffersError(IntentError):
    """The request carries an ``Idempotency-Key`` that is not the intent's pending key."""

    code = "intent_key_differs_from_pending"

    def __init__(self, intent: str, pending: PendingIntent) -> None:
        super().__init__(
            intent, pending, f"the request's key is not the pending key of intent {intent!r}"
        )


def _intent_of(request: httpx.Request) -> Optional[str]:
    intent = request.extensions.get(INTENT_EXTENSION)
    if intent is None:
        return None
    if not isinstance(intent, str) or not intent:
        raise TypeError(f"the {INTENT_EXTENSION!r} extension must be a non-empty str")
    return intent


def _shared_copy(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    """The answer of a shared attempt sequence for another caller (its body already read)."""
    headers = [
        (k, v)
        for k, v in response.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    extensions = {k: v for k, v in response.extensions.items() if k.startswith("idempo_")}
    return httpx.Response(
        response.status_code,
        headers=headers,
        content=response.content,
        request=request,
        extensions=extensions,
    )


class _Binding:
    """A request bound to an intent: core's request fingerprint and the caller's key, if any."""

    def __init__(self, request: httpx.Request, intent: str, header_name: str) -> None:
        self.intent = intent
        self.fingerprint = intent_request_fingerprint(
            request.method, str(request.url), request.headers.get("content-type"), request.content
        )
        explicit = request.headers.get(header_name)
        self.explicit_key = None if explicit is None else parse_key(explicit, min_len=1, max_len=255)

    def candidate(self) -> PendingIntent:
        return PendingIntent(
            key=self.explicit_key or generate_key(),
            fingerprint=self.fingerprint,
            created_ms=int(time.time() * 1000),
        )

    def check(self, record: PendingIntent) -> None:
        """Core's decision for this request and the intent's record; raises a refusal."""
        decision = intent_decide_send(
            (record.key, record.fingerprint, record.created_ms), self.fingerprint, self.explicit_key
        )
        if decision == IntentChangedWhilePendingError.code:
            raise IntentChangedWhilePendingError(self.intent, record)
        if decision == IntentKeyDiffersError.code:
            raise IntentKeyDiffersError(self.intent, record)


class _Attempts:
    """Shared bookkeeping of both transports (no decisions: those come from the policy)."""

    def __init__(
        self,
        policy: Optional[RetryPolicy],
        header_name: str,
        methods: Iterable[str],
        rng: Optional[random.Random],
        on_retry: Optional[Callable[[int, str, int], None]],
        store: Optional[PendingKeyStore] = None,
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.header_name = header_name
        self.methods = frozenset(m.upper() for m in methods)
        self.rng = rng or random.Random()
        self.on_retry = on_retry
        self.store: PendingKeyStore = store if store is not None else MemoryPendingKeyStore()

    def set_key(self, request: httpx.Request, key: str) -> None:
        request.headers[self.header_name] = key_header_value(key)

    def prepare(self, request: httpx.Request) -> Optional[str]:
        """Adds a fresh key when the request is protected and has none; returns the key."""
        if request.method.upper() not in self.methods:
            return None
        existing = request.headers.get(self.header_name)
        if existing is not None:
            return existing
        key = generate_key()
        request.headers[self.header_name] = key_header_value(key)
        return key

    def advise(
        self,
        attempt: int,
        started: float,
        outcome: Union[int, Literal["timeout", "connection_error"]],
        retry_after: Optional[str],
        content_type: Optional[str] = None,
        body: Optional[bytes] = None,
    ) -> Tuple[Optional[int], Optional[RetryAdvice]]:
        """``(delay_ms, None)`` to wait before the next attempt, or ``(None, advice)`` to stop."""
        elapsed_ms = int((time.monotonic() - started) * 1000)
        ra_ms = None
        if retry_after is not None:
            ra_ms = parse_retry_after(retry_after, int(time.time() * 1000))
        advice = self.policy.decide(
            attempt,
            elapsed_ms,
            outcome,
            self.rng.random(),
            retry_after_ms=ra_ms,
            content_type=content_type,
            body=body,
        )
        if not advice.retry:
            return None, advice
        delay = int(advice.delay_ms or 0)
        if self.on_retry is not None:
            self.on_retry(attempt, str(outcome), delay)
        return delay, None

    def finish(
        self,
        response: httpx.Response,
        key: str,
        attempt: int,
        advice: Optional[RetryAdvice],
        intent: Optional[str],
    ) -> httpx.Response:
        """The final response, or :class:`OutcomeUnknownError` for the outcome-unknown answer.
        A stop that settles the intent (core's ``settles_intent``) removes its pending record."""
        reason = advice.reason if advice is not None else None
        response.extensions["idempo_key"] = key
        response.extensions["idempo_attempts"] = attempt
        response.extensions["idempo_stop"] = reason
        if intent is not None:
            response.extensions[INTENT_EXTENSION] = intent
            if advice is not None and advice.settles_intent:
                self.store.remove(intent)
        if reason == OUTCOME_UNKNOWN_REASON:
            raise OutcomeUnknownError(key, attempt, response)
        return response


class _Send:
    """Send the request once (an attempt): the response, or the transport's error thrown in."""


_SEND = _Send()


class _Read(NamedTuple):
    """Read the response's body (core's policy needs it to classify the answer)."""

    response: httpx.Response


class _Close(NamedTuple):
    """Close a response that is not the answer (another attempt follows)."""

    response: httpx.Response


class _Sleep(NamedTuple):
    """Wait before the next attempt."""

    seconds: float


_Op = Union[_Send, _Read, _Close, _Sleep]


def _attempts(a: _Attempts, key: str, intent: Optional[str]) -> "Plan[_Op, httpx.Response]":
    """The attempts of one request, written once for both transports (:mod:`idempo._plan`):
    each outcome goes to core's policy, which says when to wait and retry and when to stop; the
    final response (or the last transport error, re-raised) ends the plan."""
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            response: httpx.Response = yield _SEND
        except httpx.TimeoutException:
            delay, _ = a.advise(attempt, started, "timeout", None)
            if delay is None:
                raise
        except httpx.TransportError:
            delay, _ = a.advise(attempt, started, "connection_error", None)
            if delay is None:
                raise
        else:
            content_type = response.headers.get("content-type")
            body = None
            if response_body_needed(response.status_code, content_type):
                body = yield _Read(response)
            delay, advice = a.advise(
                attempt,
                started,
                response.status_code,
                response.headers.get("retry-after"),
                content_type,
                body,
            )
            if delay is None:
                return a.finish(response, key, attempt, advice, intent)
            yield _Close(response)
        yield _Sleep(delay / 1000)


class IdempotentTransport(httpx.BaseTransport):
    """Wraps a sync httpx transport with keys and core's retry policy.

    ``on_retry(attempt, outcome, delay_ms)`` is called before each wait (logging, metrics).
    """

    def __init__(
        self,
        transport: Optional[httpx.BaseTransport] = None,
        *,
        policy: Optional[RetryPolicy] = None,
        header_name: str = "Idempotency-Key",
        methods: Iterable[str] = DEFAULT_METHODS,
        rng: Optional[random.Random] = None,
        sleep: Callable[[float], None] = time.sleep,
        on_retry: Optional[Callable[[int, str, int], None]] = None,
        store: Optional[PendingKeyStore] = None,
    ) -> None:
        self.inner = transport or httpx.HTTPTransport()
        self._a = _Attempts(policy, header_name, methods, rng, on_retry, store)
        self._sleep = sleep
        self._flights = Flights()

    @property
    def store(self) -> PendingKeyStore:
        """Where the pending intents live."""
        return self._a.store

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        intent = _intent_of(request)
        if intent is not None:
            return self._send_intent(request, intent)
        key = self._a.prepare(request)
        if key is None:
            return self.inner.handle_request(request)
        request.read()  # the body is re-sent on every attempt
        return self._run(request, key, None)

    def _send_intent(self, request: httpx.Request, intent: str) -> httpx.Response:
        request.read()
        binding = _Binding(request, intent, self._a.header_name)
        flight, created = self._flights.join(intent)
        try:
            if created:
                try:
                    flight.record.set(self._a.store.get_or_create(intent, binding.candidate()))
                except BaseException as e:
                    flight.record.fail(e)
                    raise
            record: PendingIntent = flight.record.wait()
            binding.check(record)
            if not self._flights.claim_run(flight):
                return _shared_copy(flight.result.wait(), request)
            try:
                self._a.set_key(request, record.key)
                response = self._run(request, record.key, intent)
                response.read()
            except BaseException as e:
                flight.result.fail(e)
                raise
            flight.result.set(response)
            return response
        finally:
            self._flights.leave(intent, flight)

    def _run(self, request: httpx.Request, key: str, intent: Optional[str]) -> httpx.Response:
        def io(op: _Op) -> Any:
            if op is _SEND:
                return self.inner.handle_request(request)
            if isinstance(op, _Read):
                return op.response.read()
            if isinstance(op, _Close):
                return op.response.close()
            assert isinstance(op, _Sleep)
            return self._sleep(op.seconds)

        return drive(_attempts(self._a, key, intent), io)

    def close(self) -> None:
        self.inner.close()


class AsyncIdempotentTransport(httpx.AsyncBaseTransport):
    """The asyncio form of :class:`IdempotentTransport`."""

    def __init__(
        self,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        *,
        policy: Optional[RetryPolicy] = None,
        header_name: str = "Idempotency-Key",
        methods: Iterable[str] = DEFAULT_METHODS,
        rng: Optional[random.Random] = None,
        on_retry: Optional[Callable[[int, str, int], None]] = None,
        store: Optional[PendingKeyStore] = None,
    ) -> None:
        self.inner = transport or httpx.AsyncHTTPTransport()
        self._a = _Attempts(policy, header_name, methods, rng, on_retry, store)
        self._flights = AsyncFlights()

    @property
    def store(self) -> PendingKeyStore:
        """Where the pending intents live (called from a worker thread)."""
        return self._a.store

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        intent = _intent_of(request)
        if intent is not None:
            return await self._send_intent(request, intent)
        key = self._a.prepare(request)
        if key is None:
            return await self.inner.handle_async_request(request)
        await request.aread()
        return await self._run(request, key, None)

    async def _send_intent(self, request: httpx.Request, intent: str) -> httpx.Response:
        await request.aread()
        binding = _Binding(request, intent, self._a.header_name)
        flight = self._flights.join(intent)
        try:
            if flight.record is None:
                flight.record = asyncio.ensure_future(
                    asyncio.to_thread(self._a.store.get_or_create, intent, binding.candidate())
                )
            record: PendingIntent = await asyncio.shield(flight.record)
            binding.check(record)
            mine = flight.result is None
            if flight.result is None:
                self._a.set_key(request, record.key)
                flight.result = asyncio.ensure_future(self._run_read(request, record.key, intent))
            response: httpx.Response = await asyncio.shield(flight.result)
            return response if mine else _shared_copy(response, request)
        finally:
            self._flights.leave(intent, flight)

    async def _run_read(self, request: httpx.Request, key: str, intent: str) -> httpx.Response:
        response = await self._run(request, key, intent)
        await response.aread()
        return response

    async def _run(self, request: httpx.Request, key: str, intent: Optional[str]) -> httpx.Response:
        async def io(op: _Op) -> Any:
            if op is _SEND:
                return await self.inner.handle_async_request(request)
            if isinstance(op, _Read):
                return await op.response.aread()
            if isinstance(op, _Close):
                return await op.response.aclose()
            assert isinstance(op, _Sleep)
            return await asyncio.sleep(op.seconds)

        return await drive_async(_attempts(self._a, key, intent), io)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _with_intent(intent: Optional[str], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    if intent is not None:
        extensions = dict(out.get("extensions") or {})
        extensions[INTENT_EXTENSION] = intent
        out["extensions"] = extensions
    return out


_TRANSPORT_OPTIONS = ("transport", "policy", "header_name", "methods", "rng", "sleep", "on_retry", "store")


class IdempotentClient(httpx.Client):
    """An ``httpx.Client`` over :class:`IdempotentTransport` whose ``request``/``post``/``put``/
    ``patch``/``delete`` take ``intent=`` (see the module docs). Transport options (``policy``,
    ``store``, ``transport``, ``header_name``, ``methods``, ``rng``, ``sleep``, ``on_retry``)
    go to the transport, everything else to ``httpx.Client``."""

    def __init__(self, **kwargs: Any) -> None:
        opts = {k: kwargs.pop(k) for k in _TRANSPORT_OPTIONS if k in kwargs}
        self.idempotent_transport = IdempotentTransport(**opts)
        super().__init__(transport=self.idempotent_transport, **kwargs)

    @property
    def store(self) -> PendingKeyStore:
        """Where the pending intents live."""
        return self.idempotent_transport.store

    def request(  # type: ignore[override]
        self, method: str, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return super().request(method, url, **_with_intent(intent, kwargs))

    def post(  # type: ignore[override]
        self, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return self.request("POST", url, intent=intent, **kwargs)

    def put(  # type: ignore[override]
        self, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return self.request("PUT", url, intent=intent, **kwargs)

    def patch(  # type: ignore[override]
        self, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return self.request("PATCH", url, intent=intent, **kwargs)

    def delete(  # type: ignore[override]
        self, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return self.request("DELETE", url, intent=intent, **kwargs)


class AsyncIdempotentClient(httpx.AsyncClient):
    """The asyncio form of :class:`IdempotentClient` (over :class:`AsyncIdempotentTransport`;
    ``sleep`` is not an option there)."""

    def __init__(self, **kwargs: Any) -> None:
        opts = {k: kwargs.pop(k) for k in _TRANSPORT_OPTIONS if k in kwargs and k != "sleep"}
        self.idempotent_transport = AsyncIdempotentTransport(**opts)
        super().__init__(transport=self.idempotent_transport, **kwargs)

    @property
    def store(self) -> PendingKeyStore:
        """Where the pending intents live."""
        return self.idempotent_transport.store

    async def request(  # type: ignore[override]
        self, method: str, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return await super().request(method, url, **_with_intent(intent, kwargs))

    async def post(  # type: ignore[override]
        self, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return await self.request("POST", url, intent=intent, **kwargs)

    async def put(  # type: ignore[override]
        self, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return await self.request("PUT", url, intent=intent, **kwargs)

    async def patch(  # type: ignore[override]
        self, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return await self.request("PATCH", url, intent=intent, **kwargs)

    async def delete(  # type: ignore[override]
        self, url: Union[httpx.URL, str], *, intent: Optional[str] = None, **kwargs: Any
    ) -> httpx.Response:
        return await self.request("DELETE", url, intent=intent, **kwargs)


def client(**kwargs: Any) -> IdempotentClient:
    """An :class:`IdempotentClient` (an ``httpx.Client``) whose POST/PATCH requests are keyed and
    retried; transport options go to :class:`IdempotentTransport`, the rest to the client."""
    return IdempotentClient(**kwargs)


def async_client(**kwargs: Any) -> AsyncIdempotentClient:
    """An :class:`AsyncIdempotentClient` (an ``httpx.AsyncClient``)."""
    return AsyncIdempotentClient(**kwargs)
