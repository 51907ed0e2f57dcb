#!/usr/bin/env python3
"""Guards "core owns the edge" (spec/PROTOCOL.md §7.2, §9; spec/STORAGE.md §8, §9): the Python and
TypeScript hosts translate, they do not decide. Fails when host code outside the tests builds a
fake in-progress record, parses a policy string itself, orders admission steps, computes a cache
entry's lifetime or runs memory-store transitions of its own. Comments and docstrings are not
code: they may describe the rules. Run by `make lint`.
"""

from __future__ import annotations

import io
import re
import sys
import tokenize
from pathlib import Path
from typing import Iterator, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
PY = ROOT / "bindings" / "python" / "python" / "idempo"
TS = ROOT / "bindings" / "node" / "ts"

POLICY = r"(?:re_run|outcome_unknown|reject_precision_loss|rfc|strict|equal|full)"

# (what is forbidden, regex over code, folders)
RULES: List[Tuple[str, str, Tuple[Path, ...]]] = [
    (
        "builds an in-progress record for a lock wait (core: StoreResult::Locked)",
        r"lock_?[wW]ait_?[eE]xpired|b\"\\x00\"\s*\*\s*16|bytes\(16\)|Buffer\.alloc\(16\)",
        (PY, TS),
    ),
    (
        "parses a policy string (core: FromStr / the native Config)",
        rf"[=!]==?\s*['\"]{POLICY}['\"]|['\"]{POLICY}['\"]\s*[=!]==?|in\s*\(\s*['\"]{POLICY}['\"]",
        (PY, TS),
    ),
    (
        "orders admission steps or builds an admission problem (core: machine::admit)",
        r"\b(?:body_too_large|bodyTooLarge|missing_key_response|missingKeyResponse|body_problem|"
        r"bodyProblem|unavailable_problem|problemResponse|problem_response)\s*\(|native\.admitKey\(",
        (PY, TS),
    ),
    (
        "computes a cache entry's lifetime (core: machine::cache)",
        r"min\(\s*(?:self\.)?_?cache_ttl|Math\.min\(\s*this\.#cacheTtl|"
        r"expires_?[aA]t\s*-\s*now",
        (PY / "stores", TS / "stores"),
    ),
    (
        "runs memory-store transitions of its own (core: machine::memory)",
        r"\bheapq\b|evicted_live|evictedLive|_make_room|makeRoom",
        (PY / "stores", TS / "stores"),
    ),
]

# Lines that compare a code core produced (a stop reason, an outcome) are translation, not policy.
TRANSLATION = re.compile(r"\.(?:reason|outcome|kind|op)\b|\breason\b")


def python_code(text: str) -> Iterator[Tuple[int, str]]:
    """Source lines with comments and docstrings (string statements) blanked."""
    lines = text.splitlines()
    blank = [list(line) for line in lines]
    prev = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        is_doc = tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT,
                                                           tokenize.DEDENT, tokenize.NL)
        if tok.type == tokenize.COMMENT or is_doc:
            (r0, c0), (r1, c1) = tok.start, tok.end
            for r in range(r0, r1 + 1):
                row = blank[r - 1]
                start = c0 if r == r0 else 0
                end = c1 if r == r1 else len(row)
                for c in range(start, end):
                    row[c] = " "
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type
    for n, row in enumerate(blank, 1):
        yield n, "".join(row)


def ts_code(text: str) -> Iterator[Tuple[int, str]]:
    """Source lines with /* */ and // comments blanked (a // inside a string is kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    for n, line in enumerate(text.splitlines(), 1):
        out, quote, i = [], None, 0
        while i < len(line):
            ch = line[i]
            if quote:
                out.append(ch)
                if ch == "\\" and i + 1 < len(line):
                    out.append(line[i + 1])
                    i += 1
                elif ch == quote:
                    quote = None
            elif ch in "'\"`":
                quote = ch
                out.append(ch)
            elif line.startswith("//", i):
                break
            else:
                out.append(ch)
            i += 1
        yield n, "".join(out)


def main() -> int:
    failed = False
    for what, pattern, folders in RULES:
        rx = re.compile(pattern)
        hits = []
        for folder in folders:
            for path in sorted(folder.rglob("*")):
                if path.suffix not in (".py", ".ts") or path.name.endswith(".d.ts"):
                    continue
                text = path.read_text()
                lines = python_code(text) if path.suffix == ".py" else ts_code(text)
                for n, code in lines:
                    if rx.search(code) and not (what.startswith("parses") and TRANSLATION.search(code)):
                        hits.append(f"  {path.relative_to(ROOT)}:{n}: {code.strip()}")
        if hits:
            failed = True
            print(f"check-edge-rules: a host {what}:", file=sys.stderr)
            print("\n".join(hits), file=sys.stderr)
    if failed:
        print("check-edge-rules: move the rule into core and call it (issue: core owns the edge)",
              file=sys.stderr)
        return 1
    print("check-edge-rules: the hosts make no protocol decision of their own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
