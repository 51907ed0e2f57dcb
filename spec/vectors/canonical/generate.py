#!/usr/bin/env python3
"""Generate idempo's canonical-JSON vectors (spec/vectors/canonical/*.json).

The expected outputs are NOT produced by idempo. Positive cases are computed by an independent
oracle: Python's `json` parser (strict: duplicate names, NaN/Infinity and non-finite numbers are
refused) feeding the `rfc8785` package (PyPI, 0.1.4) for the canonical bytes; every number is
converted to a double first (`float(int(s))` / `float(s)`, both correctly rounded), which is what
RFC 8785 requires and sidesteps rfc8785's refusal of integers beyond 2^53. The precision rule
(NumberMode::RejectPrecisionLoss) is computed with `decimal.Decimal`: a literal is accepted iff
Decimal(literal) == Decimal(repr(double)) (Python's repr is the shortest round-trip form).

Error cases are the project's normative decisions (code, byte offset, JSON pointer), written by
hand below; offsets are computed from marker substrings so they cannot drift. The script checks
that Python's strict parser also refuses each error case it is able to judge.

Run:  pip install rfc8785==0.1.4 && python3 spec/vectors/canonical/generate.py
The output is deterministic (fixed seeds); CI does not run this script, it reads the JSON files.
"""
import decimal
import json
import os
import random
import sys

try:
    import rfc8785
except ImportError:  # pragma: no cover
    sys.exit("generate.py needs the oracle: pip install rfc8785==0.1.4")

sys.setrecursionlimit(20000)
HERE = os.path.dirname(os.path.abspath(__file__))
decimal.getcontext().prec = 2000


class OracleReject(Exception):
    pass


def _pairs(pairs):
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise OracleReject("duplicate")
        seen.add(k)
    return dict(pairs)


def _const(name):
    raise OracleReject("constant " + name)


def oracle(text: bytes, mode: str):
    """Canonical bytes per the oracle, or raise OracleReject / ValueError."""
    numbers = []

    def num(s):
        try:
            v = float(int(s)) if all(c in "-0123456789" for c in s) else float(s)
        except OverflowError:
            raise OracleReject("overflow") from None
        if v in (float("inf"), float("-inf")):
            raise OracleReject("overflow")
        numbers.append((s, v))
        return v

    s = text.decode("utf-8")  # raises on invalid UTF-8
    if s.startswith("\ufeff"):
        raise OracleReject("bom")
    value = json.loads(
        s, object_pairs_hook=_pairs, parse_constant=_const, parse_int=num, parse_float=num
    )
    if mode == "reject_precision_loss":
        for lit, v in numbers:
            if decimal.Decimal(lit) != decimal.Decimal(repr(v)):
                raise OracleReject("precision " + lit)
    return rfc8785.dumps(value)


def precision_ok(lit: str) -> bool:
    v = float(lit)
    return v not in (float("inf"), float("-inf")) and decimal.Decimal(lit) == decimal.Decimal(repr(v))


CASES = {}


def add(file, name, data, mode="rfc", output=None, error=None, limits=None, exclude=None):
    case = {"name": name}
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        text = data.decode("utf-8")
        if text.startswith("\ufeff"):
            raise UnicodeDecodeError("utf-8", data, 0, 1, "bom kept as hex")
        case["input"] = text
    except UnicodeDecodeError:
        case["input_hex"] = data.hex()
    case["mode"] = mode
    if limits:
        case["limits"] = limits
    if exclude:
        case["exclude"] = exclude
    if error is not None:
        code, offset, pointer = error
        case["error"] = {"code": code, "offset": offset, "pointer": pointer}
    else:
        if output is None:
            output = oracle(data, mode)
        case["output"] = output.decode("utf-8") if isinstance(output, bytes) else output
    names = {c["name"] for c in CASES.setdefault(file, [])}
    assert name not in names, name
    CASES[file].append(case)


def ok(file, name, text, mode="rfc", expect=None, **kw):
    """A positive case; `expect` (if given) is a hand-written expectation that must agree."""
    out = oracle(text.encode("utf-8") if isinstance(text, str) else text, mode)
    if expect is not None:
        assert out == expect.encode("utf-8"), (name, out, expect)
    add(file, name, text, mode, output=out, **kw)


def err(file, name, data, code, offset, pointer, mode="rfc", python_rejects=True, **kw):
    if isinstance(data, str):
        data = data.encode("utf-8")
    if python_rejects and not kw.get("limits"):
        try:
            oracle(data, mode)
        except (OracleReject, ValueError, UnicodeDecodeError, RecursionError):
            pass
        else:
            raise AssertionError(f"oracle accepts error case {name}")
    add(file, name, data, mode, error=(code, offset, pointer), **kw)


def at(text, marker, nth=0):
    """Byte offset of the nth occurrence of `marker` in `text`."""
    b = text.encode("utf-8") if isinstance(text, str) else text
    m = marker.encode("utf-8") if isinstance(marker, str) else marker
    i = -1
    for _ in range(nth + 1):
        i = b.index(m, i + 1)
    return i


# ---------------------------------------------------------------------------------------------
# structure
F = "structure"
ok(F, "null", "null", expect="null")
ok(F, "true", "true", expect="true")
ok(F, "false", "false", expect="false")
ok(F, "top-level-string", '"hello"', expect='"hello"')
ok(F, "top-level-number", "42", expect="42")
ok(F, "empty-object", "{}", expect="{}")
ok(F, "empty-array", "[]", expect="[]")
ok(F, "whitespace-everywhere", ' \t\r\n{ "b" : [ 1 , 2 ] ,\n\t"a" : { } } \n', expect='{"a":{},"b":[1,2]}')
ok(F, "array-order-kept", "[3,1,2]", expect="[3,1,2]")
ok(F, "nested-sort", '{"z":{"y":1,"x":[{"b":1,"a":2}]},"a":null}', expect='{"a":null,"z":{"x":[{"a":2,"b":1}],"y":1}}')
ok(F, "literals-in-array", "[true,false,null]", expect="[true,false,null]")
ok(F, "empty-in-empty", "[[],{},[{}]]", expect="[[],{},[{}]]")
ok(F, "rfc8785-3.2.2-sample", '{\n  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],\n  "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",\n  "literals": [null, true, false]\n}')
ok(F, "depth-128", "[" * 128 + "]" * 128)
ok(F, "depth-128-objects", '{"a":' * 127 + "{}" + "}" * 127)
ok(F, "crlf-whitespace", '{\r\n"a"\r\n:\r\n1\r\n}\r\n', expect='{"a":1}')
rng = random.Random(1)
for i in range(30):
    # Random nested documents with shuffled members and random whitespace.
    def gen(depth):
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice([None, True, False, rng.randint(-1000, 1000), rng.random() * 1000, "s%d" % rng.randint(0, 99)])
        if r < 0.6:
            return [gen(depth + 1) for _ in range(rng.randint(0, 4))]
        return {("k%d" % rng.randint(0, 30)): gen(depth + 1) for _ in range(rng.randint(0, 5))}

    doc = gen(0)

    def dump(v):
        def ws():
            return rng.choice(["", " ", "\n", "\t", "  ", "\r\n"])
        if isinstance(v, dict):
            items = list(v.items())
            rng.shuffle(items)
            return "{" + ws() + ("," + ws()).join(json.dumps(k) + ws() + ":" + ws() + dump(x) for k, x in items) + ws() + "}"
        if isinstance(v, list):
            return "[" + ws() + ("," + ws()).join(dump(x) for x in v) + ws() + "]"
        return json.dumps(v)

    ok(F, f"random-doc-{i:02}", dump(doc))

# ---------------------------------------------------------------------------------------------
# strings
F = "strings"
ok(F, "simple-escapes", '"\\" \\\\ \\/ \\b \\f \\n \\r \\t"', expect='"\\" \\\\ / \\b \\f \\n \\r \\t"')
for cp in range(0x20):
    ok(F, f"control-u{cp:04x}", f'"\\u{cp:04X}"')
ok(F, "del-raw", '"\\u007f"', expect='"\x7f"')
ok(F, "line-separators-raw", '"\\u2028\\u2029"', expect='"\u2028\u2029"')
ok(F, "escaped-latin1", '"caf\\u00e9"', expect='"caf\u00e9"')
ok(F, "escaped-uppercase-hex", '"\\u00C9\\u00E9"', expect='"\u00c9\u00e9"')
ok(F, "raw-utf8", '"caf\u00e9 \u65e5\u672c \U0001F600"', expect='"caf\u00e9 \u65e5\u672c \U0001F600"')
ok(F, "escaped-surrogate-pair", '"\\ud83d\\ude00"', expect='"\U0001F600"')
ok(F, "escaped-surrogate-pair-upper", '"\\uD834\\uDD1E"', expect='"\U0001D11E"')
ok(F, "noncharacter-ffff", '"\\uffff"', expect='"\uffff"')
ok(F, "noncharacter-fdd0-raw", '"\ufdd0"', expect='"\ufdd0"')
ok(F, "noncharacter-10ffff", '"\U0010FFFF"', expect='"\U0010FFFF"')
ok(F, "bom-inside-string", '"\ufeff"', expect='"\ufeff"')
ok(F, "nul-escaped", '"a\\u0000b"', expect='"a\\u0000b"')
ok(F, "no-normalization", '"A\\u030a"', expect='"A\u030a"')
ok(F, "slash-not-escaped", '"a/b"', expect='"a/b"')
ok(F, "empty-string", '""', expect='""')
ok(F, "long-string", '"' + "x" * 5000 + '"')
ok(F, "escape-at-chunk-boundaries", '"abcdefg\\nabcdefgh\\tabcdefghi\\u0041"')
rng = random.Random(2)
POOL = ["a", "Z", "~", " ", "\u00e9", "\u00ff", "\u0100", "\u07ff", "\u0800", "\u4e2d", "\ud7ff", "\ue000", "\ufb33", "\uffee", "\U00010000", "\U0001F600", "\U0010FFFF", "\x00", "\x1f", "\x7f", '"', "\\", "/", "\u2028"]
for i in range(60):
    chars = [rng.choice(POOL) for _ in range(rng.randint(1, 12))]
    enc = []
    for c in chars:
        cp = ord(c)
        if cp < 0x20 or c in '"\\' or rng.random() < 0.4:
            if cp >= 0x10000:
                v = cp - 0x10000
                enc.append("\\u%04x\\u%04X" % (0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)))
            else:
                enc.append(rng.choice(["\\u%04x", "\\u%04X"]) % cp)
        else:
            enc.append(c)
    ok(F, f"random-string-{i:02}", '"' + "".join(enc) + '"')

# ---------------------------------------------------------------------------------------------
# ordering
F = "ordering"
ok(F, "utf16-emoji-before-fb33", '{"\ufb33":1,"\U0001F600":2}', expect='{"\U0001F600":2,"\ufb33":1}')
ok(F, "utf16-emoji-after-d7ff", '{"\U0001F600":1,"\ud7ff":2}', expect='{"\ud7ff":2,"\U0001F600":1}')
ok(F, "utf16-e000", '{"\ue000":1,"\U00010000":2}', expect='{"\U00010000":2,"\ue000":1}')
ok(F, "case-order", '{"b":1,"a":2,"B":3,"A":4}', expect='{"A":4,"B":3,"a":2,"b":1}')
ok(F, "prefix-order", '{"ab":1,"a":2,"":3,"a\\u0000":4}')
ok(F, "numeric-strings", '{"10":1,"1":2,"d":3,"2":4}', expect='{"1":2,"10":1,"2":4,"d":3}')
ok(F, "sort-unescaped-newline", '{"\\n":1,"\\\\":2,"m":3}')
ok(F, "escaped-key-order", '{"\\u0062":1,"a":2}', expect='{"a":2,"b":1}')
ok(F, "long-common-prefix", '{"customer_name":1,"customer_id":2,"customer_email":3,"customer":4}')
ok(F, "nfc-nfd-distinct", '{"\u00e9":1,"e\u0301":2}')
ok(F, "key-with-nul-prefix", '{"a\\u0000b":1,"a":2,"a\\u0000":3}')
ok(F, "eight-byte-prefix-tie", '{"abcdefghZ":1,"abcdefgh":2,"abcdefghA":3,"abcdefg\\u00e9":4}')
rng = random.Random(3)
KEYPOOL = ["a", "b", "A", "_", "0", "9", "\u00e9", "\u00c0", "\u0391", "\u4e2d", "\u65e5", "\ue000", "\uf8ff", "\ufb33", "\uff21", "\ufffd", "\U00010000", "\U0001F600", "\U0001F4A9", "\U00020000", "\U0010FFFF", "\x01", " "]
for i in range(80):
    keys = set()
    while len(keys) < rng.randint(2, 25):
        keys.add("".join(rng.choice(KEYPOOL) for _ in range(rng.randint(0, 4))))
    keys = list(keys)
    rng.shuffle(keys)

    def enc(k):
        out = []
        for c in k:
            cp = ord(c)
            if cp < 0x20 or rng.random() < 0.3:
                if cp >= 0x10000:
                    v = cp - 0x10000
                    out.append("\\u%04x\\u%04x" % (0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)))
                else:
                    out.append("\\u%04x" % cp)
            else:
                out.append(c)
        return '"' + "".join(out) + '"'

    ok(F, f"random-keys-{i:02}", "{" + ",".join(f"{enc(k)}:{j}" for j, k in enumerate(keys)) + "}")
# Same-shaped objects in an array (exercises shape reuse) with one differing shape.
ok(F, "repeated-shapes", "[" + ",".join('{"b":%d,"a":%d,"c":{"y":1,"x":2}}' % (i, i) for i in range(5)) + ',{"b":1,"a":2,"d":3}' + "]")
ok(F, "repeated-shapes-varying-keys", '[{"b":1,"a":2},{"b":1,"c":2},{"b":1,"a":2},{"a":1,"b":2}]')

# ---------------------------------------------------------------------------------------------
# numbers
F = "numbers"
EDGE = [
    "0", "-0", "0.0", "-0.0", "0e0", "0E+10", "-0e-10", "1", "-1", "1.0", "1.10", "100", "1e2", "1E2", "1e+2",
    "1e-2", "0.1", "0.2", "0.3", "0.30000000000000004", "0.10000000000000001", "1e21", "999999999999999900000",
    "999999999999999999999", "1e20", "123456789012345678901", "1e-6", "0.000001", "1e-7", "0.0000001", "5e-7",
    "5e-324", "4.9e-324", "2.5e-324", "1.7976931348623157e308", "1.7976931348623157E+308", "1e-400", "-1e-400",
    "9007199254740991", "9007199254740992", "9007199254740993", "-9007199254740993", "9007199254740994",
    "18446744073709551615", "18446744073709551616", "1152921504606846976", "295147905179352825856",
    "1424953923781206.25", "1424953923781206.2", "1549363236687059.3", "1549363236687059.2", "1.5493632366870593e15", "333333333.33333329", "1E30", "4.50", "2e-3",
    "0.000000000000000000000000001", "123456789012345", "1234567890123456", "12345678901234567",
    "123456789012345678", "-123456789012345", "100000000000000000000", "1e05", "1e-05", "12.34e1",
    "0.00001", "0.000010", "10.0000", "-5.5e-7", "3.14159265358979323846", "2.718281828459045",
    "1.5e300", "-1.5e-300", "1e308", "1e-323", "2.2250738585072014e-308", "2.2250738585072011e-308",
    "4503599627370496.5", "4503599627370497", "0.5", "0.25", "0.125", "7.0e-10", "65536", "1e15", "1e16",
    "1e17", "99999999999999999", "0.99999999999999999", "1.00000000000000000001",
]
rng = random.Random(4)
lits = list(EDGE)
for _ in range(60):  # random finite doubles, shortest form
    while True:
        v = struct_v = __import__("struct").unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if v == v and v not in (float("inf"), float("-inf")):
            break
    lits.append(repr(v).replace("e+", "e"))
for _ in range(40):  # random decimal literals, often longer than a double can hold
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 22))).lstrip("0") or "0"
    frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 6)))
    exp = rng.choice(["", "e%d" % rng.randint(-30, 30), "E+%d" % rng.randint(0, 20)])
    lits.append(("-" if rng.random() < 0.3 else "") + digits + ("." + frac if frac else "") + exp)
for _ in range(30):  # integers around 2^53 and 2^64
    base = rng.choice([2**53, 2**54, 2**63, 2**64, 10**16, 10**17])
    lits.append(str(base + rng.randint(-5, 5)))
seen = set()
for n, lit in enumerate(lits):
    if lit in seen:
        continue
    seen.add(lit)
    v = float(lit)
    if v in (float("inf"), float("-inf")):
        err(F, f"overflow-{n:03}", lit, "number_out_of_range", 0, "")
        continue
    # rfc mode at top level; strict mode inside an object (exercises the pointer).
    ok(F, f"rfc-{n:03}", lit)
    doc = '{"v":[' + lit + "]}"
    if precision_ok(lit):
        ok(F, f"strict-{n:03}", doc, mode="reject_precision_loss")
    else:
        err(F, f"strict-{n:03}", doc, "precision_loss", 6, "/v/0", mode="reject_precision_loss")
ok(F, "rfc-big-integers-round", "[9007199254740993,295147905179352825856]", expect="[9007199254740992,295147905179352830000]")
ok(F, "rfc-precision-lost-silently", "0.10000000000000001", expect="0.1")
err(F, "strict-first-loss-reported", '{"b":0.1,"a":[1,9007199254740993],"c":1e-400}', "precision_loss", at('{"b":0.1,"a":[1,9007199254740993],"c":1e-400}', "9007"), "/a/1", mode="reject_precision_loss")
ok(F, "strict-exact-values", "[0.1,1.10,100,1e2,-0,5e-324,1e21,0.000001]", mode="reject_precision_loss", expect="[0.1,1.1,100,100,0,5e-324,1e+21,0.000001]")

# ---------------------------------------------------------------------------------------------
# errors
F = "errors"
E = err
E(F, "empty-input", "", "unexpected_end", 0, "")
E(F, "only-whitespace", "  \n", "unexpected_end", 3, "")
E(F, "bom-object", b"\xef\xbb\xbf{}", "byte_order_mark", 0, None)
E(F, "bom-number", b"\xef\xbb\xbf1", "byte_order_mark", 0, None)
# invalid UTF-8
E(F, "utf8-ff", b'["\xff"]', "invalid_utf8", 2, "/0")
E(F, "utf8-truncated-2", b'["a\xc3"]', "invalid_utf8", 3, "/0")
E(F, "utf8-overlong-slash", b'"\xc0\xaf"', "invalid_utf8", 1, "")
E(F, "utf8-overlong-3", b'"\xe0\x80\xaf"', "invalid_utf8", 1, "")
E(F, "utf8-truncated-4", b'"\xf0\x9f\x98"', "invalid_utf8", 1, "")
E(F, "utf8-above-10ffff", b'"\xf4\x90\x80\x80"', "invalid_utf8", 1, "")
E(F, "utf8-lone-continuation", b'"a\x80"', "invalid_utf8", 2, "")
E(F, "utf8-in-key", b'{"\xfe":1}', "invalid_utf8", 2, "")
E(F, "utf8-outside-string", b"[1,\xff]", "invalid_utf8", 3, "/1")
E(F, "utf8-after-value", b"1\xff", "invalid_utf8", 1, None)
E(F, "utf8-late-in-long-string", b'"' + b"a" * 37 + b'\xe2\x82"', "invalid_utf8", 38, "")
# surrogates
E(F, "raw-surrogate-high", b'"\xed\xa0\x80"', "lone_surrogate", 1, "")
E(F, "raw-surrogate-low", b'["\xed\xbf\xbf"]', "lone_surrogate", 2, "/0")
E(F, "raw-surrogate-pair-cesu8", b'"\xed\xa0\xbd\xed\xb8\x80"', "lone_surrogate", 1, "")
E(F, "escaped-lone-high", '"\\ud800"', "lone_surrogate", 1, "", python_rejects=False)
E(F, "escaped-lone-low", '"\\udc00"', "lone_surrogate", 1, "", python_rejects=False)
E(F, "escaped-reversed-pair", '"\\udc00\\ud800"', "lone_surrogate", 1, "", python_rejects=False)
E(F, "escaped-high-then-bmp", '"\\ud800\\u0041"', "lone_surrogate", 1, "", python_rejects=False)
E(F, "escaped-high-then-char", '"\\ud800x"', "lone_surrogate", 1, "", python_rejects=False)
E(F, "escaped-high-then-high", '"\\ud800\\ud800"', "lone_surrogate", 1, "", python_rejects=False)
E(F, "escaped-high-at-end", '"a\\uD83D"', "lone_surrogate", 2, "", python_rejects=False)
E(F, "escaped-lone-in-array", '["ok","\\uDFFF"]', "lone_surrogate", 7, "/1", python_rejects=False)
E(F, "escaped-lone-in-key", '{"\\ud800":1}', "lone_surrogate", 2, "", python_rejects=False)
E(F, "escaped-lone-nested", '{"a":{"b":"x\\udfff"}}', "lone_surrogate", at('{"a":{"b":"x\\udfff"}}', "\\"), "/a/b", python_rejects=False)
# duplicates
E(F, "dup-plain", '{"a":1,"a":2}', "duplicate_member", 7, "/a")
E(F, "dup-after-unescape", '{"a":1,"\\u0061":2}', "duplicate_member", 7, "/a")
E(F, "dup-escaped-first", '{"\\u0061":1,"a":2}', "duplicate_member", 12, "/a")
E(F, "dup-nonascii-escape", '{"\u00e9":1,"\\u00e9":2}', "duplicate_member", at('{"\u00e9":1,"\\u00e9":2}', ',"') + 1, "/\u00e9")
E(F, "dup-among-many", '{"b":1,"a":2,"c":3,"a":4}', "duplicate_member", 19, "/a")
E(F, "dup-nested-in-array", '{"x":[{"k":1,"k":2}]}', "duplicate_member", 13, "/x/0/k")
E(F, "dup-pointer-escaping", '{"a/b":{"c~d":1,"c~d":2}}', "duplicate_member", 16, "/a~1b/c~0d")
E(F, "dup-surrogate-pair-vs-raw", '{"\U0001F600":1,"\\ud83d\\ude00":2}', "duplicate_member", at('{"\U0001F600":1,"\\ud83d\\ude00":2}', ',"') + 1, "/\U0001F600")
E(F, "dup-empty-name", '{"":1,"":2}', "duplicate_member", 6, "/")
E(F, "dup-same-value", '{"a":1,"a":1}', "duplicate_member", 7, "/a")
E(F, "dup-long-names", '{"%s":1,"%s":2}' % ("k" * 40, "k" * 40), "duplicate_member", 46, "/" + "k" * 40)
# NaN / Infinity / overflow
E(F, "nan", "NaN", "non_finite_number", 0, "")
E(F, "infinity", "Infinity", "non_finite_number", 0, "")
E(F, "minus-infinity", "-Infinity", "non_finite_number", 0, "")
E(F, "nan-in-array", "[NaN]", "non_finite_number", 1, "/0")
E(F, "infinity-in-object", '{"a":Infinity}', "non_finite_number", 5, "/a")
E(F, "overflow-1e400", "1e400", "number_out_of_range", 0, "")
E(F, "overflow-negative", "-1e309", "number_out_of_range", 0, "")
E(F, "overflow-in-array", "[1,1.8e308]", "number_out_of_range", 3, "/1")
E(F, "overflow-long-integer", "1" + "0" * 400, "number_out_of_range", 0, "")
# number grammar
E(F, "leading-zero", "01", "leading_zero", 0, "")
E(F, "leading-zero-negative", "-01", "leading_zero", 0, "")
E(F, "double-zero", "00", "leading_zero", 0, "")
E(F, "leading-zero-decimal", "00.5", "leading_zero", 0, "")
E(F, "leading-zero-in-array", "[0123]", "leading_zero", 1, "/0")
E(F, "plus-sign", "+1", "invalid_number", 0, "")
E(F, "plus-in-array", "[+1]", "invalid_number", 1, "/0")
E(F, "bare-fraction", ".5", "invalid_number", 0, "")
E(F, "bare-fraction-in-object", '{"a":.5}', "invalid_number", 5, "/a")
E(F, "trailing-dot", "1.", "invalid_number", 0, "")
E(F, "dot-exponent", "1.e5", "invalid_number", 0, "")
E(F, "empty-exponent", "1e", "invalid_number", 0, "")
E(F, "signed-empty-exponent", "1e+", "invalid_number", 0, "")
E(F, "lone-minus", "-", "unexpected_end", 1, "")
E(F, "minus-letter", "-a", "invalid_number", 0, "")
E(F, "minus-in-array", "[-]", "invalid_number", 1, "/0")
E(F, "hex-number", "0x10", "trailing_data", 1, None)
E(F, "two-dots", "1.5.3", "trailing_data", 3, None)
# literals and stray characters
E(F, "literal-tru", "tru", "invalid_literal", 0, "")
E(F, "literal-nul", "[nul]", "invalid_literal", 1, "/0")
E(F, "literal-fals", '{"a":fals}', "invalid_literal", 5, "/a")
E(F, "literal-nan-lower", "nan", "invalid_literal", 0, "")
E(F, "literal-capital-true", "True", "unexpected_character", 0, "")
E(F, "single-quotes", "'a'", "unexpected_character", 0, "")
E(F, "unquoted-key", "{a:1}", "unexpected_character", 1, "")
E(F, "missing-colon", '{"a" 1}', "unexpected_character", 5, "/a")
E(F, "missing-comma-object", '{"a":1 "b":2}', "unexpected_character", 7, "/a")
E(F, "missing-comma-array", "[1 2]", "unexpected_character", 3, "/0")
E(F, "missing-value", '{"a":}', "unexpected_character", 5, "/a")
E(F, "lone-close-bracket", "]", "unexpected_character", 0, "")
E(F, "lone-close-brace", "}", "unexpected_character", 0, "")
E(F, "mismatched-close", "[1}", "unexpected_character", 2, "/0")
E(F, "hash-comment", "# c\n1", "unexpected_character", 0, "")
E(F, "array-leading-comma", "[,]", "unexpected_character", 1, "/0")
E(F, "array-double-comma", "[1,,2]", "unexpected_character", 3, "/1")
E(F, "object-leading-comma", "{,}", "unexpected_character", 1, "")
# trailing data
E(F, "two-values", "1 2", "trailing_data", 2, None)
E(F, "object-then-garbage", "{}x", "trailing_data", 2, None)
E(F, "extra-close", "[1]]", "trailing_data", 3, None)
E(F, "literal-then-letters", "truex", "trailing_data", 4, None)
E(F, "two-strings", '"a""b"', "trailing_data", 3, None)
E(F, "slash-after-value", "1/", "trailing_data", 1, None)
E(F, "nul-after-value", "{}\x00", "trailing_data", 2, None)
# comments
E(F, "block-comment-before", "/* c */ 1", "comment", 0, "")
E(F, "line-comment-in-array", "[1, // c\n 2]", "comment", 4, "/1")
E(F, "block-comment-in-object", '{"a":1 /* */}', "comment", 7, "/a")
E(F, "line-comment-after", "[1]//c", "comment", 3, None)
# trailing commas
E(F, "trailing-comma-array", "[1,]", "trailing_comma", 2, "")
E(F, "trailing-comma-array-space", "[1, ]", "trailing_comma", 2, "")
E(F, "trailing-comma-object", '{"a":1,}', "trailing_comma", 6, "")
E(F, "trailing-comma-nested", '{"a":[1,],"b":1}', "trailing_comma", 7, "/a")
E(F, "trailing-comma-deep-object", '{"a":{"b":1,}}', "trailing_comma", 11, "/a")
# whitespace
E(F, "vertical-tab", "\x0b1", "invalid_whitespace", 0, "")
E(F, "form-feed-in-array", "[1,\x0c2]", "invalid_whitespace", 3, "/1")
E(F, "nbsp-before", "\u00a01", "invalid_whitespace", 0, "")
E(F, "nbsp-after", "1\u00a0", "invalid_whitespace", 1, None)
E(F, "line-separator", "[1,\u20282]", "invalid_whitespace", 3, "/1")
E(F, "ideographic-space-before-colon", '{"a"\u3000:1}', "invalid_whitespace", 4, "/a")
E(F, "bom-inside-array", "[\ufeff1]", "invalid_whitespace", 1, "/0")
E(F, "nel", "[\u00851]", "invalid_whitespace", 1, "/0")
# strings
E(F, "control-soh", '"a\x01b"', "control_character", 2, "")
E(F, "control-nul", '"\x00"', "control_character", 1, "")
E(F, "control-newline-in-array", '["\n"]', "control_character", 2, "/0")
E(F, "control-tab", '"\t"', "control_character", 1, "")
E(F, "control-unit-separator-in-key", '{"\x1f":1}', "control_character", 2, "")
E(F, "escape-x", '"\\x41"', "invalid_escape", 1, "")
E(F, "escape-short-u", '"\\u12"', "invalid_escape", 1, "")
E(F, "escape-bad-hex", '"\\u12G4"', "invalid_escape", 1, "")
E(F, "escape-capital-u", '"\\U0041"', "invalid_escape", 1, "")
E(F, "escape-single-quote", "\"\\'\"", "invalid_escape", 1, "")
E(F, "escape-zero", '"\\0"', "invalid_escape", 1, "")
E(F, "escape-in-key", '{"a\\qb":1}', "invalid_escape", 3, "")
# unexpected end
E(F, "unterminated-string", '"abc', "unexpected_end", 4, "")
E(F, "unterminated-string-in-array", '["a', "unexpected_end", 3, "/0")
E(F, "unterminated-after-colon", '{"a":', "unexpected_end", 5, "/a")
E(F, "unterminated-array", "[1", "unexpected_end", 2, "/0")
E(F, "unterminated-object", "{", "unexpected_end", 1, "")
E(F, "unterminated-open-array", "[", "unexpected_end", 1, "/0")
E(F, "unterminated-escape", '"\\', "unexpected_end", 2, "")
E(F, "unterminated-unicode-escape", '"\\u00', "unexpected_end", 5, "")
E(F, "unterminated-literal", "[tr", "invalid_literal", 1, "/0")
# depth (default limit 128)
E(F, "depth-129", "[" * 129 + "]" * 129, "depth_limit", 128, "/0" * 128, python_rejects=False)
E(F, "depth-10000", "[" * 10000 + "]" * 10000, "depth_limit", 128, "/0" * 128, python_rejects=False)
E(F, "depth-129-objects", '{"a":' * 129 + "1" + "}" * 129, "depth_limit", 5 * 128, "/a" * 128, python_rejects=False)
# precision mode specifics
E(F, "precision-big-int", '{"amount":9007199254740993}', "precision_loss", 10, "/amount", mode="reject_precision_loss")
E(F, "precision-decimal", "0.10000000000000001", "precision_loss", 0, "", mode="reject_precision_loss")
E(F, "precision-underflow", "[1e-400]", "precision_loss", 1, "/0", mode="reject_precision_loss")
E(F, "precision-long-exact-double", "1152921504606846976", "precision_loss", 0, "", mode="reject_precision_loss")
E(F, "precision-after-syntax-error", "[9007199254740993,]", "trailing_comma", 17, "", mode="reject_precision_loss")

# ---------------------------------------------------------------------------------------------
# limits (explicit limits; unspecified fields keep their defaults)
F = "limits"
E(F, "max-depth-3-arrays", "[[[[1]]]]", "depth_limit", 3, "/0/0/0", limits={"max_depth": 3})
ok(F, "max-depth-3-ok", "[[[1]]]", limits={"max_depth": 3})
E(F, "max-depth-3-objects", '{"a":{"b":{"c":{}}}}', "depth_limit", 15, "/a/b/c", limits={"max_depth": 3})
E(F, "max-depth-0-array", "[]", "depth_limit", 0, "", limits={"max_depth": 0})
ok(F, "max-depth-0-scalar", '"x"', limits={"max_depth": 0})
E(F, "max-members-2", '{"a":1,"b":2,"c":3}', "too_many_members", 13, "/c", limits={"max_members": 2})
ok(F, "max-members-2-ok", '{"a":1,"n":{"x":1,"y":2}}', limits={"max_members": 2})
E(F, "max-members-nested", '[{"a":1},{"x":1,"y":2,"z":3}]', "too_many_members", 22, "/1/z", limits={"max_members": 2})
E(F, "max-input-bytes", "[1,2]", "input_too_large", 4, None, limits={"max_input_bytes": 4})
ok(F, "max-input-bytes-exact", "[12]", limits={"max_input_bytes": 4})
E(F, "max-input-before-bom", b"\xef\xbb\xbf[1]", "input_too_large", 4, None, limits={"max_input_bytes": 4})
ok(F, "depth-1000-configured", "[" * 1000 + "]" * 1000, limits={"max_depth": 1000})

# ---------------------------------------------------------------------------------------------
# exclusions (RFC 6901 pointers dropped during emission, as the fingerprint uses them)
F = "exclusions"


def drop(value, tokens, orig=None):
    """Oracle for exclusion: remove what each pointer designates (array indices are original)."""
    if not tokens:
        return value
    head, rest = tokens[0], tokens[1:]
    if isinstance(value, dict):
        if head not in value:
            return value
        if not rest:
            return {k: v for k, v in value.items() if k != head}
        return {**value, head: drop(value[head], rest)}
    if isinstance(value, list) and head.isdigit() and (head == "0" or not head.startswith("0")):
        i = int(head)
        if i >= len(value):
            return value
        if not rest:
            return [v for j, v in enumerate(value) if j != i]
        return [drop(v, rest) if j == i else v for j, v in enumerate(value)]
    return value


def decode_pointer(p):
    return [t.replace("~1", "/").replace("~0", "~") for t in p.split("/")[1:]]


_add = add


def add(file, name, data, mode="rfc", output=None, error=None, limits=None, exclude=None):  # noqa: F811
    if file == "exclusions" and error is None:
        # Independent check of the hand-written expectation. Array-element pointers are
        # applied from the highest original index down so the indices stay original.
        value = json.loads(data, object_pairs_hook=_pairs, parse_int=lambda s: float(int(s)), parse_float=float)
        ptrs = sorted((decode_pointer(p) for p in exclude), key=lambda t: [int(x) if x.isdigit() else -1 for x in t], reverse=True)
        for t in ptrs:
            value = drop(value, t)
        assert rfc8785.dumps(value).decode() == output, (name, rfc8785.dumps(value), output)
    _add(file, name, data, mode, output=output, error=error, limits=limits, exclude=exclude)

add(F, "drop-member", '{"a":1,"ts":2}', output='{"a":1}', exclude=["/ts"])
add(F, "drop-nested-member", '{"a":{"trace":"x","b":1}}', output='{"a":{"b":1}}', exclude=["/a/trace"])
add(F, "drop-array-element", '{"items":[1,2,3]}', output='{"items":[2,3]}', exclude=["/items/0"])
add(F, "original-indices", '{"items":[{"t":1,"v":1},{"t":2,"v":2}]}', output='{"items":[{"v":2}]}', exclude=["/items/0", "/items/1/t"])
add(F, "escaped-pointer", '{"a/b":1,"c~d":2,"e":3}', output='{"e":3}', exclude=["/a~1b", "/c~0d"])
add(F, "unescaped-member-name", '{"\\u0074s":1,"x":2}', output='{"x":2}', exclude=["/ts"])
add(F, "no-match-ignored", '{"a":1}', output='{"a":1}', exclude=["/b", "/a/b", "/0"])
add(F, "index-token-on-object", '{"0":1,"1":2}', output='{"1":2}', exclude=["/0"])
add(F, "leading-zero-index-not-array", "[1,2]", output="[1,2]", exclude=["/01", "/-"])
add(F, "empty-name", '{"":1,"a":2}', output='{"a":2}', exclude=["/"])
add(F, "all-members", '{"a":1}', output="{}", exclude=["/a"])
add(F, "excluded-still-validated", '{"ts":{"a":1,"a":2}}', error=("duplicate_member", 13, "/ts/a"), exclude=["/ts"])
add(F, "excluded-precision-not-checked", '{"ts":9007199254740993,"a":1}', mode="reject_precision_loss", output='{"a":1}', exclude=["/ts"])
add(F, "excluded-then-included-precision", '{"ts":1,"a":9007199254740993}', mode="reject_precision_loss", error=("precision_loss", 12, "/a"), exclude=["/ts"])


def main():
    total = 0
    for file, cases in CASES.items():
        doc = {
            "format": "idempo-canonical-vectors/1",
            "description": f"RFC 8785 canonicalization vectors: {file}. See spec/vectors/README.md.",
            "cases": cases,
        }
        with open(os.path.join(HERE, file + ".json"), "w", encoding="utf-8", newline="\n") as f:
            json.dump(doc, f, ensure_ascii=True, indent=1)
            f.write("\n")
        total += len(cases)
        print(f"{file}.json: {len(cases)} cases")
    print(f"total: {total}")


if __name__ == "__main__":
    main()
