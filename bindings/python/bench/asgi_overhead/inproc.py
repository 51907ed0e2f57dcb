"""In-process cost per request (no server, no network): each variant's ASGI app called directly
with a fresh key per request, interleaved over rounds; ``--profile VARIANT`` prints cProfile's top.

    python inproc.py --rounds 5 --n 2000 dep mw
"""

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from app import build  # noqa: E402

BODY = (b'{"amount":1250,"currency":"EUR","customer":"cus_0123456789abcdef","description":"Order'
        b' 4711: two tickets, one voucher, express delivery","metadata":{"channel":"web",'
        b'"campaign":"winter-2026","ref":"a1b2c3d4e5f6"}}')


def scope(key: bytes) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/payments", "raw_path": b"/payments", "query_string": b"",
        "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
        "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"wrk"),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(BODY)).encode()), (b"idempotency-key", key)],
        "state": {},
    }


async def one(app, key: bytes) -> int:
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.sleep(3600)

    status = 0

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope(key), receive, send)
    return status


async def batch(app, n: int, prefix: str, replay: bool) -> float:
    start = time.process_time()
    for i in range(n):
        key = b"replay-key-000001" if replay else f"{prefix}-{i:08d}-key".encode()
        status = await one(app, key)
        assert status == 201, status
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=["dep", "mw"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--replay", action="store_true")
    ap.add_argument("--profile")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    variants = ["bare", *args.variants]
    apps = {v: build(v, os.path.join(tmp, f"{v}.db")) for v in variants}
    loop = asyncio.new_event_loop()
    if args.profile:
        app = apps[args.profile]
        loop.run_until_complete(batch(app, 200, "warm", args.replay))
        prof = cProfile.Profile()
        prof.enable()
        loop.run_until_complete(batch(app, args.n, "prof", args.replay))
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(35)
        return
    times = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            times[v].append(loop.run_until_complete(batch(apps[v], args.n, f"r{r}", args.replay)))
    bare = statistics.median(times["bare"])
    for v in variants:
        t = statistics.median(times[v])
        print(f"{v:12} {t:8.1f} us/req  added {t - bare:7.1f} us")


if __name__ == "__main__":
    main()
