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
from typing import Any, Callable, Iterable, Literal, Optional, Tuple, Union

import httpx

from idempo._idempo import (
    OutcomeUnknown,
    RetryPolicy,
    generate_key,
    key_header_value,
    parse_retry_after,
    response_body_needed,
)

DEFAULT_METHODS = ("POST", "PATCH")

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


class _Attempts:
    """Shared bookkeeping of both transports (no decisions: those come from the policy)."""

    def __init__(
        self,
        policy: Optional[RetryPolicy],
        header_name: str,
        methods: Iterable[str],
        rng: Optional[random.Random],
        on_retry: Optional[Callable[[int, str, int], None]],
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.header_name = header_name
        self.methods = frozenset(m.upper() for m in methods)
        self.rng = rng or random.Random()
        self.on_retry = on_retry

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
    ) -> Tuple[Optional[int], Optional[str]]:
        """``(delay_ms, None)`` to wait before the next attempt, or ``(None, reason)`` to stop."""
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
            return None, advice.reason
        delay = int(advice.delay_ms or 0)
        if self.on_retry is not None:
            self.on_retry(attempt, str(outcome), delay)
        return delay, None

    @staticmethod
    def finish(response: httpx.Response, key: str, attempt: int, reason: Optional[str]) -> httpx.Response:
        """The final response, or :class:`OutcomeUnknownError` for the outcome-unknown answer."""
        response.extensions["idempo_key"] = key
        response.extensions["idempo_attempts"] = attempt
        response.extensions["idempo_stop"] = reason
        if reason == OUTCOME_UNKNOWN_REASON:
            raise OutcomeUnknownError(key, attempt, response)
        return response


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
    ) -> None:
        self.inner = transport or httpx.HTTPTransport()
        self._a = _Attempts(policy, header_name, methods, rng, on_retry)
        self._sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = self._a.prepare(request)
        if key is None:
            return self.inner.handle_request(request)
        request.read()  # the body is re-sent on every attempt
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self.inner.handle_request(request)
            except httpx.TimeoutException:
                delay, _ = self._a.advise(attempt, started, "timeout", None)
                if delay is None:
                    raise
            except httpx.TransportError:
                delay, _ = self._a.advise(attempt, started, "connection_error", None)
                if delay is None:
                    raise
            else:
                content_type = response.headers.get("content-type")
                body = None
                if response_body_needed(response.status_code, content_type):
                    body = response.read()
                delay, reason = self._a.advise(
                    attempt,
                    started,
                    response.status_code,
                    response.headers.get("retry-after"),
                    content_type,
                    body,
                )
                if delay is None:
                    return self._a.finish(response, key, attempt, reason)
                response.close()
            self._sleep(delay / 1000)

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
    ) -> None:
        self.inner = transport or httpx.AsyncHTTPTransport()
        self._a = _Attempts(policy, header_name, methods, rng, on_retry)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = self._a.prepare(request)
        if key is None:
            return await self.inner.handle_async_request(request)
        await request.aread()
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self.inner.handle_async_request(request)
            except httpx.TimeoutException:
                delay, _ = self._a.advise(attempt, started, "timeout", None)
                if delay is None:
                    raise
            except httpx.TransportError:
                delay, _ = self._a.advise(attempt, started, "connection_error", None)
                if delay is None:
                    raise
            else:
                content_type = response.headers.get("content-type")
                body = None
                if response_body_needed(response.status_code, content_type):
                    body = await response.aread()
                delay, reason = self._a.advise(
                    attempt,
                    started,
                    response.status_code,
                    response.headers.get("retry-after"),
                    content_type,
                    body,
                )
                if delay is None:
                    return self._a.finish(response, key, attempt, reason)
                await response.aclose()
            await asyncio.sleep(delay / 1000)

    async def aclose(self) -> None:
        await self.inner.aclose()


def client(**kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` whose POST/PATCH requests are keyed and retried (kwargs go to
    :class:`IdempotentTransport`, except ``timeout`` and ``base_url`` for the client)."""
    opts = {k: kwargs.pop(k) for k in ("timeout", "base_url") if k in kwargs}
    return httpx.Client(transport=IdempotentTransport(**kwargs), **opts)


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` with :class:`AsyncIdempotentTransport`."""
    opts = {k: kwargs.pop(k) for k in ("timeout", "base_url") if k in kwargs}
    return httpx.AsyncClient(transport=AsyncIdempotentTransport(**kwargs), **opts)
