"""`make bench-e2e`: what idempo adds to a whole request, beside its peers, in one interleaved run.
Figures are printed, never asserted.

    python -m evidence.bench.e2e.run [--quick] [--seconds 3] [--rounds 3] [--only fastapi,express,...]
                                     [--no-services] [--connections 16]

Each variant is one server process (uvicorn, or node) pinned to CPU 0 with `taskset`; `wrk` (one
thread, 16 keep-alive connections) runs pinned to CPU 1. The handler is trivial (it counts its
invocations and answers a small JSON body); every request carries the same ~220-byte JSON body.
Two modes: `fresh` (a new Idempotency-Key per request, from evidence/bench/e2e/load.lua) and
`replay` (one completed key repeated). Rounds are interleaved: each
round starts every variant in turn (a new process per variant and round, so the in-memory stores
start empty), warms it up, runs fresh then replay.

Before any measurement each variant is checked once, in a process of its own with store-primitive
counting on (the Python hooks' ``on_store_op``, Node's ``store_op`` events, spec/METRICS.md): the
same key sent twice must run the handler once (a variant that fails is reported, and still
measured); then a short fresh and a short replay burst count store primitives per request (and,
for PostgreSQL and Redis, round trips on the wire through a counting TCP proxy, see
evidence/bench/e2e/wire.py) and the handler's runs during the replay burst (0 when it deduplicates
under load).

Added time per request = 1/rps(variant) - 1/rps(bare app of the same framework, same mode), in
µs: with one server process on one core, that is the CPU time the variant adds to a request. The
SQLite variants are printed beside the disk's own synchronous commit rate measured in the same
directory (evidence/bench/e2e/disk.py); the PostgreSQL and Redis variants (through the
frameworks: FastAPI with the asyncio stores, Express with the Node stores) beside the store's own
round trip (`SELECT 1` / `PING` measured from the server process, over a connection of the kind
the store uses, to the same server).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from evidence.bench.e2e import disk, wire
from evidence.bench.peers import machine
from evidence.lib.services import Server, Services

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"
DATA = HERE / ".run"
BODY = json.dumps({
    "amount": 12_345, "currency": "EUR", "customer": "cus_8f3a2b1c9d7e6f5a",
    "description": "Order 2026-12-0042, express delivery",
    "metadata": {"order_id": "ord_5c1d9e7f", "channel": "web"},
    "items": [{"sku": "SKU-1042", "qty": 1}, {"sku": "SKU-2077", "qty": 2}],
}, separators=(",", ":"))
PY_PEERS = ("asgi-idempotency-header",)
NODE_PEERS = ("express-idempotency", "@node-idempotency/core")


@dataclass
class Variant:
    framework: str  # FastAPI | Express 5 | Fastify 5
    name: str  # the row's label
    env: str  # E2E_VARIANT
    role: str  # bare | idempo | peer
    store: str = ""  # memory | sqlite | postgres | pgbouncer | redis ("" for bare)
    runs: Dict[str, List[Dict[str, float]]] = field(default_factory=dict)
    dedup: str = ""
    counts: Dict[str, Dict[str, float]] = field(default_factory=dict)
    rtt_us: List[float] = field(default_factory=list)

    @property
    def node(self) -> bool:
        return self.framework != "FastAPI"

    @property
    def key(self) -> str:
        return f"{self.framework}/{self.name}"


def variants(services: bool) -> List[Variant]:
    out = [
        Variant("FastAPI", "bare", "bare", "bare"),
        Variant("FastAPI", "idempo memory", "idempo-memory", "idempo", "memory"),
        # FastAPI's integration as the README recommends it (route class + Depends(idempotency)).
        Variant("FastAPI", "idempo dependency memory", "idempo-dependency-memory", "idempo", "memory"),
        Variant("FastAPI", "idempo SQLite", "idempo-sqlite", "idempo", "sqlite"),
        Variant("FastAPI", "asgi-idempotency-header", "asgi-idempotency-header", "peer", "memory"),
        Variant("Express 5", "bare", "express-bare", "bare"),
        Variant("Express 5", "idempo memory", "express-idempo-memory", "idempo", "memory"),
        Variant("Express 5", "idempo SQLite", "express-idempo-sqlite", "idempo", "sqlite"),
        Variant("Express 5", "express-idempotency", "express-express-idempotency", "peer", "memory"),
        Variant("Express 5", "@node-idempotency/core", "express-node-idempotency", "peer", "memory"),
        Variant("Fastify 5", "bare", "fastify-bare", "bare"),
        Variant("Fastify 5", "idempo memory", "fastify-idempo-memory", "idempo", "memory"),
        Variant("Fastify 5", "idempo SQLite", "fastify-idempo-sqlite", "idempo", "sqlite"),
    ]
    if services:
        for fw, prefix in (("FastAPI", ""), ("Express 5", "express-")):
            at = max(i for i, v in enumerate(out) if v.framework == fw) + 1
            for store, label in (("postgres", "PostgreSQL"), ("pgbouncer", "PgBouncer"), ("redis", "Redis")):
                env = prefix + ("idempo-postgres" if store == "pgbouncer" else f"idempo-{store}")
                out.insert(at, Variant(fw, f"idempo {label}", env, "idempo", store))
                at += 1
    return out


# --- setup -----------------------------------------------------------------------------------------

def ensure_peers() -> None:
    """The peers, in the bench-only (git-ignored) folder .peers/: never in the project's deps."""
    subprocess.run(["bash", str(HERE / "install_peers.sh"), str(PEERS)], check=True,
                   env={**os.environ, "PYTHON": sys.executable})
    sys.path.insert(0, str(PEERS / "python"))
    os.environ["PYTHONPATH"] = f"{PEERS / 'python'}:{os.environ.get('PYTHONPATH', '')}"


def pin(pid: int, cpu: int) -> None:
    """Every thread of the process (threads started later inherit it)."""
    subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, capture_output=True)


@dataclass
class Stores:
    """Where each store variant points, and the counting proxies (for round trips on the wire)."""

    sqlite_dir: Path
    urls: Dict[str, str] = field(default_factory=dict)
    svc: Optional[Services] = None

    def url(self, v: Variant, tag: str) -> str:
        if v.store == "sqlite":
            return str(self.sqlite_dir / f"{v.env}-{tag}.sqlite3")
        return self.urls.get(v.store, "")


def start_services(stores: Stores) -> None:
    svc = Services.start()
    stores.svc = svc
    env = dict(line.split("=", 1) for line in (svc.dir / "env").read_text().splitlines() if "=" in line)
    stores.urls = {"postgres": svc.pg_dsn, "pgbouncer": env.get("IDEMPO_TEST_PGBOUNCER_DSN", ""),
                   "redis": svc.redis_url}
    if not stores.urls["pgbouncer"]:
        del stores.urls["pgbouncer"]
    from idempo import stores as st

    s = st.PostgresStore(svc.pg_dsn)
    s.create_schema()
    s.close()


# --- one server ------------------------------------------------------------------------------------

def start(v: Variant, url: str, count: bool) -> Server:
    env = {"E2E_VARIANT": v.env, "E2E_STORE_URL": url, "E2E_COUNT": "1" if count else "0",
           "NODE_ENV": "development"}
    if v.node:
        server = Server(str(HERE / "node_app.cjs"), env, workers=1, node=True)
    else:
        server = Server("evidence.bench.e2e.py_app:app", env, workers=1)
    server.start()
    assert server.proc is not None
    pin(server.proc.pid, 0)
    return server


def call(port: int, method: str, path: str, key: str = "") -> Tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"content-type": "application/json"}
        if key:
            headers["idempotency-key"] = key
        c.request(method, path, body=BODY if method == "POST" else None, headers=headers)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def counts(port: int) -> Dict[str, Any]:
    return dict(json.loads(call(port, "GET", "/count")[1]))


def settle(port: int) -> Dict[str, Any]:
    """The counts once the requests still in flight when wrk stopped have finished."""
    last = counts(port)
    while True:
        time.sleep(0.2)
        now = counts(port)
        if now == last:
            return now
        last = now


def wrk(port: int, mode: str, seconds: float, connections: int, key: str) -> Dict[str, float]:
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "30s", "--latency",
         "-s", str(HERE / "load.lua"), f"http://127.0.0.1:{port}/pay", "--", mode, key, BODY],
        check=True, capture_output=True, text=True)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{out.stdout}\n{out.stderr}")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = json.loads(line)
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6) if r["duration_us"] else 0.0
    # wrk's own CPU share of its core (taskset execs wrk: the same child). Near 1: the load
    # generator, not the server, sets the pace, and the row understates the server's capacity.
    busy = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    r["wrk_cpu"] = busy / (r["duration_us"] / 1e6) if r["duration_us"] else 0.0
    return dict(r)


# --- the dedup check and the counts ----------------------------------------------------------------

def check(v: Variant, stores: Stores, seconds: float) -> None:
    """The dedup check, then the counts, on one connection (requests one after another, so a
    turn on the wire belongs to one request: a multiplexing client such as ioredis would otherwise
    share one turn between concurrent requests)."""
    url = stores.url(v, "check")
    proxy = wire.CountingProxy.start(url) if v.store in ("postgres", "pgbouncer", "redis") else None
    server = start(v, proxy.url if proxy else url, count=True)
    try:
        port = server.port
        key = f"e2e-check-{uuid.uuid4().hex}"
        c0 = counts(port)["handler"]
        s1, b1 = call(port, "POST", "/pay", key)
        s2, b2 = call(port, "POST", "/pay", key)
        ran = counts(port)["handler"] - c0
        if v.role == "bare":
            v.dedup = f"n/a (ran {ran}x)"
            return
        if ran == 1 and s1 == s2 and 200 <= s1 < 300 and json.loads(b1) == json.loads(b2):
            v.dedup = "ok"
        else:
            v.dedup = f"FAILED: ran {ran}x for one key ({s1}, {s2})"
        # Warm up (connections to the store opened), then count one fresh and one replay burst.
        wrk(port, "fresh", seconds, 1, uuid.uuid4().hex)
        for mode in ("fresh", "replay"):
            rkey = uuid.uuid4().hex if mode == "fresh" else f"e2e-replay-{uuid.uuid4().hex}"
            if mode == "replay":
                call(port, "POST", "/pay", rkey)
            before, trips0 = settle(port), proxy.turns() if proxy else 0
            r = wrk(port, mode, seconds, 1, rkey)
            after, trips1 = settle(port), proxy.turns() if proxy else 0
            ran_n = after["handler"] - before["handler"]
            # Fresh: the handler's runs are the requests that got through (wrk does not count the
            # ones in flight when it stops); replay: wrk's count (the handler should not run).
            n = ran_n if mode == "fresh" else r["requests"]
            ops = {op: after["store_ops"].get(op, 0) - before["store_ops"].get(op, 0) for op in after["store_ops"]}
            v.counts[mode] = {
                "requests": n, "handler": ran_n,
                "primitives": sum(ops.values()) / n if n else 0.0,
                "writes": sum(c for op, c in ops.items() if op != "get") / n if n else 0.0,
                "round_trips": (trips1 - trips0) / n if proxy and n else -1.0,
                "ops": ops,  # type: ignore[dict-item]
            }
    finally:
        server.stop()
        if proxy:
            proxy.stop()


# --- the measured rounds ---------------------------------------------------------------------------

def measure(v: Variant, stores: Stores, rnd: int, seconds: float, warmup: float, connections: int) -> None:
    server = start(v, stores.url(v, f"r{rnd}"), count=False)
    try:
        port = server.port
        if warmup > 0:
            wrk(port, "fresh", warmup, connections, uuid.uuid4().hex)
        v.runs.setdefault("fresh", []).append(wrk(port, "fresh", seconds, connections, uuid.uuid4().hex))
        key = f"e2e-replay-{uuid.uuid4().hex}"
        call(port, "POST", "/pay", key)
        v.runs.setdefault("replay", []).append(wrk(port, "replay", seconds, connections, key))
        if v.store in ("postgres", "pgbouncer", "redis"):
            v.rtt_us.append(float(json.loads(call(port, "GET", "/rtt?n=2000")[1])["us"]))
    finally:
        server.stop()


# --- the table -------------------------------------------------------------------------------------

def med(v: Variant, mode: str, what: str) -> float:
    return statistics.median(r[what] for r in v.runs.get(mode, [])) if v.runs.get(mode) else 0.0


def added_us(v: Variant, bare: Variant, mode: str) -> float:
    a, b = med(v, mode, "rps"), med(bare, mode, "rps")
    return (1 / a - 1 / b) * 1e6 if a and b else float("nan")


def per_request(c: Dict[str, Any]) -> str:
    n = c.get("requests", 0)
    ops: Dict[str, int] = c.get("ops", {})
    return ", ".join(f"{op} {k / n:.2f}" for op, k in sorted(ops.items()) if k) if n else "-"


def table(vs: List[Variant], commit_rate: float) -> None:
    bare = {v.framework: v for v in vs if v.role == "bare"}
    peers = [v for v in vs if v.role == "peer"]
    head = (f"{'framework':<10} {'variant':<24} {'mode':<6} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>8} "
            f"{'x bare':>6} {'added µs':>9}  {'vs peers (req/s ratio)':<56} {'dedup'}")
    print(head)
    print("-" * len(head))
    for mode in ("fresh", "replay"):
        for v in vs:
            if not v.runs.get(mode):
                continue
            b = bare.get(v.framework)
            rps = med(v, mode, "rps")
            ratio = f"{rps / med(b, mode, 'rps'):.2f}" if b and med(b, mode, "rps") else "-"
            add = "" if v.role == "bare" or b is None else f"{added_us(v, b, mode):+.0f}"
            same = [p for p in peers if p.framework == v.framework and p is not v]
            vs_peers = ", ".join(f"{p.name} {rps / med(p, mode, 'rps'):.2f}x" for p in same
                                 if med(p, mode, "rps")) if v.role != "bare" else ""
            non2xx = sum(r.get("non2xx", 0) for r in v.runs[mode])
            errors = sum(r.get("errors", 0) for r in v.runs[mode])
            note = v.dedup + (f"; {non2xx} answers >= 400" if non2xx else "") + (
                f"; {errors} socket errors/timeouts" if errors else "")
            wrk_cpu = med(v, mode, "wrk_cpu")
            if wrk_cpu > 0.85:
                note += f"; wrk at {wrk_cpu:.0%} of its core: load-generator bound"
            print(f"{v.framework:<10} {v.name:<24} {mode:<6} {rps:>8.0f} {med(v, mode, 'p50_us') / 1e3:>7.2f} "
                  f"{med(v, mode, 'p99_us') / 1e3:>8.2f} {ratio:>6} {add:>9}  {vs_peers:<56} {note}")
        print()
    print("req/s, p50, p99: median over the rounds; x bare: req/s / the bare app's (same framework, mode);")
    print("added µs: 1/rps - 1/rps(bare), the CPU time the variant adds per request on its one core.")
    top = max((med(v, m, "wrk_cpu") for v in vs for m in ("fresh", "replay") if v.runs.get(m)), default=0.0)
    print(f"wrk's busiest run used {top:.0%} of its core (a row marked load-generator bound understates the server).")

    sq = [v for v in vs if v.store == "sqlite" and v.runs.get("fresh")]
    if sq:
        print(f"\nSQLite: the disk's own synchronous commit rate in the store's directory ({DATA}): "
              f"{commit_rate:,.0f} commits/s (WAL, synchronous=FULL, one INSERT per transaction, evidence/bench/e2e/disk.py)")
        for v in sq:
            c = v.counts.get("fresh", {})
            w = c.get("writes", 0.0)
            limit = f"{commit_rate / w:,.0f}" if w else "-"
            print(f"  {v.framework:<10} {med(v, 'fresh', 'rps'):>7.0f} fresh req/s, p99 {med(v, 'fresh', 'p99_us') / 1e3:.1f} ms; "
                  f"{w:.2f} write primitives per fresh request ({per_request(c)}), so a disk that synced each one alone "
                  f"would allow at most {limit} fresh req/s; replay: {per_request(v.counts.get('replay', {}))}")
        print("  (every write primitive runs in a BEGIN IMMEDIATE ... COMMIT; from asyncio (Python) and from Node the")
        print("  primitives queued during one event-loop turn share one (group commit), so under load a sync serves")
        print("  several; a replay's claim finds the completed record and writes nothing, so its commit syncs nothing)")

    net = [v for v in vs if v.store in ("postgres", "pgbouncer", "redis") and v.runs.get("fresh")]
    if net:
        print("\nPostgreSQL, PgBouncer (transaction pooling) and Redis through the frameworks "
              "(FastAPI: AsyncPostgresStore / AsyncRedisStore; Express: PostgresStore with a pg.Pool, RedisStore with ioredis):")
        h2 = (f"  {'framework':<10} {'store':<22} {'added fresh':>12} {'added replay':>13} {'own RTT':>8} "
              f"{'trips fresh':>11} {'trips replay':>12} {'primitives fresh/replay':>24}")
        print(h2)
        for v in net:
            b = bare[v.framework]
            cf, cr = v.counts.get("fresh", {}), v.counts.get("replay", {})
            rtt = statistics.median(v.rtt_us) if v.rtt_us else float("nan")
            print(f"  {v.framework:<10} {v.name:<22} {added_us(v, b, 'fresh'):>10.0f}µs {added_us(v, b, 'replay'):>11.0f}µs "
                  f"{rtt:>6.0f}µs {cf.get('round_trips', -1):>11.2f} {cr.get('round_trips', -1):>12.2f} "
                  f"{cf.get('primitives', 0):>11.2f} / {cr.get('primitives', 0):<10.2f}")
        print("  own RTT: SELECT 1 / PING, sequential, from the server process to the same server (PgBouncer: through it);")
        print("  trips: request/response turns on the wire per request, counted by a TCP proxy in the checking run")
        print("  (a pipelined batch is one turn); primitives: store operations the flow asked for (on_store_op / store_op).")

    targets(vs, bare)
    print("\nchecks (one process per variant, before the rounds): the same key twice must run the handler once;")
    for v in vs:
        rc = v.counts.get("replay")
        if rc is not None and v.role != "bare":
            print(f"  {v.key:<36} {v.dedup:<8} handler runs during a {rc['requests']:.0f}-request replay burst: {rc['handler']:.0f}")


def targets(vs: List[Variant], bare: Dict[str, Variant]) -> None:
    """Issue 17's targets beside this run's figures (printed, never asserted)."""
    def fastest_peer(lang: str, mode: str) -> Optional[Tuple[str, float]]:
        ps = [(p.name, added_us(p, bare[p.framework], mode)) for p in vs
              if p.role == "peer" and (p.framework == "FastAPI") == (lang == "py") and p.runs.get(mode)]
        return min(ps, key=lambda x: x[1]) if ps else None

    lines = []
    for v in vs:
        if v.role != "idempo" or v.framework not in bare or not v.runs.get("fresh"):
            continue
        b = bare[v.framework]
        if v.store == "memory":
            cap = 50.0 if v.framework == "FastAPI" else 25.0
            peer = fastest_peer("py" if v.framework == "FastAPI" else "node", "fresh")
            limit = min(cap, peer[1]) if peer else cap
            got = added_us(v, b, "fresh")
            peer_txt = f"fastest peer {peer[0]} {peer[1]:+.0f} µs" if peer else "no peer measured"
            lines.append(f"{v.key}: fresh added {got:+.0f} µs, target <= {limit:.0f} µs ({peer_txt}, cap {cap:.0f})"
                         f" {'met' if got <= limit else 'NOT met'}")
            rep = added_us(v, b, "replay")
            lines.append(f"{v.key}: replay added {rep:+.0f} µs, target <= 0 {'met' if rep <= 0 else 'NOT met'}")
            for mode in ("fresh", "replay"):
                ratio = med(v, mode, "p99_us") / med(b, mode, "p99_us") if med(b, mode, "p99_us") else float("nan")
                lines.append(f"{v.key}: {mode} p99 {ratio:.2f}x the bare app's, target <= 1.5x "
                             f"{'met' if ratio <= 1.5 else 'NOT met'}")
        elif v.store == "sqlite":
            p99 = med(v, "fresh", "p99_us") / 1e3
            lines.append(f"{v.key}: fresh p99 {p99:.1f} ms, target <= 50 ms {'met' if p99 <= 50 else 'NOT met'}")
        else:
            cf, cr = v.counts.get("fresh", {}), v.counts.get("replay", {})
            tf, tr = cf.get("round_trips", -1.0), cr.get("round_trips", -1.0)
            lines.append(f"{v.key}: round trips {tf:.2f} fresh / {tr:.2f} replay, target <= 2 / 1 "
                         f"{'met' if 0 <= tf <= 2.05 and 0 <= tr <= 1.05 else 'NOT met'}")
    if lines:
        print("\nissue 17's targets beside this run (figures, not assertions; a loaded machine moves them):")
        for ln in lines:
            print("  " + ln)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke mode: one round of 1 s per mode, no warm-up, no PostgreSQL/Redis (~1.5 min)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per measured run (fresh, replay; whole seconds, as wrk takes them)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of fresh keys before each measured pair (0: none)")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--only", default="", help="comma-separated frameworks: fastapi, express, fastify")
    ap.add_argument("--no-services", action="store_true", help="skip the PostgreSQL/PgBouncer/Redis variants")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds, args.warmup, args.no_services = 1.0, 1, 0.0, True
    if shutil.which("wrk") is None:
        print("bench-e2e: wrk not found (apt-get install -y wrk; `make bench-e2e` installs it)", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("bench-e2e: needs 2 CPUs (server on CPU 0, wrk on CPU 1)", file=sys.stderr)
        return 2
    ensure_peers()
    DATA.mkdir(exist_ok=True)
    vs = variants(services=not args.no_services)
    if args.only:
        want = {w.strip().lower() for w in args.only.split(",") if w.strip()}
        vs = [v for v in vs if v.framework.split()[0].lower() in want]
    print(f"idempo end-to-end benchmark on {machine()}")
    print(f"one server process on CPU 0, wrk -t1 -c{args.connections} on CPU 1, {args.rounds} interleaved "
          f"round(s) of {args.seconds:g} s per mode after {args.warmup:g} s of warm-up, body {len(BODY)} B\n")
    broken: List[Variant] = []
    with tempfile.TemporaryDirectory(prefix="sqlite.", dir=DATA) as d:
        stores = Stores(Path(d))
        if any(v.store in ("postgres", "pgbouncer", "redis") for v in vs):
            start_services(stores)
            vs = [v for v in vs if v.store not in ("postgres", "pgbouncer", "redis") or v.store in stores.urls]
        try:
            for v in vs:
                try:
                    check(v, stores, 1.0)
                except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                    v.dedup = f"FAILED to run: {str(exc).splitlines()[0][:200]}"
            broken = [v for v in vs if v.dedup.startswith("FAILED to run")]
            for v in broken:
                print(f"bench-e2e: {v.key} left out: {v.dedup}", file=sys.stderr)
            vs = [v for v in vs if v not in broken]
            rates: List[float] = []
            for rnd in range(args.rounds):
                if any(v.store == "sqlite" for v in vs):
                    rates.append(disk.commit_rate(Path(d), seconds=min(args.seconds, 2.0)))
                for v in vs:
                    measure(v, stores, rnd, args.seconds, args.warmup, args.connections)
                print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
            table(vs, statistics.median(rates) if rates else 0.0)
        finally:
            if stores.svc is not None:
                stores.svc.stop()
    failed = [v.key for v in vs if v.dedup.startswith("FAILED")]
    if failed:
        print(f"\nvariants that did not deduplicate: {', '.join(failed)}")
    for v in broken:
        print(f"variant left out (it did not run): {v.key}: {v.dedup}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
