"""Scenario 7's memory verdict: RSS flatness after a warm-up, and on the Node app the V8 heap
after a full collection (docs/EVIDENCE.md section 1, scenario 7)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
from typing import Any, Dict, List, Optional, Tuple

from evidence.reliability.harness import Row, Target

SOAK_WARMUP_S = 15.0
"""Memory samples of a soak's first seconds are warm-up, not judged: a fresh Node worker's V8
heap grows its young generation to its maximum (heapTotal ~15 -> ~45 MiB, RSS ~60 -> ~100 MiB)
within the first 10-20 s of load, and the allocator settles (docs/EVIDENCE.md section 1, scenario 7)."""
SOAK_JUDGE_MIN_S = 20.0
"""Flatness is judged only over at least this many seconds after the warm-up (short soaks: not judged)."""
SOAK_FLAT_MIB = 5.0
SOAK_FLAT_FRACTION = 0.05
"""RSS is flat when the median of the judged window's last third exceeds the median of its first
third by at most max(SOAK_FLAT_MIB, SOAK_FLAT_FRACTION of it) (GC sawtooth and allocator noise)."""
SOAK_HEAP_MIB = 1.0
SOAK_HEAP_FRACTION = 0.10
"""Node: the V8 heap in use right after a full collection (what stays reachable) may grow by at most
max(SOAK_HEAP_MIB, SOAK_HEAP_FRACTION of it) from the end of the warm-up to the end of the soak."""


def mem_lines(t: Target, pid: int) -> List[Dict[str, Any]]:
    """The ``process.memoryUsage()`` samples a Node worker logged (empty for the Python app)."""
    if t.mem_dir is None:
        return []
    try:
        text = (t.mem_dir / f"{pid}.jsonl").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # the line being written
    return out


async def gc_sample(t: Target, pid: int) -> Optional[Dict[str, Any]]:
    """Asks a Node worker for a sample right after a full collection (SIGUSR2, node_app.cjs) and
    waits for it (up to 10 s); None for the Python app, or when none came."""
    if t.mem_dir is None:
        return None
    seen = sum(1 for x in mem_lines(t, pid) if "gc" in x)
    try:
        os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        return None
    for _ in range(100):
        got = [x for x in mem_lines(t, pid) if "gc" in x]
        if len(got) > seen:
            return got[-1] if got[-1]["gc"] else None
        await asyncio.sleep(0.1)
    return None


def _median(xs: List[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def judge_memory(row: Row, t: Target, pid: int, samples: List[Tuple[float, int, int]], seconds: float,
                 gc0: Optional[Dict[str, Any]], gc1: Optional[Dict[str, Any]], records: Tuple[int, int]) -> None:
    """Scenario 7's memory verdict from (seconds since start, RSS KiB, trials so far) samples:
    after SOAK_WARMUP_S, the RSS medians of the judged window's first and last thirds; on the Node
    app also the heap after a full collection at the end of the warm-up and at the end. A growth
    beyond the bounds is a violation, except RSS growth on the memory store, which holds every
    record until its TTL (600 s here) and grows with them by design (bounded by maxEntries)."""
    mib = 1024.0
    rss = [s[1] for s in samples]
    row.notes.append(f"RSS of a surviving worker: start {rss[0] / mib:.1f} MiB, end {rss[-1] / mib:.1f}, "
                     f"max {max(rss) / mib:.1f} ({len(rss)} samples)")
    window = [s for s in samples if s[0] >= SOAK_WARMUP_S]
    if not window or window[-1][0] - SOAK_WARMUP_S < SOAK_JUDGE_MIN_S:
        row.notes.append(f"memory not judged ({seconds:.0f} s soak: needs {SOAK_WARMUP_S:.0f} s warm-up + "
                         f"{SOAK_JUDGE_MIN_S:.0f} s; long mode judges)")
        return
    third = max(1, len(window) // 3)
    first = _median([s[1] / mib for s in window[:third]])
    last = _median([s[1] / mib for s in window[-third:]])
    requests = window[-1][2] - window[0][2]
    growth = last - first
    bound = max(SOAK_FLAT_MIB, SOAK_FLAT_FRACTION * first)
    verdict = "flat" if growth <= bound else "GROWING"
    text = (f"after {SOAK_WARMUP_S:.0f} s warm-up, RSS median {first:.1f} -> {last:.1f} MiB "
            f"({growth:+.1f} MiB over {requests:,} requests to all workers, bound {bound:.1f})")
    if verdict != "flat" and t.name == "memory":
        held = records[1] - records[0]
        per = ""
        if held > 0 and gc0 is not None and gc1 is not None:
            # RSS per record from the worker's own periodic samples over the judged window (not
            # the two after-GC samples: a full collection also shrinks the heap).
            lines = [x for x in mem_lines(t, pid) if "gc" not in x and gc0["t"] <= x["t"] <= gc1["t"]]
            k = len(lines) // 3
            if k > 0:
                d_rec = _median([x["records"] for x in lines[-k:]]) - _median([x["records"] for x in lines[:k]])
                d_rss = _median([x["rss"] for x in lines[-k:]]) - _median([x["rss"] for x in lines[:k]])
                if d_rec > 0:
                    per = f", ~{d_rss / d_rec:,.0f} B of RSS per record"
        verdict = f"grows with the store's records (+{held:,} held{per}; bounded by maxEntries)" if held > 0 \
            else "grows with the store's records (bounded by maxEntries)"
    elif verdict != "flat":
        row.bad(f"soak: RSS grew {growth:+.1f} MiB after the warm-up (bound {bound:.1f} MiB)")
    row.notes.append(f"{text}: {verdict}")
    if gc0 is not None and gc1 is not None:
        h0, h1 = gc0["heapUsed"] / 2**20, gc1["heapUsed"] / 2**20
        hb = max(SOAK_HEAP_MIB, SOAK_HEAP_FRACTION * h0)
        hv = "flat" if h1 - h0 <= hb else "GROWING"
        row.notes.append(
            f"V8 heap after a full GC {h0:.1f} -> {h1:.1f} MiB (bound +{hb:.1f}): {hv}; heapTotal "
            f"{gc0['heapTotal'] / 2**20:.1f} -> {gc1['heapTotal'] / 2**20:.1f}, external "
            f"{gc0['external'] / 2**20:.1f} -> {gc1['external'] / 2**20:.1f} MiB")
        if hv != "flat":
            row.bad(f"soak: V8 heap after GC grew {h1 - h0:+.1f} MiB after the warm-up")
    elif t.app == "node":
        row.notes.append("no heap sample after GC (worker without --expose-gc?)")
