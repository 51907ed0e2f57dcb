"""What idempo-gateway does per request, counted instead of timed: for a shared or loaded machine,
where `make bench-gateway`'s req/s and p50 move with the neighbours' work but counts do not.

    python -m evidence.bench.gateway.count [--requests 2000] [--rows plain,memory,sqlite] [--top 25]

Each row is the release gateway binary under valgrind (``callgrind``, one runtime worker thread:
``TOKIO_WORKER_THREADS=1``) in front of bindings/gateway/examples/bench_upstream.rs, configured as
`make bench-gateway` configures it (``plain``: the protocol off, the pass-through; ``memory`` and
``sqlite``: the protected ``POST /pay``). One keep-alive client sends the bench's body with a fresh
Idempotency-Key per request: a warm-up of a quarter of ``--requests``, then the counters are
zeroed, then ``--requests`` requests, then the counters are dumped. Printed per row: the gateway's
user-space CPU instructions per request (system calls and the kernel's TCP work are not counted),
the same without SHA-256's compression function, and the functions with the most instructions per
request (inclusive) on the protected rows.

SHA-256 runs in software under valgrind (it hides the CPU's SHA extensions from the program, so
the ``sha2`` crate takes its portable path), which overstates its share several times over: read
the "without SHA-256" column as the protocol's own work. Nothing is asserted; the counts only go
down when the work per request does.
"""

from __future__ import annotations

import argparse
import http.client
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, List, Tuple

from evidence.bench.e2e import run as e2e
from evidence.bench.gateway.run import DATA, gateway_config, store_toml
from evidence.lib.gateway import BenchUpstream, Proc, binary
from evidence.lib.services import free_port

SHA_FN = "sha2::sha256::compress256"


def drive(port: int, n: int, prefix: str) -> int:
    """``n`` POST /pay on one keep-alive connection, each with a fresh key; returns how many got a 2xx."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    ok = 0
    try:
        for i in range(n):
            conn.request("POST", "/pay", body=e2e.BODY, headers={
                "content-type": "application/json", "idempotency-key": f"{prefix}-{i}"})
            resp = conn.getresponse()
            resp.read()
            ok += 200 <= resp.status < 300
    finally:
        conn.close()
    return ok


def inclusive(out: Path) -> Tuple[int, Dict[str, int]]:
    """Program total and each function's inclusive count from a callgrind dump."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
                          check=True, capture_output=True, text=True).stdout
    total = 0
    fns: Dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if not m:
            continue
        count = int(m.group(1).replace(",", ""))
        name = m.group(2)
        if name.startswith("PROGRAM TOTALS"):
            total = count
            continue
        name = re.sub(r"\s+\[[^\]]*\]\s*$", "", name)
        name = name.split(":", 1)[1] if name.startswith(("???:", "./")) or ":" in name.split(" ")[0] else name
        fns[name] = max(fns.get(name, 0), count)
    return total, fns


def count_row(row: str, requests: int, work: Path) -> Tuple[float, float, List[Tuple[str, float]]]:
    up = BenchUpstream().start()
    port = free_port()
    cfg = gateway_config(up.port, store_toml(row if row != "plain" else "memory", work / f"cg-{row}.sqlite3", ""),
                         protect=row != "plain").replace("{listen}", f"127.0.0.1:{port}")
    cfg_path = work / f"cg-{row}.toml"
    cfg_path.write_text(cfg)
    out = work / f"callgrind-{row}.out"
    gw = Proc(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(binary()),
               "serve", "--config", str(cfg_path)], port, "/healthz", {"TOKIO_WORKER_THREADS": "1"})
    try:
        gw.start(timeout=120)
        prefix = uuid.uuid4().hex[:12]
        drive(port, max(requests // 4, 50), f"warm-{prefix}")
        subprocess.run(["callgrind_control", "-z", str(gw.pid)], check=True, capture_output=True)
        ok = drive(port, requests, f"count-{prefix}")
        subprocess.run(["callgrind_control", "-d", str(gw.pid)], check=True, capture_output=True)
        if ok != requests:
            raise RuntimeError(f"{row}: {requests - ok} of {requests} requests were not answered 2xx")
    finally:
        gw.close()
        up.close()
    dumps = sorted(work.glob(f"callgrind-{row}.out.*"), key=lambda p: p.stat().st_mtime)
    if not dumps:
        raise RuntimeError(f"{row}: callgrind wrote no dump")
    total, fns = inclusive(dumps[0])
    sha = fns.get(SHA_FN, 0)
    top = sorted(((f, c / requests) for f, c in fns.items() if "idempo" in f or "malloc" in f),
                 key=lambda t: -t[1])
    return total / requests, (total - sha) / requests, top


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rows", default="plain,memory,sqlite", help="comma-separated: plain, memory, sqlite")
    ap.add_argument("--top", type=int, default=25, help="functions listed per protected row")
    args = ap.parse_args(argv)
    for tool in ("valgrind", "callgrind_annotate", "callgrind_control"):
        if shutil.which(tool) is None:
            print(f"bench-gateway-count: {tool} not found (apt-get install -y valgrind)", file=sys.stderr)
            return 2
    try:
        binary(), binary("bench_upstream", example=True)
    except RuntimeError as exc:
        print(f"bench-gateway-count: {exc}", file=sys.stderr)
        return 2
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if any(r not in ("plain", "memory", "sqlite") for r in rows) or args.requests < 1:
        ap.error("--rows takes plain, memory, sqlite; --requests at least 1")
    print(f"idempo-gateway per-request instruction counts: {binary()}, callgrind, one runtime worker thread,")
    print(f"{args.requests} POST /pay with a fresh Idempotency-Key after {max(args.requests // 4, 50)} of warm-up, "
          f"body {len(e2e.BODY)} B, one keep-alive connection\n")
    DATA.mkdir(exist_ok=True)
    t0 = time.monotonic()
    results: Dict[str, Tuple[float, float, List[Tuple[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="count.", dir=DATA) as d:
        for row in rows:
            results[row] = count_row(row, args.requests, Path(d))
            print(f"  {row}: done ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    base = results.get("plain")
    print(f"{'row':<16} {'instructions/req':>17} {'without SHA-256':>16} {'over plain':>11}")
    for row, (tot, nosha, _) in results.items():
        over = f"{nosha - base[1]:+,.0f}" if base and row != "plain" else ""
        name = {"plain": "plain proxy", "memory": "gateway memory", "sqlite": "gateway SQLite"}[row]
        print(f"{name:<16} {tot:>17,.0f} {nosha:>16,.0f} {over:>11}")
    for row, (_, _, top) in results.items():
        if row == "plain" or args.top <= 0:
            continue
        print(f"\n{row}: the gateway's and the allocator's functions, inclusive instructions per request")
        for f, c in top[:args.top]:
            print(f"  {c:>10,.0f}  {f[:120]}")
    print(f"\nwhole run {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
