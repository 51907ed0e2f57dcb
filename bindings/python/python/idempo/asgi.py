"""ASGI middleware (Starlette, any ASGI app) that makes POST endpoints idempotent.

With FastAPI, prefer :mod:`idempo.fastapi` (a dependency that claims the key after FastAPI's
authentication dependencies and validation); the middleware runs before routing and can only read
what the ASGI scope already holds.

::

    from idempo.asgi import IdempotencyMiddleware
    from idempo.stores import SQLiteStore

    app.add_middleware(
        IdempotencyMiddleware,
        store=SQLiteStore("idempo.sqlite3"),
        # The principal, read when the middleware runs (before the endpoint): here the user an
        # authentication middleware that runs earlier put in the ASGI scope.
        scope=lambda request_scope: request_scope["user"].display_name,
    )

Per route, mark the endpoint with :func:`idempo.idempotent` (its own ``Config``, fingerprint
headers, excluded JSON pointers, scope function; ``enabled=False`` to exempt it). How the
handler's response is captured is core's plan (``spec/PROTOCOL.md`` §7.5): a small response is
buffered until core decided what to store; a streamed one (no ``content-length``, or
``more_body``) is teed to the client as it streams while at most ``max_body_bytes`` of it are
recorded (past that the record is the ``response-not-retained`` problem); a status that is not
stored passes straight through. The response is complete at its last body message: the record is
written and the answer sent before the application continues (its background tasks). The app is
not offered ``http.response.pathsend`` (a ``pathsend`` sent anyway is read from the file).
FastAPI's request validation errors (``RequestValidationError``) are marked as the framework's
rejection and never stored, so the corrected request with the same key runs. Replays carry
``Idempotent-Replayed: true``; problems are RFC 9457 ``application/problem+json``. The running
handler finds its execution (key, generation, downstream key) in ``scope["state"]["idempotency"]``
(``request.state.idempotency`` in Starlette).
"""

from __future__ import annotations

import asyncio
from typing import (
    TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, MutableMapping, Optional, Protocol,
    Sequence, Tuple,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

from idempo._flow import HandlerResult, Response, failed_log, new_handler_result
from idempo._host import (
    HostCore, HostOptions, RouteOptions, RouteParts, with_content_length,
)
from idempo._idempo import (
    BodyCapture, Config, asgi_response_headers, asgi_start_headers, asgi_target,
)
from idempo.stores._tx import enter, leave
from idempo._tee import handler_result

#: ``scope["state"]`` member set when the framework rejected the request before the handler ran.
FRAMEWORK_REJECTION = "idempo.framework_rejection"

_FRAMEWORK_EXCEPTIONS = ("RequestValidationError",)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _starlette_route(scope: Scope) -> Tuple[Optional[str], Any, bool]:
    """(route template, endpoint, routed): the Starlette route that fully matches, if any;
    ``routed`` is False when the app exposes no routes to match against. Mounts are followed
    (``/api`` + ``/payments/{id}``)."""
    app = scope.get("app")
    routes = getattr(app, "routes", None)
    if not routes:
        return None, None, False
    full = _full_match()
    if full is None:  # pragma: no cover - Starlette is what sets scope["app"].routes
        return None, None, False
    # Routes read the scope and return their child scope (Starlette's router passes its own).
    template, endpoint = _match(routes, scope, "", full, 0)
    return template, endpoint, True


_FULL: List[Any] = []

_MAX_ROUTES_CACHED = 1024
"""(method, path) pairs whose route a middleware remembers (past that it starts over)."""

_PATH_MATCHES: List[Any] = []


def _path_matches() -> Tuple[Any, ...]:
    """The ``matches`` methods of the route classes whose answer depends on the method and the
    path alone (Starlette's ``Route``, ``WebSocketRoute`` and ``Mount``; FastAPI's ``APIRoute``
    and ``APIWebSocketRoute``), and ``Mount.matches`` last."""
    if not _PATH_MATCHES:
        from starlette import routing

        found = [routing.Route.matches, routing.WebSocketRoute.matches]
        try:
            from fastapi import routing as fastapi_routing

            found += [fastapi_routing.APIRoute.matches, fastapi_routing.APIWebSocketRoute.matches]
        except ImportError:  # pragma: no cover - Starlette without FastAPI
            pass
        found.append(routing.Mount.matches)
        _PATH_MATCHES.extend(found)
    return tuple(_PATH_MATCHES)


def _path_routed(routes: Sequence[Any], depth: int = 0) -> bool:
    """True when every route (mounted ones too) matches by method and path alone, so that a
    route found for a (method, path) holds for every request with them (a ``Host`` route or a
    route class of the app's own reads more of the request)."""
    known = _path_matches()
    for route in routes:
        method = getattr(type(route), "matches", None)
        if method not in known:
            return False
        if method is known[-1]:  # a Mount: its routes too
            inner = getattr(route, "routes", None) or ()
            if depth >= 8 or not _path_routed(inner, depth + 1):
                return False
    return True


Decision = Tuple[Optional[RouteParts], str, str]
"""A middleware's decision for an HTTP request's (method, path, root_path): the route's parts
(None: the request passes through unprotected), its route template (else the path) and the
method in upper case."""


class _RouteCache:
    """The route found per (type, method, path, root_path), for an app whose routes all match by
    method and path alone, and the middleware's :data:`Decision` per (method, path, root_path)
    (what it makes of that route; only without a ``route`` function); forgotten when the app's
    route list changes."""

    def __init__(self) -> None:
        self.sig: Optional[Tuple[int, int, int]] = None
        self.usable = False
        self.found: Dict[Tuple[Any, ...], Tuple[Optional[str], Any, bool]] = {}
        self.decided: Dict[Tuple[Any, ...], Decision] = {}

    def decision(self, scope: Scope) -> Optional[Decision]:
        """The decision remembered for an HTTP request, or None (decide it, then
        :meth:`remember`)."""
        app = scope.get("app")
        routes = getattr(app, "routes", None)
        if not routes or not self.usable or self.sig != (id(app), id(routes), len(routes)):
            return None
        return self.decided.get((scope["method"], scope["path"], scope.get("root_path", "")))

    def remember(self, scope: Scope, decision: Decision) -> None:
        """Keeps ``decision`` for the request's (method, path, root_path) when its route was
        found by them alone (:meth:`route` just ran for it)."""
        app = scope.get("app")
        routes = getattr(app, "routes", None)
        if not routes or not self.usable or self.sig != (id(app), id(routes), len(routes)):
            return
        if len(self.decided) >= _MAX_ROUTES_CACHED:
            self.decided = {}
        self.decided[(scope["method"], scope["path"], scope.get("root_path", ""))] = decision

    def route(self, scope: Scope) -> Tuple[Optional[str], Any, bool]:
        app = scope.get("app")
        routes = getattr(app, "routes", None)
        if not routes:
            return None, None, False
        sig = (id(app), id(routes), len(routes))
        if sig != self.sig:
            self.sig = sig
            self.found = {}
            self.decided = {}
            try:
                self.usable = _path_routed(routes)
            except ImportError:  # pragma: no cover - Starlette is what sets scope["app"].routes
                self.usable = False
        if not self.usable:
            return _starlette_route(scope)
        key = (scope["type"], scope["method"], scope["path"], scope.get("root_path", ""))
        hit = self.found.get(key)
        if hit is None:
            hit = _starlette_route(scope)
            if len(self.found) >= _MAX_ROUTES_CACHED:
                self.found = {}
            self.found[key] = hit
        return hit


def _full_match() -> Any:
    """Starlette's ``Match.FULL`` (imported once; None without Starlette)."""
    if not _FULL:
        try:
            from starlette.routing import Match
        except ImportError:  # pragma: no cover
            return None
        _FULL.append(Match.FULL)
    return _FULL[0]


def _match(
    routes: Sequence[Any], scope: Scope, prefix: str, full: Any, depth: int
) -> Tuple[Optional[str], Any]:
    for route in routes:
        try:
            match, child = route.matches(scope)
        except Exception:  # noqa: BLE001 - a foreign route type: skip it
            continue
        if match != full:
            continue
        path = getattr(route, "path", None)
        sub = getattr(route, "routes", None)
        if sub and depth < 8:
            inner = {**scope, **child}
            template, endpoint = _match(sub, inner, prefix + (path or ""), full, depth + 1)
            return template, endpoint
        if path is None:
            return None, None
        return prefix + path, getattr(route, "endpoint", None)
    return None, None


def _authenticated(scope: Scope, authorization: bool) -> bool:
    """An authenticated user in the scope, else an ``authorization`` header came."""
    user = scope.get("user")
    if user is not None and getattr(user, "is_authenticated", False):
        return True
    return authorization


class IdempotencyMiddleware:
    """Idempotency-Key handling for an ASGI application (see the module docs for options).

    - ``store``: a store from :mod:`idempo.stores` (sync stores run in worker threads).
    - ``config``: :class:`idempo.Config` (lease, heartbeat, TTL, key required or optional,
      caching policy, replay header allowlist, takeover policy, retry-after hints).
    - ``methods``: methods that are protected (default ``POST`` and ``PATCH``).
    - ``header_name``: the key header (default ``Idempotency-Key``).
    - ``scope``: ``fn(asgi_scope) -> principal | None``; the principal (user, tenant, API
      client) namespaces keys. Without it an authenticated request raises an
      :class:`~idempo.UnscopedKeyWarning` once per route.
    - ``route``: ``fn(asgi_scope) -> template | None``; default: the matching Starlette route's
      path template, else the raw path.
    - ``public``: the routes' keys are shared by every caller (no principal); per route with
      ``idempotent(public=True)``. A route with neither ``scope`` nor ``public`` uses the shared
      namespace and warns once for authenticated requests. A ``scope`` function that returns
      ``None``, ``""`` (unless ``empty_scope_is_anonymous=True``), a non-string, or raises gets
      the request refused with 500 ``scope-unresolved`` (logged on the ``idempo`` logger); the
      handler does not run. The function runs in the middleware, before the handler: it must
      read what exists at that point (a header, a token, ``scope["user"]`` set by an
      authentication middleware that runs earlier), not state an endpoint dependency sets.
    - ``fingerprint_headers`` / ``exclude``: request headers and JSON pointers (left out) of the
      fingerprint; ``hmac_key`` makes fingerprints HMACs; ``numbers``: ``"reject_precision_loss"``
      or ``"rfc"`` (None: core's default, ``"reject_precision_loss"``).
    - Key syntax (``key_min_len``, ``key_max_len``, ``key_strict``), the request body limit
      (``max_request_body_bytes``: larger bodies get 413 after reading at most this much plus one
      chunk) and transactional mode are :class:`idempo.Config` options.
    - ``redact``: ``fn(status, headers, body) -> bytes | None``, the body to store instead
      (needs ``Config(redact=True)``).
    - ``hooks``: :class:`idempo.Hooks` callbacks for metrics.
    - ``problem_renderer``: ``fn(problem) -> (body, content_type)`` renders idempo's problems in
      the API's own error format (:class:`idempo.Problem`; default RFC 9457 problem+json).
    - A ``store`` that is not a store instance (a string, a class, a factory) is a ``TypeError``
      when the middleware is built.
    - ``only_marked``: protect only endpoints marked with :func:`idempo.idempotent`.
    - ``Config(transactional=True)``: run the claim, the handler and the completion in one
      database transaction of the store (PostgreSQL or SQLite; per route with
      ``idempotent(config=Config(transactional=True))``); the handler writes through
      :func:`idempo.current_transaction` ``().connection`` (also
      ``request.state.idempotency.transaction``). Other stores raise
      :class:`idempo.TransactionalUnsupported`.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: Any,
        route: Optional[Callable[[Scope], Optional[str]]] = None,
        **options: "Unpack[HostOptions]",
    ) -> None:
        self.app = app
        self.route_fn = route
        self._marked = False
        self._routes = _RouteCache()
        self.core = HostCore(store=store, host="idempo.asgi.IdempotencyMiddleware", **options)

    def _mark_framework_rejections(self) -> None:
        """Wraps the exception handlers of the framework's own request validation (FastAPI's
        ``RequestValidationError``) in the exception middleware below this one, so that their
        responses are marked as the framework's rejection (never stored, PROTOCOL §9)."""
        self._marked = True
        app: Any = self.app
        for _ in range(32):
            handlers = getattr(app, "_exception_handlers", None)
            if isinstance(handlers, dict):
                for exc_type, handler in list(handlers.items()):
                    name = getattr(exc_type, "__name__", "")
                    if name in _FRAMEWORK_EXCEPTIONS and not getattr(handler, "_idempo", False):
                        handlers[exc_type] = _marking(handler)
                return
            app = getattr(app, "app", None)
            if app is None:
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._marked:
            self._mark_framework_rejections()
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        decided = None if self.route_fn is not None else self._routes.decision(scope)
        if decided is None:
            decided = self._decide(scope)
        parts, route, method = decided
        if parts is None:
            await self.app(scope, receive, send)
            return
        if not isinstance(scope.get("state"), dict):
            # Servers without lifespan state (httpx.ASGITransport) set none; Starlette adds it
            # anyway, so a scope function reading scope["state"] sees an empty one.
            scope["state"] = {}
        # The protected request, in this frame (one coroutine less per request).
        core = self.core
        opts = parts.opts
        raw = scope.get("headers", ())
        admission, headers, content_type, authorization = core.start_asgi(opts, parts, raw)
        kind = admission.kind
        if kind != "read_body":
            if kind == "pass_through":  # no key, key optional: unprotected
                await self.app(scope, receive, send)
            else:
                await _send(send, core.refused(route, admission))
            return
        limit = admission.body_limit
        assert limit is not None
        message = await receive()
        body: Optional[bytes]
        if (
            message["type"] == "http.request"
            and type(message.get("body", b"")) is bytes
            and not message.get("more_body", False)
        ):
            # The whole body in one message (what _read_body reads of it, without its loop).
            body = message.get("body", b"")
            over_limit = len(body) > limit
            if over_limit:
                body = b""
        else:
            body, over_limit = await self._read_body(receive, limit, message)
            if body is None:
                return
        flow = core.admitted_flow(
            admission,
            parts,
            scope,
            method,
            route,
            asgi_target(scope) or _target(scope),
            headers,
            content_type,
            body,
            over_limit,
            _authenticated(scope, authorization),
        )
        if isinstance(flow, Response):
            await _send(send, flow)
            return
        try:
            started = flow.begin_now() if flow.inline else await flow.begin()
            if isinstance(started, Response):  # a replay or a problem: the handler does not run
                await _send(send, started)
                return
            inner = dict(scope)
            state = dict(scope.get("state") or {})
            state["idempotency"] = started
            inner["state"] = state
            inner["extensions"] = _without_pathsend(scope)
            tx = started.transaction
            token = None if tx is None else enter(tx)
            try:
                await run_captured(
                    flow, _Capture(opts.config, send, state), opts, self.app, inner,
                    _replay(body, receive), send)
            finally:
                if token is not None:
                    leave(token)
        finally:
            if flow.inline:
                flow.close_now()
            else:
                await flow.close()

    def _decide(self, scope: Scope) -> Decision:
        """The :data:`Decision` for an HTTP request (remembered, without a ``route`` function,
        for the next request with its method and path)."""
        method = scope["method"].upper()
        if method not in self.core.methods:
            decided: Decision = (None, "", method)
            if self.route_fn is None:
                self._routes.remember(scope, decided)
            return decided
        template, endpoint, routed = self._routes.route(scope)
        if self.route_fn is not None:
            template = self.route_fn(scope) or template
        elif routed and template is None:
            # No such route: the app answers 404/405.
            decided = (None, "", method)
            self._routes.remember(scope, decided)
            return decided
        opts = self.core.options_for(endpoint)
        decided = (
            None if opts is None else self.core.parts(opts), template or scope["path"], method)
        if self.route_fn is None:
            self._routes.remember(scope, decided)
        return decided

    async def _read_body(
        self, receive: Receive, limit: int, message: Optional[Message] = None
    ) -> Tuple[Optional[bytes], bool]:
        """(body, over_limit); stops at the first chunk past ``limit``; body None when the
        client went away. ``message``: the first message, already received."""
        chunks: List[bytes] = []
        size = 0
        while True:
            if message is None:
                message = await receive()
            if message["type"] == "http.disconnect":
                return None, False
            if message["type"] != "http.request":
                message = None
                continue
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return b"", True
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False
            message = None


def _marking(handler: Any) -> Any:
    """An exception handler that marks its response as the framework's rejection."""

    async def marked(request: Any, exc: BaseException) -> Any:
        state = request.scope.get("state")
        if isinstance(state, dict):
            state[FRAMEWORK_REJECTION] = True
        result = handler(request, exc)
        if hasattr(result, "__await__"):
            result = await result
        return result

    marked._idempo = True  # type: ignore[attr-defined]
    return marked


def _target(scope: Scope) -> str:
    """The concrete request target as received: raw path plus query string (spec/CANONICAL.md §2.1)."""
    query = scope.get("query_string", b"")
    raw_path = scope.get("raw_path")
    path = bytes(raw_path).decode("latin-1") if raw_path else str(scope.get("path", ""))
    return path + ("?" + bytes(query).decode("latin-1") if query else "")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive callable that yields the buffered body once, then the real channel."""
    sent = False

    async def inner() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return inner


def _without_pathsend(scope: Scope) -> Dict[str, Any]:
    """The scope's ``extensions`` without ``http.response.pathsend``: a protected response's
    bytes must pass through idempo (for the record), so the application is not offered the
    server's file sending (Starlette's ``FileResponse`` then sends the file as body chunks)."""
    extensions = dict(scope.get("extensions") or {})
    extensions.pop("http.response.pathsend", None)
    return extensions


_FILE_CHUNK = 64 * 1024


def _has_length(headers: List[Tuple[str, str]]) -> bool:
    for name, _ in headers:
        if name.lower() == "content-length":
            return True
    return False


class _Capture:
    """Captures the application's response as core's capture plan says (PROTOCOL §7.5).

    The plan is asked once the status and headers are known: at ``http.response.start`` when the
    response declares no ``content-length`` (it streams: the headers go to the client at once),
    else at the first body message (when ``more_body`` tells whether the body streams).
    ``buffer`` holds the response for the flow to answer with; ``tee`` and ``pass_through`` send
    every message to the client at once (``sent``), ``tee`` recording at most the limit
    (``truncated`` past it), ``pass_through`` recording nothing. An ``http.response.pathsend``
    (a server's file sending, if the application uses it although idempo does not offer it) is
    read from the file as body chunks.

    The last body message sets ``finished`` and awaits ``on_complete`` (the host writes the
    record and sends the live answer) before a streamed response's last message is forwarded and
    before the application's ``send`` returns: what the application does after its response (its
    background tasks) can neither change the outcome nor delay the answer, and a client that has
    the whole response finds the record. The application runs in the host's own task (no task,
    no future per request).
    """

    # Class-level defaults (no ``__slots__``): a capture sets only what differs per response.
    status: Optional[int] = None
    length = False
    """The response's headers declare a ``content-length``."""
    start: Optional[Message] = None
    plan: Optional[str] = None
    capture: Optional[BodyCapture] = None
    sent = False
    truncated = False
    finished = False
    """The last body message arrived (the response is complete)."""
    on_complete: Optional[Callable[[], Awaitable[None]]] = None
    """Awaited at the last body message (the host records the response and answers)."""
    completing = False
    """``on_complete`` started: what the application raises from now on is not the handler's
    failure (the outcome is decided)."""

    headers: List[Tuple[str, str]] = []
    """The response's headers (set at ``http.response.start``; this empty list is never
    changed)."""

    def __init__(
        self, config: Config, client: Optional[Send], state: Optional[Dict[str, Any]] = None
    ) -> None:
        """``state``: the ``scope["state"]`` the application is given (where the framework
        marks its own rejections)."""
        self.config = config
        self.client = client
        self.state: Dict[str, Any] = {} if state is None else state
        self.chunks: List[bytes] = []

    @property
    def framework(self) -> bool:
        return bool(self.state.get(FRAMEWORK_REJECTION, False))

    async def _forward(self, message: Message) -> None:
        assert self.client is not None, "the client's send is set before the response starts"
        await self.client(message)

    def _plan(self, streaming: bool) -> bool:
        """Asks core's capture plan; True when the response's start is to go to the client now
        (the caller forwards it: every plan but ``buffer``)."""
        assert self.status is not None and self.start is not None
        plan, limit = self.config.capture_plan(  # streaming, framework (self.framework)
            self.status, self.headers, streaming,
            bool(self.state.get(FRAMEWORK_REJECTION, False)))
        self.plan = plan
        if plan == "buffer":  # a buffered body is bounded by the flow
            return False
        if limit is not None:
            self.capture = BodyCapture(limit)
        self.sent = True
        return True

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.start = message
            raw = message.get("headers", ())
            decoded = asgi_response_headers(raw)  # bytes pairs, decoded in the extension
            if decoded is None:
                self.headers = headers = [
                    (bytes(n).decode("latin-1"), bytes(v).decode("latin-1")) for n, v in raw
                ]
                self.length = _has_length(headers)
            else:
                self.headers, self.length = decoded
            if not self.length and self._plan(True):
                await self._forward(message)
            return
        if kind == "http.response.pathsend":
            await self._send_file(str(message["path"]))
            return
        if kind != "http.response.body":
            if self.sent:
                await self._forward(message)  # e.g. trailers of a response already on its way
            return
        chunk = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        if self.plan is None:
            assert self.status is not None, "body before http.response.start"
            if self._plan(more):
                await self._forward(self.start)  # type: ignore[arg-type]
        if self.plan == "buffer":
            # Held for the live response (sent once the flow answers); the flow bounds the record.
            self.chunks.append(chunk)
        elif self.capture is not None:
            step = self.capture.accept(len(chunk))
            if step == "record":
                self.chunks.append(chunk)
            elif step == "discard":
                self.chunks = []
                self.truncated = True
        if more:
            if self.plan != "buffer":
                await self._forward(message)
            return
        self.finished = True
        if not self.completing and self.on_complete is not None:  # self.complete(), here
            self.completing = True
            await self.on_complete()
        if self.plan != "buffer":
            # A streamed response's last message goes out once the record is written: a client
            # that has the whole response and retries finds the record, not the key in flight.
            await self._forward(message)

    async def complete(self) -> None:
        """Runs ``on_complete`` once (at the last body message, or when the application ended
        without one)."""
        if self.completing or self.on_complete is None:
            return
        self.completing = True
        await self.on_complete()

    async def _send_file(self, path: str) -> None:
        """A ``pathsend`` as body messages read from the file (one chunk ahead, to know the last)."""
        file = await asyncio.to_thread(open, path, "rb")
        with file:
            chunk = await asyncio.to_thread(file.read, _FILE_CHUNK)
            while True:
                following = await asyncio.to_thread(file.read, _FILE_CHUNK) if chunk else b""
                await self.send(
                    {"type": "http.response.body", "body": chunk, "more_body": bool(following)})
                if not following:
                    return
                chunk = following

    def ended(self) -> None:
        """The application returned without its last body message: a response started without
        a body message has an empty body; one that ended inside its body (the client went away
        mid-stream and the framework stopped the stream) is not recorded whole."""
        if self.finished:
            return
        if self.plan is None and self.start is not None:
            self.plan = "buffer"
        elif self.plan is not None:
            self.chunks = []
            self.truncated = True

    def outcome(self, opts: RouteOptions) -> HandlerResult:
        """What the handler answered (its response as captured so far, see :meth:`ended`)."""
        if self.status is None:  # self.result(), in this frame
            raise RuntimeError("the application finished without starting a response")
        framework = bool(self.state.get(FRAMEWORK_REJECTION, False))
        if opts.redact is None:  # handler_result without a redact hook, in this frame
            return new_handler_result(
                self.status, self.headers, b"".join(self.chunks), None, framework,
                self.truncated)
        return handler_result(
            opts, self.status, self.headers, b"".join(self.chunks), self.truncated, framework)

    def result(self) -> Tuple[int, List[Tuple[str, str]], bytes]:
        if self.status is None:
            raise RuntimeError("the application finished without starting a response")
        return self.status, self.headers, b"".join(self.chunks)


class FlowSteps(Protocol):
    """The steps of a flow after its handler (:class:`~idempo._flow.AsyncRequest`'s)."""

    @property
    def route(self) -> str: ...

    async def finished(self, result: HandlerResult) -> Response: ...

    async def failed(self) -> Optional[Response]: ...


async def run_captured(
    flow: FlowSteps,
    capture: _Capture,
    opts: RouteOptions,
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    answer_failures: bool = True,
) -> Optional[Response]:
    """Runs the application (``app(scope, receive, capture.send)``, in this task) under
    ``flow`` once its handler may run: the response is recorded and answered at its last body
    message (the application's ``send`` returns after that), or when the application returns
    without one. A failure before then is the handler's: core decides what to record and the
    error is re-raised, unless core answers instead (transactional mode, a failed rollback:
    logged, and returned and sent when ``answer_failures``, else the error is re-raised). What
    the application raises after the outcome is decided (its background tasks) propagates
    unchanged."""
    answered: List[Response] = []
    # An inline flow (idempo._flow.AsyncRequest.inline) takes its steps without suspending.
    now: Any = flow if getattr(flow, "inline", False) is True else None

    async def complete() -> None:
        try:
            result = capture.outcome(opts)  # no response started, or the redact hook raised
        except BaseException:
            capture.completing = False  # nothing decided: the failure is the handler's
            raise
        answer = now.finished_now(result) if now is not None else await flow.finished(result)
        answered.append(answer)
        if not capture.sent:
            await _send(send, answer, capture)

    capture.on_complete = complete
    try:
        await app(scope, receive, capture.send)
        if not capture.completing:
            capture.ended()
            await capture.complete()
    except BaseException as exc:
        capture.on_complete = None
        if capture.completing:
            raise
        capture.completing = True  # the outcome is the failure's
        answer = now.failed_now() if now is not None else await flow.failed()
        if answer is None or not isinstance(exc, Exception):
            raise
        failed_log(flow.route, exc)
        if not answer_failures:
            raise
        if not capture.sent:
            await _send(send, answer)
        return answer
    capture.on_complete = None  # no reference cycle left for the garbage collector
    return answered[0] if answered else None


async def _send(send: Send, response: Response, capture: Optional[_Capture] = None) -> None:
    """Sends ``response``. The application's own ``http.response.start`` message (``capture``'s)
    is sent again as it is, instead of one built anew, when ``response`` starts exactly as it
    did: the same status, the same header pairs, a ``content-length`` among them, and nothing
    else in the message."""
    start = None if capture is None else capture.start
    if (
        start is not None
        and len(start) == 3
        and type(start.get("headers")) is list
        and response.status == capture.status  # type: ignore[union-attr]
        and capture.length  # type: ignore[union-attr]
        and response.headers == capture.headers  # type: ignore[union-attr]
    ):
        await send(start)
        await send({"type": "http.response.body", "body": response.body, "more_body": False})
        return
    body = response.body
    raw = asgi_start_headers(response.headers, len(body))  # encoded in the extension
    if raw is None:  # headers of another shape: as they always were
        headers = with_content_length(response.headers, body)
        raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    await send({"type": "http.response.start", "status": response.status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})
