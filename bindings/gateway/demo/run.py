"""The gateway demo: idempo-gateway on SQLite in front of payments_service.py (no idempo in it).

Plays the classic cases through the gateway and prints what happens: a new payment, its retry
(a replay: the charge does not run again), the same key with another amount (422), and a
concurrent duplicate (409 with Retry-After, then a replay). Exits non-zero when a case does not
behave.

    python3 run.py PATH/TO/idempo-gateway
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
FAILURES: List[str] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"demo-gateway: {what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"demo-gateway: {what} did not start on port {port}")


Answer = Tuple[int, Dict[str, str], dict]


def post(url: str, key: str, body: dict, tenant: str = "tenant-a") -> Answer:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Idempotency-Key", key)
    req.add_header("X-Principal", tenant)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read() or b"{}")


def charges(service: str) -> int:
    with urllib.request.urlopen(f"{service}/charges", timeout=5) as r:
        return int(json.loads(r.read())["charges"])


def expect(case: str, ok: bool, what: str) -> None:
    print(f"  {'ok ' if ok else 'FAIL'} {what}")
    if not ok:
        FAILURES.append(f"{case}: {what}")


def main() -> int:
    gateway_bin = sys.argv[1]
    work = tempfile.mkdtemp(prefix="idempo-gateway-demo-")
    service_port, gateway_port = free_port(), free_port()
    config = os.path.join(work, "gateway.toml")
    with open(config, "w") as f:
        f.write(f"""listen = "127.0.0.1:{gateway_port}"

[store]
kind = "sqlite"
path = "{os.path.join(work, 'idempo.sqlite3')}"

[principal]
header = "X-Principal"

[upstreams]
payments = "http://127.0.0.1:{service_port}"

[[routes]]
method = "POST"
path = "/payments"
upstream = "payments"
lease_ms = 10000
""")
    check = subprocess.run([gateway_bin, "check-config", config], capture_output=True, text=True)
    print(f"check-config: {check.stdout.strip() or check.stderr.strip()}")
    if check.returncode != 0:
        return 1
    procs: List[subprocess.Popen] = []
    log = open(os.path.join(work, "gateway.log"), "w")
    try:
        service = subprocess.Popen([sys.executable, os.path.join(HERE, "payments_service.py"),
                                    str(service_port)])
        procs.append(service)
        wait_port(service_port, service, "payments_service.py")
        gateway = subprocess.Popen([gateway_bin, "serve", "--config", config], stderr=log)
        procs.append(gateway)
        wait_port(gateway_port, gateway, "idempo-gateway")
        svc = f"http://127.0.0.1:{service_port}"
        url = f"http://127.0.0.1:{gateway_port}/payments"
        print(f"idempo-gateway on :{gateway_port} (SQLite) in front of payments_service.py on "
              f":{service_port}\n")

        print("1. new payment (key pay-0001-intent)")
        status, headers, body = post(url, "pay-0001-intent", {"account": "acc_1", "amount": 1000})
        print(f"  -> {status} {body}")
        expect("new", status == 201, "201 from the service")
        expect("new", charges(svc) == 1, "the card was charged once")
        first = body

        print("2. the client retries after a lost response (same key, same body)")
        status, headers, body = post(url, "pay-0001-intent", {"amount": 1000, "account": "acc_1"})
        print(f"  -> {status} Idempotent-Replayed: {headers.get('idempotent-replayed')} {body}")
        expect("replay", status == 201 and body == first, "the same answer")
        expect("replay", headers.get("idempotent-replayed") == "true", "marked as a replay")
        expect("replay", charges(svc) == 1, "no second charge")

        print("3. the same key with another amount")
        status, headers, body = post(url, "pay-0001-intent", {"account": "acc_1", "amount": 999})
        print(f"  -> {status} {body.get('type')}")
        expect("mismatch", status == 422, "422 key-reused")
        expect("mismatch", charges(svc) == 1, "nothing charged")

        print("4. a double submit while the first is still running (the service takes 1.5 s)")
        slow = f"{url}?delay_ms=1500"
        results: Dict[str, Answer] = {}
        t = threading.Thread(target=lambda: results.update(
            first=post(slow, "pay-0002-intent", {"account": "acc_2", "amount": 500})))
        t.start()
        time.sleep(0.4)
        status, headers, body = post(slow, "pay-0002-intent", {"account": "acc_2", "amount": 500})
        print(f"  duplicate -> {status} Retry-After: {headers.get('retry-after')} {body.get('type')}")
        expect("in-flight", status == 409, "409 in-flight")
        expect("in-flight", headers.get("retry-after") is not None, "with Retry-After")
        t.join()
        status, _, first = results["first"]
        print(f"  first     -> {status} {first}")
        status, headers, body = post(slow, "pay-0002-intent", {"account": "acc_2", "amount": 500})
        print(f"  retry     -> {status} Idempotent-Replayed: {headers.get('idempotent-replayed')}")
        expect("in-flight", headers.get("idempotent-replayed") == "true" and body == first,
               "the retry replays the first answer")
        expect("in-flight", charges(svc) == 2, "two intents, two charges")

        print(f"\ncharges run by the service: {charges(svc)} (one per intent)")
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
    if FAILURES:
        print("\ndemo-gateway FAILED:\n  " + "\n  ".join(FAILURES))
        print(f"gateway log: {os.path.join(work, 'gateway.log')}")
        return 1
    print("demo-gateway: every case behaved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
