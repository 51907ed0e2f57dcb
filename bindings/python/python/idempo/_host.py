"""Request preparation shared by the ASGI, WSGI and Django integrations: options, per-route
overrides, and the inputs of core's admission. Core makes every decision (``Admission``, the
order of ``spec/PROTOCOL.md`` §7.2.1); this module gathers its inputs and emits what it returns."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, replace
from typing import (
    TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence,
    Tuple, TypedDict, TypeVar, Union,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

from idempo._flow import AsyncRequest, Hooks, Response, log, response_of
from idempo._options import default
from idempo._render import ProblemRenderer, check_renderer, render
from idempo.stores._check import check_store
from idempo.stores._tx import require_transactions
from idempo.stores.memory import PartitionMemories
from idempo._idempo import (
    Admission,
    Config,
    Fingerprinter,
    InvalidArgument,
    ScopeRule,
)


class UnscopedKeyWarning(UserWarning):
    """An authenticated request hit an idempotent route that has no scope function: keys of
    different users share one namespace. Pass ``scope=`` (principal from the request), or
    declare the route ``public=True``."""


@dataclass(frozen=True)
class RouteOptions:
    """Options of one route (set by :func:`idempotent`, else the middleware's defaults)."""

    config: Config
    fingerprint_headers: Tuple[str, ...] = ()
    exclude: Tuple[str, ...] = ()
    scope: Optional[Callable[[Any], Optional[str]]] = None
    redact: Optional[Callable[[int, List[Tuple[str, str]], bytes], Optional[bytes]]] = None
    enabled: bool = True
    public: bool = False
    empty_scope_is_anonymous: bool = False


F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__idempo_route__"


def idempotent(
    *,
    config: Optional[Config] = None,
    fingerprint_headers: Iterable[str] = (),
    exclude: Iterable[str] = (),
    scope: Optional[Callable[[Any], Optional[str]]] = None,
    redact: Optional[Callable[[int, List[Tuple[str, str]], bytes], Optional[bytes]]] = None,
    enabled: bool = True,
    public: Optional[bool] = None,
    empty_scope_is_anonymous: Optional[bool] = None,
) -> Callable[[F], F]:
    """Marks an endpoint (Starlette/FastAPI endpoint or Flask view) with its own options.

    The function itself is returned unchanged (no wrapper, so FastAPI's dependency injection
    and signatures are untouched); the middleware reads the mark when the route matches.
    ``enabled=False`` exempts the route. ``config=Config(transactional=True)`` runs this route's
    handler in the store's transaction (:func:`idempo.current_transaction`). ``public=True``
    declares that the route's keys are shared by every caller (no principal; the middleware's
    scope function is not called for it); ``empty_scope_is_anonymous=True`` accepts an empty
    string from the scope function as the anonymous principal. None keeps the middleware's
    setting.
    """
    overrides: Dict[str, Any] = {
        "config": config,
        "fingerprint_headers": tuple(fingerprint_headers),
        "exclude": tuple(exclude),
        "scope": scope,
        "redact": redact,
        "enabled": enabled,
        "public": public,
        "empty_scope_is_anonymous": empty_scope_is_anonymous,
    }

    def mark(fn: F) -> F:
        setattr(fn, _MARK, overrides)
        return fn

    return mark


def route_overrides(endpoint: Any) -> Optional[Dict[str, Any]]:
    """The overrides set by :func:`idempotent` on an endpoint, if any."""
    found: Optional[Dict[str, Any]] = getattr(endpoint, _MARK, None)
    return found


class RouteParts(NamedTuple):
    """What a host reads for every request of a route, resolved once per :class:`RouteOptions`
    object (:meth:`HostCore.parts`)."""

    opts: RouteOptions
    fingerprinter: Fingerprinter
    rule: ScopeRule
    fingerprinted: FrozenSet[bytes]
    """:meth:`HostCore.fingerprinted`."""
    wanted: FrozenSet[bytes]
    """Every lowercase header name :func:`request_headers` reads for the route."""


class Prepared(NamedTuple):
    """A request ready for the flow (or already answered)."""

    answer: Optional[Response] = None
    key: Optional[str] = None
    scope: bytes = b""
    fingerprint: str = ""
    partition: Optional[bytes] = None
    """The principal's partition, for a store with per-partition quotas (``store.partitioned``)."""


Redact = Callable[[int, List[Tuple[str, str]], bytes], Optional[bytes]]
"""``fn(status, headers, body) -> bytes | None``: the body to store instead (``Config(redact=True)``)."""


class HostOptions(TypedDict, total=False):
    """The options of a host integration, typed once: the keyword arguments of
    :class:`idempo.asgi.IdempotencyMiddleware` and :class:`idempo.wsgi.IdempotencyMiddleware`,
    and the keys of Django's ``settings.IDEMPO`` (upper case), besides ``store``. What each
    means: :class:`idempo.asgi.IdempotencyMiddleware`. Defaults: :data:`HOST_DEFAULTS`."""

    config: Optional[Config]
    methods: Sequence[str]
    header_name: str
    scope: Optional[Callable[[Any], Optional[str]]]
    fingerprint_headers: Iterable[str]
    exclude: Iterable[str]
    hmac_key: Optional[bytes]
    numbers: Optional[str]
    redact: Optional[Redact]
    hooks: Optional[Hooks]
    only_marked: bool
    warn_unscoped: bool
    public: bool
    empty_scope_is_anonymous: bool
    problem_renderer: Optional[ProblemRenderer]


HOST_DEFAULTS: HostOptions = {
    "config": None,
    "methods": default("host", "methods"),
    "header_name": default("host", "header_name"),
    "scope": None,
    "fingerprint_headers": (),
    "exclude": (),
    "hmac_key": None,
    "numbers": None,
    "redact": None,
    "hooks": None,
    "only_marked": False,
    "warn_unscoped": True,
    "public": False,
    "empty_scope_is_anonymous": False,
    "problem_renderer": None,
}
"""Each :class:`HostOptions` option's default (the same in every host)."""


_MAX_ENDPOINTS = 4096
"""Endpoints whose resolved options a host keeps (an app has a bounded number of routes)."""


class HostCore:
    """The framework-independent part of an integration."""

    def __init__(
        self,
        *,
        store: Any,
        host: str = "IdempotencyMiddleware",
        sync_only: bool = False,
        **options: "Unpack[HostOptions]",
    ) -> None:
        """``options``: :class:`HostOptions` (defaults :data:`HOST_DEFAULTS`); ``host`` names the
        integration in construction errors; ``sync_only``: it calls the store synchronously (an
        asyncio store is refused, :func:`idempo.stores._check.check_store`)."""
        unknown = sorted(set(options) - set(HOST_DEFAULTS))
        if unknown:
            raise TypeError(f"{host}: unexpected option(s) {', '.join(unknown)}")
        given: Dict[str, Any] = {**HOST_DEFAULTS, **options}
        config: Optional[Config] = given["config"]
        methods: Sequence[str] = given["methods"]
        header_name: str = given["header_name"]
        scope: Optional[Callable[[Any], Optional[str]]] = given["scope"]
        fingerprint_headers: Iterable[str] = given["fingerprint_headers"]
        exclude: Iterable[str] = given["exclude"]
        hmac_key: Optional[bytes] = given["hmac_key"]
        numbers: Optional[str] = given["numbers"]
        redact: Optional[Redact] = given["redact"]
        hooks: Optional[Hooks] = given["hooks"]
        only_marked: bool = given["only_marked"]
        warn_unscoped: bool = given["warn_unscoped"]
        public: bool = given["public"]
        empty_scope_is_anonymous: bool = given["empty_scope_is_anonymous"]
        problem_renderer: Optional[ProblemRenderer] = given["problem_renderer"]
        if store is None:
            raise InvalidArgument("an idempotency store is required")
        check_store(store, host=host, sync_only=sync_only)
        self.store = store
        self.renderer = check_renderer(problem_renderer)
        self.methods = frozenset(m.upper() for m in methods)
        self.header_name = header_name.lower()
        self.header_name_bytes = self.header_name.encode("latin-1")
        self.hmac_key = hmac_key
        self.numbers = numbers
        self.hooks = hooks or Hooks()
        self.only_marked = only_marked
        self.warn_unscoped = warn_unscoped
        self.defaults = RouteOptions(
            config=config or Config(),
            fingerprint_headers=tuple(fingerprint_headers),
            exclude=tuple(exclude),
            scope=scope,
            redact=redact,
            public=public,
            empty_scope_is_anonymous=empty_scope_is_anonymous,
        )
        self._rules: Dict[Tuple[bool, bool, bool], ScopeRule] = {}
        self._fingerprinters: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], Fingerprinter] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._by_endpoint: Dict[Any, Optional[RouteOptions]] = {}
        self._fingerprinted: Dict[Tuple[str, ...], FrozenSet[bytes]] = {}
        self._parts: Dict[int, RouteParts] = {}
        self._memories: PartitionMemories = {}
        """The partition views of a memory store, for its requests' flows
        (:func:`idempo.stores.memory.partition_memory`)."""
        self._check(self.defaults)

    def parts(self, opts: RouteOptions) -> RouteParts:
        """The route's :class:`RouteParts` (remembered per options object: a host resolves one
        per endpoint, :meth:`options_for`)."""
        found = self._parts.get(id(opts))
        if found is not None and found.opts is opts:
            return found
        fingerprinted = self.fingerprinted(opts)
        found = RouteParts(
            opts, self.fingerprinter(opts), self._rule(opts), fingerprinted,
            _wanted(self.header_name_bytes, fingerprinted))
        with self._lock:
            if len(self._parts) >= _MAX_ENDPOINTS:
                self._parts.clear()
            self._parts[id(opts)] = found
        return found

    def start_asgi(
        self, opts: RouteOptions, parts: RouteParts, raw: Any
    ) -> Tuple[Admission, Optional[List[Tuple[str, str]]], Optional[str], bool]:
        """Stage 1 of core's admission (``admit_key``) on an ASGI scope's raw ``headers``: read
        in the extension (``Admission.start_asgi``, which keeps their pairs and content-type for
        stage 2), or, for headers of another shape, here as they always were. Returns the
        admission, the fingerprinted headers and the content-type when read here (else None) and
        whether an ``Authorization`` header came."""
        admission = Admission.start_asgi(
            opts.config, raw, self.header_name_bytes, parts.fingerprinted)
        if admission is not None:
            return admission, None, None, admission.authorization
        headers, lower, key_fields = request_headers(
            raw, self.header_name_bytes, parts.fingerprinted, parts.wanted)
        admission = Admission.start(
            opts.config, key_fields, declared_length(lower.get("content-length")))
        return admission, headers, lower.get("content-type"), "authorization" in lower

    def _rule(self, opts: RouteOptions) -> ScopeRule:
        """Core's validated scope rule of a route (a contradiction raises InvalidArgument)."""
        key = (opts.scope is not None, opts.public, opts.empty_scope_is_anonymous)
        found = self._rules.get(key)  # a dict read needs no lock (the GIL); a miss takes it
        if found is not None:
            return found
        with self._lock:
            rule = self._rules.get(key)
            if rule is None:
                rule = ScopeRule(
                    function=key[0], public=key[1], empty_scope_is_anonymous=key[2]
                )
                self._rules[key] = rule
            return rule

    def _check(self, opts: RouteOptions) -> None:
        if opts.redact is not None and not opts.config.redact:
            raise InvalidArgument("a redact hook needs Config(redact=True)")
        if opts.config.transactional:
            require_transactions(self.store)
        self._rule(opts)

    def options_for(self, endpoint: Any) -> Optional[RouteOptions]:
        """The options for a matched endpoint; None when the route is not protected. Resolved
        once per endpoint (its mark is read when the route is first used)."""
        if endpoint is None:
            return self._options_of(None)
        try:
            return self._by_endpoint[endpoint]
        except KeyError:
            pass
        except TypeError:  # an unhashable endpoint: resolved every time
            return self._options_of(endpoint)
        opts = self._options_of(endpoint)
        with self._lock:
            if len(self._by_endpoint) >= _MAX_ENDPOINTS:
                self._by_endpoint.clear()
            self._by_endpoint[endpoint] = opts
        return opts

    def _options_of(self, endpoint: Any) -> Optional[RouteOptions]:
        overrides = route_overrides(endpoint) if endpoint is not None else None
        if overrides is None:
            return None if self.only_marked else self.defaults
        if not overrides["enabled"]:
            return None
        # A route's own scope function or public flag replaces the middleware's declaration.
        if overrides.get("public") is not None:
            public = bool(overrides["public"])
        else:
            public = False if overrides["scope"] is not None else self.defaults.public
        anonymous = overrides.get("empty_scope_is_anonymous")
        opts = replace(
            self.defaults,
            config=overrides["config"] or self.defaults.config,
            fingerprint_headers=overrides["fingerprint_headers"]
            or self.defaults.fingerprint_headers,
            exclude=overrides["exclude"] or self.defaults.exclude,
            # A route declared public has no principal: the middleware's function is not its.
            scope=overrides["scope"] or (None if overrides.get("public") else self.defaults.scope),
            redact=overrides["redact"] or self.defaults.redact,
            public=public,
            empty_scope_is_anonymous=self.defaults.empty_scope_is_anonymous
            if anonymous is None
            else bool(anonymous),
        )
        self._check(opts)
        return opts

    def fingerprinted(self, opts: RouteOptions) -> FrozenSet[bytes]:
        """The route's fingerprint header names, lowercase, as bytes (what
        :func:`request_headers` keeps)."""
        names = opts.fingerprint_headers
        found = self._fingerprinted.get(names)
        if found is None:
            found = frozenset(n.lower().encode("latin-1") for n in names)
            self._fingerprinted[names] = found
        return found

    def fingerprinter(self, opts: RouteOptions) -> Fingerprinter:
        cache_key = (opts.fingerprint_headers, opts.exclude)
        found = self._fingerprinters.get(cache_key)
        if found is not None:
            return found
        with self._lock:
            fp = self._fingerprinters.get(cache_key)
            if fp is None:
                fp = Fingerprinter(
                    header_names=list(opts.fingerprint_headers),
                    exclude=list(opts.exclude),
                    hmac_key=self.hmac_key,
                    numbers=self.numbers,  # type: ignore[arg-type]
                )
                self._fingerprinters[cache_key] = fp
            return fp

    def flow_args(self, opts: RouteOptions, route: str, prepared: Prepared) -> Dict[str, Any]:
        """The keyword arguments of the request's flow (``SyncRequest`` / ``AsyncRequest``)."""
        assert prepared.key is not None
        return dict(
            store=self.store,
            config=opts.config,
            scope=prepared.scope,
            partition=prepared.partition,
            fingerprint=prepared.fingerprint,
            key=prepared.key,
            route=route,
            hooks=self.hooks,
            renderer=self.renderer,
        )

    def async_request(self, opts: RouteOptions, route: str, prepared: Prepared) -> AsyncRequest:
        """The request's asyncio flow (:meth:`flow_args`, without the dictionary between)."""
        assert prepared.key is not None
        return AsyncRequest(
            store=self.store,
            config=opts.config,
            scope=prepared.scope,
            partition=prepared.partition,
            fingerprint=prepared.fingerprint,
            key=prepared.key,
            route=route,
            hooks=self.hooks,
            renderer=self.renderer,
            memories=self._memories,
        )

    def admitted_flow(
        self,
        admission: Admission,
        parts: RouteParts,
        request: Any,
        method: str,
        route: str,
        target: str,
        headers: Optional[List[Tuple[str, str]]],
        content_type: Optional[str],
        body: bytes,
        over_limit: bool,
        authenticated: bool,
    ) -> "Union[AsyncRequest, Response]":
        """:meth:`admit_body` then :meth:`async_request` for an asyncio host, in one call: the
        request's flow, or the answer when core refused the request. ``headers`` None: those
        ``Admission.start_asgi`` read (with its content-type unless ``content_type`` is given)."""
        opts = parts.opts
        admitted = admission.admit(  # _admit, in this frame
            parts.fingerprinter, parts.rule, method, target, route, body, headers, content_type,
            over_limit, authenticated, opts.scope, request)
        if admitted is None:
            return self.refused(route, admission)
        key, scope_id, fingerprint, partition, warning = admitted
        if warning is not None and self.warn_unscoped and route not in self._warned:
            self._warned.add(route)
            warnings.warn(warning, UnscopedKeyWarning, stacklevel=2)
        store = self.store
        return AsyncRequest(  # by position (store, config, scope, fingerprint, key, route,
            # hooks, partition, renderer, memories): no keyword dictionary per request
            store, opts.config, scope_id, fingerprint, key, route, self.hooks,
            partition if getattr(store, "partitioned", False) is True else None,
            self.renderer, self._memories,
        )

    def _admit(
        self,
        admission: Admission,
        fingerprinter: Fingerprinter,
        rule: ScopeRule,
        opts: RouteOptions,
        request: Any,
        method: str,
        route: str,
        target: str,
        headers: Optional[List[Tuple[str, str]]],
        content_type: Optional[str],
        body: bytes,
        over_limit: bool,
        authenticated: bool,
    ) -> Optional[Tuple[str, bytes, str, bytes]]:
        """Stages 2 and 3 (``Admission.admit``): the key, scope id, fingerprint and partition,
        or None when core refused the request (``admission`` then holds the answer); warns once
        per route when core says the key is not scoped to a principal."""
        admitted = admission.admit(  # by position: no keyword dictionary per request
            fingerprinter,
            rule,
            method,
            target,
            route,
            body,
            headers,
            content_type,
            over_limit,
            authenticated,
            opts.scope,  # scope_function
            request,  # scope_argument
        )
        if admitted is None:
            return None
        key, scope_id, fingerprint, partition, warning = admitted
        if warning is not None and self.warn_unscoped and route not in self._warned:
            self._warned.add(route)
            warnings.warn(warning, UnscopedKeyWarning, stacklevel=3)
        return key, scope_id, fingerprint, partition

    def refused(self, route: str, admission: Admission) -> Response:
        """Core's refusal: logs core's line (if any), reports the outcome, returns the answer."""
        if admission.log is not None:
            log.error("%s", admission.log)
        assert admission.problem is not None
        answer = response_of(admission.problem)
        self.hooks.outcome(route, answer.outcome)
        return render(answer, self.renderer)

    def admit_key(
        self,
        opts: RouteOptions,
        route: str,
        key_fields: List[bytes],
        declared_length: Optional[int],
    ) -> Tuple[Optional[Admission], Optional[Response]]:
        """Stage 1 of core's admission: ``(None, None)`` to pass the request through
        unprotected, ``(None, answer)`` to answer now, or ``(admission, None)``: read at most
        ``admission.body_limit`` bytes of body and call :meth:`admit_body`."""
        admission = Admission.start(opts.config, key_fields, declared_length)
        if admission.kind == "pass_through":
            return None, None
        if admission.kind == "refuse":
            return None, self.refused(route, admission)
        return admission, None

    def admit_body(
        self,
        admission: Admission,
        *,
        opts: RouteOptions,
        request: Any,
        method: str,
        route: str,
        target: str,
        headers: List[Tuple[str, str]],
        content_type: Optional[str],
        body: bytes,
        over_limit: bool,
        authenticated: bool,
    ) -> Prepared:
        """Stages 2 and 3 of core's admission, in one call (``Admission.admit``): the body and its
        fingerprint, then the scope (core calls the route's scope function with ``request`` once
        the body passed).

        The scope uses the route *template* (one record namespace per endpoint); the fingerprint
        covers the concrete ``target`` (path and query), so the same key sent to
        ``/accounts/1/payments`` and ``/accounts/2/payments`` is a 422, never a replay.
        """
        admitted = self._admit(
            admission, self.fingerprinter(opts), self._rule(opts), opts, request, method, route,
            target, headers, content_type, body, over_limit, authenticated)
        if admitted is None:
            return Prepared(answer=self.refused(route, admission))
        key, scope_id, fingerprint, partition = admitted
        partitioned = getattr(self.store, "partitioned", False) is True
        return Prepared(None, key, scope_id, fingerprint, partition if partitioned else None)


def declared_length(value: Optional[str]) -> Optional[int]:
    """The body length a ``Content-Length`` value declares (None: absent or unreadable)."""
    if value is None:
        return None
    if value.isdigit() and value.isascii():  # the usual value: nothing to strip
        return int(value)
    text = value.strip()
    return int(text) if text.isdigit() else None


_READ = frozenset((b"content-length", b"content-type", b"authorization"))
"""The request headers a host reads itself (the body's length and type, authentication)."""


def request_headers(
    raw: Iterable[Tuple[bytes, bytes]],
    key_name: bytes,
    fingerprinted: FrozenSet[bytes],
    wanted: Optional[FrozenSet[bytes]] = None,
) -> Tuple[List[Tuple[str, str]], Dict[str, str], List[bytes]]:
    """One pass over an ASGI request's raw headers: the decoded pairs of the headers named in
    ``fingerprinted`` (lowercase; core's fingerprint reads those and no other, matching names
    without regard to ASCII case), the last value of ``content-length``, ``content-type`` and
    ``authorization`` by lowercase name, and the raw values of the key header ``key_name``
    (lowercase) in order. ``wanted``: the route's :attr:`RouteParts.wanted`, when the host has
    it."""
    headers: List[Tuple[str, str]] = []
    read: Dict[str, str] = {}
    key_fields: List[bytes] = []
    if wanted is None:
        wanted = _wanted(key_name, fingerprinted)
    for n, v in raw:
        low = n.lower()
        if low not in wanted:  # most headers: one lookup
            continue
        if low == key_name:
            key_fields.append(bytes(v))
        if low in _READ:
            read[low.decode("latin-1")] = v.decode("latin-1")
        if low in fingerprinted:
            headers.append((n.decode("latin-1"), v.decode("latin-1")))
    return headers, read, key_fields


_WANTED: Dict[Tuple[bytes, FrozenSet[bytes]], FrozenSet[bytes]] = {}


def _wanted(key_name: bytes, fingerprinted: FrozenSet[bytes]) -> FrozenSet[bytes]:
    """Every lowercase header name :func:`request_headers` reads (per key name and route)."""
    found = _WANTED.get((key_name, fingerprinted))
    if found is None:
        if len(_WANTED) >= 1024:
            _WANTED.clear()
        found = _WANTED[(key_name, fingerprinted)] = _READ | fingerprinted | {key_name}
    return found


def with_content_length(headers: List[Tuple[str, str]], body: bytes) -> List[Tuple[str, str]]:
    """Adds ``content-length`` when missing (replays and problems carry no framing headers)."""
    for name, _ in headers:
        if name.lower() == "content-length":
            return headers
    return [*headers, ("content-length", str(len(body)))]



def response_length(headers: Any) -> Optional[int]:
    """A response's declared ``Content-Length`` (None: absent or unreadable). A teed body whose
    declared length has been sent is complete, so its record is written before the last bytes
    leave: a client that has them and retries at once finds the record, not a 409."""
    for name, value in headers:
        if str(name).lower() == "content-length":
            return declared_length(str(value))
    return None
