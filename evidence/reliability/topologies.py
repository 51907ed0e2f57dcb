"""Duplicate storms under 4 worker processes against the production topologies, with a fault
in the middle of each (issue 16; docs/EVIDENCE.md "Production topologies").

    python -m evidence.reliability.topologies --mode short   # CI: one fault per row, ~2 min
    python -m evidence.reliability.topologies --mode long    # publishing: 60 s storms, several faults
    python -m evidence.reliability.topologies --apps node --rows redis-cluster

Rows (each from the Python app under ``uvicorn --workers 4`` and from the Node app's supervisor
with 4 workers, evidence/reliability/app.py and node_app.cjs):

- ``pgbouncer / kill -9 worker``: PostgreSQL behind PgBouncer in transaction mode; a worker is
  SIGKILLed while a handler runs in it (a request that sleeps in its handler, so the kill is
  mid-handler; the other requests of that worker die with it).
- ``pgbouncer / pg restart``: the same topology; ``pg_ctl restart -m immediate`` of PostgreSQL
  under load (every server connection of PgBouncer breaks), PgBouncer with
  ``server_login_retry = 1``; the long mode runs it again with PgBouncer's default (15 s: a server
  login that fails while PostgreSQL restarts makes PgBouncer refuse clients that long).
- ``pg-standby / promotion``: a primary with a synchronous streaming standby; the apps connect
  through the multi-host DSN (``target_session_attrs=read-write``; libpq for Python, the Node
  PostgresStore's own list of servers); the primary is stopped at once and the standby promoted.
- ``redis-cluster / primary kill -9``: three primaries with a replica each
  (cluster-node-timeout 2000 ms); a primary is SIGKILLed and its replica takes over.

The storm: a few keys at a time, each hit by many concurrent clients with the same body (the
scenario-1 shape), each client retrying 409, 503 and dead connections until it gets a final answer
(``201``, a replay, or ``500 outcome-unknown``) or its deadline. Executions are counted in the
app's own ``effects`` table. Reported per row, and required (a violation fails the run):

- **doubles**: keys executed more than once (target 0; route ``/pay/ou``, takeover
  ``outcome_unknown``, where spec/PROTOCOL.md section 11 allows at most one execution). On Redis a
  double whose two runs are both generation 1 means a claim lost in the failover (asynchronous
  replication, spec/STORAGE.md section 5): reported as such, still counted.
- **lost answers**: clients with no final answer by their deadline, fresh or replayed answers that
  differ from the key's stored answer, a completed answer that later reads as outcome-unknown
  (target 0). ``500 outcome-unknown`` for a key whose owner died or lost its store is the
  documented outcome and is counted apart.
- **5xx** other than ``503 store-unavailable`` (with ``Retry-After``) and ``500 outcome-unknown``.
- the **503 window**: seconds from the first to the last ``503`` after each fault (before the next
  one; the row's longest), and apart the 503s before any fault (figures only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from evidence.lib.http import ConnectionDied, Reply
from evidence.lib.services import Server
from evidence.lib.topology import Bouncer, ClusterWithReplicas, Pair
from evidence.reliability.harness import (APPS, LEASE_MS, SHORT_TTL_MS, STORE_TIMEOUT_MS, Effects, Row, Target, body,
                                          classify, new_key, post, print_table)

WORKERS = 4
LOGIN_RETRY_S = 1
"""PgBouncer's ``server_login_retry`` in the rows (its default, 15 s, in the long mode's extra row)."""
ROUTE = "/pay/ou"
FINAL = ("201", "201 replay", "500 outcome-unknown")
RETRYABLE = ("409 in-flight", "503 store-unavailable")

PROFILES: Dict[str, Dict[str, Any]] = {
    # One fault per row, a storm of 5 s (longer where the fault's 503 window is): all eight rows
    # (two apps) within about three minutes.
    "short": dict(seconds=5.0, faults=[1.5], keys=6, clients=8, deadline=60.0, redis_faults=[1.5],
                  bouncer_default=False),
    # Publishing: 60 s storms, a fault every 15-20 s (one promotion: a pair promotes once; two
    # cluster primaries, each with its own replica).
    # The Node app gets 8 clients per key: with 16 (192 at once) its workers missed the 2 s store
    # deadline on this 2-core machine before any fault ("store claim timed out", 503), which
    # hides the fault's own window. The restart row runs twice there: PgBouncer with server_login_retry = 1 s, and with its
    # default (15 s), whose refusal after a failed login during the restart sets the 503 window.
    "long": dict(seconds=60.0, faults=[10.0, 28.0, 46.0], keys=12, clients=16, deadline=60.0,
                 redis_faults=[10.0, 35.0], bouncer_default=True, node_clients=8),
}


@dataclass
class Storm:
    """What the clients saw: per key its answers, and the time of every 503."""

    t0: float
    answers: Dict[str, List[Tuple[str, bytes]]] = field(default_factory=dict)
    lost: List[str] = field(default_factory=list)
    t503: List[float] = field(default_factory=list)
    gave_up_on: Counter = field(default_factory=Counter)
    """The last answer each client without a final answer got before its deadline."""
    requests: int = 0
    died: int = 0
    labels: Counter = field(default_factory=Counter)
    faults_at: List[float] = field(default_factory=list)
    """When each fault was injected (seconds since t0)."""


async def client(t: Target, s: Storm, row: Row, key: str, data: bytes, sleep_ms: int, deadline: float,
                 first: Optional[List[Tuple[str, str]]] = None) -> None:
    """One client of a key: retries 409, 503 and dead connections until a final answer."""
    extra = first
    last = "no answer"
    until = time.monotonic() + deadline
    c = t.client()
    try:
        while time.monotonic() < until:
            try:
                # A whole request timeout even near the deadline (a shortened one would turn the
                # last attempt's 503, which takes up to the store deadline, into "no answer").
                r: Reply = await post(c, ROUTE, key, data, extra=[("x-ev-sleep-ms", str(sleep_ms)), *(extra or [])],
                                      timeout=15.0)
            except (ConnectionDied, asyncio.TimeoutError) as exc:
                s.died += 1
                extra = None
                last = "no answer within 15 s" if isinstance(exc, asyncio.TimeoutError) else "connection died"
                await asyncio.sleep(0.1)
                continue
            extra = None
            s.requests += 1
            label = classify(r)
            last = label
            s.labels[label] += 1
            if label == "503 store-unavailable":
                s.t503.append(time.monotonic() - s.t0)
                if not r.headers.get("retry-after", "").isdigit():
                    row.bad(f"503 without Retry-After ({r.headers.get('retry-after')!r})")
            if label in RETRYABLE:
                await asyncio.sleep(random.uniform(0.05, 0.25))
                continue
            if label in FINAL:
                s.answers[key].append((label, r.body))
                return
            row.bad(f"{label}: {r.body[:120]!r}")
            s.answers[key].append((label, r.body))
            return
        s.lost.append(key)
        s.gave_up_on[last] += 1
    finally:
        await c.close()


def windows_503(t503: List[float], faults: List[float]) -> Tuple[List[Tuple[float, float, float, int]], int]:
    """The 503 window of each fault: (fault time, first 503, last 503, count) over the 503s from
    that fault to the next one (the last fault: to the end), and the number of 503s before the
    first fault (a store deadline missed under load, no fault involved)."""
    out = []
    for i, f in enumerate(faults):
        end = faults[i + 1] if i + 1 < len(faults) else float("inf")
        xs = [x for x in t503 if f <= x < end]
        out.append((f, min(xs) if xs else f, max(xs) if xs else f, len(xs)))
    return out, sum(1 for x in t503 if not faults or x < faults[0])


def verdict(t: Target, row: Row, s: Storm, redis: bool) -> Dict[str, Any]:
    """Counts executions per key (the app's effects table) and judges every key's answers."""
    keys = list(s.answers)
    per = t.effects.per_key(keys)
    doubles = lost_replication = 0
    ou = 0
    for key in keys:
        effects = per[key]
        n = len(effects)
        row.executions += n
        answers = s.answers[key]
        row.trials += len(answers) + s.lost.count(key)
        if n > 1:
            gens = sorted(e[2] for e in effects)
            doubles += 1
            if redis and gens.count(1) > 1:
                lost_replication += 1
                row.bad(f"{key[:8]}: {n} executions, generations {gens} (a claim lost in the failover)")
            else:
                row.bad(f"{key[:8]}: {n} executions, generations {gens}")
        bodies = {b for label, b in answers if label in ("201", "201 replay")}
        unknown = [label for label, _ in answers if label == "500 outcome-unknown"]
        ou += len(unknown)
        if len(bodies) > 1:
            row.bad(f"{key[:8]}: {len(bodies)} different answers given")
        if n == 0 and bodies:
            row.bad(f"{key[:8]}: answered 201 without an execution")
    return dict(doubles=doubles, lost_replication=lost_replication, ou=ou)


async def settle(t: Target, row: Row, s: Storm) -> Tuple[int, int]:
    """After the lease: each key's stored answer (a probe, retried while 409) must be the answer
    its clients got. Returns (keys whose delivered answer was lost, keys whose owner's completion
    failed). The latter is documented (spec/PROTOCOL.md 7.5, ``completion_failed``): the owner's
    client got the handler's 201, the record stayed in progress and its lease made the key
    outcome-unknown for every retry, none of which ran the handler again."""
    await asyncio.sleep(LEASE_MS / 1000 + 0.3)
    c = t.client()
    lost = failed_completion = 0
    try:
        async def probe(key: str) -> None:
            nonlocal lost, failed_completion
            fresh = [b for label, b in s.answers[key] if label == "201"]
            replays = [b for label, b in s.answers[key] if label == "201 replay"]
            until = time.monotonic() + 20
            r: Optional[Reply] = None
            while time.monotonic() < until:
                try:
                    r = await post(c, ROUTE, key, body("storm"), timeout=10)
                except (ConnectionDied, asyncio.TimeoutError):
                    await asyncio.sleep(0.2)
                    continue
                if classify(r) in RETRYABLE:
                    await asyncio.sleep(0.2)
                    continue
                break
            label = classify(r) if r is not None else "no answer"
            row.outcomes[f"settled: {label}"] += 1
            if r is not None and r.replayed:
                if any(b != r.body for b in fresh + replays):
                    lost += 1
                    row.bad(f"{key[:8]}: a client was told another answer than the one the key keeps")
            elif label == "500 outcome-unknown":
                if replays:
                    lost += 1
                    row.bad(f"{key[:8]}: clients got the stored answer, the key now answers outcome-unknown")
                elif fresh:
                    failed_completion += 1
            elif fresh or replays:
                lost += 1
                row.bad(f"{key[:8]}: clients got 201, the key now answers {label}")
            elif label not in FINAL:
                row.bad(f"{key[:8]}: no final answer after the storm ({label})")

        keys = list(s.answers)
        for i in range(0, len(keys), 32):
            await asyncio.gather(*(probe(k) for k in keys[i:i + 32]))
    finally:
        await c.close()
    return lost, failed_completion


# --- faults ----------------------------------------------------------------------------------

def fault_kill_worker(t: Target, s_ref: List[Storm], row: Row, prof: Dict[str, Any]) -> Callable[[], Awaitable[str]]:
    """SIGKILL of a worker mid-handler: a request that sleeps in its handler (``x-ev-stop``), its
    worker killed once the handler has started; the request's client retries like the others."""

    async def run() -> str:
        s = s_ref[0]
        key = new_key()
        s.answers[key] = []
        data = body("storm")
        owner = asyncio.ensure_future(client(t, s, row, key, data, 0, prof["deadline"], first=[("x-ev-stop", "1")]))
        pid = None
        for _ in range(500):
            pid = t.effects.started_pid(key)
            if pid:
                break
            await asyncio.sleep(0.01)
        if pid is None:
            raise RuntimeError("the handler to kill never started")
        os.kill(pid, signal.SIGKILL)
        dups = [asyncio.ensure_future(client(t, s, row, key, data, 0, prof["deadline"]))
                for _ in range(prof["clients"] - 1)]
        await asyncio.gather(owner, *dups)
        return f"kill -9 of worker {pid} mid-handler"

    return run


# --- rows ------------------------------------------------------------------------------------

@dataclass
class Topo:
    """A started topology and the store settings its apps get."""

    name: str
    store: str
    url: str


async def run_row(app: str, topo: Topo, fault_name: str, prof: Dict[str, Any], work: Path,
                  make_faults: Callable[[Target, List["Storm"], Row], List[Tuple[float, Callable[[], Awaitable[str]]]]],
                  summary: List[Dict[str, Any]]) -> Row:
    if app == "node" and "node_clients" in prof:
        prof = {**prof, "clients": prof["node_clients"]}
    effects = str(work / f"effects-topo-{app}-{topo.name}-{uuid.uuid4().hex[:8]}.sqlite3")
    env = {"EV_STORE": topo.store, "EV_STORE_URL": topo.url, "EV_EFFECTS": effects, "EV_LEASE_MS": str(LEASE_MS),
           "EV_SHORT_TTL_MS": str(SHORT_TTL_MS), "EV_STORE_TIMEOUT_MS": str(STORE_TIMEOUT_MS)}
    row = Row(topo.name, f"T {fault_name}", app)
    t0 = time.monotonic()
    server = Server(APPS[app], env, workers=WORKERS, node=app == "node").start()
    t = Target(topo.name, topo.url, WORKERS, server, Effects(effects), None, app)
    storm_ref: List[Storm] = []
    try:
        faults = make_faults(t, storm_ref, row)
        # The fault closures read the storm through storm_ref.
        storm_ref.append(Storm(time.monotonic()))
        s = await storm(t, row, prof, faults, storm_ref[0])
        v = verdict(t, row, s, redis=topo.store == "redis-cluster")
        lost_settled, failed_completion = await settle(t, row, s)
        refused_only = set(s.gave_up_on) <= {"503 store-unavailable"}
        if s.lost and fault_name.endswith("(default)") and refused_only:
            # PgBouncer's default server_login_retry: refusals (503 + Retry-After, nothing run)
            # outlasting a client's patience are this row's documented figure (SCALING.md step 3),
            # provided the settle probe found every key's answer kept.
            row.notes.append(f"{len(s.lost)} clients gave up after {prof['deadline']:.0f} s of 503 (refused, "
                             f"nothing run; PgBouncer's default server_login_retry)")
        else:
            for key in s.lost:
                row.bad(f"{key[:8]}: a client got no final answer within {prof['deadline']:.0f} s "
                        f"(last: {dict(s.gave_up_on)})")
        row.outcomes.update({f"answers: {k}": n for k, n in s.labels.items()})
        fa: List[float] = s.faults_at
        windows, before = windows_503(s.t503, fa)
        w = "; ".join(f"fault {i + 1}: " + (f"503 window {hi - lo:.1f} s ({n} x 503, +{lo - f:.1f} to +{hi - f:.1f} s "
                                              "after the fault)" if n else "no 503")
                      for i, (f, lo, hi, n) in enumerate(windows)) or "no fault injected"
        if before:
            w += f"; {before} x 503 before the first fault (the store deadline under load)"
        row.notes.append(w)
        row.notes.append(f"{len(s.answers)} keys x {prof['clients']} clients, {s.requests} answers, "
                         f"{s.died} connections died")
        gave_up = len(s.lost)
        lost = (0 if s.lost and not any("no final answer" in v for v in row.violations) else gave_up) + lost_settled
        row.notes.append(f"doubles {v['doubles']}, lost answers {lost}, outcome-unknown answers {v['ou']} "
                         f"(documented), keys whose owner's completion failed {failed_completion} (its client "
                         f"got the 201, the key then outcome-unknown: PROTOCOL 7.5 completion_failed)")
        summary.append(dict(app=app, topology=topo.name, fault=fault_name, keys=len(s.answers),
                            clients=len(s.answers) * prof["clients"], executions=row.executions,
                            doubles=v["doubles"], lost=lost, gave_up=gave_up, ou=v["ou"], cf=failed_completion, n503=len(s.t503),
                            window=max((hi - lo for _, lo, hi, n in windows if n), default=0.0),
                            before=before,
                            violations=len(row.violations), seconds=0.0))
    except Exception as exc:  # noqa: BLE001 - reported as a failed row, the suite goes on
        row.bad(f"{type(exc).__name__}: {exc}")
        row.notes.append(server.log_tail(800).replace("\n", " | "))
    finally:
        if row.violations:
            tb = server.last_traceback()
            if tb:
                print(f"[topologies] {app} {topo.name} / {fault_name}: the server's last traceback:\n{tb}",
                      flush=True)
        server.stop()
    row.seconds = time.monotonic() - t0
    if summary and summary[-1]["app"] == app and summary[-1]["fault"] == fault_name and summary[-1]["topology"] == topo.name:
        summary[-1]["seconds"] = row.seconds
        summary[-1]["violations"] = len(row.violations)
    return row


async def storm(t: Target, row: Row, prof: Dict[str, Any],
                      faults: List[Tuple[float, Callable[[], Awaitable[str]]]], s: Storm) -> Storm:
    """Runs the storm on ``s`` for ``prof['seconds']``: ``prof['keys']`` lanes, each a key at a
    time with ``prof['clients']`` concurrent clients; each fault coroutine starts at its offset
    (the text it returns goes into the notes). Returns when every client has its answer."""
    s.t0 = time.monotonic()
    stop_at = s.t0 + prof["seconds"]
    faults_at: List[float] = []

    async def lane() -> None:
        while time.monotonic() < stop_at:
            key = new_key()
            s.answers[key] = []
            data = body("storm")
            sleep_ms = random.choice((0, 5, 20, 50))
            await asyncio.gather(*(client(t, s, row, key, data, sleep_ms, prof["deadline"])
                                   for _ in range(prof["clients"])))

    async def fault(at: float, f: Callable[[], Awaitable[str]]) -> None:
        await asyncio.sleep(max(0.0, s.t0 + at - time.monotonic()))
        t_fault = time.monotonic() - s.t0
        faults_at.append(t_fault)
        try:
            note = await f()
        except Exception as exc:  # noqa: BLE001 - a fault that could not be injected fails the row
            row.bad(f"fault at +{t_fault:.1f} s failed: {type(exc).__name__}: {exc}")
            return
        row.notes.append(f"+{t_fault:.1f} s: {note}")

    tasks = [asyncio.ensure_future(lane()) for _ in range(prof["keys"])]
    tasks += [asyncio.ensure_future(fault(at, f)) for at, f in faults]
    await asyncio.gather(*tasks)
    s.faults_at = faults_at
    return s


def _schema(dsn: str) -> None:
    from idempo import stores

    st = stores.PostgresStore(dsn)
    st.create_schema()
    st.close()


ROWS = ("pgbouncer", "pg-standby", "redis-cluster")


async def run_topologies(apps: List[str], rows: List[str], prof: Dict[str, Any], work: Path,
                         summary: List[Dict[str, Any]]) -> List[Row]:
    """Each topology started once for both apps where a fault leaves it usable (PgBouncer; the
    cluster while a primary with a replica is left); a promotion needs a fresh pair per app."""
    out: List[Row] = []

    def done(app: str, got: Row) -> None:
        out.append(got)
        print(f"[topologies] {app} {got.store} / {got.scenario}: {len(got.violations)} violations, "
              f"{got.seconds:.1f} s", flush=True)

    if "pgbouncer" in rows:
        for retry in (LOGIN_RETRY_S, None) if prof["bouncer_default"] else (LOGIN_RETRY_S,):
            b = await asyncio.to_thread(Bouncer.start, retry)
            try:
                await asyncio.to_thread(_schema, b.direct_dsn)
                topo = Topo("pgbouncer", "postgres", b.dsn)
                bouncer = b

                def kills(t: Target, ref: List[Storm], row: Row) -> List[Tuple[float, Callable[[], Awaitable[str]]]]:
                    return [(at, fault_kill_worker(t, ref, row, prof)) for at in prof["faults"]]

                async def restart() -> str:
                    took = await asyncio.to_thread(bouncer.pg_restart)
                    return f"pg_ctl restart -m immediate ({took:.1f} s)"

                def restarts(t: Target, ref: List[Storm], row: Row) -> List[Tuple[float, Callable[[], Awaitable[str]]]]:
                    return [(at, restart) for at in prof["faults"]]

                for app in apps:
                    if retry is not None:
                        done(app, await run_row(app, topo, "kill -9 worker mid-handler", prof, work, kills, summary))
                    name = f"pg restart, login retry {retry} s" if retry is not None else \
                        "pg restart, login retry 15 s (default)"
                    done(app, await run_row(app, topo, name, prof, work, restarts, summary))
            finally:
                await asyncio.to_thread(b.stop)
    if "pg-standby" in rows:
        for app in apps:
            p = await asyncio.to_thread(Pair.start)
            try:
                await asyncio.to_thread(_schema, p.primary_dsn)
                topo = Topo("pg-standby", "postgres", p.dsn)

                async def promote() -> str:
                    took = await asyncio.to_thread(p.promote)
                    return f"primary stopped (immediate), standby promoted in {took:.1f} s"

                def promotion(t: Target, ref: List[Storm], row: Row) -> List[Tuple[float, Callable[[], Awaitable[str]]]]:
                    return [(prof["faults"][0], promote)]

                done(app, await run_row(app, topo, "standby promotion", prof, work, promotion, summary))
            finally:
                await asyncio.to_thread(p.stop)
    if "redis-cluster" in rows:
        cl: Optional[ClusterWithReplicas] = None
        kills_left = 0
        try:
            for app in apps:
                if cl is None or kills_left < len(prof["redis_faults"]):
                    if cl is not None:
                        await asyncio.to_thread(cl.stop)
                    cl = await asyncio.to_thread(ClusterWithReplicas.start)
                    kills_left = 2  # primaries with a replica, less the seed replica's own
                cluster = cl
                seed = await asyncio.to_thread(cluster.seed)
                topo = Topo("redis-cluster", "redis-cluster", f"redis://127.0.0.1:{seed}/0")

                async def kill() -> str:
                    port, took = await asyncio.to_thread(cluster.kill_primary, seed)
                    return f"kill -9 of primary :{port}, a replica owned its slots after {took:.1f} s"

                def primary_kills(t: Target, ref: List[Storm], row: Row) -> List[Tuple[float, Callable[[], Awaitable[str]]]]:
                    return [(at, kill) for at in prof["redis_faults"]]

                kills_left -= len(prof["redis_faults"])
                done(app, await run_row(app, topo, "kill -9 primary, replica takes over", prof, work,
                                        primary_kills, summary))
        finally:
            if cl is not None:
                await asyncio.to_thread(cl.stop)
    return out


def print_summary(summary: List[Dict[str, Any]], header: str) -> None:
    print()
    print(header)
    print(f"{'app':<7} {'topology':<14} {'fault':<38} {'keys':>5} {'clients':>7} {'execs':>6} {'doubles':>7} "
          f"{'lost':>5} {'gave':>4} {'o-u':>5} {'c-f':>4} {'503s':>5} {'early':>5} {'503 window':>10} {'viol.':>5} {'time':>6}")
    print("-" * 128)
    for r in summary:
        print(f"{r['app']:<7} {r['topology']:<14} {r['fault']:<38} {r['keys']:>5} {r['clients']:>7} "
              f"{r['executions']:>6} {r['doubles']:>7} {r['lost']:>5} {r['gave_up']:>4} {r['ou']:>5} {r['cf']:>4} {r['n503']:>5} {r['before']:>5} "
              f"{r['window']:>9.1f}s {r['violations']:>5} {r['seconds']:>5.0f}s")
    print("-" * 128)
    print("execs: handler executions counted in the app's effects table; doubles: keys executed more than once; "
          "lost: clients told an answer the key does not keep, or without a final answer (except in the row of "
          "PgBouncer's default login retry, where clients refused with 503 for 60 s are its figure: gave); gave: "
          "clients without a final answer within 60 s; o-u: 500 outcome-unknown "
          "answers (documented: the key's owner died or lost its store); c-f: keys whose owner's completion failed "
          "(its client got the 201, later retries outcome-unknown: PROTOCOL 7.5); early: 503s before the first "
          "fault (store deadline missed under load); 503 window: first to last 503 after a fault and before the "
          "next one, the longest of the row's faults")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=tuple(PROFILES), default="short")
    ap.add_argument("--apps", default="python,node")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma list of: " + ", ".join(ROWS))
    args = ap.parse_args(argv)
    prof = PROFILES[args.mode]
    apps = [a for a in args.apps.split(",") if a]
    rows_wanted = [r for r in args.rows.split(",") if r]
    for a in apps:
        if a not in APPS:
            ap.error(f"unknown app {a!r}")
    for r in rows_wanted:
        if r not in ROWS:
            ap.error(f"unknown row {r!r} ({', '.join(ROWS)})")
    rows: List[Row] = []
    summary: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="idempo-evidence-topo.") as work:
        rows = asyncio.run(run_topologies(apps, rows_wanted, prof, Path(work), summary))
    head = (f"idempo production topologies ({args.mode} mode, {time.monotonic() - t0:.0f} s, {WORKERS} workers per app, "
            f"lease {LEASE_MS} ms, store deadline {STORE_TIMEOUT_MS} ms, {os.cpu_count()} CPUs)")
    print_table(rows, head)
    print_summary(summary, head)
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
