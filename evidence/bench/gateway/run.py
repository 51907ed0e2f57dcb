"""`make bench-gateway`: idempo-gateway's cost per request, in one interleaved run, beside a
plain reverse proxy, the upstream alone and the Python ASGI integration. Printed, never asserted.

    python -m evidence.bench.gateway.run [--seconds 3] [--rounds 3] [--warmup 1] [--connections 16]
                                         [--no-services] [--upstream-cpu 0] [--upstream-work-ms 0]

Every request is ``POST /pay`` with a fresh Idempotency-Key and the ~220-byte JSON body of
`make bench-e2e` (its wrk script, evidence/bench/e2e/load.lua, and its wrk runner: `wrk -t1`, 16
keep-alive connections, pinned to CPU 1). Rows:

- ``upstream direct``: wrk straight to the upstream, bindings/gateway/examples/bench_upstream.rs
  (a one-thread hyper server that counts its executions and answers 201 with a small JSON body);
- ``plain proxy``: the gateway binary with the protocol off for /pay (its one route is on another
  path; ``fallback_upstream`` forwards everything else unchanged, forward.rs' pass-through): the
  same HTTP server, client and connection pool, no key, no store;
- ``gateway memory | SQLite | PostgreSQL``: the protected route ``POST /pay`` (public, core's
  defaults) on each store; PostgreSQL when ``IDEMPO_BENCH_POSTGRES_URL`` is set, else a throwaway
  server from scripts/test-services.sh (``--no-services``: neither);
- ``Python ASGI memory | SQLite | PostgreSQL``: FastAPI behind idempo's ASGI middleware on the
  same store (evidence/bench/e2e/py_app.py, ``E2E_VARIANT=idempo-<store>``: MemoryStore,
  SQLiteStore, AsyncPostgresStore), one uvicorn process: the in-process integration the gateway's
  5x target is stated against, store for store.

The server side is pinned to CPU 0 (the gateway process, all its threads, and the upstream it
forwards to: the service as a whole on one core, as the ASGI app with its handler is); wrk alone
on CPU 1. Each round starts every row's processes afresh (empty memory store, new SQLite file),
warms up, then measures; rounds are interleaved and the table shows the median. Before the
rounds each gateway row is checked once: the same key twice runs the upstream once and the second
answer is the replay.

``--upstream-work-ms N`` makes the upstream wait N ms (a thread sleep, no CPU) before each answer, as a
service that calls its database or a payment provider does: the default 0 keeps the trivial
upstream, the worst case for the p50 target (the protocol's fixed CPU cost against a service that
costs ~7 µs); with it the p50 rows read the gateway beside a service with work of its own. The
Python ASGI rows keep their trivial handler (the 5x target compares the two integrations' own
cost), so with N > 0 run them apart: ``--only 'upstream direct,plain proxy,gateway memory,gateway SQLite'``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from evidence.bench.e2e import disk
from evidence.bench.e2e import run as e2e
from evidence.bench.peers import machine
from evidence.lib.gateway import BenchUpstream, Gateway, Proc, binary
from evidence.lib.services import Server, Services

HERE = Path(__file__).resolve().parent
DATA = HERE / ".run"
P50_TARGET = 1.10
"""Gateway (memory or SQLite) p50 at most 10% over the plain proxy's (issue #21)."""
RPS_TARGET = 5.0
"""Gateway requests/s at least 5x the Python ASGI integration's on the same store (issue #21)."""


@dataclass
class Row:
    name: str
    kind: str  # direct | plain | gateway | asgi
    store: str = ""  # memory | sqlite | postgres
    runs: List[Dict[str, float]] = field(default_factory=list)
    check: str = ""

    def med(self, what: str) -> float:
        return statistics.median(r[what] for r in self.runs) if self.runs else 0.0


def gateway_config(upstream_port: int, store: str, protect: bool) -> str:
    """The gateway's TOML: ``POST /pay`` protected (public: no principal), or, for the plain
    proxy, a route on a path the benchmark never calls and every other request forwarded."""
    return "\n".join([
        'listen = "{listen}"',
        'fallback_upstream = "app"' if not protect else "",
        "",
        "[store]",
        store,
        "",
        "[upstreams]",
        f'app = "http://127.0.0.1:{upstream_port}"',
        "",
        "[[routes]]",
        'method = "POST"',
        f'path = "{"/pay" if protect else "/not-benchmarked"}"',
        'upstream = "app"',
        "public = true",
        "",
    ])


def store_toml(store: str, sqlite_path: Path, pg_dsn: str) -> str:
    if store == "memory":
        # Room for every fresh key of a round (the default holds 100,000 records).
        return 'kind = "memory"\nmax_entries = 4000000\nmax_bytes = 2147483648'
    if store == "sqlite":
        return f'kind = "sqlite"\npath = "{sqlite_path}"'
    if store == "postgres":
        return f'kind = "postgres"\ndsn = "{pg_dsn}"\npool_size = 16'
    return 'kind = "memory"'


@dataclass
class Running:
    """The processes of one row: the port wrk targets, and what to stop."""

    port: int
    upstream: Optional[BenchUpstream]
    procs: List[Callable[[], None]]

    def stop(self) -> None:
        for stop in reversed(self.procs):
            stop()


def start_row(row: Row, work: Path, tag: str, pg_dsn: str, upstream_cpu: int, work_ms: float = 0.0) -> Running:
    if row.kind == "asgi":
        url = {"sqlite": str(work / f"asgi-{tag}.sqlite3"), "postgres": pg_dsn}.get(row.store, "")
        server = Server("evidence.bench.e2e.py_app:app",
                        {"E2E_VARIANT": f"idempo-{row.store}", "E2E_STORE_URL": url, "E2E_COUNT": "0"}, workers=1)
        server.start()
        assert server.proc is not None
        e2e.pin(server.proc.pid, 0)
        return Running(server.port, None, [server.stop])
    up = BenchUpstream(work_ms=work_ms).start()
    e2e.pin(up.pid, upstream_cpu)
    if row.kind == "direct":
        return Running(up.port, up, [up.close])
    gw: Proc = Gateway(gateway_config(up.port, store_toml(row.store, work / f"gw-{tag}.sqlite3", pg_dsn),
                                      protect=row.kind == "gateway"), work).start()
    e2e.pin(gw.pid, 0)
    return Running(gw.port, up, [up.close, gw.close])


def upstream_count(up: BenchUpstream) -> int:
    return int(json.loads(e2e.call(up.port, "GET", "/count")[1])["handler"])


def check(row: Row, work: Path, pg_dsn: str, upstream_cpu: int, work_ms: float = 0.0) -> None:
    """The same key twice: one upstream execution, the second answer the stored one, replayed."""
    run = start_row(row, work, "check", pg_dsn, upstream_cpu, work_ms)
    try:
        if row.kind != "gateway":
            row.check = "n/a"
            return
        assert run.upstream is not None
        key = f"gw-check-{uuid.uuid4().hex}"
        s1, b1 = e2e.call(run.port, "POST", "/pay", key)
        s2, b2 = e2e.call(run.port, "POST", "/pay", key)
        ran = upstream_count(run.upstream)
        row.check = "ok" if ran == 1 and s1 == s2 == 201 and b1 == b2 else f"FAILED: ran {ran}x ({s1}, {s2})"
    finally:
        run.stop()


def measure(row: Row, work: Path, rnd: int, args: argparse.Namespace, pg_dsn: str) -> None:
    run = start_row(row, work, f"r{rnd}", pg_dsn, args.upstream_cpu, args.upstream_work_ms)
    try:
        if args.warmup > 0:
            e2e.wrk(run.port, "fresh", args.warmup, args.connections, uuid.uuid4().hex)
        r = e2e.wrk(run.port, "fresh", args.seconds, args.connections, uuid.uuid4().hex)
        if run.upstream is not None:
            time.sleep(0.2)
            r["upstream_runs"] = float(upstream_count(run.upstream))
        row.runs.append(r)
    finally:
        run.stop()


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def table(rows: List[Row], commit_rate: float, work_ms: float = 0.0) -> None:
    by = {r.name: r for r in rows}
    plain = by.get("plain proxy")
    direct = by.get("upstream direct")
    head = (f"{'row':<22} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'p50 vs plain':>12} "
            f"{'added µs/req':>12}  {'check':<6} notes")
    print(head)
    print("-" * len(head))
    for r in rows:
        rps, p50, p99 = r.med("rps"), r.med("p50_us"), r.med("p99_us")
        vs = f"{p50 / plain.med('p50_us'):.2f}x" if plain and plain.med("p50_us") and r is not plain else ""
        base = plain if r.kind == "gateway" else direct if r.kind == "plain" else None
        # With an upstream that waits, the server's core is not saturated: 1/rps is latency, not CPU.
        added = (f"{(1 / rps - 1 / base.med('rps')) * 1e6:+.1f}" if base and rps and base.med("rps") and not work_ms
                 else "")
        notes = []
        non2xx = sum(int(x.get("non2xx", 0)) for x in r.runs)
        errors = sum(int(x.get("errors", 0)) for x in r.runs)
        if non2xx:
            notes.append(f"{non2xx} answers >= 400")
        if errors:
            notes.append(f"{errors} socket errors/timeouts")
        if r.med("wrk_cpu") > 0.85:
            notes.append(f"wrk at {r.med('wrk_cpu'):.0%} of its core: load-generator bound")
        print(f"{r.name:<22} {rps:>8.0f} {p50 / 1e3:>7.3f} {p99 / 1e3:>7.2f} {vs:>12} {added:>12}  {r.check:<6} "
              f"{'; '.join(notes)}")
    print("req/s, p50, p99: median over the rounds (wrk's own percentiles, fresh key per request);")
    print("added µs/req: 1/rps - 1/rps of the row below it in the stack (gateway rows: the plain proxy; the plain")
    print("proxy: the upstream alone): CPU time added per request on the server's one core"
          + (" (left out: an upstream that waits leaves the core idle, so it would be latency, not CPU)." if work_ms else "."))
    if commit_rate and "gateway SQLite" in by:
        print(f"SQLite: the disk's own synchronous commit rate in {DATA}: {commit_rate:,.0f} commits/s "
              "(WAL, synchronous=FULL; evidence/bench/e2e/disk.py); a fresh request is two write transactions "
              "(claim, complete).")

    print("\nissue 21's targets beside this run (figures, not assertions; a loaded machine moves them):")
    if plain and plain.med("p50_us"):
        for name in ("gateway memory", "gateway SQLite"):
            g = by.get(name)
            if g and g.runs:
                ratio = g.med("p50_us") / plain.med("p50_us")
                print(f"  {name}: p50 {g.med('p50_us') / 1e3:.3f} ms = {ratio:.2f}x the plain proxy's "
                      f"{plain.med('p50_us') / 1e3:.3f} ms (+{(ratio - 1) * 100:.0f}%), target <= +10%: "
                      f"{verdict(ratio <= P50_TARGET)}")
    for g in rows:
        asgi = next((a for a in rows if a.kind == "asgi" and a.store == g.store), None)
        if g.kind != "gateway" or asgi is None or not asgi.med("rps") or not g.runs:
            continue
        ratio = g.med("rps") / asgi.med("rps")
        print(f"  {g.name}: {g.med('rps'):,.0f} req/s = {ratio:.1f}x the Python ASGI integration's "
              f"{asgi.med('rps'):,.0f} on the same store, target >= 5x: {verdict(ratio >= RPS_TARGET)}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_GATEWAY_DURATION") or 3),
                    help="seconds per measured run (whole seconds, as wrk takes them; env BENCH_GATEWAY_DURATION)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of fresh keys before each measured run")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--no-services", action="store_true", help="skip the PostgreSQL row")
    ap.add_argument("--upstream-cpu", type=int, default=0, help="the CPU the upstream runs on (default 0, beside the gateway)")
    ap.add_argument("--upstream-work-ms", type=float, default=0.0,
                    help="the upstream waits this long (ms, a thread sleep) before each answer (default 0: trivial)")
    ap.add_argument("--only", default="", help="comma-separated row names to run (e.g. 'plain proxy,gateway memory')")
    args = ap.parse_args(argv)
    if not args.upstream_work_ms >= 0:
        ap.error("--upstream-work-ms must be 0 or more")
    if shutil.which("wrk") is None:
        print("bench-gateway: wrk not found (apt-get install -y wrk; `make bench-gateway` installs it)", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("bench-gateway: needs 2 CPUs (server side on CPU 0, wrk on CPU 1)", file=sys.stderr)
        return 2
    try:
        gw_bin, up_bin = binary(), binary("bench_upstream", example=True)
    except RuntimeError as exc:
        print(f"bench-gateway: {exc}", file=sys.stderr)
        return 2
    rows = [Row("upstream direct", "direct"), Row("plain proxy", "plain"),
            Row("gateway memory", "gateway", "memory"), Row("gateway SQLite", "gateway", "sqlite")]
    pg_dsn = os.environ.get("IDEMPO_BENCH_POSTGRES_URL", "")
    svc: Optional[Services] = None
    if not args.no_services:
        if not pg_dsn:
            try:
                svc = Services.start()
                pg_dsn = svc.pg_dsn
            except (RuntimeError, OSError, KeyError) as exc:
                print(f"bench-gateway: no PostgreSQL row ({str(exc).splitlines()[0][:200]})", file=sys.stderr)
        if pg_dsn:
            rows.append(Row("gateway PostgreSQL", "gateway", "postgres"))
    rows += [Row("Python ASGI memory", "asgi", "memory"), Row("Python ASGI SQLite", "asgi", "sqlite")]
    if pg_dsn:
        from idempo import stores

        pg = stores.PostgresStore(pg_dsn)  # the table, for the Python row (the gateway creates its own)
        pg.create_schema()
        pg.close()
        rows.append(Row("Python ASGI PostgreSQL", "asgi", "postgres"))
    if args.only:
        want = {w.strip() for w in args.only.split(",") if w.strip()}
        rows = [r for r in rows if r.name in want]
    print(f"idempo-gateway benchmark on {machine()}")
    print(f"gateway {gw_bin}, upstream {up_bin}")
    print(f"server side on CPU 0 (upstream on CPU {args.upstream_cpu}), wrk -t1 -c{args.connections} on CPU 1; "
          f"{args.rounds} interleaved round(s) of {args.seconds:g} s after {args.warmup:g} s of warm-up; "
          f"POST /pay, fresh Idempotency-Key per request, body {len(e2e.BODY)} B")
    print(f"upstream work per request: {args.upstream_work_ms:g} ms (a thread sleep, no CPU)"
          + ("; the Python ASGI rows' handler does none" if args.upstream_work_ms else " (the trivial upstream)") + "\n")
    t0 = time.monotonic()
    DATA.mkdir(exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="gw.", dir=DATA) as d:
            work = Path(d)
            for r in rows:
                try:
                    check(r, work, pg_dsn, args.upstream_cpu, args.upstream_work_ms)
                except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                    r.check = "FAILED"
                    print(f"bench-gateway: {r.name} left out: {str(exc).splitlines()[0][:300]}", file=sys.stderr)
            rows = [r for r in rows if r.check != "FAILED"]
            rates: List[float] = []
            for rnd in range(args.rounds):
                rates.append(disk.commit_rate(work, seconds=1.0))
                for r in rows:
                    measure(r, work, rnd, args, pg_dsn)
                print(f"round {rnd + 1}/{args.rounds} done ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
            table(rows, statistics.median(rates) if rates else 0.0, args.upstream_work_ms)
    finally:
        if svc is not None:
            svc.stop()
    print(f"\nwhole run {time.monotonic() - t0:.0f} s")
    return 1 if any(r.check.startswith("FAILED") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
