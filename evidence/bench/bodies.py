"""The benchmark bodies, written to files so Rust, Python and Node time the very same bytes.

tiny (~200 B payment), medium (~4 KB order), large (~1 MB batch), numbers (~64 KB of floats and
integers), unicode (~16 KB of non-ASCII text and escapes). Deterministic: the same bytes every run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict


def _payment(i: int) -> Dict[str, Any]:
    return {
        "amount": 1000 + i,
        "currency": "EUR",
        "customer": f"cus_{123456789 + i:x}",
        "description": f"Order #{i} for some goods and services",
        "metadata": {"order_id": str(i), "source": "web", "ratio": 0.1 * i, "items": [1, 2, 3]},
        "capture": i % 2 == 0,
    }


def _fill(target: int, make: Any) -> bytes:
    items = []
    size = 0
    i = 0
    while size < target:
        item = make(i)
        size += len(json.dumps(item)) + 1
        items.append(item)
        i += 1
    return json.dumps({"batch": "b-1", "items": items}).encode()


def bodies() -> Dict[str, bytes]:
    rng = random.Random(7)
    tiny = json.dumps(_payment(1)).encode()
    medium = _fill(4_000, _payment)
    large = _fill(1_000_000, _payment)
    numbers = json.dumps(
        {"series": [[rng.uniform(-1e6, 1e6), rng.randint(-(2**40), 2**40), rng.random() * 1e-5]
                    for _ in range(1_200)]}
    ).encode()
    words = ["Grüße", "日本語のテキスト", "emoji 😀🎉", "Ωμέγα", "naïve café", "Здравствуйте", "\u2028line", "tab\tquote\"",
             "ℌ𝔢𝔩𝔩𝔬", "עברית"]
    unicode = json.dumps(
        {f"k{i}-{words[i % len(words)]}": [words[(i * 3) % len(words)], words[(i * 7) % len(words)]]
         for i in range(300)},
        ensure_ascii=bool(0),
    ).encode()
    return {"1-tiny": tiny, "2-medium": medium, "3-large": large, "4-numbers": numbers, "5-unicode": unicode}


def write(directory: Path) -> Dict[str, int]:
    directory.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name, data in bodies().items():
        (directory / f"{name}.json").write_bytes(data)
        sizes[name] = len(data)
    return sizes
