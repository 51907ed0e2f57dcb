"""The purge process: deletes expired records beside your services and exports the figures.

::

    python -m idempo.purge --store-url postgresql://app@db/app --interval 60 --metrics-port 9464

Every ``--interval`` seconds it deletes expired records in batches of ``--batch`` (at most
``--max-batches`` per run), reads the store's figures (:meth:`stats`) and logs one line. With
``--metrics-port`` it serves Prometheus metrics on ``/metrics`` (``spec/STORAGE.md`` §4.7; needs
``prometheus-client``: ``pip install 'idempo[purge]'``). Several replicas may run at once: the
PostgreSQL batch takes its rows ``FOR UPDATE SKIP LOCKED``. ``SIGTERM`` or ``SIGINT`` ends it
after the batch under way (exit status 0); a configuration error exits with status 2 before
anything runs; a failed run (store unreachable) is logged, counted, and retried at the next
interval.

Options come from flags or the environment: ``IDEMPO_STORE_URL``, ``IDEMPO_PURGE_INTERVAL_S``,
``IDEMPO_PURGE_BATCH``, ``IDEMPO_PURGE_MAX_BATCHES``, ``IDEMPO_METRICS_PORT``,
``IDEMPO_METRICS_ADDR``. Store URLs: ``sqlite:///absolute/path.sqlite3`` (``sqlite://relative``),
``postgresql://...`` (a ``CachedStore``'s records live there: purge its PostgreSQL),
``redis://...`` and ``redis+cluster://node:port`` (Redis expires records itself; the process then
only reports figures and frees memory sooner).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from idempo._idempo import InvalidArgument
from idempo.stores._base import PurgeCounts, StoreStats

log = logging.getLogger("idempo.purge")

STATES = ("in_progress", "completed", "outcome_unknown")


class PurgeConfigError(InvalidArgument):
    """The purge process cannot start: a missing or unknown store URL, a bad option value, or
    metrics asked for without ``prometheus-client`` installed."""


def store_from_url(url: str) -> Any:
    """A store for ``url`` (see the module docs for the schemes)."""
    if not url:
        raise PurgeConfigError("no store: pass --store-url or set IDEMPO_STORE_URL")
    if url.startswith("sqlite://"):
        from idempo.stores import SQLiteStore

        path = url[len("sqlite://"):]
        if not path:
            raise PurgeConfigError("a sqlite URL needs a path: sqlite:///var/lib/app/idempo.sqlite3")
        _check_sqlite(path)
        return SQLiteStore(path, create_schema=False)
    if url.startswith(("postgresql://", "postgres://")):
        from idempo.stores import PostgresStore

        return PostgresStore(url)
    if url.startswith("redis+cluster://"):
        from idempo.stores import RedisStore

        return RedisStore("redis://" + url[len("redis+cluster://"):], cluster=True)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from idempo.stores import RedisStore

        return RedisStore(url)
    scheme = url.split(":", 1)[0]
    raise PurgeConfigError(
        f"unknown store URL scheme {scheme!r}: use sqlite://, postgresql://, redis:// or "
        "redis+cluster://"
    )


def _check_sqlite(path: str) -> None:
    """A wrong path would silently create an empty database: the file and its table must exist."""
    import sqlite3

    if not os.path.isfile(path):
        raise PurgeConfigError(f"no SQLite database at {path!r} (is this the service's file?)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        found = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idempo_record'"
        ).fetchone()
    finally:
        conn.close()
    if found is None:
        raise PurgeConfigError(f"{path!r} has no idempo_record table (is this the service's file?)")


class Metrics:
    """The process's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ImportError as exc:
            raise PurgeConfigError(
                "--metrics-port needs prometheus-client: pip install 'idempo[purge]'"
            ) from exc
        self.prom = prom
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.records = prom.Gauge("idempo_records", "Records by state", ["state"], registry=r)
        self.expired = prom.Gauge(
            "idempo_records_expired", "Records past expires_at, not purged yet", registry=r
        )
        self.lag = prom.Gauge(
            "idempo_purge_lag_seconds",
            "Age of the oldest expired record not purged yet (0 when none)",
            registry=r,
        )
        self.size = prom.Gauge(
            "idempo_store_size_bytes", "Table and indexes, or the database file", registry=r
        )
        self.purged = prom.Counter(
            "idempo_purged_records", "Records deleted by this process", ["state"], registry=r
        )
        self.batch = prom.Histogram(
            "idempo_purge_batch_duration_seconds", "Duration of one purge batch", registry=r
        )
        self.last_success = prom.Gauge(
            "idempo_purge_last_success_timestamp_seconds",
            "Unix time of the last run that ended without error",
            registry=r,
        )
        self.runs = prom.Counter(
            "idempo_purge_runs", "Purge runs by result", ["result"], registry=r
        )
        for state in STATES:
            self.purged.labels(state)
        for result in ("ok", "error"):
            self.runs.labels(result)

    def serve(self, port: int, addr: str) -> None:
        self.prom.start_http_server(port, addr=addr, registry=self.registry)

    def observe_batch(self, seconds: float, counts: PurgeCounts) -> None:
        self.batch.observe(seconds)
        for state in STATES:
            self.purged.labels(state).inc(getattr(counts, state))

    def observe_stats(self, stats: StoreStats) -> None:
        for state in STATES:
            self.records.labels(state).set(getattr(stats, state))
        self.expired.set(stats.expired)
        self.lag.set((stats.purge_lag_ms or 0) / 1000)
        if stats.size_bytes is not None:
            self.size.set(stats.size_bytes)


@dataclass(frozen=True)
class RunResult:
    """What one run did."""

    purged: PurgeCounts
    batches: int
    seconds: float
    stats: Optional[StoreStats]


def run_once(
    store: Any,
    *,
    batch: int,
    max_batches: int,
    stop: Optional[threading.Event] = None,
    metrics: Optional[Metrics] = None,
) -> RunResult:
    """One run: batches until one comes back short, ``max_batches`` ran or ``stop`` is set (checked
    between batches, never inside one), then the store's figures."""
    started = time.monotonic()
    total = PurgeCounts()
    batches = 0
    while batches < max_batches and not (stop is not None and stop.is_set()):
        t0 = time.monotonic()
        counts = store.purge_expired(batch)
        batches += 1
        total = total + counts
        if metrics is not None:
            metrics.observe_batch(time.monotonic() - t0, counts)
        if counts.total < batch:
            break
    stats_fn = getattr(store, "stats", None)
    stats = stats_fn() if callable(stats_fn) else None
    if metrics is not None and stats is not None:
        metrics.observe_stats(stats)
    return RunResult(total, batches, time.monotonic() - started, stats)


def _describe(result: RunResult) -> str:
    p = result.purged
    line = (
        f"purged {p.total} (in_progress {p.in_progress}, completed {p.completed}, "
        f"outcome_unknown {p.outcome_unknown}) in {result.batches} batch(es), "
        f"{result.seconds:.3f} s"
    )
    s = result.stats
    if s is not None:
        lag = "none" if s.purge_lag_ms is None else f"{s.purge_lag_ms / 1000:.1f} s"
        size = "n/a" if s.size_bytes is None else f"{s.size_bytes} B"
        line += f"; records {s.total}, expired {s.expired}, lag {lag}, size {size}"
    return line


def _env_number(name: str, kind: type, default: Any) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise PurgeConfigError(f"{name}={raw!r} is not a {kind.__name__}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m idempo.purge",
        description="Delete expired idempotency records on an interval and export metrics.",
    )
    p.add_argument("--store-url", default=os.environ.get("IDEMPO_STORE_URL", ""),
                   help="sqlite:///path, postgresql://..., redis://..., redis+cluster://... "
                   "(env IDEMPO_STORE_URL)")
    p.add_argument("--interval", type=float, default=None,
                   help="seconds between runs (default 60; env IDEMPO_PURGE_INTERVAL_S)")
    p.add_argument("--batch", type=int, default=None,
                   help="records per batch (default 1000; env IDEMPO_PURGE_BATCH)")
    p.add_argument("--max-batches", type=int, default=None,
                   help="batches per run at most (default 100; env IDEMPO_PURGE_MAX_BATCHES)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (env IDEMPO_METRICS_PORT)")
    p.add_argument("--metrics-addr", default=os.environ.get("IDEMPO_METRICS_ADDR", "0.0.0.0"),
                   help="address of the metrics endpoint (default 0.0.0.0)")
    p.add_argument("--once", action="store_true", help="one run, then exit (status 1 on error)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s idempo-purge %(message)s")
    args = _parser().parse_args(argv)
    try:
        interval = args.interval if args.interval is not None else _env_number(
            "IDEMPO_PURGE_INTERVAL_S", float, 60.0)
        batch = args.batch if args.batch is not None else _env_number(
            "IDEMPO_PURGE_BATCH", int, 1000)
        max_batches = args.max_batches if args.max_batches is not None else _env_number(
            "IDEMPO_PURGE_MAX_BATCHES", int, 100)
        port = args.metrics_port if args.metrics_port is not None else _env_number(
            "IDEMPO_METRICS_PORT", int, None)
        if not interval > 0:
            raise PurgeConfigError(f"--interval must be positive, got {interval}")
        if batch < 1 or max_batches < 1:
            raise PurgeConfigError("--batch and --max-batches must be at least 1")
        if port is not None and not 0 < port < 65536:
            raise PurgeConfigError(f"--metrics-port must be 1..65535, got {port}")
        store = store_from_url(args.store_url)
        metrics = Metrics() if port is not None else None
    except InvalidArgument as exc:
        print(f"idempo-purge: configuration error: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("%s: stopping after the batch under way", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if metrics is not None and port is not None:
        metrics.serve(port, args.metrics_addr)
        log.info("metrics on http://%s:%d/metrics", args.metrics_addr, port)
    log.info("purging %s every %g s, batches of %d", _redact(args.store_url), interval, batch)
    status = 0
    try:
        while not stop.is_set():
            try:
                result = run_once(
                    store, batch=batch, max_batches=max_batches, stop=stop, metrics=metrics
                )
            except Exception as exc:  # noqa: BLE001 - a run fails, the process goes on
                log.error("run failed: %s", exc)
                if metrics is not None:
                    metrics.runs.labels("error").inc()
                if args.once:
                    status = 1
                    break
            else:
                log.info("run ok: %s", _describe(result))
                if metrics is not None:
                    metrics.runs.labels("ok").inc()
                    metrics.last_success.set(time.time())
                if args.once:
                    break
            stop.wait(interval)
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()
    log.info("stopped")
    return status


def _redact(url: str) -> str:
    """The URL without its password."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}" if user else f"{scheme}://{host}"


__all__: List[str] = ["Metrics", "PurgeConfigError", "RunResult", "main", "run_once", "store_from_url"]

if __name__ == "__main__":
    sys.exit(main())
