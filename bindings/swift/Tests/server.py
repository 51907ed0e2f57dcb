#!/usr/bin/env python3
"""A tiny idempotent payments server for the Swift client tests (standard library only).

It follows the idempo contract closely enough to exercise a client: one record per key with a
request fingerprint; a new key runs the handler once and stores the answer; a repeat while the
first is running gets 409 + Retry-After; a repeat after it finished gets the stored answer with
`Idempotent-Replayed: true`; the same key with another body gets 422; no key gets 400.

Test controls (request headers, not part of the fingerprint):
  X-Test-Fail-Times: N      the first N requests with this key get 503 + Retry-After: 0 and do
                            not run the handler (a flaky upstream)
  X-Test-Delay-Ms: MS       the handler takes MS milliseconds (the record is in flight meanwhile)
  X-Test-Lose-Response: N   for the first N requests with this key, process normally (run or
                            replay) and then close the connection without answering (a lost
                            response)
  X-Test-Outcome-Unknown: 1 the record is in idempo's "outcome unknown" state: every request
                            with this key gets idempo's 500 outcome-unknown problem and does not
                            run the handler
  X-Test-App-Status: N      the application answers N itself (application/json, not an idempo
                            problem type; e.g. a validation 422 or a business 409)

GET /stats?key=K  -> {"executions": n, "requests": m, "header_values": [...], "total_requests": t,
                      "total_executions": e} for key K (the totals count every POST /payments).

Prints `PORT <n>` on its first stdout line (it binds 127.0.0.1 on a free port) and runs until
killed or until its stdin closes.
"""
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

LOCK = threading.Lock()
RECORDS = {}  # key -> {"state": "in_progress"|"completed", "fingerprint", "status", "body"}
STATS = {}  # key -> {"executions", "requests", "header_values", "lost", "failed"}
NEXT_PAYMENT = [0]
TOTALS = {"requests": 0, "executions": 0}


def parse_key(value):
    """The key text of a header value: a quoted sf-string (\\" and \\\\ escapes) or the bare form."""
    value = value.strip(" \t")
    if not value.startswith('"'):
        return value or None
    out, i = [], 1
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            out.append(value[i + 1])
            i += 2
            continue
        if c == '"':
            return "".join(out) or None
        out.append(c)
        i += 1
    return None


def problem(status, title, detail, type_="about:blank"):
    return status, {"type": type_, "title": title, "status": status, "detail": detail}


LOG = os.environ.get("IDEMPO_TEST_SERVER_LOG")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        # Quiet unless IDEMPO_TEST_SERVER_LOG names a file (for debugging the tests).
        if LOG:
            with open(LOG, "a") as f:
                f.write("%.3f %s %s\n" % (time.time(), self.client_address[1], fmt % args))

    def answer(self, status, payload, headers=None, content_type="application/json"):
        body = json.dumps(payload, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urlparse(self.path)
        if url.path != "/stats":
            self.answer(*problem(404, "Not Found", url.path), content_type="application/problem+json")
            return
        key = parse_qs(url.query).get("key", [""])[0]
        with LOCK:
            s = STATS.get(key, {"executions": 0, "requests": 0, "header_values": []})
            payload = {k: s[k] for k in ("executions", "requests", "header_values")}
            payload.update(total_requests=TOTALS["requests"], total_executions=TOTALS["executions"])
        self.answer(200, payload)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        with LOCK:
            TOTALS["requests"] += 1
        if urlparse(self.path).path != "/payments":
            self.answer(*problem(404, "Not Found", self.path), content_type="application/problem+json")
            return
        raw_key = self.headers.get("Idempotency-Key")
        key = parse_key(raw_key) if raw_key is not None else None
        if key is None:
            self.answer(*problem(400, "Missing or invalid Idempotency-Key", "send one key per intent"),
                        content_type="application/problem+json")
            return
        try:
            doc = json.loads(body)
            fingerprint = hashlib.sha256(
                json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        except ValueError:
            self.answer(*problem(400, "Invalid JSON", "the body is not JSON"),
                        content_type="application/problem+json")
            return

        with LOCK:
            s = STATS.setdefault(key, {"executions": 0, "requests": 0, "header_values": [],
                                       "lost": 0, "failed": 0})
            s["requests"] += 1
            s["header_values"].append(raw_key)
            fail = s["failed"] < int(self.headers.get("X-Test-Fail-Times") or 0)
            if fail:
                s["failed"] += 1
            lose = s["lost"] < int(self.headers.get("X-Test-Lose-Response") or 0)
            if lose:
                s["lost"] += 1
            record = RECORDS.get(key)
            app_status = int(self.headers.get("X-Test-App-Status") or 0)
            if app_status:
                outcome = "app"
            elif self.headers.get("X-Test-Outcome-Unknown") == "1":
                outcome = "outcome_unknown"
            elif fail:
                outcome = "fail"
            elif record is None:
                RECORDS[key] = {"state": "in_progress", "fingerprint": fingerprint}
                outcome = "run"
            elif record["fingerprint"] != fingerprint:
                outcome = "mismatch"
            elif record["state"] == "in_progress":
                outcome = "in_flight"
            else:
                outcome = "replay"

        if outcome == "run":
            time.sleep(int(self.headers.get("X-Test-Delay-Ms") or 0) / 1000)
            with LOCK:
                NEXT_PAYMENT[0] += 1
                stored = {"payment_id": "pay_%d" % NEXT_PAYMENT[0], "amount": doc.get("amount")}
                RECORDS[key].update(state="completed", status=201, body=stored)
                STATS[key]["executions"] += 1
                TOTALS["executions"] += 1

        if lose:
            # The work is done (or replayed) but the answer never reaches the client.
            self.close_connection = True
            return
        if outcome == "app":
            # The application's own answer (a validation error, a business conflict): JSON, not
            # one of idempo's problem types.
            self.answer(app_status, {"detail": [{"loc": ["body", "amount"], "msg": "invalid"}]},
                        headers={"Retry-After": "0"})
        elif outcome == "outcome_unknown":
            self.answer(500, {"type": "urn:idempo:problem:outcome-unknown", "title": "Outcome unknown",
                              "status": 500,
                              "detail": "An earlier attempt may have taken effect; check before a new key."},
                        content_type="application/problem+json")
        elif outcome == "fail":
            self.answer(*problem(503, "Service Unavailable", "try again"),
                        headers={"Retry-After": "0"}, content_type="application/problem+json")
        elif outcome == "mismatch":
            self.answer(*problem(422, "Idempotency-Key reused", "this key was used with another request",
                                 "urn:idempo:problem:key-reused"),
                        content_type="application/problem+json")
        elif outcome == "in_flight":
            self.answer(*problem(409, "Request in progress", "retry after the Retry-After delay",
                                 "urn:idempo:problem:in-flight"),
                        headers={"Retry-After": "1"}, content_type="application/problem+json")
        else:
            with LOCK:
                record = RECORDS[key]
            headers = {"Idempotent-Replayed": "true"} if outcome == "replay" else {}
            self.answer(record["status"], record["body"], headers=headers)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that timed out and went away is part of the tests, not a server error.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def main():
    server = Server(("127.0.0.1", 0), Handler)
    print("PORT %d" % server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # Stop when the test process closes our stdin (or dies).
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
