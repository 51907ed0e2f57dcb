#!/usr/bin/env python3
"""Generate idempo's request-fingerprint vectors (spec/vectors/fingerprint/fingerprint.json).

An independent model of spec/CANONICAL.md §2, not the Rust code: the framing is built here with
`struct`, hashed with `hashlib` / `hmac`, and the canonical body comes from Python's strict `json`
parser plus the `rfc8785` package (PyPI 0.1.4) with exclusions applied on the parsed value.

Run:  pip install rfc8785==0.1.4 && python3 spec/vectors/fingerprint/generate.py
"""
import decimal
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
decimal.getcontext().prec = 2000
TAG = b"idempo/fingerprint/v1"


def field(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def is_json(ct):
    if ct is None:
        return False
    essence = ct.split(";")[0].strip(" \t")
    if "/" not in essence:
        return False
    ty, sub = essence.split("/", 1)
    if not ty or not sub:
        return False
    sub = sub.lower()
    return (ty.lower() == "application" and sub == "json") or sub.endswith("+json")


class Reject(Exception):
    pass


def _pairs(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise Reject("duplicate_member")
    return dict(pairs)


def canonical(body: bytes, exclude, numbers):
    lits = []

    def num(s):
        v = float(int(s)) if all(c in "-0123456789" for c in s) else float(s)
        lits.append((s, v))
        return v

    value = json.loads(body.decode("utf-8"), object_pairs_hook=_pairs, parse_int=num, parse_float=num)
    for p in sorted(exclude, reverse=True):
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in p.split("/")[1:]]
        value = drop(value, tokens)
    if numbers == "reject_precision_loss":
        # Only the numbers still present matter; these vectors keep lossy numbers out of excluded parts.
        for lit, v in lits:
            if decimal.Decimal(lit) != decimal.Decimal(repr(v)):
                raise Reject("precision_loss")
    return rfc8785.dumps(value)


def drop(value, tokens):
    head, rest = tokens[0], tokens[1:]
    if isinstance(value, dict) and head in value:
        if not rest:
            return {k: v for k, v in value.items() if k != head}
        return {**value, head: drop(value[head], rest)}
    if isinstance(value, list) and head.isdigit() and (head == "0" or head[0] != "0") and int(head) < len(value):
        i = int(head)
        if not rest:
            return value[:i] + value[i + 1:]
        return value[:i] + [drop(value[i], rest)] + value[i + 1:]
    return value


def framing(req, cfg):
    out = field(TAG) + field(req["method"].upper().encode()) + field(req["route"].encode())
    names = sorted({n.lower() for n in cfg.get("header_names", [])})
    out += struct.pack(">I", len(names))
    for n in names:
        vals = [v for (k, v) in req.get("headers", []) if k.lower() == n]
        out += field(n.encode()) + struct.pack(">I", len(vals))
        for v in vals:
            out += field(v.strip(" \t").encode())
    body = bytes.fromhex(req["body_hex"]) if "body_hex" in req else req.get("body", "").encode()
    js = is_json(req.get("content_type"))
    out += bytes([1 if js else 2])
    canon = None
    if not body:
        out += b"\x00" + struct.pack(">Q", 0)
    elif js:
        canon = canonical(body, cfg.get("exclude", []), cfg.get("numbers", "reject_precision_loss"))
        out += b"\x01" + canon + struct.pack(">Q", len(canon))
    else:
        out += b"\x02" + body + struct.pack(">Q", len(body))
    return out, canon


CASES = []


def case(name, req, cfg=None, error=None):
    cfg = cfg or {}
    c = {"name": name, "config": cfg, "request": req}
    if error:
        c["error"] = error
    else:
        fr, canon = framing(req, cfg)
        c["canonical_body"] = canon.decode() if canon is not None else None
        c["framing_hex"] = fr.hex()
        if "hmac_key_hex" in cfg:
            c["fingerprint"] = "h1:" + hmac.new(bytes.fromhex(cfg["hmac_key_hex"]), fr, hashlib.sha256).hexdigest()
        else:
            c["fingerprint"] = "v1:" + hashlib.sha256(fr).hexdigest()
    CASES.append(c)


J = "application/json"
PAY = '{"amount":1250,"currency":"EUR","customer":{"id":"cus_1"}}'
base = {"method": "POST", "route": "/payments", "headers": [], "content_type": J, "body": PAY}
case("json-basic", base)
case("json-lowercase-method", {**base, "method": "post"})
case("json-reordered-whitespace", {**base, "body": '{ "customer" : { "id" : "cus_1" },\n "currency":"EUR", "amount":1250.0 }'})
case("json-number-spelling", {**base, "body": '{"amount":1.25e3,"currency":"EUR","customer":{"id":"cus_1"}}'})
case("json-escaped-strings", {**base, "body": '{"amount":1250,"currency":"\\u0045UR","customer":{"id":"cus\\u005f1"}}'})
case("json-other-amount", {**base, "body": '{"amount":1251,"currency":"EUR","customer":{"id":"cus_1"}}'})
case("json-other-route", {**base, "route": "/payments/{id}"})
case("json-charset-param", {**base, "content_type": "application/json; charset=utf-8"})
case("json-suffix-type", {**base, "content_type": "application/problem+json"})
case("json-uppercase-type", {**base, "content_type": "Application/JSON"})
case("other-text-plain", {**base, "content_type": "text/plain"})
case("other-no-content-type", {**base, "content_type": None})
case("other-jsonx", {**base, "content_type": "application/jsonx"})
case("other-raw-not-canonicalized", {**base, "content_type": "text/plain", "body": '{ "b":1, "a":2 }'})
case("other-binary-body", {"method": "PUT", "route": "/blobs/{id}", "headers": [], "content_type": "application/octet-stream", "body_hex": "00ff80fe0a"})
case("empty-body-json", {**base, "body": ""})
case("empty-body-other", {**base, "body": "", "content_type": None})
case("json-top-level-scalar", {**base, "body": "42"})
case("json-unicode-keys", {**base, "body": '{"\ufb33":1,"\U0001F600":2,"\u00e9":3}'})
H = {"header_names": ["X-Tenant", "Accept-Language"]}
case("headers-present", {**base, "headers": [["x-tenant", "acme"], ["Accept-Language", "en"]]}, H)
case("headers-case-and-trim", {**base, "headers": [["X-TENANT", " \tacme "], ["accept-language", "en\t"]]}, H)
case("headers-unconfigured-ignored", {**base, "headers": [["x-tenant", "acme"], ["Accept-Language", "en"], ["X-Request-Id", "r-123"]]}, H)
case("headers-missing", {**base, "headers": [["x-tenant", "acme"]]}, H)
case("headers-empty-value", {**base, "headers": [["x-tenant", "acme"], ["accept-language", ""]]}, H)
case("headers-repeated", {**base, "headers": [["x-tenant", "acme"], ["accept-language", "en"], ["accept-language", "fr"]]}, H)
case("headers-repeated-other-order", {**base, "headers": [["accept-language", "fr"], ["x-tenant", "acme"], ["accept-language", "en"]]}, H)
case("headers-duplicate-config-names", {**base, "headers": [["x-tenant", "acme"], ["Accept-Language", "en"]]}, {"header_names": ["x-tenant", "X-Tenant", "accept-language"]})
X = {"exclude": ["/client_timestamp", "/trace/id"]}
case("exclude-volatile", {**base, "body": '{"amount":1250,"client_timestamp":"2026-11-30T10:00:00Z","trace":{"id":"t-1","hop":2}}'}, X)
case("exclude-volatile-other-values", {**base, "body": '{"trace":{"hop":2,"id":"t-999"},"client_timestamp":"2026-12-01T00:00:00Z","amount":1250}'}, X)
case("exclude-array-element", {**base, "body": '{"items":[{"nonce":1},{"sku":"a"}]}'}, {"exclude": ["/items/0"]})
case("numbers-rfc-mode-rounds", {**base, "body": '{"amount":9007199254740993}'}, {"numbers": "rfc"})
case("numbers-rfc-mode-same-double", {**base, "body": '{"amount":9007199254740992}'}, {"numbers": "rfc"})
K = {"hmac_key_hex": b"server-secret-key-0001".hex()}
case("hmac-basic", base, K)
case("hmac-other-key", base, {"hmac_key_hex": b"server-secret-key-0002".hex()})
case("hmac-with-headers-and-exclusions", {**base, "headers": [["x-tenant", "acme"]], "body": '{"amount":1250,"client_timestamp":1}'}, {**K, "header_names": ["x-tenant"], "exclude": ["/client_timestamp"]})
case("error-precision-loss", {**base, "body": '{"amount":9007199254740993}'}, error={"code": "precision_loss", "offset": 10, "pointer": "/amount"})
case("error-duplicate-member", {**base, "body": '{"amount":1,"amount":2}'}, error={"code": "duplicate_member", "offset": 12, "pointer": "/amount"})
case("error-invalid-json", {**base, "body": '{"amount":1,}'}, error={"code": "trailing_comma", "offset": 11, "pointer": ""})
case("error-invalid-utf8-json", {**{k: v for k, v in base.items() if k != "body"}, "body_hex": b'{"a":"\xff"}'.hex()}, error={"code": "invalid_utf8", "offset": 6, "pointer": "/a"})
case("error-bad-pointer", base, {"exclude": ["client_timestamp"]}, error={"code": "pointer_missing_slash"})
case("error-root-pointer", base, {"exclude": [""]}, error={"code": "root_pointer"})
case("error-empty-hmac-key", base, {"hmac_key_hex": ""}, error={"code": "empty_hmac_key"})
case("error-bad-header-name", base, {"header_names": ["x tenant"]}, error={"code": "invalid_header_name"})


def main():
    by_name = {c["name"]: c for c in CASES}

    def same(a, b):
        assert by_name[a]["fingerprint"] == by_name[b]["fingerprint"], (a, b)

    def differ(a, b):
        assert by_name[a]["fingerprint"] != by_name[b]["fingerprint"], (a, b)

    for n in ["json-lowercase-method", "json-reordered-whitespace", "json-number-spelling", "json-escaped-strings", "json-charset-param", "json-suffix-type", "json-uppercase-type"]:
        same("json-basic", n)
    for n in ["json-other-amount", "json-other-route", "other-text-plain", "empty-body-json", "hmac-basic"]:
        differ("json-basic", n)
    same("other-text-plain", "other-no-content-type")
    differ("empty-body-json", "empty-body-other")
    same("headers-present", "headers-case-and-trim")
    same("headers-present", "headers-unconfigured-ignored")
    same("headers-present", "headers-duplicate-config-names")
    differ("headers-missing", "headers-empty-value")
    differ("headers-repeated", "headers-repeated-other-order")
    same("exclude-volatile", "exclude-volatile-other-values")
    same("numbers-rfc-mode-rounds", "numbers-rfc-mode-same-double")
    differ("hmac-basic", "hmac-other-key")
    doc = {
        "format": "idempo-fingerprint-vectors/1",
        "description": "Request fingerprints (spec/CANONICAL.md section 2). See spec/vectors/README.md.",
        "cases": CASES,
    }
    with open(os.path.join(HERE, "fingerprint.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(doc, f, ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"fingerprint.json: {len(CASES)} cases")


if __name__ == "__main__":
    main()
