#!/usr/bin/env python3
"""The minimum supported Rust version each workspace crate declares, checked with the one
toolchain this machine has (`make lint` runs it).

A second, older toolchain cannot be fetched here, so the check is made of the parts that one
toolchain can judge:

1. every dependency a crate builds with (normal and build dependencies, transitively, as
   resolved by the committed Cargo.lock) declares a `rust-version` no newer than the crate's;
2. the crate's own `rust-version` is at least what its edition needs (2024: 1.85);
3. clippy's `incompatible_msrv` lint (on in `make lint`'s clippy run, which reads each crate's
   `rust-version`) flags standard-library APIs stabilised after it.

What it does not see: language syntax newer than the declared version in the crate's own code
(only building with that toolchain would). Exits 1 with one line per problem.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Dict, List, Optional, Set, Tuple

EDITION_MSRV = {"2015": (1, 0, 0), "2018": (1, 31, 0), "2021": (1, 56, 0), "2024": (1, 85, 0)}


def version(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    if not text:
        return None
    parts = [int(part) for part in text.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def show(v: Tuple[int, ...]) -> str:
    return ".".join(str(part) for part in (v[:2] if v[2:] == (0,) else v))


def main() -> int:
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    meta = json.loads(out)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    problems: List[str] = []
    for member in meta["workspace_members"]:
        crate = packages[member]
        declared = version(crate.get("rust_version"))
        if declared is None:
            problems.append(f"{crate['name']}: no rust-version declared (set it in Cargo.toml)")
            continue
        need = EDITION_MSRV.get(crate["edition"])
        if need and declared < need:
            problems.append(
                f"{crate['name']}: edition {crate['edition']} needs Rust {show(need)}, "
                f"rust-version says {show(declared)}"
            )
        seen: Set[str] = set()
        stack = [member]
        while stack:
            node = nodes[stack.pop()]
            for dep in node["deps"]:
                kinds = {k["kind"] for k in dep["dep_kinds"]}
                if kinds <= {"dev"} or dep["pkg"] in seen:
                    continue
                seen.add(dep["pkg"])
                stack.append(dep["pkg"])
        worst: Dict[str, Tuple[int, ...]] = {}
        for dep_id in seen:
            dep = packages[dep_id]
            dep_msrv = version(dep.get("rust_version"))
            if dep_msrv and dep_msrv > declared:
                worst[f"{dep['name']} {dep['version']}"] = dep_msrv
        for name, dep_msrv in sorted(worst.items()):
            problems.append(
                f"{crate['name']} declares rust-version {show(declared)} but builds with {name}, "
                f"which needs Rust {show(dep_msrv)}: raise rust-version or pin an older {name.split()[0]}"
            )
    for line in problems:
        print(f"check-msrv: {line}", file=sys.stderr)
    if not problems:
        print(f"check-msrv: {len(meta['workspace_members'])} crates, their dependencies within their rust-version")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
