#!/usr/bin/env python3
"""Generate idempo's function-call vectors (spec/vectors/call/call.json).

An independent model of spec/PROTOCOL.md §13, not the Rust code: the scope framing of
spec/KEYS.md §2 and the v1 fingerprint framing of spec/CANONICAL.md built here with `struct` and
`hashlib`/`hmac`, the canonical payload from the `rfc8785` package (exclusions: top-level members
removed before canonicalization, enough for these cases).

Run:  pip install rfc8785==0.1.4 && python3 spec/vectors/call/generate.py
"""
import hashlib
import hmac
import json
import os
import struct
import sys

try:
    import rfc8785
except ImportError:  # pragma: no cover
    sys.exit("generate.py needs the oracle: pip install rfc8785==0.1.4")

HERE = os.path.dirname(os.path.abspath(__file__))


def scope(principal: str, name: str, key: str) -> str:
    data = b"".join(
        struct.pack(">Q", len(f)) + f
        for f in (b"idempo-scope-v1", principal.encode(), b"CALL", name.encode(), key.encode())
    )
    return hashlib.sha256(data).hexdigest()


def field(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def fingerprint(name: str, payload: str, exclude, hmac_key) -> str:
    value = json.loads(payload)
    for pointer in exclude:
        assert pointer.count("/") == 1, "top-level pointers only"
        value.pop(pointer[1:], None)
    body = rfc8785.dumps(value)
    framing = (
        field(b"idempo/fingerprint/v1") + field(b"CALL") + field(name.encode())
        + struct.pack(">I", 0) + bytes([0x01, 0x01]) + body + struct.pack(">Q", len(body))
    )
    if hmac_key is None:
        return "v1:" + hashlib.sha256(framing).hexdigest()
    return "h1:" + hmac.new(hmac_key.encode(), framing, hashlib.sha256).hexdigest()


CASES = [
    {"name": "message_id", "function": "billing.charge", "principal": "", "key": "msg-1",
     "payload": '{"order":"o-1","cents":250}', "exclude": [], "hmac_key": None},
    {"name": "member_order_and_number_form_do_not_matter", "function": "billing.charge",
     "principal": "", "key": "msg-1", "payload": '{ "cents":2.5e2, "order":"o-1" }',
     "exclude": [], "hmac_key": None},
    {"name": "other_function_same_key", "function": "billing.refund", "principal": "",
     "key": "msg-1", "payload": '{"order":"o-1","cents":250}', "exclude": [], "hmac_key": None},
    {"name": "tenant", "function": "billing.charge", "principal": "tenant-7", "key": "msg-1",
     "payload": '{"order":"o-1","cents":250}', "exclude": [], "hmac_key": None},
    {"name": "excluded_pointer", "function": "ingest", "principal": "", "key": "job-9",
     "payload": '{"id":9,"sent_at":"10:05"}', "exclude": ["/sent_at"], "hmac_key": None},
    {"name": "excluded_pointer_other_value", "function": "ingest", "principal": "",
     "key": "job-9", "payload": '{"id":9,"sent_at":"11:00"}', "exclude": ["/sent_at"],
     "hmac_key": None},
    {"name": "hmac", "function": "billing.charge", "principal": "", "key": "msg-1",
     "payload": '{"order":"o-1","cents":250}', "exclude": [], "hmac_key": "server-secret"},
]


def main() -> None:
    out = []
    for case in CASES:
        c = dict(case)
        c["scope_hex"] = scope(c["principal"], c["function"], c["key"])
        c["fingerprint"] = fingerprint(c["function"], c["payload"], c["exclude"], c["hmac_key"])
        out.append(c)
    doc = {
        "description": "Function calls (spec/PROTOCOL.md §13): scope of (principal, CALL, "
        "function, key), fingerprint of (CALL, function, application/json, payload), and the "
        "stored response of a result and of a stored error.",
        "cases": out,
        "result": {"serializer": "json", "body": '{"ok":true}', "status": 200,
                   "content_type": "application/vnd.idempo.result; serializer=json"},
        "stored_error": {"status": 400, "content_type": "application/vnd.idempo.error+json"},
        "wait_delay": [
            {"attempt": 0, "retry_after_ms": 1000, "elapsed_ms": 0, "budget_ms": 10000,
             "jitter": 65535, "delay_ms": 50},
            {"attempt": 0, "retry_after_ms": 1000, "elapsed_ms": 0, "budget_ms": 10000,
             "jitter": 0, "delay_ms": 25},
            {"attempt": 3, "retry_after_ms": 1000, "elapsed_ms": 0, "budget_ms": 10000,
             "jitter": 65535, "delay_ms": 400},
            {"attempt": 10, "retry_after_ms": 1000, "elapsed_ms": 0, "budget_ms": 10000,
             "jitter": 65535, "delay_ms": 1000},
            {"attempt": 30, "retry_after_ms": 60000, "elapsed_ms": 0, "budget_ms": 10000,
             "jitter": 65535, "delay_ms": 2000},
            {"attempt": 0, "retry_after_ms": 1000, "elapsed_ms": 9990, "budget_ms": 10000,
             "jitter": 65535, "delay_ms": None},
        ],
    }
    with open(os.path.join(HERE, "call.json"), "w") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
