"""`make bench-peers`: one table comparing idempo with its peers on the same bodies, plus end-to-end
server throughput per store. Figures are printed, never asserted.

    python -m evidence.bench.peers [--budget-ms 500] [--seconds 5] [--connections 32] [--no-e2e]

1. Fingerprinting the same body files (evidence/bench/bodies.py) in three languages:
   Rust (idempo-core; serde_jcs + sha2; raw SHA-256 as the limit), Python (idempo; rfc8785 +
   hashlib; json.dumps(sort_keys=True) + hashlib; raw hashlib), Node (idempo; canonicalize +
   crypto; json-canonicalize + crypto; raw crypto). Each cell: time per operation and the ratio to
   idempo's fingerprint in the same language (> 1x: slower than idempo).
2. End to end: the reliability app (evidence/reliability/app.py) under uvicorn, a Python asyncio
   load generator on loopback, bounded runs: new keys (claim + handler + complete), replays of a
   completed key, and the same handler without idempo as the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from evidence.bench.bodies import write as write_bodies
from evidence.lib.http import Client, ConnectionDied
from evidence.lib.services import ROOT, Server, Services

RUST_DIR = ROOT / "evidence" / "bench" / "rust"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} CPUs, {cpu}, {platform.system()} {platform.release()}, "
            f"{time.strftime('%Y-%m-%d')}, load average {load}")


def rust_driver() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", RUST_DIR / "target"))
    subprocess.run(["cargo", "build", "--release", "-q", "--manifest-path", str(RUST_DIR / "Cargo.toml")],
                   check=True, env={**os.environ, "CARGO_TARGET_DIR": str(target)})
    return target / "release" / "idempo-evidence-peers"


def run_lines(cmd: List[str]) -> List[Dict[str, Any]]:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def fmt_ns(ns: Optional[float]) -> str:
    if ns is None:
        return "refused"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fingerprint_table(results: List[Dict[str, Any]], sizes: Dict[str, int]) -> None:
    bodies = sorted(sizes)
    by: Dict[Tuple[str, str], Dict[str, Optional[float]]] = {}
    for r in results:
        by.setdefault((r["lang"], r["impl"]), {})[r["body"]] = r["ns"]
    width = 22
    head = f"{'language':<8} {'implementation':<30}" + "".join(
        f"{b.split('-', 1)[1] + f' ({sizes[b]:,} B)':>{width}}" for b in bodies)
    print(head)
    print("-" * len(head))
    for (lang, impl), cells in by.items():
        base = by.get((lang, "idempo fingerprint"), {})
        row = f"{lang:<8} {impl:<30}"
        for b in bodies:
            ns = cells.get(b)
            ref = base.get(b)
            ratio = f" ({ns / ref:.2f}x)" if ns is not None and ref else ""
            row += f"{fmt_ns(ns) + ratio:>{width}}"
        print(row)
    print("ratio: time / idempo fingerprint in the same language (> 1x: slower than idempo); "
          "'raw sha256' is the floor any fingerprint pays; idempo's fingerprint also rejects numbers "
          "that lose precision (strict mode), the canonicalize rows do not")


# --- end to end ------------------------------------------------------------------------------------

async def load(port: int, route: str, seconds: float, connections: int, key_mode: str) -> Dict[str, Any]:
    c = Client("127.0.0.1", port, timeout=30, max_idle=connections * 2)
    lat: List[float] = []
    statuses: Dict[int, int] = {}
    errors = 0
    body = json.dumps({"amount": 100, "currency": "EUR", "tag": "bench"}).encode()
    fixed = uuid.uuid4().hex
    if key_mode == "replay":
        await c.request("POST", route, headers=[("content-type", "application/json"), ("idempotency-key", fixed)],
                        body=body)
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.monotonic() < deadline:
            headers = [("content-type", "application/json")]
            if key_mode != "none":
                headers.append(("idempotency-key", fixed if key_mode == "replay" else uuid.uuid4().hex))
            try:
                r = await c.request("POST", route, headers=headers, body=body)
            except (ConnectionDied, asyncio.TimeoutError):
                errors += 1
                continue
            lat.append(r.elapsed)
            statuses[r.status] = statuses.get(r.status, 0) + 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(connections)))
    wall = time.monotonic() - t0
    await c.close()
    lat.sort()
    n = len(lat)
    return {
        "rps": n / wall if wall else 0.0,
        "p50": lat[n // 2] * 1000 if n else 0.0,
        "p99": lat[min(n - 1, int(n * 0.99))] * 1000 if n else 0.0,
        "n": n,
        "statuses": statuses,
        "errors": errors,
    }


def e2e(seconds: float, connections: int, stores: List[str]) -> None:
    svc = Services.start() if {"postgres", "redis"} & set(stores) else None
    try:
        with tempfile.TemporaryDirectory(prefix="idempo-bench.") as d:
            print(f"\nend to end: evidence/reliability/app.py under uvicorn, {connections} keep-alive connections, "
                  f"{seconds:.0f} s per run, Python asyncio load generator on the same machine (loopback)")
            head = f"{'store':<9} {'workers':>7} {'run':<26} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}  statuses"
            print(head)
            print("-" * len(head))
            for name in stores:
                url = {"memory": "", "sqlite": f"{d}/store-{name}.sqlite3",
                       "postgres": svc.pg_dsn if svc else "", "redis": svc.redis_url if svc else ""}[name]
                if name == "postgres":
                    from idempo import stores as st

                    s = st.PostgresStore(url)
                    s.create_schema()
                    s.close()
                workers = 1 if name == "memory" else 2
                env = {"EV_STORE": name, "EV_STORE_URL": url, "EV_EFFECTS": f"{d}/effects-{name}.sqlite3",
                       "EV_LEASE_MS": "30000"}
                server = Server("evidence.reliability.app:app", env, workers=workers).start()
                try:
                    runs = [("new key each request", "/pay/ou", "new"), ("replay of one key", "/pay/ou", "replay")]
                    if name in ("memory", "sqlite"):
                        runs.insert(0, ("no idempo (baseline)", "/plain", "none"))
                    for label, route, mode in runs:
                        r = asyncio.run(load(server.port, route, seconds, connections, mode))
                        st_text = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
                        if r["errors"]:
                            st_text += f", errors: {r['errors']}"
                        print(f"{name:<9} {workers:>7} {label:<26} {r['rps']:>9.0f} {r['p50']:>8.1f} {r['p99']:>8.1f}  {st_text}")
                finally:
                    server.stop()
    finally:
        if svc is not None:
            svc.stop()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-ms", type=int, default=500, help="time per measurement (split in 5 rounds)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per end-to-end run")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--stores", default="memory,sqlite,postgres,redis")
    ap.add_argument("--no-e2e", action="store_true")
    args = ap.parse_args(argv)
    print(f"idempo peer benchmark on {machine()}")
    with tempfile.TemporaryDirectory(prefix="idempo-bodies.") as d:
        sizes = write_bodies(Path(d))
        results = run_lines([str(rust_driver()), d, str(args.budget_ms)])
        results += run_lines([sys.executable, str(ROOT / "evidence" / "bench" / "py_driver.py"), d, str(args.budget_ms)])
        results += run_lines(["node", str(ROOT / "evidence" / "bench" / "node_driver.mjs"), d, str(args.budget_ms)])
    print("\nfingerprint of the same bodies (best of 5 interleaved rounds)")
    fingerprint_table(results, sizes)
    if not args.no_e2e:
        e2e(args.seconds, args.connections, [s for s in args.stores.split(",") if s])
    return 0


if __name__ == "__main__":
    sys.exit(main())
