#!/usr/bin/env python3
"""Prints the kill table of a `make mutants-*` run from cargo-mutants' output directory.

    python3 scripts/mutants_table.py target/mutants/suite [target/mutants/model ...]

cargo-mutants writes one line per mutant (`file:line:col: description`) to caught.txt,
missed.txt, timeout.txt and unviable.txt of `<dir>/mutants.out`; a run with `--iterate` moves
what earlier runs caught or found unviable to previously_caught.txt (the "earlier" column). The
table counts each outcome per file and
lists every survivor (missed or timed out), the lines spec/MODEL.md §5.2 gives a reason for.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

OUTCOMES = [("caught", ("caught.txt",)), ("earlier", ("previously_caught.txt",)),
            ("missed", ("missed.txt",)), ("timeout", ("timeout.txt",)), ("unviable", ("unviable.txt",))]
COLUMNS = ["caught", "earlier", "missed", "timeout", "unviable"]


def lines(out: Path, names: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for name in names:
        p = out / name
        if p.exists():
            found += [line for line in p.read_text().splitlines() if line.strip()]
    return found


def table(run: Path) -> int:
    out = run / "mutants.out"
    if not out.is_dir():
        print(f"mutants: no results in {out} (run the make verb first)", file=sys.stderr)
        return 1
    per: dict[str, Counter[str]] = {}
    survivors: list[str] = []
    for outcome, names in OUTCOMES:
        for line in dict.fromkeys(lines(out, names)):
            per.setdefault(line.split(":", 1)[0], Counter())[outcome] += 1
            if outcome in ("missed", "timeout"):
                survivors.append(f"  {outcome:<8} {line}")
    print(f"\n{run}: kill table")
    print(f"  {'file':<32}" + "".join(f" {c:>9}" for c in COLUMNS))
    total: Counter[str] = Counter()
    for file in sorted(per):
        total.update(per[file])
        print(f"  {file:<32}" + "".join(f" {per[file][c]:>9}" for c in COLUMNS))
    print(f"  {'total':<32}" + "".join(f" {total[c]:>9}" for c in COLUMNS))
    if total["earlier"]:
        print("  earlier: caught or unviable in an earlier run of the same pass (--iterate)")
    if survivors:
        print("  survivors (each needs a test or a written reason, spec/MODEL.md §5.2):")
        print("\n".join(survivors))
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    return max(table(Path(a)) for a in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
