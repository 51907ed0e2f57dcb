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

The running view finds its execution (key, generation, downstream key) in
``environ["idempo.execution"]`` (``flask.request.environ``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from idempo._flow import Execution, HandlerResult, Hooks, Response, run_sync
from idempo._host import HostCore, declared_length, with_content_length
from idempo._idempo import Config

Environ = Dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_REASONS = {
    200: "OK", 201: "Created", 202: "Accepted", 204: "No Content", 400: "Bad Request",
    404: "Not Found", 409: "Conflict", 413: "Content Too Large", 422: "Unprocessable Content",
    500: "Internal Server Error", 503: "Service Unavailable",
}


def _status_line(status: int) -> str:
    return f"{status} {_REASONS.get(status, 'Status')}"


class IdempotencyMiddleware:
    """Idempotency-Key handling for a WSGI application (options as in :mod:`idempo.asgi`;
    ``resolve(environ) -> (route template | None, endpoint | None)`` finds the route)."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        store: Any,
        config: Optional[Config] = None,
        methods: Sequence[str] = ("POST", "PATCH"),
        header_name: str = "Idempotency-Key",
        scope: Optional[Callable[[Environ], Optional[str]]] = None,
        resolve: Optional[Callable[[Environ], Tuple[Optional[str], Any]]] = None,
        fingerprint_headers: Iterable[str] = (),
        exclude: Iterable[str] = (),
        hmac_key: Optional[bytes] = None,
        numbers: Optional[str] = None,
        redact: Optional[Callable[[int, List[Tuple[str, str]], bytes], Optional[bytes]]] = None,
        hooks: Optional[Hooks] = None,
        only_marked: bool = False,
        warn_unscoped: bool = True,
        public: bool = False,
        empty_scope_is_anonymous: bool = False,
    ) -> None:
        self.app = app
        self.resolve = resolve
        self.core = HostCore(
            store=store,
            config=config,
            methods=methods,
            header_name=header_name,
            scope=scope,
            fingerprint_headers=fingerprint_headers,
            exclude=exclude,
            hmac_key=hmac_key,
            numbers=numbers,
            redact=redact,
            hooks=hooks,
            only_marked=only_marked,
            warn_unscoped=warn_unscoped,
            public=public,
            empty_scope_is_anonymous=empty_scope_is_anonymous,
        )
        self._env_key = "HTTP_" + header_name.upper().replace("-", "_")

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
        body, over_limit = self._read_body(environ, admission.body_limit)
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

        def handler(execution: Execution) -> HandlerResult:
            environ["idempo.execution"] = execution
            captured: Dict[str, Any] = {}

            def capture_start(status: str, response_headers: List[Tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
                captured["status"] = int(status.split(" ", 1)[0])
                captured["headers"] = list(response_headers)
                return lambda chunk: captured.setdefault("written", []).append(chunk)

            chunks = self.app(environ, capture_start)
            try:
                out = b"".join([*captured.get("written", []), *chunks])
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
            status = int(captured["status"])
            out_headers = [(str(n), str(v)) for n, v in captured["headers"]]
            stored = opts.redact(status, out_headers, out) if opts.redact is not None else None
            return HandlerResult(status, out_headers, out, stored)

        response = run_sync(
            store=core.store,
            config=opts.config,
            scope=prepared.scope,
            partition=prepared.partition,
            fingerprint=prepared.fingerprint,
            key=prepared.key,
            route=route,
            handler=handler,
            hooks=core.hooks,
        )
        return _send(start_response, response)

    def _read_body(self, environ: Environ, limit: int) -> Tuple[bytes, bool]:
        """(body, over_limit): at most ``limit`` + 1 bytes are read."""
        stream = environ.get("wsgi.input")
        if stream is None:
            return b"", False
        length = declared_length(environ.get("CONTENT_LENGTH") or None)
        data = stream.read(min(length, limit + 1)) if length else stream.read(limit + 1)
        if len(data) > limit:
            return b"", True
        return data, False


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
