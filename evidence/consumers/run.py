"""Consumers evidence row: a storm of duplicated deliveries to several concurrent Redis Streams
consumer processes (a consumer group), with kill -9 of consumers mid-function and a store outage
(the Redis that is both broker and idempo's store killed with SIGKILL and restarted), under each
takeover policy.

    python -m evidence.consumers.run --mode short     # CI: a few rows, ~1 min, fails on a violation
    python -m evidence.consumers.run --mode long      # more messages, kills and outages per row
    python -m evidence.consumers.run --rows python:outcome_unknown,node:re_run

The consumers (``py_consumer.py``: redis-py + ``idempotent_function``; ``node_consumer.mjs``:
ioredis + ``idempotent``) key each message by the producer's ``msg_id`` and log every delivery,
execution (with its downstream key, before the work), typed error and acknowledgement to their
own file; this driver counts from those files, never from idempo's records. The producer adds
each logical message several times (a producer that retried its XADD), some of them once more
with a changed amount under the same ``msg_id`` (a producer bug: must raise the typed mismatch and
never run), and retries its own XADD through the outage.

Redis runs with ``appendonly yes`` and ``appendfsync always``, so a SIGKILL of the server loses no
acknowledged write: the outage is the server gone for a while, not a loss of its data.

Verdicts, per row: **doubles** (a message executed under two downstream keys: a downstream-keyed
effect done twice) must be 0; **lost** (a message neither completed nor dead-lettered, or an entry
left pending) must be 0; **untyped** errors must be 0; under
``outcome_unknown`` no message may execute twice (**re-runs** 0). Of a message's two payloads the
first to reach a consumer runs and the other raises ``PayloadMismatch``; running both is a
violation. Exit status 1 on a violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import redis

from evidence.lib.services import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STREAM = "orders"
GROUP = "billing"
LEASE_MS = 1500
"""idempo's lease (heartbeat every third of it): a killed consumer's call is taken over after it."""
CLAIM_IDLE_MS = 1000
"""XAUTOCLAIM's min idle time: a killed consumer's pending entries go to another after it."""


@dataclass(frozen=True)
class Mode:
    messages: int
    copies: int
    produce_s: float
    kills: int
    outages: int
    outage_s: float
    consumers: int = 4


MODES = {
    "short": Mode(messages=150, copies=3, produce_s=6.0, kills=3, outages=1, outage_s=1.5),
    "long": Mode(messages=2000, copies=4, produce_s=60.0, kills=20, outages=4, outage_s=3.0),
}
DEFAULT_ROWS = {
    "short": "python:outcome_unknown,python:re_run,node:re_run",
    "long": "python:outcome_unknown,python:re_run,node:outcome_unknown,node:re_run",
}


class RedisServer:
    """A Redis of the row's own on a free port, its AOF fsynced on every write."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="idempo-consumers-redis."))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction",
             "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                c: "redis.Redis" = redis.Redis.from_url(self.url, socket_timeout=1)
                if c.ping():
                    c.close()
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis did not start: {(self.dir / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Consumer:
    app: str
    name: str
    log: Path
    proc: "subprocess.Popen[bytes]"


def spawn(app: str, name: str, url: str, log: Path, takeover: str) -> Consumer:
    args = [url, name, str(log), takeover, str(LEASE_MS), str(CLAIM_IDLE_MS)]
    if app == "python":
        cmd = [sys.executable, "-m", "evidence.consumers.py_consumer", *args]
    else:
        cmd = ["node", str(HERE / "node_consumer.mjs"), *args]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    err = open(log.with_suffix(".stderr"), "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    err.close()
    return Consumer(app, name, log, proc)


def mid_function(consumers: List[Consumer], rng: random.Random) -> Consumer:
    """A live consumer whose last logged step is an execution (it is inside the function), within
    a second; else any live one."""
    live = [c for c in consumers if c.proc.poll() is None]
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        inside = [c for c in live if _last_event(c.log) == "exec"]
        if inside:
            return rng.choice(inside)
        time.sleep(0.005)
    return rng.choice(live)


def _last_event(log: Path) -> str:
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            tail = f.read().splitlines()
        return str(json.loads(tail[-1])["ev"]) if tail else ""
    except (OSError, ValueError, KeyError):
        return ""


@dataclass
class Row:
    app: str
    takeover: str
    messages: int = 0
    adds: int = 0
    entries: int = 0
    producer_retries: int = 0
    deliveries: int = 0
    executions: int = 0
    re_runs: int = 0
    doubles: int = 0
    done: int = 0
    dead: int = 0
    lost: int = 0
    pending: int = 0
    tampered: int = 0
    kills: int = 0
    mid_function: int = 0
    outages: int = 0
    outage_s: float = 0.0
    typed: Counter = field(default_factory=Counter)
    untyped: Counter = field(default_factory=Counter)
    broker_errors: int = 0
    seconds: float = 0.0
    violations: List[str] = field(default_factory=list)


def plan(mode: Mode, rng: random.Random) -> Tuple[List[Dict[str, str]], Dict[str, str]]:
    """The producer's XADDs in order: each message ``copies`` times, every tenth once more with a
    changed amount (the same msg_id); returns them and each message's true amount."""
    timed: List[Tuple[float, Dict[str, str]]] = []
    truth: Dict[str, str] = {}
    for n in range(mode.messages):
        msg_id = f"m-{n:05d}"
        cents = str(100 + n)
        truth[msg_id] = cents
        work = str(rng.choice((5, 10, 20, 40, 150)))
        # Copies of one message land close together (a retrying producer), not spread over the
        # run; the changed one after all of them (so the true payload is the one that runs).
        timed += [(n + rng.uniform(-3, 3), {"msg_id": msg_id, "cents": cents, "work_ms": work})
                  for _ in range(mode.copies)]
        if n % 10 == 7:
            timed.append((n + 3.5, {"msg_id": msg_id, "cents": str(99_999), "work_ms": work}))
    timed.sort(key=lambda a: a[0])
    return [a for _, a in timed], truth


def xadd(url: str, client: "redis.Redis", fields: Dict[str, str]) -> Tuple["redis.Redis", int]:
    """XADD, retried through an outage (a retry after a lost reply adds a second entry: one more
    duplicate, as a real producer's retry does); returns the client and the retries."""
    retries = 0
    while True:
        try:
            client.xadd(STREAM, fields)  # type: ignore[arg-type]
            return client, retries
        except redis.RedisError:
            retries += 1
            time.sleep(0.05)
            client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)


def inject(schedule: List[Tuple[float, str]], start: float, row: "Row", consumers: List[Consumer],
           server: RedisServer, app: str, work: Path, takeover: str, mode: Mode, seed: int) -> None:
    """The faults, at their moments, while the producer goes on: kill -9 of a consumer (inside
    the function when one is, within a second) replaced by a new process of the same name, or the
    Redis server killed with SIGKILL and started again on the same port and AOF."""
    rng = random.Random(seed + 1)
    for moment, fault in schedule:
        pause = start + moment - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        if fault == "kill":
            victim = mid_function(consumers, rng)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(timeout=10)
            row.kills += 1
            gen = sum(1 for c in consumers if c.name == victim.name)
            consumers.append(spawn(app, victim.name, server.url, work / f"{victim.name}-{gen}.log", takeover))
        else:
            down = time.monotonic()
            server.kill()
            time.sleep(mode.outage_s)
            server.start()
            row.outages += 1
            row.outage_s += time.monotonic() - down


def settled(url: str) -> Tuple[bool, int]:
    """All entries delivered to the group and none pending; and the pending count."""
    try:
        c: "redis.Redis" = redis.Redis.from_url(url, socket_timeout=1)
        group = next(g for g in c.xinfo_groups(STREAM) if g["name"] in (GROUP, GROUP.encode()))
        pending = int(group["pending"])
        read_all = group.get("entries-read") == c.xlen(STREAM)
        c.close()
        return pending == 0 and read_all, pending
    except (redis.RedisError, StopIteration):
        return False, -1


def entries(url: str) -> int:
    try:
        c: "redis.Redis" = redis.Redis.from_url(url, socket_timeout=1)
        n = int(c.xlen(STREAM))
        c.close()
        return n
    except redis.RedisError:
        return -1


def run_row(app: str, takeover: str, mode: Mode, seed: int) -> Row:
    row = Row(app, takeover)
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="idempo-consumers-row."))
    server = RedisServer()
    consumers: List[Consumer] = []
    t0 = time.monotonic()
    try:
        server.start()
        admin: "redis.Redis" = redis.Redis.from_url(server.url, socket_timeout=2)
        admin.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        admin.close()
        for i in range(mode.consumers):
            consumers.append(spawn(app, f"c-{i}", server.url, work / f"c-{i}-0.log", takeover))
        adds, truth = plan(mode, rng)
        row.messages = len(truth)
        row.adds = len(adds)
        row.tampered = sum(1 for a in adds if a["cents"] != truth[a["msg_id"]])
        # Faults at evenly spread moments of the production window, in random order.
        faults = ["kill"] * mode.kills + ["outage"] * mode.outages
        rng.shuffle(faults)
        moments = [mode.produce_s * (k + 1) / (len(faults) + 1) for k in range(len(faults))]
        schedule = list(zip(moments, faults))
        producer: "redis.Redis" = redis.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
        start = time.monotonic()
        injector = threading.Thread(
            target=inject, args=(schedule, start, row, consumers, server, app, work, takeover, mode, seed)
        )
        injector.start()
        try:
            for i, fields in enumerate(adds):
                pause = start + mode.produce_s * i / len(adds) - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                producer, retries = xadd(server.url, producer, fields)
                row.producer_retries += retries
        finally:
            injector.join()
        producer.close()
        deadline = time.monotonic() + 60
        pending = -1
        while time.monotonic() < deadline:
            ok, pending = settled(server.url)
            if ok:
                break
            time.sleep(0.2)
        row.pending = max(pending, 0)
        row.entries = entries(server.url)
        if pending != 0:
            row.violations.append(f"{pending} entries still pending at the end")
        time.sleep(0.3)  # the last acknowledgements' log lines
    finally:
        for c in consumers:
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGKILL)
                c.proc.wait(timeout=10)
        server.remove()
    row.seconds = time.monotonic() - t0
    judge(row, work, truth, takeover)
    shutil.rmtree(work, ignore_errors=True)
    return row


def judge(row: Row, work: Path, truth: Dict[str, str], takeover: str) -> None:
    records: List[Dict[str, Any]] = []
    killed_pids = set()
    for log in sorted(work.glob("*.log")):
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        records += lines
        name, gen = log.stem.rsplit("-", 1)
        if any(c.stem == f"{name}-{int(gen) + 1}" for c in work.glob("*.log")) and lines:
            killed_pids.add(lines[0]["pid"])
            # A kill mid-function: its last call started and never acknowledged or failed.
            last_exec = max((i for i, r in enumerate(lines) if r["ev"] == "exec"), default=-1)
            if last_exec >= 0 and not any(r["ev"] in ("ack", "typed", "untyped") for r in lines[last_exec:]):
                row.mid_function += 1
    stderr = "".join(p.read_text(errors="replace") for p in work.glob("*.stderr")).strip()
    execs: Dict[str, List[Dict[str, Any]]] = {}
    finals: Dict[str, str] = {}
    for r in records:
        ev = r["ev"]
        if ev == "delivery":
            row.deliveries += 1
        elif ev == "exec":
            row.executions += 1
            execs.setdefault(r["msg"], []).append(r)
        elif ev == "typed":
            row.typed[r["kind"]] += 1
        elif ev == "untyped":
            row.untyped[r["kind"]] += 1
            if len(row.violations) < 20:
                row.violations.append(f"untyped {r['kind']}: {r.get('text', '')[:200]}")
        elif ev == "broker_error":
            row.broker_errors += 1
        elif ev == "ack" and not str(r["outcome"]).startswith("PayloadMismatch"):
            if r["outcome"] == "done" or finals.get(r["msg"]) != "done":
                finals[r["msg"]] = r["outcome"]
    for msg, runs in execs.items():
        row.re_runs += len(runs) - 1
        if len({x["cents"] for x in runs}) > 1:  # the first payload to arrive wins, the other raises
            row.violations.append(f"{msg}: executed with two payloads {sorted({x['cents'] for x in runs})}")
        if len({x["dk"] for x in runs}) > 1:
            row.doubles += 1
            row.violations.append(f"{msg}: executed under {len({x['dk'] for x in runs})} downstream keys")
    row.done = sum(1 for v in finals.values() if v == "done")
    row.dead = sum(1 for v in finals.values() if v != "done")
    row.lost = len(truth) - len(finals)
    if row.lost:
        row.violations.append(f"{row.lost} messages neither completed nor dead-lettered")
    if takeover == "outcome_unknown" and row.re_runs:
        row.violations.append(f"{row.re_runs} re-runs under outcome_unknown")
    if row.violations and stderr:
        row.violations.append(f"consumers' stderr: {stderr[-1500:]}")


def print_table(rows: List[Row]) -> None:
    print()
    print("Consumers: Redis Streams consumer group, duplicated deliveries, kill -9 of consumers, "
          "Redis (broker and store) killed and restarted")
    head = (f"{'app':<7} {'takeover':<16} {'msgs':>5} {'adds':>5} {'deliv':>6} {'execs':>6} {'re-run':>6} "
            f"{'double':>6} {'done':>5} {'dead':>5} {'lost':>5} {'kills':>5} {'mid-fn':>6} {'outage':>7} "
            f"{'time':>6}  typed errors / figures")
    print(head)
    print("-" * 150)
    for r in rows:
        typed = ", ".join(f"{k} {v}" for k, v in sorted(r.typed.items(), key=lambda kv: -kv[1]))
        extra = [typed or "no typed errors", f"changed payloads {r.tampered}",
                 f"stream entries {r.entries} (producer retries {r.producer_retries})",
                 f"consumers' broker errors {r.broker_errors}"]
        if r.untyped:
            extra.append("UNTYPED " + ", ".join(f"{k} {v}" for k, v in r.untyped.items()))
        print(f"{r.app:<7} {r.takeover:<16} {r.messages:>5} {r.adds:>5} {r.deliveries:>6} {r.executions:>6} "
              f"{r.re_runs:>6} {r.doubles:>6} {r.done:>5} {r.dead:>5} {r.lost:>5} {r.kills:>5} "
              f"{r.mid_function:>6} {r.outage_s:>6.1f}s {r.seconds:>5.1f}s  {'; '.join(extra)}")
    print("-" * 150)
    bad = [r for r in rows if r.violations]
    if bad:
        print("\nVIOLATIONS:")
        for r in bad:
            for v in r.violations:
                print(f"  {r.app} / {r.takeover}: {v}")
    else:
        print("no violations: 0 doubles, 0 lost, 0 untyped errors, no message run with two payloads")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=tuple(MODES), default="short")
    ap.add_argument("--rows", default=None, help="comma list of app:takeover (apps: python, node)")
    ap.add_argument("--seed", type=int, default=22)
    args = ap.parse_args(argv)
    # SIGTERM (make interrupted, a CI timeout) ends the run through the rows' cleanup: no
    # consumer process or Redis server outlives it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    mode = MODES[args.mode]
    rows = []
    for spec in (args.rows or DEFAULT_ROWS[args.mode]).split(","):
        app, takeover = spec.split(":")
        if app == "node" and not (ROOT / "bindings" / "node" / "dist" / "index.js").exists():
            print(f"[consumers] {spec}: skipped, bindings/node is not built (make node-build)")
            continue
        row = run_row(app, takeover, mode, args.seed)
        print(f"[consumers] {app} {takeover}: {row.executions} executions of {row.messages} messages, "
              f"{len(row.violations)} violations, {row.seconds:.1f}s", flush=True)
        rows.append(row)
    print_table(rows)
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
