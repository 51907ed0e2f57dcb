"""FastAPI: idempotency as a dependency, claimed after authentication and validation.

::

    from fastapi import Depends, FastAPI
    import idempo
    from idempo.fastapi import Idempotency
    from idempo.stores import SQLiteStore

    idempotency = Idempotency(store=SQLiteStore("idempo.sqlite3"), principal=current_tenant)
    app = FastAPI()
    app.router.route_class = idempotency.route_class  # before the routes are declared

    @app.post("/payments", status_code=201)
    async def create_payment(
        payment: Payment, execution: idempo.Execution = Depends(idempotency)
    ) -> dict: ...

``principal`` is one of the app's own dependencies (usually the one that authenticates the
caller) returning the principal's id, a non-empty string: keys are per principal. A route is
protected when ``Depends(idempotency)`` is among its dependencies (a parameter, the route's or
the router's ``dependencies=[...]``). The key is claimed when the endpoint is about to run, after
FastAPI solved every dependency and validated the request: a request that fails authentication
(the principal dependency raises 401/403) or validation (422) never claims a key and nothing is
stored for it. The endpoint's parameter receives the :class:`idempo.Execution` (key, generation,
downstream key; ``request.state.idempotency`` too). Everything else is the ASGI integration's:
core's admission order and problems, the response captured by core's capture plan as it is sent
(teed when it streams, ``pathsend`` not offered), background tasks run after the record is
written, the route's OpenAPI operation documents the ``Idempotency-Key`` header and idempo's
problem responses (``spec/openapi/idempotency.yaml``).

Per route options: mark the endpoint with :func:`idempo.idempotent` (``config``,
``fingerprint_headers``, ``exclude``, ``redact``, ``public``); its ``scope=`` is not used here
(the principal is a dependency).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
from contextvars import ContextVar
from typing import (
    Any, Callable, Coroutine, Dict, Iterable, List, Optional, Set, Tuple, Type, Union,
)

try:
    from fastapi import Depends, Request
    from fastapi.routing import APIRoute
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "idempo.fastapi needs FastAPI: pip install 'idempo[fastapi]' (or pip install fastapi)"
    ) from exc
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response as StarletteResponse
from starlette.types import Receive, Scope, Send

from idempo._flow import (
    INLINE, AsyncRequest, Execution, HandlerResult, Hooks, Response, failed_log,
)
from idempo._loop import running_loop
from idempo._render import ProblemRenderer
from idempo._host import (
    HostCore, RouteOptions, RouteParts, route_overrides,
)
from idempo._idempo import Config, InvalidArgument, asgi_target
from idempo.stores._tx import enter, leave
from idempo.asgi import _Capture, _send, _target, _without_pathsend, run_captured

import fastapi.routing as _fastapi_routing

#: Newer FastAPI builds an included route's handler in an "effective route context" (its prefix,
#: the router's dependencies); older versions build it on the route itself.
_EFFECTIVE: Any = getattr(_fastapi_routing, "_effective_route_context_var", None)

__all__ = ["Idempotency", "IdempotentRoute", "PROBLEM_RESPONSES", "key_parameter"]

_PROBLEM_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details.",
    "required": ["type", "title", "status"],
    "properties": {
        "type": {
            "type": "string",
            "description": "`urn:idempo:problem:<slug>` (not resolvable, by design).",
            "pattern": "^urn:idempo:problem:[a-z-]+$",
        },
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {
            "type": "string",
            "description": "For `invalid-key`, the key error code (`spec/KEYS.md` §1).",
        },
    },
}

_RETRY_AFTER: Dict[str, Any] = {
    "description": "Delta-seconds (at least 1) after which a retry with the same key may succeed.",
    "schema": {"type": "integer", "minimum": 1},
}


def _problem(description: str, retry_after: bool = False) -> Dict[str, Any]:
    response: Dict[str, Any] = {
        "description": description,
        "content": {"application/problem+json": {"schema": _PROBLEM_SCHEMA}},
    }
    if retry_after:
        response["headers"] = {"Retry-After": _RETRY_AFTER}
    return response


#: idempo's problem responses of a protected operation, by status (the descriptions of
#: ``spec/openapi/idempotency.yaml``'s ``components/responses``; 422 is merged with FastAPI's own
#: validation error, see :data:`KEY_REUSED`).
PROBLEM_RESPONSES: Dict[int, Dict[str, Any]] = {
    400: _problem(
        "`missing-key` (the route requires a key), `invalid-key` (with `code`), or `invalid-body`"
        " (the body cannot be fingerprinted). Fix the request; do not retry it unchanged."),
    409: _problem(
        "`in-flight`: a request with this key is still being processed. Retry the same request"
        " with the same key after `Retry-After`; it then gets the stored response.", True),
    413: _problem("`body-too-large`: the request body exceeds the limit for fingerprinting."),
    500: _problem(
        "`outcome-unknown`: the first execution may or may not have taken effect; look the"
        " resource up before using a new key. `response-not-retained`: the request was processed"
        " but its response was too large to keep for replays. `scope-unresolved`: the server"
        " could not tell whose key this is and ran nothing."),
    503: _problem(
        "`store-unavailable` or `contention`: the server could not record the request and ran"
        " nothing. Retry the same request with the same key after `Retry-After`.", True),
}

KEY_REUSED: Dict[str, Any] = _problem(
    "Validation Error (FastAPI's, `application/json`), or idempo's `key-reused`"
    " (`application/problem+json`): the key was used for a different request; use a new key"
    " for a new intent.")


def key_parameter(header_name: str = "Idempotency-Key", required: bool = True,
                  config: Optional[Config] = None) -> Dict[str, Any]:
    """The OpenAPI header parameter of the key (``components/parameters/IdempotencyKey``), with
    the route's key bounds (an sf-string's quotes count toward the field's length)."""
    config = config or Config()
    return {
        "name": header_name,
        "in": "header",
        "required": required,
        "description": (
            "One key per user intent (not per attempt): every retry of the same intent sends the"
            " same key with the same request. An RFC 9651 sf-string or a bare token of visible"
            " ASCII without `\"` or `,`."
        ),
        "schema": {"type": "string", "minLength": config.key_min_len,
                   "maxLength": max(512, config.key_max_len + 2),
                   "pattern": "^[\\x20-\\x7E]+$"},
    }


class _Unclaimed:
    """What ``Depends(idempotency)`` gives before the claim; the endpoint's parameter gets the
    :class:`idempo.Execution` instead. Another dependency that asked for it gets this."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            "idempo: the Execution exists once the endpoint runs (after the claim); take it as an"
            " endpoint parameter (execution: idempo.Execution = Depends(idempotency)), not in"
            " another dependency")


class _Answer(StarletteResponse):
    """idempo's own answer (a problem or a replay), sent by the ASGI integration's function."""

    def __init__(self, answer: Response) -> None:
        self.answer = answer
        self.status_code = answer.status
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send(send, self.answer)
        if self.background is not None:  # the dependencies' own background tasks
            await self.background()


_UNCLAIMED = _Unclaimed()

_PRINCIPAL = "__idempo_principal__"
"""The endpoint's keyword argument that carries the principal on a route whose handler solves the
principal dependency in place of ``Depends(idempotency)`` (:func:`_without_claim`)."""


class _Run:
    """One request on a protected route: from the dependency to the response's last byte."""

    # Class-level defaults: a request's run sets only what differs.
    called = False
    entered = False
    principal: Any = None
    flow: Optional[AsyncRequest] = None
    """Set once the claim let the endpoint run (core's flow, waiting for its response)."""
    capture: Optional[_Capture] = None
    placeholder = _UNCLAIMED
    """What ``Depends(idempotency)`` gives before the claim."""
    # The route's, set on its own subclass (:func:`_run_class`): a request sets only its own.
    owner: "Idempotency"
    opts: RouteOptions
    parts: RouteParts
    route: str
    names: Optional[Tuple[str, ...]] = None
    """The endpoint's parameters that take the :class:`Execution` when the route's handler
    runs without solving ``Depends(idempotency)`` (:func:`_without_claim`; the principal then
    comes as the endpoint's ``_PRINCIPAL`` argument); None: FastAPI solved it
    (:meth:`Idempotency.__call__` marked the run ``called``)."""

    def __init__(self, request: Request) -> None:
        self.request = request

    async def execute(self, endpoint: Callable[..., Any], is_async: bool,
                      args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Admission and claim, then the endpoint (unless core answered without it)."""
        if self.names is not None:  # the handler without Depends(idempotency): the principal
            if self.owner.principal is not None:
                self.principal = kwargs.pop(_PRINCIPAL, None)
        elif not self.called:  # Depends(idempotency) overridden (dependency_overrides)
            return await _call(endpoint, is_async, args, kwargs)  # unprotected
        core = self.owner.core
        request = self.request
        opts = self.opts
        parts = self.parts
        scope = request.scope
        raw = scope.get("headers", ())
        admission, headers, content_type, authorization = core.start_asgi(opts, parts, raw)
        kind = admission.kind
        if kind != "read_body":
            if kind == "pass_through":  # no key, key optional: the endpoint runs unprotected
                return await _call(endpoint, is_async, args, self._given(kwargs, None))
            return _Answer(core.refused(self.route, admission))
        assert admission.body_limit is not None
        body, over_limit = await _read_body(request, admission.body_limit)
        flow = core.admitted_flow(
            admission,
            parts,
            self,
            scope["method"].upper(),
            self.route,
            asgi_target(scope) or _target(scope),
            headers,
            content_type,
            body,
            over_limit,
            self.owner.principal is not None or authorization,
        )
        if isinstance(flow, Response):
            return _Answer(flow)
        started = flow.begin_now() if flow.inline else await _begin(flow)
        if isinstance(started, Response):  # answered without running: a replay or a problem
            return _Answer(started)
        self.flow = flow
        self.capture = _Capture(opts.config, None)
        # request.state.idempotency = started: Request.state (made at its first use) is a view
        # of scope["state"], which it creates when missing.
        state = request.__dict__.get("_state")
        if state is None:
            scope.setdefault("state", {})["idempotency"] = started
        else:
            state.idempotency = started
        tx = started.transaction
        token = None if tx is None else enter(tx)
        try:
            given = self._given(kwargs, started)
            if is_async:  # _call, in this frame
                return await endpoint(*args, **given)
            return await run_in_threadpool(endpoint, *args, **given)
        finally:
            if token is not None:
                leave(token)

    def _given(self, kwargs: Dict[str, Any], execution: Optional[Execution]) -> Dict[str, Any]:
        """``kwargs`` (the endpoint wrapper's own dictionary, made for its call) with the
        placeholder's parameters given ``execution``, in place (values replaced while iterating:
        the dictionary keeps its size), or the parameters in :attr:`names`."""
        names = self.names
        if names is not None:
            for name in names:
                kwargs[name] = execution
            return kwargs
        placeholder = self.placeholder
        for name, value in kwargs.items():
            if value is placeholder:
                kwargs[name] = execution
        return kwargs

    async def failed(self, exc: BaseException) -> None:
        """The handler ended with an error: the flow records it (core's rule), then the caller
        re-raises it."""
        assert self.flow is not None
        flow = self.flow
        answer = flow.failed_now() if flow.inline else await _settle(flow, flow.failed())
        if answer is not None and isinstance(exc, Exception):
            failed_log(self.route, exc)

    async def respond(self, inner: StarletteResponse, scope: Scope, receive: Receive,
                      send: Send) -> None:
        """Sends the endpoint's response through core's capture plan, then the flow's answer;
        the response's background tasks run after that."""
        capture, flow = self.capture, self.flow
        assert capture is not None and flow is not None
        capture.client = send
        inner_scope = dict(scope)
        inner_scope["extensions"] = _without_pathsend(scope)
        await run_captured(
            # An inline flow's steps never suspend: nothing for a cancellation to interrupt.
            flow if flow.inline else _Settled(flow), capture, self.opts, inner, inner_scope,
            receive, send, answer_failures=False)


class _Settled:
    """The flow's steps after the handler as :func:`_settle` runs them (uninterrupted by a
    cancelled request when the store can block)."""

    def __init__(self, flow: AsyncRequest) -> None:
        self.flow = flow
        self.route = flow.route

    async def finished(self, result: HandlerResult) -> Response:
        answer: Response = await _settle(self.flow, self.flow.finished(result))
        return answer

    async def failed(self) -> Optional[Response]:
        answer: Optional[Response] = await _settle(self.flow, self.flow.failed())
        return answer


async def _begin(flow: AsyncRequest) -> Union[Response, Execution]:
    """The claim. A store that runs inline cannot be interrupted; another's claim runs in a task
    of its own, so a request cancelled meanwhile (the client went away) still ends its flow: a
    claim made for it is answered as a handler that failed (core decides what to record)."""
    if flow.mode == INLINE:
        return await flow.begin()
    task = running_loop().create_task(flow.begin())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_abandoned(flow))
        raise


def _abandoned(flow: AsyncRequest) -> Callable[["asyncio.Future[Any]"], None]:
    def done(task: "asyncio.Future[Any]") -> None:
        if task.cancelled() or task.exception() is not None:
            return
        if isinstance(task.result(), Execution):
            _spawn(flow.failed())
    return done


_PENDING: "Set[asyncio.Future[Any]]" = set()
"""Strong references to flows finishing on their own (the event loop keeps only weak ones)."""


def _spawn(coro: "Coroutine[Any, Any, Any]") -> "asyncio.Future[Any]":
    task: "asyncio.Future[Any]" = running_loop().create_task(coro)
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)
    return task


async def _settle(flow: AsyncRequest, step: Any) -> Any:
    """A step after the handler (recording its response or its failure): inline, or for a store
    that can block in a task that a cancelled request does not interrupt (the record is written
    even when the client went away)."""
    if flow.mode == INLINE:
        return await step
    return await asyncio.shield(_spawn(step))


class _Captured(StarletteResponse):
    """The endpoint's response, sent through the request's capture."""

    def __init__(self, inner: StarletteResponse, run: _Run) -> None:
        self.inner = inner
        self.run = run
        self.status_code = inner.status_code
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.run.respond(self.inner, scope, receive, send)


_CURRENT: "ContextVar[Optional[_Run]]" = ContextVar("idempo_fastapi_run", default=None)


async def _call(endpoint: Callable[..., Any], is_async: bool, args: Tuple[Any, ...],
                kwargs: Dict[str, Any]) -> Any:
    if is_async:
        return await endpoint(*args, **kwargs)
    return await run_in_threadpool(endpoint, *args, **kwargs)


async def _read_body(request: Request, limit: int) -> Tuple[bytes, bool]:
    """The request body as FastAPI read it (or read now, at most ``limit`` plus one chunk).
    Starlette's own ``Request`` whose body nobody read has its messages received here as
    ``Request.stream`` receives them (the same state kept: the stream consumed, the client
    gone), without the stream's generator; the usual body comes in one message."""
    cached = getattr(request, "_body", None)
    if isinstance(cached, bytes):
        return (b"", True) if len(cached) > limit else (cached, False)
    if type(request) is not Request or getattr(request, "_stream_consumed", None) is not False:
        return await _stream_body(request, limit)
    message = await request.receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        request._stream_consumed = True
        body = message.get("body", b"")
        if type(body) is bytes:
            if len(body) > limit:
                return b"", True
            request._body = body  # the endpoint may still read it
            return body, False
    return await _receive_body(request, limit, message)


async def _receive_body(request: Request, limit: int, message: Any) -> Tuple[bytes, bool]:
    """:func:`_read_body` past the first message (``message``), as ``Request.stream`` reads."""
    receive = request.receive
    chunks: List[bytes] = []
    size = 0
    while True:
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if not more:
                request._stream_consumed = True
            if chunk:
                size += len(chunk)
                if size > limit:
                    return b"", True
                chunks.append(chunk)
            if not more:
                break
        elif kind == "http.disconnect":
            request._is_disconnected = True
            raise ClientDisconnect()
        message = await receive()
    body = b"".join(chunks)
    request._body = body  # the endpoint may still read it
    return body, False


async def _stream_body(request: Request, limit: int) -> Tuple[bytes, bool]:
    """:func:`_read_body` through ``request.stream()`` (another request class, or a stream
    already under way)."""
    chunks: List[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return b"", True
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # the endpoint may still read it
    return body, False


async def _handled(request: Request, exc: Exception) -> Optional[StarletteResponse]:
    """The app's own answer to an exception the endpoint raised (its exception handlers, as
    Starlette's route wrapper would run them), or None when the app has none for it."""
    handlers, status_handlers = request.scope.get("starlette.exception_handlers", ({}, {}))
    handler = None
    if isinstance(exc, StarletteHTTPException):
        handler = status_handlers.get(exc.status_code)
    if handler is None:
        for cls in type(exc).__mro__:
            if cls in handlers:
                handler = handlers[cls]
                break
    if handler is None:
        return None
    if inspect.iscoroutinefunction(handler):
        response = await handler(request, exc)
    else:
        response = await run_in_threadpool(handler, request, exc)
    return response  # type: ignore[no-any-return]


def _uses(dependant: Any, owner: "Idempotency", depth: int = 0) -> bool:
    for dep in getattr(dependant, "dependencies", ()):
        if dep.call is owner or (depth < 16 and _uses(dep, owner, depth + 1)):
            return True
    return False


def _context(route: APIRoute) -> Any:
    """The route as FastAPI is building its handler (an included route's effective context)."""
    if _EFFECTIVE is not None:
        ctx = _EFFECTIVE.get()
        if ctx is not None and getattr(ctx, "original_route", None) is route:
            return ctx
    return route


def _document(ctx: Any, header_name: str, config: Config) -> None:
    """Adds the key parameter and idempo's problem responses to the route's OpenAPI operation."""
    responses = dict(ctx.responses or {})
    for status, response in PROBLEM_RESPONSES.items():
        responses.setdefault(status, copy.deepcopy(response))
    ctx.responses = responses
    extra = copy.deepcopy(ctx.openapi_extra or {})
    params = extra.setdefault("parameters", [])
    if not any(str(p.get("name", "")).lower() == header_name.lower() for p in params):
        params.append(key_parameter(header_name, config.key_required, config))
    extra.setdefault("responses", {}).setdefault("422", copy.deepcopy(KEY_REUSED))
    ctx.openapi_extra = extra


class IdempotentRoute(APIRoute):
    """An ``APIRoute`` whose routes with ``Depends(idempotency)`` claim the key after FastAPI
    solved the dependencies and validated the request. Use ``Idempotency.route_class`` (bound
    to its :class:`Idempotency`)."""

    idempotency: "Idempotency"

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        # A route re-created from another (older FastAPI's include_router) gets our wrapper:
        # wrap the original once.
        endpoint = getattr(endpoint, _ORIGINAL, endpoint)
        self._idempo_endpoint = endpoint
        if not (inspect.isgeneratorfunction(endpoint) or inspect.isasyncgenfunction(endpoint)):
            endpoint = _wrap(endpoint)
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Any]:
        inner = super().get_route_handler()
        owner = getattr(type(self), "idempotency", None)
        ctx = _context(self)
        if owner is None or not _uses(ctx.dependant, owner):
            return inner
        original = self._idempo_endpoint
        if inspect.isgeneratorfunction(original) or inspect.isasyncgenfunction(original):
            raise TypeError(
                f"idempo: {ctx.path}: a generator endpoint cannot be idempotent here; return a"
                " StreamingResponse (it is teed to the client and recorded up to the limit)")
        overrides = route_overrides(original)
        if overrides is not None and overrides.get("scope") is not None:
            raise TypeError(
                f"idempo: {ctx.path}: idempotent(scope=...) is not used with idempo.fastapi;"
                " the principal is Idempotency(principal=<dependency>)")
        opts = owner.core.options_for(original)
        if opts is None:
            raise TypeError(
                f"idempo: {ctx.path}: the route uses Depends(idempotency) but is marked"
                " idempotent(enabled=False)")
        _document(ctx, owner.header_name, opts.config)
        direct = None
        without = _without_claim(ctx.dependant, owner)
        if without is not None:
            # The same handler on the route's dependencies without Depends(idempotency): FastAPI
            # does not solve it per request (the endpoint's wrapper claims, as it does anyway).
            dependant = ctx.dependant
            ctx.dependant = without[0]
            try:
                direct = (super().get_route_handler(), without[1])
            finally:
                ctx.dependant = dependant
        return _route_handler(inner, direct, owner, opts, str(ctx.path),
                              getattr(ctx, "dependency_overrides_provider", None))


def _without_claim(dependant: Any, owner: "Idempotency") -> Optional[Tuple[Any, Tuple[str, ...]]]:
    """The route's dependencies with each ``Depends(idempotency)`` among its own replaced by what
    that dependency depends on (the principal dependency, the same object as FastAPI built, its
    result given to the endpoint as ``_PRINCIPAL``), and the endpoint's parameters that took
    ``Depends(idempotency)``; None when the route uses it otherwise (inside another dependency)
    or FastAPI built it differently than expected: the route's handler then solves it."""
    deps = list(getattr(dependant, "dependencies", None) or ())
    ours = [d for d in deps if d.call is owner]
    if not ours or any(d.call is not owner and _uses(d, owner) for d in deps):
        return None
    expected = 0 if owner.principal is None else 1
    for d in ours:
        subs = list(d.dependencies)
        if (len(subs) != expected or d.path_params or d.query_params or d.header_params
                or d.cookie_params or d.body_params
                or any(sub.call is not owner.principal or _uses(sub, owner) for sub in subs)):
            return None
    kept: List[Any] = []
    for d in deps:
        if d.call is not owner:
            kept.append(d)
        elif expected and not any(getattr(k, "name", None) == _PRINCIPAL for k in kept):
            principal = copy.copy(d.dependencies[0])
            principal.name = _PRINCIPAL
            kept.append(principal)
    without = copy.copy(dependant)
    without.dependencies = kept
    return without, tuple(d.name for d in ours if d.name is not None)


def _wrap(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    is_async = inspect.iscoroutinefunction(endpoint) or inspect.iscoroutinefunction(
        getattr(endpoint, "__call__", None))  # noqa: B004 (an instance's own async __call__)

    @functools.wraps(endpoint)
    async def endpoint_with_claim(*args: Any, **kwargs: Any) -> Any:
        run = _CURRENT.get()
        if run is None or run.entered:
            kwargs.pop(_PRINCIPAL, None)
            return await _call(endpoint, is_async, args, kwargs)
        run.entered = True
        return await run.execute(endpoint, is_async, args, kwargs)

    setattr(endpoint_with_claim, _ORIGINAL, endpoint)
    return endpoint_with_claim


_ORIGINAL = "__idempo_original__"


def _run_class(owner: "Idempotency", opts: RouteOptions, parts: RouteParts, route: str,
               names: Optional[Tuple[str, ...]]) -> "Type[_Run]":
    """:class:`_Run` for one route's requests (what is the route's, on the class)."""

    class RouteRun(_Run):
        pass

    RouteRun.owner = owner
    RouteRun.opts = opts
    RouteRun.parts = parts
    RouteRun.route = route
    RouteRun.names = names
    return RouteRun


def _route_handler(inner: Callable[[Request], Any],
                   direct: Optional[Tuple[Callable[[Request], Any], Tuple[str, ...]]],
                   owner: "Idempotency", opts: RouteOptions, route: str,
                   provider: Any) -> Callable[[Request], Any]:
    """The route's handler: ``inner`` (FastAPI's, solving ``Depends(idempotency)``) or, unless
    the app overrides that dependency (``dependency_overrides``, checked per request),
    ``direct`` (:func:`_without_claim`'s handler and parameters)."""
    parts = owner.core.parts(opts)
    full_run = _run_class(owner, opts, parts, route, None)
    direct_run = full_run if direct is None else _run_class(owner, opts, parts, route, direct[1])
    solve_direct = inner if direct is None else direct[0]

    async def handler(request: Request) -> StarletteResponse:
        overrides = getattr(provider, "dependency_overrides", None)
        if direct is None or (overrides and owner in overrides):
            run = full_run(request)
            solve = inner
        else:
            run = direct_run(request)
            solve = solve_direct
        token = _CURRENT.set(run)
        try:
            try:
                response: StarletteResponse = await solve(request)
            except Exception as exc:
                if run.flow is None:
                    raise  # before the claim (authentication, validation): FastAPI's answer
                handled = await _handled(request, exc)
                if handled is None:
                    raise
                response = handled  # the endpoint's HTTPException: its answer, recorded
        except BaseException as exc:
            if run.flow is not None:
                await run.failed(exc)
            raise
        finally:
            _CURRENT.reset(token)
        if run.flow is None:
            return response
        return _Captured(response, run)

    return handler


class Idempotency:
    """Idempotency-Key handling for FastAPI routes, as a dependency (see the module docs).

    - ``store``: a store from :mod:`idempo.stores` (sync stores run in worker threads).
    - ``principal``: a FastAPI dependency (it may depend on others, e.g. your authentication)
      returning the caller's id, a non-empty string; keys are per principal. What it returns
      goes through core's scope rule: ``None``, ``""`` (unless ``empty_scope_is_anonymous``), or
      a non-string gets the request refused with 500 ``scope-unresolved``; if it raises (401),
      FastAPI answers and nothing is claimed.
    - ``public=True`` instead: the routes' keys are shared by every caller (no principal).
      One of the two is required.
    - ``config``, ``header_name``, ``fingerprint_headers``, ``exclude``, ``hmac_key``,
      ``numbers``, ``redact``, ``hooks``, ``problem_renderer``: as for
      :class:`idempo.asgi.IdempotencyMiddleware`.
    """

    def __init__(
        self,
        *,
        store: Any,
        principal: Optional[Callable[..., Any]] = None,
        public: bool = False,
        config: Optional[Config] = None,
        header_name: str = "Idempotency-Key",
        fingerprint_headers: Iterable[str] = (),
        exclude: Iterable[str] = (),
        hmac_key: Optional[bytes] = None,
        numbers: Optional[str] = None,
        redact: Optional[Callable[[int, List[Tuple[str, str]], bytes], Optional[bytes]]] = None,
        hooks: Optional[Hooks] = None,
        problem_renderer: Optional[ProblemRenderer] = None,
        empty_scope_is_anonymous: bool = False,
    ) -> None:
        if principal is None and not public:
            raise InvalidArgument(
                "Idempotency needs principal=<a dependency returning the caller's id> (keys are"
                " per principal), or public=True for routes whose keys every caller shares")
        if principal is not None and not callable(principal):
            raise InvalidArgument("principal must be a FastAPI dependency (a callable)")
        self.principal = principal
        self.header_name = header_name
        self.core = HostCore(
            store=store,
            config=config,
            methods=("POST", "PATCH", "PUT", "DELETE"),
            header_name=header_name,
            scope=_principal_of if principal is not None else None,
            fingerprint_headers=fingerprint_headers,
            exclude=exclude,
            hmac_key=hmac_key,
            numbers=numbers,
            redact=redact,
            hooks=hooks,
            only_marked=False,
            warn_unscoped=True,
            problem_renderer=problem_renderer,
            host="idempo.fastapi.Idempotency",
            public=public,
            empty_scope_is_anonymous=empty_scope_is_anonymous,
        )
        params = [inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY,
                                    annotation=Request)]
        if principal is not None:
            params.append(inspect.Parameter(
                "idempo_principal", inspect.Parameter.KEYWORD_ONLY,
                default=Depends(principal), annotation=Any))
        self.__signature__ = inspect.Signature(params)
        #: The ``APIRoute`` class to use for the routes (``app.router.route_class = ...`` or
        #: ``APIRouter(route_class=...)``).
        self.route_class: type = type("IdempotentRoute", (IdempotentRoute,), {"idempotency": self})

    async def __call__(self, request: Request, idempo_principal: Any = None) -> Any:
        run = _CURRENT.get()
        if run is None or run.owner is not self:
            raise RuntimeError(
                "idempo: Depends(idempotency) on a route that is not an idempotency route: set"
                " app.router.route_class = idempotency.route_class (or"
                " APIRouter(route_class=idempotency.route_class)) before declaring the route")
        run.called = True
        run.principal = idempo_principal
        return run.placeholder


def _principal_of(run: _Run) -> Any:
    return run.principal
