"""A small payments service written without idempo (Python standard library only).

It trusts the gateway in front of it: the caller's tenant comes in ``X-Principal`` and the
gateway's downstream key in ``Idempotency-Key``, which the service uses to deduplicate its own
side effect (a charge runs once per downstream key, even if the gateway re-runs a request after a
crash). ``GET /charges`` tells how many charges ran, for the demo to check.

    python3 payments_service.py PORT
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict
from urllib.parse import parse_qs, urlparse

LOCK = threading.Lock()
CHARGES: Dict[str, dict] = {}  # downstream key -> the charge it made
RUNS = 0  # requests that reached the handler


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if urlparse(self.path).path == "/charges":
            with LOCK:
                self._send(200, {"charges": len(CHARGES), "runs": RUNS})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        global RUNS
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        payment = json.loads(self.rfile.read(length) or b"{}")
        delay_ms = int(parse_qs(url.query).get("delay_ms", ["0"])[0])
        key = self.headers.get("Idempotency-Key", "")
        tenant = self.headers.get("X-Principal", "")
        with LOCK:
            RUNS += 1
        if delay_ms:
            time.sleep(delay_ms / 1000)
        with LOCK:
            charge = CHARGES.get(key)
            if charge is None:
                charge = {
                    "id": f"ch_{len(CHARGES) + 1}",
                    "tenant": tenant,
                    "amount": payment.get("amount"),
                    "status": "succeeded",
                }
                if key:
                    CHARGES[key] = charge
        self._send(201, charge)


def main() -> None:
    port = int(sys.argv[1])
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
