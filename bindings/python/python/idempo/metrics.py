"""Request-path metrics in the formats operators already scrape (``spec/METRICS.md``).

Two adapters over :class:`idempo.Hooks`; pass what they return as ``hooks=`` to any integration
(ASGI, FastAPI, WSGI/Flask, Django)::

    from prometheus_client import REGISTRY
    from idempo.metrics import prometheus_hooks

    app.add_middleware(IdempotencyMiddleware, store=store, hooks=prometheus_hooks(REGISTRY))

or, with an OpenTelemetry meter (``opentelemetry-api``; the SDK and exporter are the app's)::

    from opentelemetry import metrics
    from idempo.metrics import opentelemetry_hooks

    hooks = opentelemetry_hooks(metrics.get_meter("idempo"))

Both record the same series: every answered request by route template and core's outcome name,
leases lost, takeovers, store failures by primitive, and a histogram of store primitive latency.
Combine them with your own hooks with :meth:`idempo.Hooks.chain`. Neither records a key, a body
or a scope: labels are the route template, the outcome and the primitive's name only.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from idempo._flow import Hooks
from idempo._idempo import STORE_LATENCY_BUCKETS as _STORE_LATENCY_BUCKETS

__all__ = ["STORE_LATENCY_BUCKETS", "opentelemetry_hooks", "prometheus_hooks"]

STORE_LATENCY_BUCKETS: Sequence[float] = _STORE_LATENCY_BUCKETS
"""Histogram bounds (seconds) of ``idempo_store_operation_duration_seconds``, from core (the
same in every binding): an embedded store answers in well under a millisecond, a networked one
in a few, a failing one at its timeout."""


def prometheus_hooks(registry: Any = None, *, namespace: str = "idempo") -> Hooks:
    """Hooks that count into ``prometheus_client`` collectors registered in ``registry``
    (default: ``prometheus_client.REGISTRY``).

    Series (``spec/METRICS.md``): ``idempo_requests_total{route,outcome}``,
    ``idempo_lease_lost_total{route}``, ``idempo_takeovers_total{route}``,
    ``idempo_store_errors_total{route,op}`` and the histogram
    ``idempo_store_operation_duration_seconds{op}``. Build it once per registry: a second call
    on the same registry raises ``ValueError`` (duplicate timeseries), as ``prometheus_client``
    does.
    """
    try:
        import prometheus_client as prom
    except ImportError as exc:  # pragma: no cover - exercised without the extra
        raise ImportError(
            "idempo.metrics.prometheus_hooks needs prometheus-client: "
            "pip install 'idempo[metrics]'"
        ) from exc
    if registry is None:
        registry = prom.REGISTRY
    requests = prom.Counter(
        "requests",
        "Requests idempo answered, by route template and core's outcome",
        ["route", "outcome"],
        namespace=namespace,
        registry=registry,
    )
    lease_lost = prom.Counter(
        "lease_lost",
        "Handlers whose lease another request took over while they ran",
        ["route"],
        namespace=namespace,
        registry=registry,
    )
    takeovers = prom.Counter(
        "takeovers",
        "Requests that took over an expired lease and ran the handler again",
        ["route"],
        namespace=namespace,
        registry=registry,
    )
    store_errors = prom.Counter(
        "store_errors",
        "Store primitives that failed (the request failed closed)",
        ["route", "op"],
        namespace=namespace,
        registry=registry,
    )
    latency = prom.Histogram(
        "store_operation_duration_seconds",
        "Duration of one store primitive, as the request saw it",
        ["op"],
        namespace=namespace,
        registry=registry,
        buckets=STORE_LATENCY_BUCKETS,
    )

    def on_store_op(route: str, op: str, seconds: float, failed: bool) -> None:
        latency.labels(op).observe(seconds)
        if failed:
            store_errors.labels(route, op).inc()

    return Hooks(
        on_outcome=lambda route, outcome: requests.labels(route, outcome).inc(),
        on_lease_lost=lambda route: lease_lost.labels(route).inc(),
        on_takeover=lambda route: takeovers.labels(route).inc(),
        on_store_op=on_store_op,
    )


def opentelemetry_hooks(meter: Any, *, prefix: Optional[str] = "idempo") -> Hooks:
    """Hooks that record into instruments created on an OpenTelemetry ``meter``
    (``opentelemetry.metrics.Meter``).

    Instruments (``spec/METRICS.md``): counters ``idempo.requests`` (attributes ``route``,
    ``outcome``), ``idempo.lease_lost`` and ``idempo.takeovers`` (``route``),
    ``idempo.store.errors`` (``route``, ``op``), and the histogram
    ``idempo.store.operation.duration`` in seconds (``op``).
    """
    for method in ("create_counter", "create_histogram"):
        if not callable(getattr(meter, method, None)):
            raise TypeError(
                f"opentelemetry_hooks expects an OpenTelemetry Meter (with {method}); got "
                f"{type(meter).__name__}: pass opentelemetry.metrics.get_meter('idempo')"
            )
    p = f"{prefix}." if prefix else ""
    requests = meter.create_counter(
        f"{p}requests", unit="{request}", description="Requests idempo answered"
    )
    lease_lost = meter.create_counter(
        f"{p}lease_lost", unit="{handler}", description="Handlers whose lease was taken over"
    )
    takeovers = meter.create_counter(
        f"{p}takeovers", unit="{request}", description="Takeovers of an expired lease"
    )
    store_errors = meter.create_counter(
        f"{p}store.errors", unit="{operation}", description="Store primitives that failed"
    )
    latency = meter.create_histogram(
        f"{p}store.operation.duration", unit="s", description="Duration of one store primitive"
    )

    def on_store_op(route: str, op: str, seconds: float, failed: bool) -> None:
        latency.record(seconds, {"op": op})
        if failed:
            store_errors.add(1, {"route": route, "op": op})

    return Hooks(
        on_outcome=lambda route, outcome: requests.add(1, {"route": route, "outcome": outcome}),
        on_lease_lost=lambda route: lease_lost.add(1, {"route": route}),
        on_takeover=lambda route: takeovers.add(1, {"route": route}),
        on_store_op=on_store_op,
    )
