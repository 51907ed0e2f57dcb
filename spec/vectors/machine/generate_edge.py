#!/usr/bin/env python3
"""Writes the machine scripts for what is stored and how a response is captured
(spec/PROTOCOL.md sections 7.5, 7.6, 9 and 10), from the spec's rules, not from the Rust code.

Run from the repository root: python3 spec/vectors/machine/generate_edge.py

- policy_*: the storage table of section 9 (statuses that say the request never ran are released;
  a framework's rejection is released whatever its status; a handler's business 4xx is stored);
- always_stored_headers: content-encoding, content-type and vary are stored whatever the allowlist;
- oversized_not_retained*, truncated_stream_not_retained, tx_too_large_*: a storable response
  past max_body_bytes completes the record with the response-not-retained problem (and, in
  transactional mode, commits it before the held response is sent);
- replay_not_retained: a retry replays that problem;
- locked_*: a transactional claim whose lock wait timed out is answered 409 in-flight;
- custom_header_allowlist: its response_hex re-derived with the always-stored headers.

response_hex follows spec/STORAGE.md section 2; downstream keys spec/PROTOCOL.md section 8.
"""
import hashlib
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SCOPE = "5a9dae266a4dbbfd526bad6c34a963f4e454a2ce8774a23596bd01bdb1052cfd"
FP = "v1:" + "a" * 64
TOKEN = "0f" * 16
NOW = 1700000000000

# spec/PROTOCOL.md section 9 defaults
NEVER_RAN = [401, 403, 407, 408, 409, 425, 429]
DEFAULT_HEADERS = ["cache-control", "content-language", "content-location", "content-type",
                   "etag", "last-modified", "location"]
ALWAYS_STORED = ["content-encoding", "content-type", "vary"]

# spec/PROTOCOL.md section 10: the response-not-retained problem body, exactly.
NOT_RETAINED_BODY = json.dumps({
    "type": "urn:idempo:problem:response-not-retained",
    "title": "Response not retained",
    "status": 500,
    "detail": "The request with this Idempotency-Key was processed, but its response was too "
              "large to keep for replays. Look the resource up instead of retrying; do not send "
              "it again with a new key.",
}, separators=(",", ":"), ensure_ascii=False)
NOT_RETAINED = (500, [("content-type", "application/problem+json")], NOT_RETAINED_BODY)

HANDLER_HEADERS = [["Content-Type", "application/json"], ["Set-Cookie", "session=secret"],
                   ["Location", "/payments/7"], ["X-Trace", "abc"]]


def encode(status, headers, body):
    """spec/STORAGE.md section 2, version 1."""
    out = b"idr" + bytes([1]) + struct.pack(">HH", status, len(headers))
    for name, value in headers:
        n, v = name.encode(), value.encode()
        out += struct.pack(">H", len(n)) + n + struct.pack(">I", len(v)) + v
    b = body.encode()
    return (out + struct.pack(">I", len(b)) + b).hex()


def stored_headers(headers, allowlist):
    """Section 9: allow-listed or always stored, lowercase, in the handler's order."""
    keep = {h.lower() for h in allowlist} | set(ALWAYS_STORED)
    return [(n.lower(), v) for n, v in headers if n.lower() in keep]


def downstream_key(generation):
    scope = bytes.fromhex(SCOPE)
    fp = FP.encode()
    h = hashlib.sha256(b"idempo-downstream-v2\0" + scope + struct.pack(">I", len(fp)) + fp
                       + struct.pack(">I", generation))
    return h.hexdigest()


def config(**over):
    c = {
        "takeover": "outcome_unknown",
        "lease_ms": 30000,
        "heartbeat_ms": 10000,
        "ttl_ms": 86400000,
        "transient_statuses": NEVER_RAN,
        "store_server_errors": False,
        "max_body_bytes": 1048576,
        "stored_headers": DEFAULT_HEADERS,
        "in_flight_retry_after_ms": 1000,
        "unavailable_retry_after_ms": 1000,
        "max_store_rounds": 3,
    }
    c.update(over)
    if c.get("transactional"):
        c["heartbeat_ms"] = c.get("heartbeat_ms")
    return c


def claim(c):
    return {"expect": {"action": "store", "op": "claim", "fingerprint": FP, "token": TOKEN,
                       "lease_ms": c["lease_ms"], "ttl_ms": c["ttl_ms"]}}


def claimed(c):
    return {"event": {"type": "claimed", "generation": 1, "now_ms": NOW},
            "expect": {"action": "run_handler", "token": TOKEN, "generation": 1,
                       "downstream_key": downstream_key(1),
                       "heartbeat_ms": None if c.get("transactional") else c["heartbeat_ms"]}}


def finished(status, headers, body, **extra):
    e = {"type": "handler_finished", "status": status, "headers": headers, "body": body,
         "body_to_store": None}
    e.update(extra)
    return e


def respond(outcome, status, headers, body):
    return {"action": "respond", "outcome": outcome, "status": status, "headers": headers,
            "body": body}


def complete(c, hex_):
    return {"action": "store", "op": "complete", "token": TOKEN, "response_hex": hex_,
            "ttl_ms": c["ttl_ms"]}


def write(name, description, c, steps):
    doc = {"name": name, "description": description, "config": c, "scope": SCOPE,
           "fingerprint": FP, "entropy": TOKEN, "steps": steps}
    with open(os.path.join(HERE, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


def released_script(name, description, status, body, **extra):
    c = config()
    headers = [["Content-Type", "application/json"]]
    write(name, description, c, [
        claim(c), claimed(c),
        {"event": finished(status, headers, body, **extra),
         "expect": {"action": "store", "op": "release", "token": TOKEN}},
        {"event": {"type": "released", "applied": True},
         "expect": respond("not_stored", status, headers, body)},
    ])


def stored_script(name, description, c, status, headers, body, **extra):
    hex_ = encode(status, stored_headers(headers, c["stored_headers"]), body)
    write(name, description, c, [
        claim(c), claimed(c),
        {"event": finished(status, headers, body, **extra), "expect": complete(c, hex_)},
        {"event": {"type": "completed", "applied": True},
         "expect": respond("stored", status, headers, body)},
    ])


def not_retained_script(name, description, c, body, **extra):
    steps = [claim(c), claimed(c),
             {"event": finished(201, HANDLER_HEADERS, body, **extra),
              "expect": complete(c, encode(*NOT_RETAINED))}]
    done = respond("not_retained", 201, HANDLER_HEADERS, body)
    if c.get("transactional"):
        steps.append({"event": {"type": "completed", "applied": True},
                      "expect": {"action": "store", "op": "commit"}})
        steps.append({"event": {"type": "committed"}, "expect": done})
    else:
        steps.append({"event": {"type": "completed", "applied": True}, "expect": done})
    write(name, description, c, steps)


def main():
    reasons = {401: "Unauthorized", 403: "Forbidden", 407: "Proxy Authentication Required",
               408: "Request Timeout", 409: "Conflict", 425: "Too Early",
               429: "Too Many Requests"}
    for status in NEVER_RAN:
        released_script(
            f"policy_{status}_released",
            f"Section 9: a {status} ({reasons[status]}) says the request never ran: the key is "
            "released, so the fixed request with the same key runs.",
            status, '{"error":"x"}')
    for status in (400, 422):
        released_script(
            f"policy_framework_{status}_released",
            f"Section 9: a {status} the framework produced before the handler ran (origin "
            "framework, e.g. a request validation error) is released whatever its status: the "
            "corrected body with the same key runs.",
            status, '{"detail":"field required"}', origin="framework")
    for status, body in ((402, '{"error":"card_declined"}'), (404, '{"error":"no such order"}'),
                         (422, '{"error":"amount too small"}')):
        stored_script(
            f"policy_handler_{status}_stored",
            f"Section 9: the handler's own business {status} (origin handler) is its answer and "
            "is stored like a success.",
            config(), status, [["Content-Type", "application/json"]], body, origin="handler")
    c = config(stored_headers=["x-trace"])
    stored_script(
        "always_stored_headers",
        "Section 9: content-encoding, content-type and vary change what the stored bytes mean, "
        "so they are stored with the body whatever the allowlist (here only x-trace).",
        c, 200,
        [["Content-Type", "text/plain"], ["Content-Encoding", "gzip"],
         ["Vary", "Accept-Encoding"], ["X-Trace", "abc"], ["Location", "/x"]],
        "gzipped")
    not_retained_script(
        "oversized_not_retained",
        "Section 7.5: a storable response whose stored body exceeds max_body_bytes is completed "
        "with the response-not-retained problem (retries replay it); the live client gets the "
        "handler's response.",
        config(max_body_bytes=8), '{"id":77}')
    not_retained_script(
        "oversized_not_retained_re_run",
        "Section 7.5: the same outcome under the re_run takeover policy (nothing is left in "
        "flight for a takeover to run again).",
        config(max_body_bytes=8, takeover="re_run"), '{"id":77}')
    not_retained_script(
        "truncated_stream_not_retained",
        "Section 7.5: the host teed a streamed body and stopped recording at the limit "
        "(body_truncated): the record is the response-not-retained problem.",
        config(max_body_bytes=8), "", body_truncated=True)
    not_retained_script(
        "tx_too_large_not_retained",
        "Section 7.6: in transactional mode a too-large response completes the record with the "
        "response-not-retained problem and commits; the held response is sent once committed.",
        config(max_body_bytes=8, transactional=True, heartbeat_ms=None, takeover="re_run"),
        '{"id":77}')
    c = config(max_body_bytes=8, transactional=True, heartbeat_ms=None)
    not_committed = {"action": "respond", "outcome": "not_committed", "status": 503,
                     "headers": [["content-type", "application/problem+json"],
                                 ["retry-after", "1"]],
                     "problem": {"type": "urn:idempo:problem:store-unavailable", "status": 503}}
    big = [claim(c), claimed(c),
           {"event": finished(201, HANDLER_HEADERS, '{"id":77}'),
            "expect": complete(c, encode(*NOT_RETAINED))}]
    write("tx_too_large_commit_failed",
          "Section 7.6: a too-large response whose not-retained record cannot be committed is "
          "answered 503 not_committed, never with the handler's response.",
          c, big + [{"event": {"type": "completed", "applied": True},
                     "expect": {"action": "store", "op": "commit"}},
                    {"event": {"type": "store_failed"}, "expect": not_committed}])
    write("tx_too_large_completion_refused_rolls_back",
          "Section 7.6: a too-large response whose not-retained completion does not apply (the "
          "record is not this flow's) rolls back and answers 503 not_committed.",
          c, big + [{"event": {"type": "completed", "applied": False},
                     "expect": {"action": "store", "op": "release", "token": TOKEN}},
                    {"event": {"type": "released", "applied": False}, "expect": not_committed}])
    for old in ("tx_too_large_mark_refused_rolls_back", "tx_too_large_marked_unknown_and_committed"):
        path = os.path.join(HERE, old + ".json")
        if os.path.exists(path):
            os.remove(path)
    c = config()
    problem_headers = [["content-type", "application/problem+json"]]
    write("replay_not_retained",
          "Section 7.5: a retry of a request whose response was not retained replays the "
          "response-not-retained problem (500) with the replay marker.",
          c, [claim(c), {
              "event": {"type": "existing", "now_ms": NOW + 5000, "record": {
                  "fingerprint": FP, "state": 2, "token": "a1" * 16, "generation": 1,
                  "lease_until_ms": None, "expires_at_ms": NOW + 86400000,
                  "response": {"status": 500, "headers": problem_headers,
                               "body": NOT_RETAINED_BODY}}},
              "expect": respond("replayed", 500,
                                problem_headers + [["idempotent-replayed", "true"]],
                                NOT_RETAINED_BODY)}])
    for tx in (True, False):
        c = config(transactional=True, heartbeat_ms=None) if tx else config()
        name = "locked_claim_in_flight" if tx else "locked_claim_in_flight_non_tx"
        write(name,
              "Section 7.6: a claim that waited for the record's row lock past the store's lock "
              "timeout (locked) is another request in flight: 409 in-flight with Retry-After, "
              "nothing to clean up." + ("" if tx else " Accepted outside transactional mode too."),
              c, [claim(c), {
                  "event": {"type": "locked", "now_ms": NOW},
                  "expect": {"action": "respond", "outcome": "in_flight", "status": 409,
                             "headers": [["content-type", "application/problem+json"],
                                         ["retry-after", "1"]],
                             "problem": {"type": "urn:idempo:problem:in-flight",
                                         "status": 409}}},
                  {"event": {"type": "locked", "now_ms": NOW},
                   "expect": {"error": "finished"}}])
    # Section 7.6: a store failure before the commit is known is 503 not_committed, also when
    # it is the rollback after the handler (e.g. the server went away during the handler's SQL).
    c = config(transactional=True, heartbeat_ms=None)
    write("tx_rollback_failed_after_handler_error",
          "Section 7.6: the handler raised and the rollback (release) failed too, as when the "
          "database shut down during the handler's own statement: nothing committed, so the "
          "answer is 503 not_committed with Retry-After (retry the same key), not the error.",
          c, [claim(c), claimed(c),
              {"event": {"type": "handler_failed", "maybe_side_effect": True},
               "expect": {"action": "store", "op": "release", "token": TOKEN}},
              {"event": {"type": "store_failed"}, "expect": not_committed}])
    write("tx_rollback_failed_after_not_stored",
          "Section 7.6: a response whose status is not stored (here the framework's 500 for a "
          "failed view) rolls back; when that rollback fails the answer is 503 not_committed.",
          c, [claim(c), claimed(c),
              {"event": finished(500, [["Content-Type", "text/html"]], "Server Error"),
               "expect": {"action": "store", "op": "release", "token": TOKEN}},
              {"event": {"type": "store_failed"}, "expect": not_committed}])
    # Re-derive custom_header_allowlist's stored bytes with the always-stored headers.
    path = os.path.join(HERE, "custom_header_allowlist.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    for step in doc["steps"]:
        ev, ex = step.get("event"), step.get("expect")
        if ev and ev["type"] == "handler_finished" and ex.get("op") == "complete":
            ex["response_hex"] = encode(ev["status"],
                                        stored_headers(ev["headers"],
                                                       doc["config"]["stored_headers"]),
                                        ev["body"])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
