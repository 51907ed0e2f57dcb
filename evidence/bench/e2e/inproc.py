"""What a Python variant of `make bench-e2e` adds to one request, counted instead of timed: for a
shared or loaded machine, where req/s moves with the neighbours' work but counts do not.

    python -m evidence.bench.e2e.inproc [--variants idempo-memory,idempo-dependency-memory]
                                        [--requests 1000] [--instructions]

Each variant is the bench's own FastAPI app (evidence/bench/e2e/py_app.py, ``E2E_VARIANT``) in a
process of its own, driven in-process (no server, no socket) with the bench's body: ``fresh`` (a
new key per request) and ``replay`` (one completed key). Printed per variant and mode, beside the
bare app's: the Python bytecodes executed per request (``sys.settrace`` opcode events, after a
warm-up) and the functions that add the most; with ``--instructions``, the CPU instructions per
request under valgrind (``cachegrind``, the difference between a run of N and of 5N requests,
divided by 4N: start-up cancels out), which include the native code and the garbage collector
but not the system calls. Neither is a time; both only go down when the work per request does.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[3]
BODY = json.dumps({
    "amount": 12_345, "currency": "EUR", "customer": "cus_8f3a2b1c9d7e6f5a",
    "description": "Order 2026-12-0042, express delivery",
    "metadata": {"order_id": "ord_5c1d9e7f", "channel": "web"},
    "items": [{"sku": "SKU-1042", "qty": 1}, {"sku": "SKU-2077", "qty": 2}],
}, separators=(",", ":")).encode()  # as run.py's BODY
WARMUP = 200


async def _request(app: Any, key: bytes) -> int:
    """One POST /pay as uvicorn hands it over (wrk's headers); returns the status."""
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
               (b"content-length", str(len(BODY)).encode()), (b"idempotency-key", key)]
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
             "scheme": "http", "method": "POST", "root_path": "", "path": "/pay",
             "raw_path": b"/pay", "query_string": b"", "headers": headers, "state": {}}
    given = False
    status = [0]

    async def receive() -> Dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: Dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]

    await app(scope, receive, send)
    return status[0]


def child(mode: str, n: int, trace: bool) -> None:
    """Runs in the variant's process: warm-up, then ``n`` requests (traced when ``trace``)."""
    from evidence.bench.e2e import py_app

    counts: "collections.Counter[str]" = collections.Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_name}"] += 1
        return tracer

    async def run() -> None:
        replay_key = f"inproc-{uuid.uuid4().hex}".encode()
        keys = [replay_key if mode == "replay" else uuid.uuid4().hex.encode()
                for _ in range(WARMUP + n)]
        statuses = collections.Counter([await _request(py_app.app, k) for k in keys[:WARMUP]])
        if trace:
            sys.settrace(tracer)
        for k in keys[WARMUP:]:
            statuses[await _request(py_app.app, k)] += 1
        sys.settrace(None)
        if set(statuses) - {200, 201}:
            raise SystemExit(f"unexpected answers: {dict(statuses)}")

    asyncio.run(run())
    if trace:
        print(json.dumps({k: v / n for k, v in counts.items()}))


def _spawn(variant: str, mode: str, n: int, trace: bool, valgrind: bool = False) -> str:
    cmd = [sys.executable, "-m", "evidence.bench.e2e.inproc", "--child", mode, str(n)]
    if trace:
        cmd.append("--trace")
    if valgrind:
        cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               *cmd]
    env = {**os.environ, "E2E_VARIANT": variant, "E2E_COUNT": "0",
           "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{variant} {mode}: {out.stderr[-2000:]}")
    return out.stdout + out.stderr


def opcodes(variant: str, mode: str, n: int) -> Dict[str, float]:
    return {k: float(v) for k, v in json.loads(_spawn(variant, mode, n, True).splitlines()[-1]).items()}


def instructions(variant: str, mode: str, n: int) -> float:
    def total(k: int) -> int:
        found = re.search(r"I\s+refs:\s+([\d,]+)", _spawn(variant, mode, k, False, valgrind=True))
        if found is None:
            raise SystemExit("valgrind printed no instruction count")
        return int(found.group(1).replace(",", ""))

    return (total(5 * n) - total(n)) / (4 * n)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="idempo-memory,idempo-dependency-memory")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--instructions", action="store_true", help="also count CPU instructions (valgrind)")
    ap.add_argument("--top", type=int, default=12, help="functions listed per variant and mode")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.trace)
        return 0
    if args.instructions and shutil.which("valgrind") is None:
        print("inproc: valgrind not found (apt-get install -y valgrind)", file=sys.stderr)
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for mode in ("fresh", "replay"):
        bare = opcodes("bare", mode, args.requests)
        bare_total = sum(bare.values())
        bare_instr = instructions("bare", mode, args.requests // 5 or 1) if args.instructions else 0.0
        line = f"{mode:<6} {'bare':<26} {bare_total:>7.0f} bytecodes/request"
        print(line + (f" {bare_instr:>10,.0f} instructions/request" if args.instructions else ""))
        for variant in variants:
            ops = opcodes(variant, mode, args.requests)
            total = sum(ops.values())
            line = f"{mode:<6} {variant:<26} {total:>7.0f} bytecodes/request ({total - bare_total:+.0f})"
            if args.instructions:
                instr = instructions(variant, mode, args.requests // 5 or 1)
                line += f" {instr:>10,.0f} instructions/request ({instr - bare_instr:+,.0f})"
            print(line)
            added: List[Tuple[float, str]] = sorted(
                ((ops.get(k, 0.0) - bare.get(k, 0.0), k) for k in set(ops) | set(bare)), reverse=True)
            for d, k in added[: args.top]:
                print(f"         {d:+7.0f}  {k}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
