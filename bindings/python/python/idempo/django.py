"""Django middleware with the same options as :mod:`idempo.asgi` and :mod:`idempo.wsgi`.

::

    # settings.py
    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "idempo.django.IdempotencyMiddleware",   # after authentication: scopes use request.user
        ...,
    ]
    IDEMPO = {
        "STORE": "myproject.idempotency.make_store",   # a store, or a dotted path to it/its factory
        "SCOPE": "idempo.django.user_scope",           # principal: the authenticated user's pk
        "EMPTY_SCOPE_IS_ANONYMOUS": True,              # anonymous requests: user_scope gives ""
        "CONFIG": {"ttl_ms": 86_400_000, "lease_ms": 30_000},   # or an idempo.Config
    }

Option names are the keyword arguments of :class:`idempo.wsgi.IdempotencyMiddleware` in upper case:
``STORE``, ``CONFIG`` (an :class:`idempo.Config` or a dict of its keyword arguments: TTL, lease and
heartbeat, required key, caching policy, replay header allowlist, ...), ``METHODS``,
``HEADER_NAME``, ``SCOPE``, ``FINGERPRINT_HEADERS``, ``EXCLUDE`` (JSON pointers), ``HMAC_KEY``,
``NUMBERS``, ``REDACT``, ``HOOKS``, ``ONLY_MARKED``, ``WARN_UNSCOPED``, ``PUBLIC`` (keys shared by
every caller, no principal) and ``EMPTY_SCOPE_IS_ANONYMOUS``. The request body limit
(``max_request_body_bytes``, 413 above it), the key syntax (``key_min_len``, ``key_max_len``,
``key_strict``) and transactional mode (``transactional``: the view runs in the SQL store's
transaction, :func:`idempo.current_transaction`) are ``CONFIG`` options. A ``SCOPE`` function that
returns ``None``, ``""`` (unless ``EMPTY_SCOPE_IS_ANONYMOUS``), a non-string or raises refuses the
request with 500 ``scope-unresolved``. Callables (``SCOPE``, ``REDACT``,
``HOOKS``) may be given as dotted paths. An unknown name is an ``ImproperlyConfigured`` error.

The route template is the URL pattern Django resolved (``/orders/<int:order>/pay``); a view
marked with :func:`idempo.idempotent` (function view, ``as_view()`` result or the view class)
gets its own options, ``enabled=False`` exempts it. The running view finds its execution (key,
generation, downstream key) in ``request.idempotency`` (``None`` when the request is not
protected: another method, an exempt view, an optional key that was not sent). Both sync and async middleware chains are
supported (Django picks the mode; async views keep running on the event loop).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Tuple, Union

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings  # type: ignore[import-untyped]
from django.core.exceptions import (  # type: ignore[import-untyped]
    ImproperlyConfigured,
    RequestDataTooBig,
)
from django.http import HttpResponse  # type: ignore[import-untyped]
from django.urls import Resolver404, resolve  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from idempo._flow import (
    AsyncRequest,
    HandlerResult,
    Hooks,
    Response,
    SyncRequest,
    failed_log,
)
from idempo._tee import TeeRecord, handler_result
from idempo._host import (
    HOST_DEFAULTS,
    HostCore,
    HostOptions,
    Prepared,
    RouteOptions,
    declared_length,
    idempotent,
    route_overrides,
    with_content_length,
)
from idempo._idempo import BodyCapture, Config, InvalidArgument

__all__ = ["IdempotencyMiddleware", "idempotent", "user_scope"]

#: Setting names (``settings.IDEMPO`` keys) and the option each sets.
OPTIONS = {"STORE": "store", **{name.upper(): name for name in HostOptions.__annotations__}}
"""``settings.IDEMPO`` keys and the :class:`~idempo._host.HostOptions` option each sets."""

#: Former setting names and where each went (``CONFIG`` keys are :class:`idempo.Config` options).
RENAMED = {
    "MAX_BODY_BYTES": "CONFIG['max_request_body_bytes']",
    "STRICT_KEY": "CONFIG['key_strict']",
    "KEY_MIN_LEN": "CONFIG['key_min_len']",
    "KEY_MAX_LEN": "CONFIG['key_max_len']",
    "TRANSACTIONAL": "CONFIG['transactional']",
}

_DEFAULTS: Dict[str, Any] = dict(HOST_DEFAULTS)


def user_scope(request: Any) -> Optional[str]:
    """The principal of a request: the primary key of ``request.user`` when authenticated, ``""``
    for anonymous requests (accepted as the anonymous namespace with
    ``EMPTY_SCOPE_IS_ANONYMOUS``, else refused with 500 ``scope-unresolved``). ``None`` when no
    authentication middleware set ``request.user`` (refused: the middleware order is wrong)."""
    user = getattr(request, "user", None)
    if user is None:
        return None
    if not user.is_authenticated:
        return ""
    return str(user.pk)


def _imported(name: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return import_string(value)
    except ImportError as exc:
        hint = ""
        if name == "STORE":
            hint = (
                "; STORE is a store instance or the dotted path of one (or of a function that "
                "returns one), not a file name or DSN: e.g. 'STORE': SQLiteStore('idempo.sqlite3')"
            )
        raise ImproperlyConfigured(
            f"settings.IDEMPO[{name!r}]: cannot import {value!r}: {exc}{hint}"
        ) from exc


def options_from_settings(raw: Any) -> Dict[str, Any]:
    """The middleware options from a ``settings.IDEMPO`` mapping (see the module docs)."""
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("settings.IDEMPO must be a dict (at least {'STORE': ...})")
    renamed = sorted(str(k) for k in raw if k in RENAMED)
    if renamed:
        raise ImproperlyConfigured(
            "settings.IDEMPO: "
            + "; ".join(f"{k} is now {RENAMED[k]}" for k in renamed)
        )
    unknown = sorted(str(k) for k in raw if k not in OPTIONS)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.IDEMPO: unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}"
        )
    if raw.get("STORE") is None:
        raise ImproperlyConfigured("settings.IDEMPO['STORE'] is required (an idempotency store)")
    opts = dict(_DEFAULTS)
    for name, value in raw.items():
        opts[OPTIONS[name]] = value
    store = _imported("STORE", opts["store"])
    if isinstance(opts["store"], str) and callable(store):
        try:
            store = store()
        except TypeError as exc:
            raise ImproperlyConfigured(
                f"settings.IDEMPO['STORE']: calling {opts['store']!r} failed ({exc}); point STORE "
                "at a store instance or at a function that takes no arguments and returns one"
            ) from exc
    opts["store"] = store
    for name in ("SCOPE", "REDACT", "HOOKS", "PROBLEM_RENDERER"):
        opts[OPTIONS[name]] = _imported(name, opts[OPTIONS[name]])
    hooks = opts["hooks"]
    if hooks is not None and not isinstance(hooks, Hooks):
        opts["hooks"] = hooks() if callable(hooks) else hooks
        if not isinstance(opts["hooks"], Hooks):
            raise ImproperlyConfigured("settings.IDEMPO['HOOKS'] must be an idempo.Hooks")
    config = opts["config"]
    if isinstance(config, dict):
        try:
            opts["config"] = Config(**{str(k).lower(): v for k, v in config.items()})
        except (TypeError, InvalidArgument) as exc:
            raise ImproperlyConfigured(f"settings.IDEMPO['CONFIG']: {exc}") from exc
    elif config is not None and not isinstance(config, Config):
        raise ImproperlyConfigured("settings.IDEMPO['CONFIG'] must be an idempo.Config or a dict")
    return opts


@dataclass(frozen=True)
class _Ready:
    """A request that runs under the flow."""

    opts: RouteOptions
    route: str
    prepared: Prepared
    key: str


class IdempotencyMiddleware:
    """Idempotency-Key handling for Django views, configured by ``settings.IDEMPO``."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        opts = options_from_settings(getattr(settings, "IDEMPO", None))
        try:
            self.core = HostCore(
                **opts,
                host="settings.IDEMPO['STORE']",
                sync_only=not self.is_async,
            )
        except (InvalidArgument, TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"settings.IDEMPO: {exc}") from exc
        self._meta_key = "HTTP_" + str(opts["header_name"]).upper().replace("-", "_")

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self._acall(request)
        request.idempotency = None
        step = self._prepare(request)
        if step is None:
            return self.get_response(request)
        if isinstance(step, HttpResponse):
            return step
        flow = SyncRequest(**self._flow_args(step))
        try:
            started = flow.begin()
        except BaseException:
            flow.close()
            raise
        if isinstance(started, Response):
            return _to_django(started)
        request.idempotency = started
        try:
            return flow.call(
                lambda _: _captured(flow, step.opts, self.get_response(request)), started
            )
        except BaseException as exc:
            answer = flow.failed()
            if answer is None or not isinstance(exc, Exception):
                raise
            failed_log(step.route, exc)
            return _to_django(answer)

    def _flow_args(self, step: _Ready) -> Dict[str, Any]:
        return self.core.flow_args(step.opts, step.route, step.prepared)

    async def _acall(self, request: Any) -> Any:
        request.idempotency = None
        if str(request.method or "GET").upper() not in self.core.methods:
            return await self.get_response(request)
        # In a worker thread: the scope function and request.user may query the database.
        step = await sync_to_async(self._prepare)(request)
        if step is None:
            return await self.get_response(request)
        if isinstance(step, HttpResponse):
            return step
        flow = AsyncRequest(**self._flow_args(step))
        try:
            started = await flow.begin()
        except BaseException:
            await flow.close()
            raise
        if isinstance(started, Response):
            return _to_django(started)
        request.idempotency = started
        token = flow.enter(started)
        try:
            response = await self.get_response(request)
            return await _acaptured(flow, step.opts, response)
        except BaseException as exc:
            flow.leave(token)
            token = None
            answer = await flow.failed()
            if answer is None or not isinstance(exc, Exception):
                raise
            failed_log(step.route, exc)
            return _to_django(answer)
        finally:
            flow.leave(token)

    def _prepare(self, request: Any) -> Union[None, HttpResponse, _Ready]:
        """None: pass the request through unprotected; a response: answered here; else ready."""
        core = self.core
        method = str(request.method or "GET").upper()
        if method not in core.methods:
            return None
        try:
            match = resolve(request.path_info, getattr(request, "urlconf", None))
        except Resolver404:
            return None  # no such route: Django answers 404
        opts = core.options_for(_endpoint(match.func))
        if opts is None:
            return None
        route = _template(match.route, request.path_info)
        meta = request.META
        raw_key = meta.get(self._meta_key)
        key_fields = [] if raw_key is None else [_header_bytes(str(raw_key))]
        admission, answer = core.admit_key(
            opts, route, key_fields, declared_length(meta.get("CONTENT_LENGTH") or None)
        )
        if answer is not None:
            return _to_django(answer)
        if admission is None:
            return None  # no key, key optional: unprotected
        assert admission.body_limit is not None
        body, over_limit = self._read_body(request, admission.body_limit)
        headers = [(str(n).lower(), str(v)) for n, v in request.headers.items()]
        user = getattr(request, "user", None)
        authenticated = "HTTP_AUTHORIZATION" in meta or bool(
            user is not None and user.is_authenticated
        )
        prepared = core.admit_body(
            admission,
            opts=opts,
            request=request,
            method=method,
            route=route,
            target=_target(request),
            headers=headers,
            content_type=meta.get("CONTENT_TYPE") or None,
            body=body,
            over_limit=over_limit,
            authenticated=authenticated,
        )
        if prepared.answer is not None:
            return _to_django(prepared.answer)
        assert prepared.key is not None  # admitted
        return _Ready(opts, route, prepared, prepared.key)

    def _read_body(self, request: Any, limit: int) -> Tuple[bytes, bool]:
        """(body, over_limit): over the limit when longer than ``limit`` or than Django's
        ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (such a body is not read)."""
        try:
            body: bytes = request.body
        except RequestDataTooBig:
            return b"", True
        if len(body) > limit:
            return b"", True
        return body, False


def _endpoint(func: Any) -> Any:
    """The view that carries the :func:`idempotent` mark: the function, else its view class."""
    if route_overrides(func) is not None:
        return func
    view_class = getattr(func, "view_class", None)
    if view_class is not None and route_overrides(view_class) is not None:
        return view_class
    return func


def _template(route: Optional[str], path: str) -> str:
    """The resolved URL pattern as a path template: ``/orders/<int:order>/pay`` for ``path()``,
    ``/legacy/(?P<id>[0-9]+)/$`` for ``re_path()`` (its leading ``^`` dropped)."""
    template = route if route is not None else path
    template = template[1:] if template.startswith("^") else template
    return template if template.startswith("/") else "/" + template


def _target(request: Any) -> str:
    """The request target as received (spec/CANONICAL.md §2.1): the server's raw request URI when
    it reports one (gunicorn ``RAW_URI``, others ``REQUEST_URI``), else Django's full path."""
    raw = request.META.get("RAW_URI") or request.META.get("REQUEST_URI")
    if isinstance(raw, str) and raw.startswith("/"):
        return raw
    return str(request.get_full_path())


def _header_bytes(value: str) -> bytes:
    """A header value as its wire bytes (WSGI and Django's ASGI handler decode them as
    Latin-1); a value no server could have produced goes as UTF-8, which core refuses."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


def _plan(opts: RouteOptions, response: Any) -> Tuple[int, List[Tuple[str, str]], str, Optional[int]]:
    """(status, headers, plan, limit): core's capture plan for a Django response. A response
    whose content is in memory tells its length; a streaming or file response streams."""
    status = int(response.status_code)
    headers = [(str(n), str(v)) for n, v in response.items()]
    streaming = bool(getattr(response, "streaming", False))
    hint = headers
    if not streaming:
        hint = with_content_length(headers, response.content)
    plan, limit = opts.config.capture_plan(status, hint, streaming=streaming)
    return status, headers, plan, limit


def _in_memory(plan: str, limit: Optional[int], body: bytes) -> Tuple[bytes, bool]:
    """(recorded, truncated) for a body already in memory."""
    if plan == "pass_through":
        return b"", False
    if plan == "tee":
        assert limit is not None
        if BodyCapture(limit).accept(len(body)) != "record":
            return b"", True
    return body, False


def _captured(flow: SyncRequest, opts: RouteOptions, response: Any) -> Any:
    """The view's response, recorded as core's capture plan says (PROTOCOL §7.5.1): a body in
    memory is handed to the flow; a streamed one (``StreamingHttpResponse``, ``FileResponse``) is
    teed to the client as it is produced, the flow finishing when it ends; a status that is not
    stored releases the claim at once. The live response object is returned when core answers
    with it (cookies and other response state intact)."""
    status, headers, plan, limit = _plan(opts, response)
    if not getattr(response, "streaming", False):
        body = bytes(response.content)
        recorded, truncated = _in_memory(plan, limit, body)
        answer = flow.finished(handler_result(opts, status, headers, recorded, truncated))
        return _answer(answer, response, body if plan == "buffer" else None)
    if plan == "buffer":  # transactional: sent only once committed
        body = b"".join(bytes(chunk) for chunk in response.streaming_content)
        response.streaming_content = [body]
        answer = flow.finished(handler_result(opts, status, headers, body, False))
        return _answer(answer, response, body)
    if plan == "pass_through":
        flow.finished(HandlerResult(status, headers, b""))
        return response
    assert limit is not None
    response.streaming_content = _Tee(
        flow, opts, status, headers, iter(response.streaming_content), BodyCapture(limit))
    return response


async def _acaptured(flow: AsyncRequest, opts: RouteOptions, response: Any) -> Any:
    """:func:`_captured` for the async chain; a teed body becomes an async iterator, which
    Django's ASGI handler serves without adapting."""
    status, headers, plan, limit = _plan(opts, response)
    streaming = bool(getattr(response, "streaming", False))
    if not streaming:
        body = bytes(response.content)
        recorded, truncated = _in_memory(plan, limit, body)
        answer = await flow.finished(handler_result(opts, status, headers, recorded, truncated))
        return _answer(answer, response, body if plan == "buffer" else None)
    source = response.streaming_content
    is_async = bool(getattr(response, "is_async", False))
    if plan == "buffer":
        if is_async:
            body = b"".join([bytes(chunk) async for chunk in source])
        else:
            body = await sync_to_async(lambda: b"".join(bytes(c) for c in source))()

        async def again() -> AsyncIterator[bytes]:
            yield body

        response.streaming_content = again()
        answer = await flow.finished(handler_result(opts, status, headers, body, False))
        return _answer(answer, response, body)
    capture = BodyCapture(limit) if plan == "tee" and limit is not None else None
    if capture is None:
        await flow.finished(HandlerResult(status, headers, b""))
        if not is_async:
            response.streaming_content = _ASyncSource(iter(source))
        return response
    response.streaming_content = _ATee(
        flow, opts, status, headers,
        source.__aiter__() if is_async else _ASyncSource(iter(source)), capture)
    return response


class _Tee(TeeRecord):
    """A streamed body teed to the client (sync chain); Django calls :meth:`close` when the
    response is closed (also when the client went away early: the record is then not
    retained)."""

    def __init__(
        self, flow: SyncRequest, opts: RouteOptions, status: int,
        headers: List[Tuple[str, str]], source: Iterator[Any], capture: BodyCapture,
    ) -> None:
        super().__init__(opts, status, headers, capture)
        self.flow = flow
        self.source = source

    def __iter__(self) -> "_Tee":
        return self

    def __next__(self) -> bytes:
        if self.done:
            raise StopIteration
        try:
            chunk = bytes(next(self.source))
        except StopIteration:
            self.flow.finished(self.result(True))
            raise
        except BaseException:
            self.done = True
            self.flow.failed()
            raise
        self.record(chunk)
        if self.last(chunk):
            self.flow.finished(self.result(True))
        return chunk

    def close(self) -> None:
        if not self.done:
            self.flow.finished(self.result(False))


_END = object()


class _ASyncSource:
    """A sync iterator read from asyncio, each step in a worker thread."""

    def __init__(self, source: Iterator[Any]) -> None:
        self.source = source

    def __aiter__(self) -> "_ASyncSource":
        return self

    async def __anext__(self) -> Any:
        source = self.source
        chunk = await sync_to_async(lambda: next(source, _END), thread_sensitive=False)()
        if chunk is _END:
            raise StopAsyncIteration
        return chunk


class _ATee(TeeRecord):
    """:class:`_Tee` for the async chain."""

    def __init__(
        self, flow: AsyncRequest, opts: RouteOptions, status: int,
        headers: List[Tuple[str, str]], source: AsyncIterator[Any], capture: BodyCapture,
    ) -> None:
        super().__init__(opts, status, headers, capture)
        self.flow = flow
        self.source = source
        self.loop = asyncio.get_running_loop()

    def __aiter__(self) -> "_ATee":
        return self

    async def __anext__(self) -> bytes:
        if self.done:
            raise StopAsyncIteration
        try:
            chunk = bytes(await self.source.__anext__())
        except StopAsyncIteration:
            await self.flow.finished(self.result(True))
            raise
        except asyncio.CancelledError:
            # The client went away (Django cancels the response): record what was seen.
            await asyncio.shield(self.flow.finished(self.result(False)))
            raise
        except BaseException:
            self.done = True
            await self.flow.failed()
            raise
        self.record(chunk)
        if self.last(chunk):
            await self.flow.finished(self.result(True))
        return chunk

    def close(self) -> None:
        """Django's response closer (run in a worker thread): finishes an unfinished tee."""
        if not self.done:
            result = self.result(False)
            asyncio.run_coroutine_threadsafe(self.flow.finished(result), self.loop)


def _to_django(answer: Response) -> Any:
    """A Django response carrying exactly core's status, headers and body."""
    out = HttpResponse(content=answer.body, status=answer.status)
    del out["Content-Type"]  # only the headers core chose (a replay's, or problem+json)
    for name, value in answer.headers:
        out[name] = value
    return out


def _answer(answer: Response, live: Any, body: Optional[bytes]) -> Any:
    """Core's answer; when it is the handler's own response, the live Django response object
    (cookies and other response state intact). ``body``: the live body when it was held for
    the flow (else the answer is the live response whenever the status is the handler's)."""
    if answer.handler_ran and int(live.status_code) == answer.status:
        if body is None or answer.body == body:
            return live
    return _to_django(answer)
