"""Request preparation shared by the ASGI and WSGI integrations: options, per-route overrides,
key admission, fingerprint and scope. Core makes every decision; this module gathers its inputs."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar

from idempo._flow import Hooks, Response, response_of
from idempo.stores._tx import require_transactions
from idempo._idempo import (
    CanonicalizationError,
    Config,
    Fingerprinter,
    InvalidArgument,
    admit_key,
    body_problem,
    body_too_large,
    memory_partition,
    scope_id,
)

DEFAULT_MAX_BODY_BYTES = 1024 * 1024


class UnscopedKeyWarning(UserWarning):
    """An authenticated request hit an idempotent route that has no scope function: keys of
    different users share one namespace. Pass ``scope=`` (principal from the request)."""


@dataclass(frozen=True)
class RouteOptions:
    """Options of one route (set by :func:`idempotent`, else the middleware's defaults)."""

    config: Config
    fingerprint_headers: Tuple[str, ...] = ()
    exclude: Tuple[str, ...] = ()
    scope: Optional[Callable[[Any], Optional[str]]] = None
    redact: Optional[Callable[[int, List[Tuple[str, str]], bytes], Optional[bytes]]] = None
    enabled: bool = True
    transactional: bool = False


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
    transactional: Optional[bool] = None,
) -> Callable[[F], F]:
    """Marks an endpoint (Starlette/FastAPI endpoint or Flask view) with its own options.

    The function itself is returned unchanged (no wrapper, so FastAPI's dependency injection
    and signatures are untouched); the middleware reads the mark when the route matches.
    ``enabled=False`` exempts the route. ``transactional=True`` runs this route's handler in
    the store's transaction (:func:`idempo.current_transaction`); None keeps the middleware's
    setting.
    """
    overrides: Dict[str, Any] = {
        "config": config,
        "fingerprint_headers": tuple(fingerprint_headers),
        "exclude": tuple(exclude),
        "scope": scope,
        "redact": redact,
        "enabled": enabled,
        "transactional": transactional,
    }

    def mark(fn: F) -> F:
        setattr(fn, _MARK, overrides)
        return fn

    return mark


def route_overrides(endpoint: Any) -> Optional[Dict[str, Any]]:
    """The overrides set by :func:`idempotent` on an endpoint, if any."""
    found: Optional[Dict[str, Any]] = getattr(endpoint, _MARK, None)
    return found


@dataclass(frozen=True)
class Prepared:
    """A request ready for the flow (or already answered)."""

    answer: Optional[Response] = None
    key: Optional[str] = None
    scope: bytes = b""
    fingerprint: str = ""
    unprotected: bool = False
    partition: Optional[bytes] = None
    """The principal's partition, for a store with per-partition quotas (``store.partitioned``)."""


class HostCore:
    """The framework-independent part of an integration."""

    def __init__(
        self,
        *,
        store: Any,
        config: Optional[Config],
        methods: Sequence[str],
        header_name: str,
        scope: Optional[Callable[[Any], Optional[str]]],
        fingerprint_headers: Iterable[str],
        exclude: Iterable[str],
        hmac_key: Optional[bytes],
        numbers: str,
        max_body_bytes: int,
        strict_key: bool,
        key_min_len: int,
        key_max_len: int,
        redact: Optional[Callable[[int, List[Tuple[str, str]], bytes], Optional[bytes]]],
        hooks: Optional[Hooks],
        only_marked: bool,
        warn_unscoped: bool,
        transactional: bool = False,
    ) -> None:
        if store is None:
            raise InvalidArgument("an idempotency store is required")
        if max_body_bytes <= 0:
            raise InvalidArgument("max_body_bytes must be positive")
        self.store = store
        self.methods = frozenset(m.upper() for m in methods)
        self.header_name = header_name.lower()
        self.hmac_key = hmac_key
        self.numbers = numbers
        self.max_body_bytes = max_body_bytes
        self.key_opts = {"strict": strict_key, "min_len": key_min_len, "max_len": key_max_len}
        self.hooks = hooks or Hooks()
        self.only_marked = only_marked
        self.warn_unscoped = warn_unscoped
        self.defaults = RouteOptions(
            config=config or Config(),
            fingerprint_headers=tuple(fingerprint_headers),
            exclude=tuple(exclude),
            scope=scope,
            redact=redact,
            transactional=transactional,
        )
        self._check(self.defaults)
        self._fingerprinters: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], Fingerprinter] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def _check(self, opts: RouteOptions) -> None:
        if opts.redact is not None and not opts.config.redact:
            raise InvalidArgument("a redact hook needs Config(redact=True)")
        if opts.transactional:
            require_transactions(self.store)

    def options_for(self, endpoint: Any) -> Optional[RouteOptions]:
        """The options for a matched endpoint; None when the route is not protected."""
        overrides = route_overrides(endpoint) if endpoint is not None else None
        if overrides is None:
            return None if self.only_marked else self.defaults
        if not overrides["enabled"]:
            return None
        opts = replace(
            self.defaults,
            config=overrides["config"] or self.defaults.config,
            fingerprint_headers=overrides["fingerprint_headers"]
            or self.defaults.fingerprint_headers,
            exclude=overrides["exclude"] or self.defaults.exclude,
            scope=overrides["scope"] or self.defaults.scope,
            redact=overrides["redact"] or self.defaults.redact,
            transactional=self.defaults.transactional
            if overrides.get("transactional") is None
            else bool(overrides["transactional"]),
        )
        self._check(opts)
        return opts

    def fingerprinter(self, opts: RouteOptions) -> Fingerprinter:
        cache_key = (opts.fingerprint_headers, opts.exclude)
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

    def too_large(self) -> Response:
        return response_of(body_too_large(self.max_body_bytes))

    def prepare(
        self,
        *,
        opts: RouteOptions,
        request: Any,
        method: str,
        route: str,
        target: str,
        key_value: Optional[bytes],
        headers: List[Tuple[str, str]],
        content_type: Optional[str],
        body: bytes,
        authenticated: bool,
    ) -> Prepared:
        """Admits the key, computes the principal, fingerprint and scope id.

        The scope uses the route *template* (one record namespace per endpoint); the fingerprint
        covers the concrete ``target`` (path and query), so the same key sent to
        ``/accounts/1/payments`` and ``/accounts/2/payments`` is a 422, never a replay.
        """
        key, problem = admit_key(key_value, opts.config, **self.key_opts)  # type: ignore[arg-type]
        if problem is not None:
            answer = response_of(problem)
            self.hooks.outcome(route, answer.outcome)
            return Prepared(answer=answer)
        if key is None:
            return Prepared(unprotected=True)
        principal = opts.scope(request) if opts.scope is not None else None
        if principal is None:
            if authenticated and self.warn_unscoped and route not in self._warned:
                self._warned.add(route)
                warnings.warn(
                    f"idempotent route {method} {route} has no scope function but the request is "
                    "authenticated: all users share one key namespace (pass scope=...)",
                    UnscopedKeyWarning,
                    stacklevel=2,
                )
            principal = ""
        try:
            fp = self.fingerprinter(opts).fingerprint(
                method, target, body, headers, content_type=content_type
            )
        except CanonicalizationError as exc:
            answer = response_of(body_problem(exc))
            self.hooks.outcome(route, answer.outcome)
            return Prepared(answer=answer)
        partition = (
            memory_partition(principal) if getattr(self.store, "partitioned", False) is True else None
        )
        return Prepared(
            key=key,
            scope=scope_id(principal, method, route, key),
            fingerprint=fp,
            partition=partition,
        )


def with_content_length(headers: List[Tuple[str, str]], body: bytes) -> List[Tuple[str, str]]:
    """Adds ``content-length`` when missing (replays and problems carry no framing headers)."""
    if any(n.lower() == "content-length" for n, _ in headers):
        return headers
    return [*headers, ("content-length", str(len(body)))]

