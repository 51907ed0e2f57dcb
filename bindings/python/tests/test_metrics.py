"""Request-path metrics (``idempo.metrics``, ``spec/METRICS.md``): the Prometheus and
OpenTelemetry adapters count what really happened to requests through the ASGI middleware, with
the names and labels of ``spec/vectors/metrics/request.json``."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import idempo
from idempo.asgi import IdempotencyMiddleware
from idempo.metrics import opentelemetry_hooks, prometheus_hooks
from idempo.stores import MemoryStore, SQLiteStore

VECTORS = json.loads(
    (Path(__file__).resolve().parents[3] / "spec/vectors/metrics/request.json").read_text()
)

Labels = Tuple[Tuple[str, str], ...]


class Reader:
    """Reads back what an adapter recorded: counter totals and histogram counts by labels."""

    def __init__(self, hooks: idempo.Hooks, read: Callable[[], Dict[str, Dict[Labels, float]]]):
        self.hooks = hooks
        self._read = read

    def value(self, metric: str, **labels: str) -> float:
        want = tuple(sorted(labels.items()))
        return sum(
            v for k, v in self._read().get(metric, {}).items() if all(p in k for p in want)
        )

    def names(self) -> List[str]:
        return sorted(self._read())


def prometheus_reader() -> Reader:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    hooks = prometheus_hooks(registry)

    def read() -> Dict[str, Dict[Labels, float]]:
        # The text exposition format, as a scraper receives it.
        out: Dict[str, Dict[Labels, float]] = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                name = sample.name
                if family.type == "histogram":
                    if not name.endswith("_count"):
                        continue
                    name = name[: -len("_count")]
                labels = tuple(sorted(sample.labels.items()))
                out.setdefault(name, {})[labels] = sample.value
        return out

    return Reader(hooks, read)


def otel_reader() -> Reader:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    hooks = opentelemetry_hooks(provider.get_meter("idempo-test"))
    seen: Dict[str, Dict[Labels, float]] = {}

    def read() -> Dict[str, Dict[Labels, float]]:
        data = reader.get_metrics_data()
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.data.data_points:
                        labels = tuple(sorted((k, str(v)) for k, v in point.attributes.items()))
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count
                        seen.setdefault(metric.name, {})[labels] = float(value)
        return seen

    return Reader(hooks, read)


READERS = {"prometheus": prometheus_reader, "opentelemetry": otel_reader}


@pytest.fixture(params=sorted(READERS))
def metrics(request: pytest.FixtureRequest) -> Iterator[Tuple[str, Reader]]:
    yield request.param, READERS[request.param]()


def name_of(adapter: str, metric: str) -> str:
    entry = next(m for m in VECTORS["metrics"] if m["id"] == metric)
    return str(entry[adapter])


def app_with(store: Any, hooks: idempo.Hooks, **options: Any) -> Starlette:
    runs: List[int] = []

    async def pay(request: Request) -> Response:
        body = await request.json()
        if body.get("sleep"):
            await asyncio.sleep(body["sleep"])
        if body.get("sleep_first") and not runs:
            runs.append(0)  # the first run: slow; a re-run after a takeover is quick
            await asyncio.sleep(body["sleep_first"])
            return JSONResponse({"n": 0}, status_code=201)
        runs.append(1)
        return JSONResponse({"n": len(runs)}, status_code=201)

    app = Starlette(routes=[Route("/payments/{id}", pay, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, store=store, hooks=hooks, **options)
    app.state.runs = runs
    return app


def post(c: httpx.AsyncClient, key: str, body: Dict[str, Any]) -> Any:
    return c.post("/payments/7", json=body, headers={"Idempotency-Key": key})


def client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def test_outcomes_and_store_latency_by_route_template(metrics: Tuple[str, Reader]) -> None:
    adapter, m = metrics
    app = app_with(MemoryStore(), m.hooks)

    async def main() -> None:
        async with client(app) as c:
            assert (await post(c, "key-metrics-1", {"a": 1})).status_code == 201
            assert (await post(c, "key-metrics-1", {"a": 1})).status_code == 201  # replay
            assert (await post(c, "key-metrics-1", {"a": 2})).status_code == 422
            slow = asyncio.ensure_future(post(c, "key-metrics-2", {"sleep": 0.3}))
            await asyncio.sleep(0.1)
            assert (await post(c, "key-metrics-2", {"sleep": 0.3})).status_code == 409
            assert (await slow).status_code == 201

    asyncio.run(main())
    requests = name_of(adapter, "requests")
    route = "/payments/{id}"  # the template, never the concrete path
    assert m.value(requests, route=route, outcome="stored") == 2
    assert m.value(requests, route=route, outcome="replayed") == 1
    assert m.value(requests, route=route, outcome="mismatch") == 1
    assert m.value(requests, route=route, outcome="in_flight") == 1
    assert m.value(requests, route="/payments/7") == 0
    latency = name_of(adapter, "store_latency")
    # Every request made at least one store round; the two stored ones a claim and a complete.
    assert m.value(latency, op="complete") == 2
    assert m.value(latency) >= 5
    assert app.state.runs == [1, 1]


def test_lease_lost_and_takeover_are_counted(metrics: Tuple[str, Reader]) -> None:
    adapter, m = metrics
    config = idempo.Config(lease_ms=1000, heartbeat_ms=0, takeover="re_run")
    app = app_with(MemoryStore(), m.hooks, config=config)

    async def main() -> None:
        async with client(app) as c:
            body = {"sleep_first": 1.6}
            first = asyncio.ensure_future(post(c, "key-metrics-3", body))
            await asyncio.sleep(1.2)  # the first lease expired (no heartbeat)
            second = await post(c, "key-metrics-3", body)
            assert second.status_code == 201
            await first

    asyncio.run(main())
    assert m.value(name_of(adapter, "takeovers"), route="/payments/{id}") == 1
    assert m.value(name_of(adapter, "lease_lost"), route="/payments/{id}") == 1
    assert m.value(name_of(adapter, "requests"), outcome="lease_lost") == 1


def test_store_failures_counted_by_primitive(metrics: Tuple[str, Reader], tmp_path: Path) -> None:
    adapter, m = metrics
    path = tmp_path / "idempo.sqlite3"
    app = app_with(SQLiteStore(path, busy_timeout_ms=200), m.hooks)

    async def main() -> None:
        async with client(app) as c:
            assert (await post(c, "key-metrics-4", {"a": 1})).status_code == 201
            locker = sqlite3.connect(path, isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")
            try:
                r = await post(c, "key-metrics-5", {"a": 1})
            finally:
                locker.execute("ROLLBACK")
                locker.close()
            assert r.status_code == 503

    asyncio.run(main())
    assert m.value(name_of(adapter, "store_errors"), route="/payments/{id}", op="claim") == 1
    assert m.value(name_of(adapter, "requests"), outcome="store_unavailable") == 1
    assert app.state.runs == [1]


def test_exported_names_are_the_specs(metrics: Tuple[str, Reader]) -> None:
    """Every series of spec/vectors/metrics/request.json, and nothing else, once each has a
    sample."""
    adapter, m = metrics
    h = m.hooks
    assert h.on_outcome and h.on_lease_lost and h.on_takeover and h.on_store_op
    h.on_outcome("/r", "stored")
    h.on_lease_lost("/r")
    h.on_takeover("/r")
    h.on_store_op("/r", "claim", 0.001, True)
    assert m.names() == sorted(str(e[adapter]) for e in VECTORS["metrics"])


def test_a_raising_hook_never_changes_the_answer() -> None:
    def boom(*_: Any) -> None:
        raise RuntimeError("exporter down")

    hooks = idempo.Hooks.chain(idempo.Hooks(on_outcome=boom, on_store_op=boom), idempo.Hooks())
    app = app_with(MemoryStore(), hooks)

    async def main() -> None:
        async with client(app) as c:
            assert (await post(c, "key-metrics-6", {"a": 1})).status_code == 201
            assert (await post(c, "key-metrics-6", {"a": 1})).status_code == 201

    asyncio.run(main())
    assert app.state.runs == [1]


def test_opentelemetry_hooks_refuses_what_is_not_a_meter() -> None:
    with pytest.raises(TypeError, match="get_meter"):
        opentelemetry_hooks(object())


def test_latency_buckets_are_cores_and_the_vectors() -> None:
    """The histogram bounds come from core, equal the vector's, and are what prometheus_client
    exports (an operator's bucket-based alert reads every binding the same way)."""
    from prometheus_client import CollectorRegistry

    from idempo.metrics import STORE_LATENCY_BUCKETS

    spec = next(m for m in VECTORS["metrics"] if m["id"] == "store_latency")
    assert list(STORE_LATENCY_BUCKETS) == spec["buckets"]
    registry = CollectorRegistry()
    hooks = prometheus_hooks(registry)
    assert hooks.on_store_op is not None
    hooks.on_store_op("/payments", "claim", 0.0001, False)
    bounds = [
        float(s.labels["le"])
        for family in registry.collect()
        if family.name == "idempo_store_operation_duration_seconds"
        for s in family.samples
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    ]
    assert bounds == spec["buckets"]
