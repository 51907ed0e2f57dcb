"""Fingerprint throughput: idempo (Rust core via pyo3) against two pure-Python recipes.

- ``json.dumps``: ``hashlib.sha256(json.dumps(json.loads(body), sort_keys=True,
  separators=(",", ":")).encode())`` (what many services do; not canonical: numbers, escapes and
  key order differ from RFC 8785);
- ``rfc8785``: ``hashlib.sha256(rfc8785.dumps(json.loads(body)))`` (canonical, pure Python).

Both recipes start from the raw body bytes, like idempo (which parses, canonicalizes, frames
method/route/headers and hashes). Also shown: ``hashlib.sha256(body)`` alone, the floor. Prints
figures and ratios; asserts nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import statistics
import sys
import timeit
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import idempo

try:
    import rfc8785
except ImportError:  # pragma: no cover - installed by the setup script
    rfc8785 = None


def bodies() -> Dict[str, bytes]:
    rng = random.Random(42)
    # About 200 bytes: the "~200-byte body".
    tiny = {"amount": 1000, "currency": "eur", "customer": "cus_9s6XKzkNRiz8i3",
            "description": "Order #1234", "metadata": {"order_id": "1234", "channel": "web"},
            "capture": True, "receipt_email": "ada@example.com"}
    medium = {
        "amount": 125_000, "currency": "usd", "customer": {"id": "cus_123", "email": "a@b.example",
                                                          "address": {"line1": "1 Main St", "city": "X"}},
        "items": [{"sku": f"sku-{i}", "qty": rng.randint(1, 9), "price": rng.randint(100, 99_999)}
                  for i in range(30)],
        "metadata": {f"k{i}": f"value-{i}" for i in range(20)},
    }
    large = {"events": [{"id": i, "type": "charge.succeeded", "amount": rng.randint(1, 10**9),
                         "tags": [f"t{j}" for j in range(5)], "note": "x" * 40}
                        for i in range(2000)]}
    numbers = {"values": [rng.uniform(-1e6, 1e6) for _ in range(500)] +
               [rng.randint(-10**15, 10**15) for _ in range(500)]}
    unicode = {"names": ["Zoë", "Łódź", "東京", "😀 emoji", "naïve café", "Ελληνικά", "עִבְרִית"] * 60,
               "keys": {"é": 1, "e": 2, "Ω": 3, "😀": 4, "a": 5}}
    out = {}
    for name, obj in [("tiny", tiny), ("medium", medium), ("large", large),
                      ("numbers", numbers), ("unicode", unicode)]:
        out[name] = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    out.update(shared_bodies())
    return out


def shared_bodies() -> Dict[str, bytes]:
    """The unicode-heavy bodies of ``evidence/bench/bodies.py`` (issue 17, "every body shape"; the
    same bytes ``make bench-peers`` times): supplementary characters and U+E000-U+FFFF in member
    names and values, written as UTF-8 (``uni-raw``) and as ``\\u`` escapes with surrogate pairs
    (``uni-esc``)."""
    path = Path(__file__).resolve().parents[3] / "evidence" / "bench" / "bodies.py"
    spec = importlib.util.spec_from_file_location("idempo_bench_bodies", path)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with the repo
        return {}
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shared = module.bodies()
    return {"uni-raw": shared["6-unicode-raw"], "uni-esc": shared["7-unicode-escaped"]}


def per_call(fn: Callable[[], object], min_time: float = 0.25) -> float:
    """Median seconds per call over 5 runs of an auto-sized loop."""
    timer = timeit.Timer(fn)
    n, _ = timer.autorange()
    n = max(1, int(n * min_time / 0.2))
    runs = [timer.timeit(n) / n for _ in range(5)]
    return statistics.median(runs)


def fmt(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:8.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.2f} µs"
    return f"{seconds * 1e3:8.2f} ms"


def main() -> int:
    fp = idempo.Fingerprinter()
    bound = fp.for_route("POST", "/payments")
    rows: List[Tuple[str, int, float, float, float, float, float, float]] = []
    for name, body in bodies().items():
        t_fp = per_call(lambda: idempo.fingerprint("POST", "/payments", body))
        t_prep = per_call(lambda: fp.fingerprint("POST", "/payments", body))
        t_bound = per_call(lambda: bound(body))
        t_dumps = per_call(lambda: hashlib.sha256(json.dumps(
            json.loads(body), sort_keys=True, separators=(",", ":")).encode()).digest())
        t_rfc = (per_call(lambda: hashlib.sha256(rfc8785.dumps(json.loads(body))).digest())
                 if rfc8785 is not None else float("nan"))
        t_sha = per_call(lambda: hashlib.sha256(body).digest())
        rows.append((name, len(body), t_fp, t_prep, t_bound, t_dumps, t_rfc, t_sha))

    print(f"idempo fingerprint benchmark (Python {sys.version.split()[0]}; median of 5 runs)")
    print(f"{'body':8} {'bytes':>8} | {'fingerprint':>11} {'prepared':>11} {'for_route':>11} | "
          f"{'json.dumps':>11} {'rfc8785':>11} {'sha256 only':>11} | {'x dumps':>8} {'x rfc8785':>9} "
          f"{'/ sha256':>8} | {'fn x dumps':>10} {'fn x rfc':>8}")
    for name, size, t_fp, t_prep, t_bound, t_dumps, t_rfc, t_sha in rows:
        best = min(t_fp, t_prep, t_bound)
        print(f"{name:8} {size:8d} | {fmt(t_fp)} {fmt(t_prep)} {fmt(t_bound)} | {fmt(t_dumps)} "
              f"{fmt(t_rfc)} {fmt(t_sha)} | {t_dumps / best:7.1f}x {t_rfc / best:8.1f}x "
              f"{best / t_sha:7.1f}x | {t_dumps / t_fp:9.1f}x {t_rfc / t_fp:7.1f}x")
    print("fingerprint: idempo.fingerprint(method, route, body); prepared: Fingerprinter.fingerprint;")
    print("for_route: Fingerprinter.for_route(method, route)(body), the per-route hot path.")
    print("x dumps / x rfc8785: how many times faster idempo's fastest call is than the recipe; "
          "/ sha256: that call's time over hashing the raw bytes alone; fn x ...: the same ratios "
          "for idempo.fingerprint itself.")
    print("targets (issue 4): >= 8x json.dumps and >= 20x rfc8785 on every size; a ~200-byte "
          "body within 2x of sha256 alone.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
