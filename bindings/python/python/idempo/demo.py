"""``python -m idempo.demo``: a payments API served for real on localhost, played by a client.

The server (uvicorn, a separate process so it can really crash) runs a Starlette app with
:class:`idempo.asgi.IdempotencyMiddleware` on a :class:`idempo.stores.SQLiteStore` in a temporary
directory. Its handler charges by inserting into its own ``charges`` table, keyed by the
downstream key idempo hands it (so a takeover re-run after a crash cannot charge twice), and logs
every execution in ``executions``. The client plays the classic cases and the demo checks, from
the handler's own tables, how many times each charge ran. Exit status 1 if any expectation fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

LEASE_MS = 3000

def started_mark(workdir: Path, key: str) -> Path:
    """The file a slow request's handler creates when it starts (so a duplicate meets it in flight)."""
    return workdir / f"started-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


EFFECTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
  id INTEGER PRIMARY KEY, downstream_key TEXT UNIQUE NOT NULL, idem_key TEXT NOT NULL,
  account TEXT NOT NULL, amount INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS executions (id INTEGER PRIMARY KEY, idem_key TEXT NOT NULL);
"""


# ---------------------------------------------------------------- server (child process)


def build_app(workdir: Path) -> Any:
    """The payments app: Starlette + IdempotencyMiddleware on SQLite."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from idempo import Config
    from idempo.asgi import IdempotencyMiddleware
    from idempo.stores import SQLiteStore

    effects = workdir / "effects.sqlite3"
    with sqlite3.connect(effects) as conn:
        conn.executescript(EFFECTS_SCHEMA)

    def charge(idem_key: str, downstream_key: str, account: str, amount: int) -> int:
        conn = sqlite3.connect(effects, isolation_level=None, timeout=5)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO executions (idem_key) VALUES (?)", (idem_key,))
            conn.execute(
                "INSERT OR IGNORE INTO charges (downstream_key, idem_key, account, amount) "
                "VALUES (?, ?, ?, ?)",
                (downstream_key, idem_key, account, amount),
            )
            row = conn.execute(
                "SELECT id FROM charges WHERE downstream_key = ?", (downstream_key,)
            ).fetchone()
            conn.execute("COMMIT")
            return int(row[0])
        finally:
            conn.close()

    async def create_payment(request: Request) -> JSONResponse:
        body = await request.json()
        execution = request.state.idempotency
        delay_ms = int(request.headers.get("x-demo-delay-ms", "0"))
        if delay_ms:
            started_mark(workdir, execution.key).touch()  # the demo waits for it (scenario 3)
            await asyncio.sleep(delay_ms / 1000)
        payment_id = await asyncio.to_thread(
            charge, execution.key, execution.downstream_key, body["account"], int(body["amount"])
        )
        marker = workdir / "crashed-once"
        if request.headers.get("x-demo-crash") == "after-charge" and not marker.exists():
            marker.touch()
            os._exit(3)  # the process dies after the charge, before any response
        return JSONResponse(
            {"payment_id": payment_id, "account": body["account"], "amount": body["amount"]},
            status_code=201,
            headers={"location": f"/payments/{payment_id}"},
        )

    async def health(_request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/payments", create_payment, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    app.add_middleware(
        IdempotencyMiddleware,
        store=SQLiteStore(workdir / "idempo.sqlite3"),
        config=Config(lease_ms=LEASE_MS, takeover="re_run"),
        scope=lambda scope: "merchant-1",
    )
    return app


def serve(port: int, workdir: Path) -> None:
    import uvicorn

    uvicorn.run(build_app(workdir), host="127.0.0.1", port=port, log_level="error")


# ---------------------------------------------------------------- client side (the demo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """The API process; can be restarted on the same port and database after a crash."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "idempo.demo", "serve", "--port", str(self.port),
             "--dir", str(self.workdir)],
        )
        import httpx

        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"demo server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=0.5).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("demo server did not start within 15 s")

    def wait_exit(self, timeout: float) -> Optional[int]:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Demo:
    def __init__(self, workdir: Path, server: Server) -> None:
        self.workdir = workdir
        self.server = server
        self.failures: List[str] = []

    def effects(self, key: str) -> Tuple[int, int]:
        """(charges, handler executions) recorded by the handler for this key."""
        with sqlite3.connect(self.workdir / "effects.sqlite3") as conn:
            charges = conn.execute("SELECT COUNT(*) FROM charges WHERE idem_key = ?", (key,))
            runs = conn.execute("SELECT COUNT(*) FROM executions WHERE idem_key = ?", (key,))
            return int(charges.fetchone()[0]), int(runs.fetchone()[0])

    def expect(self, what: str, ok: bool) -> None:
        print(f"    {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failures.append(what)

    def client(self, timeout: float = 5.0, log: Optional[List[str]] = None) -> Any:
        import httpx

        from idempo import RetryPolicy
        from idempo.client import IdempotentTransport

        def on_retry(attempt: int, outcome: str, delay_ms: int) -> None:
            line = f"attempt {attempt}: {outcome} -> retry in {delay_ms} ms, same key"
            print(f"    client: {line}")
            if log is not None:
                log.append(outcome)

        transport = IdempotentTransport(
            httpx.HTTPTransport(),
            policy=RetryPolicy(max_attempts=12, base_delay_ms=200, max_delay_ms=1500,
                               max_elapsed_ms=20_000),
            on_retry=on_retry,
        )
        return httpx.Client(transport=transport, base_url=self.server.url, timeout=timeout)

    def raw(self, key: str, amount: int, headers: Optional[Dict[str, str]] = None) -> Any:
        import httpx

        from idempo import key_header_value

        h = {"Idempotency-Key": key_header_value(key), **(headers or {})}
        return httpx.post(self.server.url + "/payments", json={"account": "acct_1", "amount": amount},
                          headers=h, timeout=10)

    # -- the scenarios

    def lost_response(self) -> None:
        print("\n1. The response is lost (client timeout); the client retries with the same key")
        log: List[str] = []
        with self.client(timeout=0.5, log=log) as c:
            r = c.post("/payments", json={"account": "acct_1", "amount": 1000},
                       headers={"X-Demo-Delay-Ms": "1200"})
        key = r.extensions["idempo_key"]
        print(f"    final: {r.status_code} {r.text} after {r.extensions['idempo_attempts']} attempts"
              f" (replayed={r.headers.get('idempotent-replayed', 'false')})")
        charges, runs = self.effects(key)
        print(f"    charges for this key: {charges}; handler executions: {runs}")
        self.expect("first attempt timed out and was retried", "timeout" in log)
        self.expect("final answer is the stored 201, replayed",
                    r.status_code == 201 and r.headers.get("idempotent-replayed") == "true")
        self.expect("charged exactly once", charges == 1 and runs == 1)

    def double_submit(self) -> None:
        print("\n2. Double submit: the same request sent twice")
        from idempo import generate_key

        key = generate_key()
        a = self.raw(key, 2500)
        b = self.raw(key, 2500)
        print(f"    first:  {a.status_code} {a.text}")
        print(f"    second: {b.status_code} {b.text} (Idempotent-Replayed: "
              f"{b.headers.get('idempotent-replayed')})")
        charges, _ = self.effects(key)
        print(f"    charges for this key: {charges}")
        self.expect("second answer is the first one, replayed",
                    b.status_code == a.status_code == 201 and b.content == a.content
                    and b.headers.get("idempotent-replayed") == "true"
                    and b.headers.get("location") == a.headers.get("location"))
        self.expect("charged exactly once", charges == 1)

    def concurrent_duplicate(self) -> None:
        print("\n3. Concurrent duplicate: a second request while the first still runs")
        from idempo import generate_key

        key = generate_key()
        results: Dict[str, Any] = {}
        first = threading.Thread(
            target=lambda: results.__setitem__("first", self.raw(key, 4200, {"X-Demo-Delay-Ms": "1000"})))
        first.start()
        # The duplicate goes once the first request's handler runs (a loaded machine may take a
        # while to get it there; sent earlier, the duplicate would be the first).
        started = started_mark(self.workdir, key)
        deadline = time.monotonic() + 10
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        dup = self.raw(key, 4200)
        print(f"    duplicate during the run: {dup.status_code} Retry-After: "
              f"{dup.headers.get('retry-after')} {dup.json().get('title')}")
        first.join()
        print(f"    first: {results['first'].status_code} {results['first'].text}")
        again = self.raw(key, 4200)
        print(f"    duplicate after: {again.status_code} {again.text} (replayed)")
        charges, _ = self.effects(key)
        print(f"    charges for this key: {charges}")
        self.expect("409 + Retry-After while in flight",
                    dup.status_code == 409 and dup.headers.get("retry-after") is not None)
        self.expect("then the stored answer is replayed",
                    again.status_code == 201 and again.content == results["first"].content)
        self.expect("charged exactly once", charges == 1)

    def different_amount(self) -> None:
        print("\n4. Same key, different amount")
        from idempo import generate_key

        key = generate_key()
        ok = self.raw(key, 700)
        bad = self.raw(key, 7000)
        print(f"    amount 700:  {ok.status_code}")
        print(f"    amount 7000: {bad.status_code} {bad.json().get('title')}")
        charges, _ = self.effects(key)
        print(f"    charges for this key: {charges}")
        self.expect("422 problem+json", bad.status_code == 422
                    and bad.headers.get("content-type") == "application/problem+json")
        self.expect("charged exactly once (the 700)", charges == 1)

    def crash(self) -> None:
        print(f"\n5. The server crashes after charging, before answering (lease {LEASE_MS} ms)")
        log: List[str] = []
        result: Dict[str, Any] = {}

        def call() -> None:
            with self.client(timeout=5, log=log) as c:
                result["r"] = c.post("/payments", json={"account": "acct_1", "amount": 9900},
                                     headers={"X-Demo-Crash": "after-charge"})

        t = threading.Thread(target=call)
        t.start()
        code = self.server.wait_exit(10)
        crashed_at = time.monotonic()
        print(f"    server process exited with status {code}; restarting it on the same database")
        self.server.start()
        restart_ms = (time.monotonic() - crashed_at) * 1000
        t.join(25)
        r = result.get("r")
        if r is None:
            self.expect("client got an answer", False)
            return
        key = r.extensions["idempo_key"]
        charges, runs = self.effects(key)
        print(f"    final: {r.status_code} {r.text} after {r.extensions['idempo_attempts']} attempts")
        print(f"    charges for this key: {charges}; handler executions: {runs}")
        self.expect("the crash was seen as a connection error and retried",
                    "connection_error" in log)
        if restart_ms < LEASE_MS - 500:
            self.expect("409 while the dead owner's lease was live", "409" in log)
        else:
            # A slow machine restarted the server after the lease had run out: no retry could
            # meet the live lease, so there is no 409 to see (the takeover below still must run).
            print(f"    (the restart took {restart_ms:.0f} ms, past the {LEASE_MS} ms lease: "
                  "no 409 expected)")
        self.expect("recovered after the lease: 201", r.status_code == 201)
        self.expect("the re-run did not charge again (downstream key)", charges == 1 and runs == 2)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m idempo.demo", description=__doc__)
    sub = parser.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="run the payments API (used by the demo)")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve(args.port, args.dir)
        return 0

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="idempo-demo-") as tmp:
        workdir = Path(tmp)
        server = Server(workdir)
        print(f"idempo demo: payments API on {server.url} (SQLite store in {workdir})")
        server.start()
        demo = Demo(workdir, server)
        steps: List[Callable[[], None]] = [
            demo.lost_response, demo.double_submit, demo.concurrent_duplicate,
            demo.different_amount, demo.crash,
        ]
        try:
            for step in steps:
                try:
                    step()
                except Exception as exc:  # noqa: BLE001 - report and continue
                    demo.expect(f"{step.__name__} raised {type(exc).__name__}: {exc}", False)
        finally:
            server.stop()
        with sqlite3.connect(workdir / "effects.sqlite3") as conn:
            total = conn.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
            runs = conn.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
    print(f"\nhandler executions: {runs}; charges made: {total} (one per payment intent: 5 expected)"
          f"; {time.monotonic() - started:.1f} s")
    if total != 5:
        demo.failures.append(f"{total} charges in total, expected 5")
    if demo.failures:
        print(f"demo FAILED: {len(demo.failures)} expectation(s) not met:")
        for f in demo.failures:
            print(f"  - {f}")
        return 1
    print("demo passed: every intent charged exactly once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
