"""Streamed responses through the WSGI host (issue 13): server memory and time to first byte.

A Flask app behind :class:`idempo.wsgi.FlaskIdempotency` (MemoryStore, default 1 MiB record
limit) runs in Werkzeug's threaded server in a child process. Two requests:

- a 100 MiB streamed body (1,600 chunks of 64 KiB, no ``Content-Length``): the server's peak
  resident memory (``ru_maxrss``) after it, against its resident memory before it, and the
  target "within the record limit plus 16 MiB";
- a slow stream (a first chunk, then ten chunks 100 ms apart): the time to its first byte, against
  the handler's first chunk (immediately) and its last (after about 1 s).

Prints figures; asserts nothing (run once: ``make bench-python``).
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import textwrap
import time

SERVER = textwrap.dedent(
    """
    import logging, resource, sys, threading, time
    from flask import Flask, request
    from werkzeug.serving import make_server
    from idempo.stores import MemoryStore
    from idempo.wsgi import FlaskIdempotency

    app = Flask(__name__)

    @app.post("/big")
    def big():
        chunk = b"x" * 65536
        def body():
            for _ in range(1600):
                yield chunk
        return app.response_class(body(), mimetype="application/octet-stream")

    @app.post("/slow")
    def slow():
        def body():
            yield b"first"
            for _ in range(10):
                time.sleep(0.1)
                yield b"."
        return app.response_class(body(), mimetype="text/plain")

    @app.get("/rss")
    def rss():
        with open("/proc/self/status") as f:
            now = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"rss_kib": now, "peak_kib": peak}

    FlaskIdempotency(app, store=MemoryStore())
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    print(server.server_port, flush=True)
    server.serve_forever()
    """
)


def _post(port: int, path: str, key: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, body=b"{}", headers={
        "Idempotency-Key": key, "Content-Type": "application/json"})
    return conn.getresponse()


def _rss(port: int) -> tuple[int, int]:
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/rss")
    data = json.loads(conn.getresponse().read())
    conn.close()
    return int(data["rss_kib"]), int(data["peak_kib"])


def main() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        # Warm up (imports, first request) before the baseline.
        _post(port, "/slow", "warm-up-key-1").read()
        before, _ = _rss(port)
        response = _post(port, "/big", "big-stream-key")
        total = 0
        while True:
            chunk = response.read(1 << 20)
            if not chunk:
                break
            total += len(chunk)
        _, peak = _rss(port)
        limit_mib = 1.0
        print(f"WSGI (Flask, Werkzeug threaded) 100 MiB streamed response: {total / 2**20:.0f} MiB "
              f"received; server RSS {before / 1024:.1f} MiB before it, peak RSS of the whole run "
              f"{peak / 1024:.1f} MiB (+{max(0, peak - before) / 1024:.1f} MiB; target: within "
              f"the {limit_mib:.0f} MiB record limit + 16 MiB)")
        start = time.monotonic()
        slow = _post(port, "/slow", "slow-stream-key")
        first = slow.read(5)
        ttfb = time.monotonic() - start
        rest = slow.read()
        done = time.monotonic() - start
        print(f"WSGI slow stream: first byte after {ttfb * 1000:.0f} ms ({first!r}), last after "
              f"{done * 1000:.0f} ms ({len(rest)} more bytes); target: the handler's first chunk "
              f"(at once), not its last (~1000 ms)")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
