"""WSGI middleware and a Flask extension, with the same options as :mod:`idempo.asgi`.

::

    from flask import Flask
    from idempo.stores import SQLiteStore
    from idempo.wsgi import FlaskIdempotency

    app = Flask(__name__)
    FlaskIdempotency(app, store=SQLiteStore("idempo.sqlite3"), scope=lambda environ: environ.get("REMOTE_USER"))

The scope function runs in the middleware, before the view: it must read what exists there (the
WSGI environ: ``REMOTE_USER``, a header, a token). One that returns ``None``, ``""``, a non-string
or raises refuses the request with 500 ``scope-unresolved``; ``public=True`` declares that a
route's keys are shared by every caller.

The request body is read as PEP 3333 says: ``CONTENT_LENGTH`` bytes, or to the end of
``wsgi.input`` where the server sets ``wsgi.input_terminated`` (chunked uploads under Werkzeug,
gunicorn); a request with neither has no body. The response is captured as core's plan says
(``spec/PROTOCOL.md`` §7.5.1): a body whose ``Content-Length`` is within the record limit is held
until core decided what to store; any other (a generator without a length, a large file) is teed
to the client as the application produces it while at most ``max_body_bytes`` of it are recorded
(past that, retries get the ``response-not-retained`` problem); a status that is not stored passes
straight through. The application's own status line (its reason phrase) is sent unchanged.

The running view finds its execution (key, generation, downstream key) in
``environ["idempo.execution"]`` (``flask.request.environ``).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

if TYPE_CHECKING:
    from typing_extensions import Unpack

from idempo._flow import HandlerResult, Response, SyncRequest, failed_log
from idempo._host import (
    HostCore,
    HostOptions,
    RouteOptions,
    declared_length,
    with_content_length,
)
from idempo._idempo import BodyCapture
from idempo._tee import TeeRecord, handler_result

Environ = Dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
Headers = List[Tuple[str, str]]

_READ_CHUNK = 64 * 1024


def _status_line(status: int) -> str:
    """The status line of an answer idempo builds (a replay, a problem): the standard phrase."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"{status} {phrase}"


class IdempotencyMiddleware:
    """Idempotency-Key handling for a WSGI application (options as in :mod:`idempo.asgi`;
    ``resolve(environ) -> (route template | None, endpoint | None)`` finds the route).

    ``store`` must be a synchronous store instance (``SQLiteStore(path)``, ``PostgresStore(dsn)``,
    ...): a string, a class, a factory or an asyncio store is a ``TypeError`` here.
    ``problem_renderer``: ``fn(problem) -> (body, content_type)`` renders idempo's problems in the
    API's own error format (:mod:`idempo._render`; default RFC 9457 problem+json).
    """

    def __init__(
        self,
        app: WSGIApp,
        *,
        store: Any,
        resolve: Optional[Callable[[Environ], Tuple[Optional[str], Any]]] = None,
        host: str = "idempo.wsgi.IdempotencyMiddleware",
        **options: "Unpack[HostOptions]",
    ) -> None:
        self.app = app
        self.resolve = resolve
        self.core = HostCore(store=store, host=host, sync_only=True, **options)
        self._env_key = "HTTP_" + self.core.header_name.upper().replace("-", "_")

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if method not in self.core.methods:
            return self.app(environ, start_response)
        template, endpoint = self.resolve(environ) if self.resolve else (None, None)
        if self.resolve is not None and template is None:
            return self.app(environ, start_response)  # no such route: the app answers 404/405
        opts = self.core.options_for(endpoint)
        if opts is None:
            return self.app(environ, start_response)
        route = template or str(environ.get("PATH_INFO", "/"))
        core = self.core
        raw_key = environ.get(self._env_key)
        key_fields = [] if raw_key is None else [str(raw_key).encode("latin-1")]
        admission, answer = core.admit_key(
            opts, route, key_fields, declared_length(environ.get("CONTENT_LENGTH") or None)
        )
        if answer is not None:
            return _send(start_response, answer)
        if admission is None:
            return self.app(environ, start_response)  # no key, key optional: unprotected
        assert admission.body_limit is not None
        body, over_limit = read_body(environ, admission.body_limit)
        headers = _headers(environ)
        lower = {n.lower(): v for n, v in headers}
        prepared = core.admit_body(
            admission,
            opts=opts,
            request=environ,
            method=method,
            route=route,
            target=_target(environ),
            headers=headers,
            content_type=lower.get("content-type"),
            body=body,
            over_limit=over_limit,
            authenticated="authorization" in lower or bool(environ.get("REMOTE_USER")),
        )
        environ["wsgi.input"] = _Input(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        if prepared.answer is not None:
            return _send(start_response, prepared.answer)
        assert prepared.key is not None
        flow = SyncRequest(**core.flow_args(opts, route, prepared))
        try:
            started = flow.begin()
        except BaseException:
            flow.close()
            raise
        if isinstance(started, Response):
            return _send(start_response, started)
        environ["idempo.execution"] = started
        try:
            return flow.call(lambda _: self._run_app(environ, start_response, opts, flow), started)
        except BaseException as exc:
            answer = flow.failed()
            if answer is None or not isinstance(exc, Exception):
                raise
            failed_log(route, exc)
            return _send(start_response, answer)

    def _run_app(
        self, environ: Environ, start_response: StartResponse, opts: RouteOptions,
        flow: SyncRequest,
    ) -> Iterable[bytes]:
        """Runs the application under the claim and answers as core's capture plan says."""
        started: Dict[str, Any] = {}
        pending: List[bytes] = []

        def capture_start(
            status: str, response_headers: Headers, exc_info: Any = None
        ) -> Callable[[bytes], None]:
            started["line"] = str(status)
            started["headers"] = [(str(n), str(v)) for n, v in response_headers]
            return pending.append  # write(): sent before the iterable's chunks

        app_iter = self.app(environ, capture_start)
        chunks = iter(app_iter)
        try:
            # PEP 3333: start_response may wait for the first body chunk.
            while "line" not in started:
                try:
                    pending.append(next(chunks))
                except StopIteration:
                    raise RuntimeError("the WSGI application did not call start_response") from None
            line = str(started["line"])
            status = int(line.split(" ", 1)[0])
            headers: Headers = started["headers"]
            plan, limit = opts.config.capture_plan(status, headers, streaming=False)
            if plan == "buffer":
                assert limit is not None
                held = _hold(pending, chunks, None if opts.config.transactional else limit)
                if held is not None:
                    _close(app_iter)
                    body = b"".join(held)
                    response = flow.finished(handler_result(opts, status, headers, body, False))
                    if response.handler_ran and response.status == status and response.body == body:
                        # The application's own answer, with its own status line.
                        start_response(line, with_content_length(headers, body))
                        return [body]
                    return _send(start_response, response)
                # Longer than its Content-Length said: teed from here (the record is not retained).
            if plan == "pass_through":
                # Not stored: core releases the claim now; the body goes to the client untouched.
                flow.finished(HandlerResult(status, headers, b""))
                start_response(line, headers)
                return app_iter if not pending else _Chain(pending, chunks, app_iter)
            assert limit is not None
            tee = _Tee(flow, opts, status, headers, pending, chunks, app_iter, BodyCapture(limit))
            start_response(line, headers)
            return tee
        except BaseException:
            _close(app_iter)
            raise


def read_body(environ: Environ, limit: int) -> Tuple[bytes, bool]:
    """(body, over_limit) as PEP 3333 says: ``CONTENT_LENGTH`` bytes, or the input to its end
    where the server sets ``wsgi.input_terminated``; a request with neither has no body (reading
    would wait for a client that sent nothing). At most ``limit`` + 1 bytes are read."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b"", False
    length = declared_length(environ.get("CONTENT_LENGTH") or None)
    if length is not None:
        want = min(length, limit + 1)
    elif environ.get("wsgi.input_terminated"):
        want = limit + 1
    else:
        return b"", False
    parts: List[bytes] = []
    got = 0
    while got < want:
        chunk = stream.read(min(_READ_CHUNK, want - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    if got > limit:
        return b"", True
    return b"".join(parts), False


def _hold(
    pending: List[bytes], chunks: Iterator[bytes], limit: Optional[int]
) -> Optional[List[bytes]]:
    """Reads the whole body into ``pending`` while it stays within ``limit`` (None: no limit,
    transactional mode); None when it went past the limit (``pending`` holds what was read)."""
    size = sum(len(c) for c in pending)
    if limit is not None and size > limit:
        return None
    for chunk in chunks:
        pending.append(chunk)
        size += len(chunk)
        if limit is not None and size > limit:
            return None
    return pending


def _close(app_iter: Any) -> None:
    close = getattr(app_iter, "close", None)
    if close is not None:
        close()


class _Chain:
    """The chunks read before ``start_response`` was called, then the rest of the iterable."""

    def __init__(self, pending: List[bytes], chunks: Iterator[bytes], app_iter: Any) -> None:
        self._pending = pending
        self._chunks = chunks
        self._app_iter = app_iter

    def __iter__(self) -> Iterator[bytes]:
        yield from self._pending
        yield from self._chunks

    def close(self) -> None:
        _close(self._app_iter)


class _Tee(TeeRecord):
    """The application's body sent to the client chunk by chunk while at most the plan's limit
    is recorded; when it ends (or the server closes it early: the client went away) the flow
    records what was seen, truncated when it passed the limit or did not end."""

    def __init__(
        self,
        flow: SyncRequest,
        opts: RouteOptions,
        status: int,
        headers: Headers,
        pending: List[bytes],
        chunks: Iterator[bytes],
        app_iter: Any,
        capture: Optional[BodyCapture],
    ) -> None:
        super().__init__(opts, status, headers, capture)
        self._flow = flow
        self._pending = pending
        self._chunks = chunks
        self._app_iter = app_iter
        for chunk in pending:
            self.record(chunk)
        if self.remaining is not None:
            self.remaining -= sum(len(c) for c in pending)

    def __iter__(self) -> "_Tee":
        return self

    def __next__(self) -> bytes:
        if self.done:
            raise StopIteration
        if self._pending:
            return self._pending.pop(0)
        try:
            chunk = next(self._chunks)
        except StopIteration:
            self._finish(complete=True)
            raise
        except BaseException:
            self.done = True
            try:
                _close(self._app_iter)
            finally:
                self._flow.failed()
            raise
        self.record(chunk)
        if self.last(chunk):
            self._finish(complete=True)
        return chunk

    def close(self) -> None:
        """Called by the server when it is done with the body (PEP 3333)."""
        if not self.done:
            self._finish(complete=False)

    def _finish(self, *, complete: bool) -> None:
        self.done = True
        try:
            _close(self._app_iter)
        finally:
            self._flow.finished(self.result(complete))


class _Input:
    """A re-readable ``wsgi.input`` over the buffered body."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = len(self._body) - self._pos
        chunk = self._body[self._pos : self._pos + size]
        self._pos += len(chunk)
        return chunk

    def readline(self, size: int = -1) -> bytes:
        end = self._body.find(b"\n", self._pos)
        end = len(self._body) if end < 0 else end + 1
        if size is not None and size >= 0:
            end = min(end, self._pos + size)
        chunk = self._body[self._pos : end]
        self._pos = end
        return chunk

    def __iter__(self) -> Any:
        while True:
            line = self.readline()
            if not line:
                return
            yield line


def _headers(environ: Environ) -> List[Tuple[str, str]]:
    out = []
    for k, v in environ.items():
        if k.startswith("HTTP_"):
            out.append((k[5:].replace("_", "-").lower(), str(v)))
    if environ.get("CONTENT_TYPE"):
        out.append(("content-type", str(environ["CONTENT_TYPE"])))
    return out


def _target(environ: Environ) -> str:
    """The request target as received (spec/CANONICAL.md §2.1): the server's raw request URI when
    it reports one (gunicorn ``RAW_URI``, others ``REQUEST_URI``), else path and query rebuilt."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if isinstance(raw, str) and raw.startswith("/"):
        return raw
    path = str(environ.get("SCRIPT_NAME", "")) + str(environ.get("PATH_INFO", ""))
    query = environ.get("QUERY_STRING")
    return path + (f"?{query}" if query else "")


def _send(start_response: StartResponse, response: Response) -> List[bytes]:
    headers = with_content_length(response.headers, response.body)
    start_response(_status_line(response.status), headers)
    return [response.body]


class FlaskIdempotency:
    """Flask extension: wraps ``app.wsgi_app`` with :class:`IdempotencyMiddleware`, resolving
    the route template (``/payments/<int:id>``) and the view (for :func:`idempo.idempotent`
    marks) from Flask's URL map."""

    def __init__(self, app: Any = None, **options: Any) -> None:
        self.options = options
        self.middleware: Optional[IdempotencyMiddleware] = None
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Any) -> None:
        def resolve(environ: Environ) -> Tuple[Optional[str], Any]:
            try:
                rule, _args = app.url_map.bind_to_environ(environ).match(return_rule=True)
            except Exception:  # noqa: BLE001 - 404/405: not a protected route
                return None, None
            return rule.rule, app.view_functions.get(rule.endpoint)

        self.middleware = IdempotencyMiddleware(app.wsgi_app, resolve=resolve, **self.options)
        app.wsgi_app = self.middleware
        app.extensions["idempo"] = self
