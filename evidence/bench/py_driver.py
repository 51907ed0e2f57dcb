"""Python side of `make bench-peers`: idempo (Rust core via the extension) vs rfc8785 + hashlib vs
json.dumps(sort_keys=True) + hashlib vs raw hashlib, on the body files of a directory. Prints one
JSON line per measurement (ns per operation, best of five interleaved rounds). Figures only."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional

import rfc8785

import idempo


def time_all(cases: Mapping[str, Callable[[], object]], budget: float) -> Dict[str, Optional[float]]:
    """Best of five rounds per implementation, the rounds interleaved (round r runs every
    implementation once), so a load change on the machine skews all of them alike."""
    best: Dict[str, Optional[float]] = {}
    for impl, fn in cases.items():
        try:
            fn()
            best[impl] = float("inf")
        except Exception:  # noqa: BLE001 - an implementation that refuses the body gets no figure
            best[impl] = None
    for _ in range(5):
        for impl, fn in cases.items():
            current = best[impl]
            if current is None:
                continue
            n = 0
            t0 = time.perf_counter()
            while True:
                fn()
                n += 1
                dt = time.perf_counter() - t0
                if dt >= budget / 5:
                    break
            best[impl] = min(current, dt / n * 1e9)
    return best


def main() -> None:
    directory = Path(sys.argv[1])
    budget = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.5
    fp = idempo.Fingerprinter()
    for path in sorted(directory.glob("*.json")):
        body = path.read_bytes()
        name = path.stem
        cases = {
            "idempo fingerprint": lambda: fp.fingerprint("POST", "/payments", body, [], content_type="application/json"),
            "idempo canonicalize+sha256": lambda: hashlib.sha256(idempo.canonicalize(body)).digest(),
            "rfc8785+sha256": lambda: hashlib.sha256(rfc8785.dumps(json.loads(body))).digest(),
            "json.dumps(sort_keys)+sha256": lambda: hashlib.sha256(
                json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
            ).digest(),
            "raw sha256 (limit)": lambda: hashlib.sha256(body).digest(),
        }
        for impl, ns in time_all(cases, budget).items():
            print(json.dumps({"lang": "python", "impl": impl, "body": name, "ns": ns}), flush=True)


if __name__ == "__main__":
    main()
