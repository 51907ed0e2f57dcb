"""Streamed responses through the ASGI integrations: the server's peak memory for a 100 MiB
streamed response, and the time to first byte of a slow stream.

Each integration runs in its own uvicorn process (``none``: FastAPI without idempo, the baseline;
``middleware``: ``IdempotencyMiddleware``; ``dependency``: ``idempo.fastapi``), with the memory
store and the default record limit (``max_stored_body_bytes``, 1 MiB). The client streams the
response and discards it. Peak memory is the server process's ``VmHWM`` after the request minus
its ``VmRSS`` before it (Linux ``/proc``). The slow stream yields a first chunk, sleeps 2 s,
yields the last one; its time to first byte should be the first chunk's, not the last's.
Prints figures; asserts nothing. Run once: ``python bindings/python/bench/bench_stream.py``.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from typing import Any, AsyncIterator, Dict

SIZE = 100 * 1024 * 1024
CHUNK = 64 * 1024
SLOW_S = 2.0


def build(mode: str) -> Any:
    from fastapi import Depends, FastAPI
    from fastapi.responses import StreamingResponse

    from idempo.asgi import IdempotencyMiddleware
    from idempo.fastapi import Idempotency
    from idempo.stores import AsyncMemoryStore

    app = FastAPI()
    deps: Any = []
    if mode == "dependency":
        idempotency = Idempotency(store=AsyncMemoryStore(), public=True)
        app.router.route_class = idempotency.route_class
        deps = [Depends(idempotency)]
    elif mode == "middleware":
        app.add_middleware(IdempotencyMiddleware, store=AsyncMemoryStore(), public=True)

    block = b"x" * CHUNK

    @app.post("/big", dependencies=deps)
    async def big() -> StreamingResponse:
        async def parts() -> AsyncIterator[bytes]:
            for _ in range(SIZE // CHUNK):
                yield block

        return StreamingResponse(parts(), media_type="application/octet-stream")

    @app.post("/slow", dependencies=deps)
    async def slow() -> StreamingResponse:
        async def parts() -> AsyncIterator[bytes]:
            yield b"first\n"
            await asyncio.sleep(SLOW_S)
            yield b"last\n"

        return StreamingResponse(parts(), media_type="text/plain")

    return app


def serve(mode: str, port: int) -> None:
    import uvicorn

    uvicorn.run(build(mode), host="127.0.0.1", port=port, log_level="error", lifespan="off")


def _kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(mode: str) -> Dict[str, float]:
    import httpx

    port = _free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", mode, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=60) as c:
            # Warm up (imports, first request paths) with a small slow-stream request.
            c.post("/slow", headers={"Idempotency-Key": "warmup-000001"}).read()
            before = _kib(proc.pid, "VmRSS")
            received = 0
            started = time.monotonic()
            with c.stream("POST", "/big", headers={"Idempotency-Key": "big-stream-0001"}) as r:
                for chunk in r.iter_raw():
                    received += len(chunk)
            big_s = time.monotonic() - started
            peak = _kib(proc.pid, "VmHWM")
            assert received == SIZE, received
            started = time.monotonic()
            with c.stream("POST", "/slow", headers={"Idempotency-Key": "slow-stream-001"}) as r:
                parts = r.iter_raw()
                first = next(parts)
                ttfb = time.monotonic() - started
                rest = b"".join(parts)
                total = time.monotonic() - started
            assert first.startswith(b"first") and rest.endswith(b"last\n"), (first, rest)
        return {"rss_before_mib": before / 1024, "peak_mib": peak / 1024,
                "peak_delta_mib": (peak - before) / 1024, "big_s": big_s,
                "ttfb_s": ttfb, "slow_total_s": total}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    print(f"100 MiB streamed in {CHUNK // 1024} KiB chunks; record limit 1 MiB (default);"
          f" slow stream: first chunk, {SLOW_S:g} s, last chunk")
    print(f"{'integration':<12} {'RSS before':>11} {'peak':>9} {'peak - before':>14}"
          f" {'100 MiB in':>11} {'slow TTFB':>10} {'slow total':>11}")
    for mode in ("none", "middleware", "dependency"):
        m = measure(mode)
        print(f"{mode:<12} {m['rss_before_mib']:>8.1f} MiB {m['peak_mib']:>5.1f} MiB"
              f" {m['peak_delta_mib']:>10.1f} MiB {m['big_s']:>9.2f} s {m['ttfb_s']:>8.3f} s"
              f" {m['slow_total_s']:>9.3f} s")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        main()
