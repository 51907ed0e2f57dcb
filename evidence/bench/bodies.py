"""The benchmark bodies, written to files so Rust, Python and Node time the very same bytes.

tiny (~200 B payment), medium (~4 KB order), large (~1 MB batch), numbers (~64 KB of floats and
integers), unicode (~16 KB of non-ASCII text and escapes), and two unicode-heavy bodies of the
same records (issue 17, "every body shape"): unicode-raw (~160 KB written as UTF-8, as
``json.dumps(ensure_ascii=False)`` and ``JSON.stringify`` write it) and unicode-escaped (~330 KB,
every non-ASCII character a ``\\u`` escape and every supplementary one a surrogate pair, as Python's default
``json.dumps`` writes it). Their member names and values mix supplementary characters (emoji,
mathematical letters, CJK extension B) with U+E000-U+FFFF (private use, presentation forms,
fullwidth forms), so UTF-16 order differs from code-point order within one object, plus quotes,
control characters and U+2028. Deterministic: the same bytes every run.
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


# Character ranges for the unicode-heavy bodies: supplementary planes (surrogate pairs in UTF-16)
# next to U+E000-U+FFFF, where UTF-16 order and code-point order disagree, and other scripts.
_RANGES = [(0x1F300, 0x1F64F), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF), (0xE000, 0xF8FF),
           (0xFB00, 0xFDCF), (0xFF01, 0xFFEF), (0x4E00, 0x9FFF), (0x0400, 0x04FF), (0x00C0, 0x024F),
           (0x0370, 0x03FF), (0x0590, 0x05FF), (0x0041, 0x007A)]


def _text(rng: random.Random, n: int) -> str:
    lo, hi = _RANGES[rng.randrange(len(_RANGES))]
    out = "".join(chr(rng.randint(lo, hi)) for _ in range(n))
    if rng.random() < 0.15:
        out += rng.choice(['"quoted"', "\\path", "line\nbreak", "\t", "\u2028", "\u0001", " ascii text"])
    return out


def _unicode_record(rng: random.Random, i: int) -> Dict[str, Any]:
    # Names that start with a supplementary character sort before U+E000-U+FFFF in UTF-16, after
    # them by code point.
    return {
        "\U0001F600 mood": _text(rng, 6),
        "\uFF3Aone": _text(rng, 12),
        "\U0001D518\U0001D52B\U0001D526": [_text(rng, 4), _text(rng, 8), i],
        "\uE000private": _text(rng, 20),
        "\u540d\u524d": _text(rng, 10),
        "\u043a\u043b\u044e\u0447": {"\uFB33": _text(rng, 3), "\U00020000": _text(rng, 5), "z": i * 7},
        "id": i,
    }


def _unicode_heavy() -> Dict[str, Any]:
    rng = random.Random(17)
    items = [_unicode_record(rng, i) for i in range(400)]
    # One large object of distinct names drawn from the same ranges (no repeated shape to reuse).
    names: Dict[str, str] = {}
    while len(names) < 600:
        names[_text(rng, rng.randint(1, 6))] = _text(rng, rng.randint(2, 12))
    return {"items": items, "index": names}


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
    heavy = _unicode_heavy()
    unicode_raw = json.dumps(heavy, ensure_ascii=False).encode()
    unicode_escaped = json.dumps(heavy).encode()
    return {"1-tiny": tiny, "2-medium": medium, "3-large": large, "4-numbers": numbers, "5-unicode": unicode,
            "6-unicode-raw": unicode_raw, "7-unicode-escaped": unicode_escaped}


def write(directory: Path) -> Dict[str, int]:
    directory.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name, data in bodies().items():
        (directory / f"{name}.json").write_bytes(data)
        sizes[name] = len(data)
    return sizes
