"""The reliability scenarios against idempo-gateway (bindings/gateway): the real binary in front of
a real upstream process (evidence/reliability/gateway_upstream.py under uvicorn, 2 worker
processes), real sockets, real kill -9 and SIGSTOP, a real PostgreSQL stopped and frozen.

    python -m evidence.reliability.gateway --mode short      # part of `make evidence-short`
    python -m evidence.reliability.gateway --mode long --stores sqlite --scenarios 1,3

The upstream counts its executions in its own ``effects`` table by the client's key (the gateway
forwards it, and the downstream key in ``X-Idempo-Downstream-Key``); ``/pay/keyed`` keeps one
charge per downstream key, as a payment API deduplicating on it would. Scenarios (the bindings'
numbering, run.py, where one applies; ``g``: the gateway's own fault):

1, 2   duplicate storms: K concurrent requests with one key (then half with another body): exactly
       one upstream execution, the others 409 or the replay, the other body 422 (run.py's own
       scenario, through the gateway), on memory, SQLite and PostgreSQL;
3u     the upstream kill -9'd mid-request (before / after its effect): 502, then outcome-unknown
       (``/pay/ou``) or, after the lease, a re-run with the same downstream key (``/pay/keyed``);
3g     the gateway kill -9'd mid-request and restarted on the same SQLite file: 409 until the
       lease ends, then outcome-unknown or the re-run with the same downstream key: never a
       second charge;
4u     the upstream SIGSTOPped past the lease: the gateway's heartbeat keeps the lease, the
       duplicate is 409, never a second run; after SIGCONT the owner's answer is the replay;
4g     a gateway SIGSTOPped past the lease, a second gateway on the same SQLite file takes over
       (outcome-unknown / re-run with the same downstream key); the resumed owner's completion is
       rejected, replays keep the takeover's answer;
5, 5b  PostgreSQL stopped (pg_ctl stop -m immediate) and hung (SIGSTOP): 503 with Retry-After,
       nothing forwarded, recovery (run.py's own scenarios, through the gateway);
6      TTL: replays until expiry, then a new run under a new downstream key; the gateway's purge
       task deletes expired rows while live traffic goes on.

Prints the same table as run.py; exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, cast

from evidence.lib.gateway import Gateway, binary
from evidence.lib.http import Client, ConnectionDied, Reply
from evidence.lib.services import Server, Services
from evidence.reliability import run as bindings
from evidence.reliability.harness import (LEASE_MS, SHORT_TTL_MS, STORE_TIMEOUT_MS, TTL_MARGIN_MS, Effects, Row,
                                          Target, body, classify, new_key, post, print_table)

UPSTREAM_APP = "evidence.reliability.gateway_upstream:app"
DOWNSTREAM_HEADER = "X-Idempo-Downstream-Key"
APP = "gateway"
MODES = ("ou", "keyed")
UPSTREAM_STEPS = ("in_handler", "after_effect")

PROFILES: Dict[str, Dict[str, Any]] = {
    "short": dict(rounds={2: 40, 16: 12, 64: 4, 256: 2}, mixed={2: 20, 16: 8, 64: 3, 256: 1}, kill_trials=2,
                  stop_trials=2, probes=5, hung_probes=5, ttl_keys=8, purge=10_000),
    "long": dict(rounds={2: 3000, 16: 600, 64: 150, 256: 60}, mixed={2: 1500, 16: 300, 64: 75, 256: 30},
                 kill_trials=10, stop_trials=5, probes=50, hung_probes=30, ttl_keys=50, purge=200_000),
}


def config(store: str, upstream_port: int, purge_interval_ms: int = 60_000) -> str:
    routes = []
    for path, takeover, ttl in (("/pay/ou", "outcome_unknown", 600_000), ("/pay/keyed", "re_run", 600_000),
                                ("/pay/ttl", "outcome_unknown", SHORT_TTL_MS)):
        routes.append(f'[[routes]]\nmethod = "POST"\npath = "{path}"\nupstream = "app"\npublic = true\n'
                      f'lease_ms = {LEASE_MS}\nttl_ms = {ttl}\ntakeover = "{takeover}"\n')
    return (f'listen = "{{listen}}"\ndownstream_key_header = "{DOWNSTREAM_HEADER}"\nupstream_timeout_ms = 5000\n'
            f'shutdown_deadline_ms = 2000\npurge_interval_ms = {purge_interval_ms}\n\n[store]\n{store}\n\n'
            f'[upstreams]\napp = "http://127.0.0.1:{upstream_port}"\n\n' + "\n".join(routes))


def store_toml(name: str, url: str) -> str:
    if name == "memory":
        return 'kind = "memory"'
    if name == "sqlite":
        return f'kind = "sqlite"\npath = "{url}"'
    return f'kind = "postgres"\ndsn = "{url}"\ntimeout_ms = {STORE_TIMEOUT_MS}'


def target(name: str, url: str, gw: Gateway, effects: Effects, svc: Optional[Services]) -> Target:
    # The scenarios reach the server under test through ``server.port`` only (run.py's storms and
    # outages use nothing else of it): the gateway stands where the bindings' uvicorn server does.
    return Target(name, url, 1, cast(Server, gw), effects, svc, APP)


async def settle(c: Any, route: str, key: str, data: bytes, bound_s: float) -> Reply:
    """Retries while the answer is 409 in-flight, up to ``bound_s``."""
    r: Reply = await post(c, route, key, data, fresh=True)
    until = time.monotonic() + bound_s
    while classify(r) == "409 in-flight" and time.monotonic() < until:
        await asyncio.sleep(0.1)
        r = await post(c, route, key, data, fresh=True)
    return r


def judge_keyed(row: Row, t: Target, key: str, what: str, final: Reply, effect_before: bool) -> None:
    """``/pay/keyed`` after a fault: one downstream key, one charge, the answer names the first charge."""
    effects = t.effects.rows(key)
    row.executions += len(effects)
    dkeys = {e[3] for e in effects}
    charges = sum(t.effects.downstream(d) for d in dkeys)
    if len(dkeys) != 1 or charges != 1:
        row.bad(f"{what}: {charges} downstream charges over {len(dkeys)} downstream keys")
    if final.status == 201 and effects and final.json()["charge"] != min(e[0] for e in effects):
        row.bad(f"{what}: the re-run did not return the first charge")
    if len(effects) != (2 if effect_before else 1):
        row.bad(f"{what}: {len(effects)} executions, expected {2 if effect_before else 1} (one per run)")


# --- 3u: the upstream killed mid-request --------------------------------------------------------

async def s_upstream_kill(t: Target, up: Server, trials: int) -> Row:
    row = t.row("3u upstream kill -9 mid-request")
    c = t.client()
    t0 = time.monotonic()
    for mode, step in [(m, s) for _ in range(trials) for m in MODES for s in UPSTREAM_STEPS]:
        key, data, route, what = new_key(), body(f"{mode}-{step}"), f"/pay/{mode}", f"{mode}/{step}"
        first = await post(c, route, key, data, extra=[("x-ev-crash", step)], fresh=True)
        row.trials += 1
        row.outcomes[f"crashed request: {classify(first)}"] += 1
        if first.status != 502:
            row.bad(f"{what}: the crashed request got {classify(first)}, expected the gateway's 502")
        up.wait_ready()  # uvicorn replaces the killed worker
        retry = await settle(c, route, key, data, 10 * LEASE_MS / 1000)
        again = await post(c, route, key, data, fresh=True)
        row.outcomes[f"{mode} retry: {classify(retry)}"] += 1
        if mode == "ou":
            if classify(retry) != "500 outcome-unknown" or classify(again) != "500 outcome-unknown":
                row.bad(f"{what}: retries {classify(retry)} / {classify(again)}, expected outcome-unknown")
            n = len(t.effects.rows(key))
            row.executions += n
            if n != (1 if step == "after_effect" else 0):
                row.bad(f"{what}: {n} executions")
        else:
            if retry.status != 201 or retry.replayed or not (again.replayed and again.body == retry.body):
                row.bad(f"{what}: retries {classify(retry)} / {classify(again)}, expected a re-run then its replay")
            judge_keyed(row, t, key, what, retry, step == "after_effect")
    row.notes.append("502 for the dropped request; outcome-unknown (ou) or one charge per downstream key (keyed)")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


# --- 3g: the gateway killed mid-request, restarted on the same file --------------------------

async def wait_started(t: Target, key: str) -> Optional[int]:
    for _ in range(1000):
        pid = t.effects.started_pid(key)
        if pid:
            return pid
        await asyncio.sleep(0.01)
    return None


async def s_gateway_kill(t: Target, gw: Gateway, trials: int) -> Row:
    row = t.row("3g gateway kill -9, restart")
    c = t.client()
    t0 = time.monotonic()
    restart_ms: List[float] = []
    for mode in MODES * trials:
        key, data, route = new_key(), body(f"gwkill-{mode}"), f"/pay/{mode}"
        first = asyncio.ensure_future(post(c, route, key, data, extra=[("x-ev-stop", "1")], fresh=True, timeout=30))
        if await wait_started(t, key) is None:
            row.bad(f"{mode}: the upstream never started")
            first.cancel()
            continue
        gw.kill9()
        killed = time.monotonic()
        row.trials += 1
        try:
            r0 = await first
            row.bad(f"{mode}: the killed gateway answered {classify(r0)}")
        except ConnectionDied:
            pass
        r0s = time.monotonic()
        gw.start()
        restart_ms.append((time.monotonic() - r0s) * 1000)
        early = await post(c, route, key, data, fresh=True)
        row.outcomes[f"{mode} retry at restart: {classify(early)}"] += 1
        late = time.monotonic() - killed >= LEASE_MS / 2000
        if classify(early) != "409 in-flight" and not late:
            row.bad(f"{mode}: retry at restart {classify(early)}, expected 409 while the lease runs")
        await asyncio.sleep(max(0.0, killed + LEASE_MS / 1000 + 0.2 - time.monotonic()))
        await asyncio.sleep(0.5)  # the upstream's own request (400 ms) has finished its effect
        retry = await settle(c, route, key, data, 10 * LEASE_MS / 1000)
        again = await post(c, route, key, data, fresh=True)
        row.outcomes[f"{mode} after the lease: {classify(retry)}"] += 1
        if mode == "ou":
            n = len(t.effects.rows(key))
            row.executions += n
            if classify(retry) != "500 outcome-unknown" or classify(again) != "500 outcome-unknown" or n != 1:
                row.bad(f"ou: {classify(retry)} / {classify(again)}, {n} executions")
        else:
            if retry.status != 201 or retry.replayed or not (again.replayed and again.body == retry.body):
                row.bad(f"keyed: {classify(retry)} / {classify(again)}, expected a re-run then its replay")
            judge_keyed(row, t, key, "keyed", retry, True)
    if restart_ms:
        row.notes.append(f"restart to ready in max {max(restart_ms):.0f} ms on the same SQLite file")
    row.notes.append("no second charge: the re-run carries the same downstream key")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


# --- 4u / 4g: SIGSTOP past the lease ---------------------------------------------------------

async def s_upstream_stop(t: Target, trials: int) -> Row:
    row = t.row("4u upstream SIGSTOP past lease")
    c = t.client()
    t0 = time.monotonic()
    for mode in MODES * trials:
        key, data, route = new_key(), body(f"upstop-{mode}"), f"/pay/{mode}"
        first = asyncio.ensure_future(post(c, route, key, data, extra=[("x-ev-stop", "1")], fresh=True, timeout=30))
        pid = await wait_started(t, key)
        if pid is None:
            row.bad(f"{mode}: the upstream never started")
            first.cancel()
            continue
        os.kill(pid, signal.SIGSTOP)
        row.trials += 1
        try:
            await asyncio.sleep(LEASE_MS / 1000 + 0.3)
            dup = await post(c, route, key, data, fresh=True)
        finally:
            os.kill(pid, signal.SIGCONT)
        owner = await first
        replay = await post(c, route, key, data, fresh=True)
        labels = [classify(x) for x in (dup, owner, replay)]
        row.outcomes[f"{mode}: " + " / ".join(labels)] += 1
        if labels[0] != "409 in-flight":
            row.bad(f"{mode}: duplicate past the lease got {labels[0]}: the heartbeat should hold the lease")
        if owner.status != 201 or owner.replayed or not (replay.replayed and replay.body == owner.body):
            row.bad(f"{mode}: owner / replay {labels}")
        n = len(t.effects.rows(key))
        row.executions += n
        if n != 1:
            row.bad(f"{mode}: {n} executions")
    row.notes.append("the gateway renews the lease while the upstream is frozen: no takeover, no second run")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


async def s_gateway_stop(t: Target, a: Gateway, b: Gateway, trials: int) -> Row:
    row = t.row("4g gateway SIGSTOP, 2nd takes over")
    ca, cb = t.client(), Client("127.0.0.1", b.port, timeout=30)
    t0 = time.monotonic()
    for mode in MODES * trials:
        key, data, route = new_key(), body(f"gwstop-{mode}"), f"/pay/{mode}"
        first = asyncio.ensure_future(post(ca, route, key, data, extra=[("x-ev-stop", "1")], fresh=True, timeout=30))
        if await wait_started(t, key) is None:
            row.bad(f"{mode}: the upstream never started")
            first.cancel()
            continue
        a.signal(signal.SIGSTOP)
        row.trials += 1
        try:
            await asyncio.sleep(LEASE_MS / 1000 + 0.3)
            take = await post(cb, route, key, data, fresh=True)
        finally:
            a.signal(signal.SIGCONT)
        try:
            stale: Reply = await first
        except ConnectionDied:
            stale = Reply(599, {}, b"")
        await asyncio.sleep(0.2)
        via_a = await post(ca, route, key, data, fresh=True)
        via_b = await post(cb, route, key, data, fresh=True)
        labels = [classify(x) for x in (take, stale, via_a, via_b)]
        row.outcomes[f"{mode}: " + " / ".join(labels)] += 1
        if mode == "ou":
            n = len(t.effects.rows(key))
            row.executions += n
            if labels[0] != "500 outcome-unknown" or labels[2] != labels[0] or labels[3] != labels[0] or n != 1:
                row.bad(f"ou: {labels}, {n} executions")
        else:
            if take.status != 201 or take.replayed:
                row.bad(f"keyed: the takeover answered {labels[0]}")
            elif not (via_a.replayed and via_a.body == take.body and via_b.replayed and via_b.body == take.body):
                row.bad(f"keyed: the stored answer is not the takeover's: {labels}")
            judge_keyed(row, t, key, "keyed", take, True)
    row.notes.append("the resumed owner's completion is rejected (token compare-and-set); one charge per downstream key")
    row.seconds = time.monotonic() - t0
    await ca.close()
    await cb.close()
    return row


# --- 6: TTL and the gateway's purge task --------------------------------------------------------

async def s_ttl(t: Target, keys: int) -> Row:
    row = t.row("6 TTL: replay, then new run")
    c = t.client()
    t0 = time.monotonic()

    async def one() -> None:
        key, data = new_key(), body("ttl")
        r = await post(c, "/pay/ttl", key, data)
        start = time.monotonic()
        if r.status != 201 or r.replayed:
            row.bad(f"first {classify(r)}")
            return
        row.trials += 1
        while time.monotonic() - start < (SHORT_TTL_MS - TTL_MARGIN_MS) / 1000:
            rr = await post(c, "/pay/ttl", key, data)
            row.outcomes["before expiry: " + classify(rr)] += 1
            if not (rr.replayed and rr.body == r.body):
                row.bad(f"before expiry: {classify(rr)}")
            await asyncio.sleep(0.25)
        await asyncio.sleep(max(0.0, start + (SHORT_TTL_MS + TTL_MARGIN_MS / 2) / 1000 - time.monotonic()))
        after = await post(c, "/pay/ttl", key, data)
        row.outcomes["after expiry: " + classify(after)] += 1
        effects = t.effects.rows(key)
        row.executions += len(effects)
        if after.status != 201 or after.replayed:
            row.bad(f"after expiry: {classify(after)}")
        elif len(effects) != 2:
            row.bad(f"after expiry: {len(effects)} executions")
        else:
            # A record replaced at expiry is generation 2 (a new downstream key); one the purge
            # task deleted first is absent, so the new claim is generation 1 again, with the
            # same downstream key (derived from scope, fingerprint and generation).
            same = effects[0][3] == effects[1][3]
            row.outcomes["new run: " + ("same downstream key (purged first)" if same else "new downstream key")] += 1

    await asyncio.gather(*(one() for _ in range(keys)))
    row.notes.append(f"purge task every {PURGE_INTERVAL_MS} ms")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


def expired_left(path: str, n: int) -> int:
    lite = sqlite3.connect(path, timeout=30)
    try:
        return int(lite.execute("SELECT count(*) FROM idempo_record WHERE expires_at <= ?", (1000 + n,)).fetchone()[0])
    finally:
        lite.close()


async def s_purge(t: Target, n: int, interval_ms: int) -> Row:
    """The gateway's own purge task (every ``interval_ms``) against n expired rows put in its
    SQLite file, with live requests meanwhile."""
    row = t.row(f"6 purge task, {n:,} expired rows")
    t0 = time.monotonic()
    bindings._fill_expired(t, n)
    rows0, _ = bindings._table_size(t)
    c = t.client()
    lat: List[float] = []
    live = 0
    deadline = t0 + 30 + n / 2000
    left = n
    while time.monotonic() < deadline:
        r = await post(c, "/pay/ou", new_key(), body("during-purge"))
        live += 1
        lat.append(r.elapsed * 1000)
        if r.status != 201:
            row.bad(f"request during purge: {classify(r)}")
        left = expired_left(t.url, n)
        if left == 0:
            break
        await asyncio.sleep(0.01)
    took = time.monotonic() - t0
    rows1, _ = bindings._table_size(t)
    row.outcomes[f"expired rows left {left:,} of {n:,}"] += 1
    if left:
        row.bad(f"{left} expired rows left after {took:.1f} s")
    if rows1 < rows0 - n + live:
        row.bad(f"live records were purged: {rows0} -> {rows1} rows with {live} new")
    lat.sort()
    if lat:
        row.notes.append(f"{live} live requests meanwhile, max {lat[-1]:.0f} ms")
    row.notes.append(f"gone {took:.1f} s after the insert (purge every {interval_ms} ms, batches of 1000)")
    row.seconds = took
    await c.close()
    return row


# --- driver ------------------------------------------------------------------------------------

PURGE_INTERVAL_MS = 500


async def run_store(name: str, svc: Optional[Services], prof: Dict[str, Any], work: Path,
                    only: Optional[set]) -> List[Row]:
    effects = str(work / f"effects-gateway-{name}.sqlite3")
    url = {"memory": "", "sqlite": str(work / "gateway-store.sqlite3"), "postgres": svc.pg_dsn if svc else ""}[name]
    up = Server(UPSTREAM_APP, {"EV_EFFECTS": effects}, workers=2).start()
    gw = Gateway(config(store_toml(name, url), up.port, PURGE_INTERVAL_MS), work)
    second: Optional[Gateway] = None
    rows: List[Row] = []

    def want(s: str) -> bool:
        return only is None or s in only

    try:
        gw.start()
        t = target(name, url, gw, Effects(effects), svc)
        if want("1"):
            rows.append(await bindings.s_concurrent(t, prof["rounds"], mixed=False))
        if want("2"):
            rows.append(await bindings.s_concurrent(t, prof["mixed"], mixed=True))
        if name == "sqlite":
            if want("3"):
                rows.append(await s_upstream_kill(t, up, prof["kill_trials"]))
                rows.append(await s_gateway_kill(t, gw, prof["kill_trials"]))
            if want("4"):
                rows.append(await s_upstream_stop(t, prof["stop_trials"]))
                second = Gateway(config(store_toml(name, url), up.port, PURGE_INTERVAL_MS), work).start()
                rows.append(await s_gateway_stop(t, gw, second, prof["stop_trials"]))
            if want("6"):
                rows.append(await s_ttl(t, prof["ttl_keys"]))
                rows.append(await s_purge(t, prof["purge"], PURGE_INTERVAL_MS))
        if name == "postgres" and want("5"):
            rows.append(await bindings.s_outage(t, prof["probes"]))
            rows.append(await bindings.s_hung_pg(t, prof["hung_probes"]))
    except Exception as exc:  # noqa: BLE001 - reported as a failed row, the suite goes on
        r = Row(name, "suite error", APP)
        where = [ln.strip() for ln in traceback.format_exc().splitlines() if "gateway.py" in ln or "run.py" in ln]
        r.bad(f"{type(exc).__name__}: {exc} at {where}")
        r.notes.append(gw.log_tail(800).replace("\n", " | "))
        rows.append(r)
    finally:
        if second is not None:
            second.close()
        gw.close()
        up.stop()
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("short", "long"), default="short")
    ap.add_argument("--stores", default="memory,sqlite,postgres")
    ap.add_argument("--scenarios", default="", help="comma list of scenario numbers: 1,2,3,4,5,6 (default all)")
    args = ap.parse_args(argv)
    try:
        print(f"[reliability] gateway binary {binary()}", flush=True)
    except RuntimeError as exc:
        print(f"[reliability] gateway: {exc}", file=sys.stderr)
        return 2
    prof = PROFILES[args.mode]
    only = set(args.scenarios.split(",")) if args.scenarios else None
    names = [s for s in args.stores.split(",") if s]
    svc = Services.start() if "postgres" in names else None
    if svc is not None:
        from idempo import stores

        s = stores.PostgresStore(svc.pg_dsn)  # the table exists before the outage scenarios run
        s.create_schema()
        s.close()
    rows: List[Row] = []
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="idempo-evidence-gw.") as work:
            for name in names:
                t1 = time.monotonic()
                got = asyncio.run(run_store(name, svc, prof, Path(work), only))
                rows.extend(got)
                print(f"[reliability] gateway {name}: {len(got)} scenarios, "
                      f"{sum(len(r.violations) for r in got)} violations, {time.monotonic() - t1:.1f} s", flush=True)
    finally:
        if svc is not None:
            svc.stop()
    print_table(rows, f"idempo-gateway reliability scenarios ({args.mode} mode, {time.monotonic() - t0:.0f} s, "
                      f"lease {LEASE_MS} ms, {os.cpu_count()} CPUs)")
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
