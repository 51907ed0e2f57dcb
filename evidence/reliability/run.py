"""Reliability suite: idempo's ASGI middleware under uvicorn worker processes (Python) and its
Express middleware under ``cluster`` worker processes (Node), against memory, SQLite, PostgreSQL
and Redis, with real kill -9, SIGSTOP, store outages and a hung PostgreSQL server.

    python -m evidence.reliability.run --mode short     # CI: about a minute per store, fails on a violation
    python -m evidence.reliability.run --mode long      # publishing: >= 10^5 trials per store
    python -m evidence.reliability.run --apps node --stores postgres --scenarios 5

Executions are counted in the app's own ``effects`` table (evidence/reliability/app.py,
evidence/reliability/node_app.cjs), never in idempo's records. One summary table is printed at the end; the exit status is 1 when any
scenario saw a violation of the guarantees in spec/PROTOCOL.md section 11.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from evidence.lib.http import Client, ConnectionDied, Reply
from evidence.lib.services import Server, Services, rss_kib
from evidence.reliability.harness import (APPS, HUNG_SLACK_MS, LEASE_MS, MODES, NODE_PURGE, SHORT_TTL_MS, SQLITE_BUSY_MS,
                                          STEPS, STORE_TIMEOUT_MS, TTL_MARGIN_MS, TX_TABLE, Effects, Row, Target, body,
                                          classify, new_key, post, print_table, store_sql)
from evidence.reliability.memory import SOAK_JUDGE_MIN_S, SOAK_WARMUP_S, gc_sample, judge_memory

# --- 1 and 2: concurrent duplicates ------------------------------------------------------------

async def s_concurrent(t: Target, rounds: Dict[int, int], mixed: bool, route: str = "/pay/ou") -> Row:
    name = "2 K dup, half other body" if mixed else "1 K concurrent same key"
    if route == "/pay/tx":
        name = ("2t" if mixed else "1t") + name[1:] + ", tx"
    row = t.row(name)
    c = t.client()
    t0 = time.monotonic()
    lat: List[float] = []

    async def one_round(k: int) -> None:
        key = new_key()
        tags = ["A" if (not mixed or i % 2 == 0) else "B" for i in range(k)]
        random.shuffle(tags)
        sleep = str(random.choice((0, 0, 5, 20)))

        async def one(tag: str) -> Tuple[str, Optional[Reply]]:
            try:
                return tag, await post(c, route, key, body(tag), extra=[("x-ev-sleep-ms", sleep)])
            except ConnectionDied as exc:
                row.bad(f"K={k} connection died: {exc}")
                return tag, None

        replies = await asyncio.gather(*(one(tg) for tg in tags))
        fresh = [(tg, r) for tg, r in replies if r is not None and r.status == 201 and not r.replayed]
        for _tg, r in replies:
            row.trials += 1
            if r is None:
                continue
            lat.append(r.elapsed)
            label = classify(r)
            row.outcomes[label] += 1
            if r.status >= 500:
                row.bad(f"K={k} {label}")
        if len(fresh) != 1:
            row.bad(f"K={k} {len(fresh)} fresh answers")
            return
        winner_tag, winner = fresh[0]
        for tg, r in replies:
            if r is None:
                continue
            if tg != winner_tag:
                # Transactional mode: a duplicate that waited past the lock timeout for the
                # uncommitted claim is answered 409 (it cannot read the fingerprint yet).
                if r.status != 422 and not (route == "/pay/tx" and classify(r) == "409 in-flight"):
                    row.bad(f"K={k} other body got {classify(r)}")
            elif r is not winner and not (r.status == 409 or (r.replayed and r.body == winner.body)):
                row.bad(f"K={k} same body got {classify(r)}")
        if route == "/pay/tx":
            n = int(store_sql(t, "SELECT count(*) FROM ev_effects_tx WHERE key = ?", (key,))[0][0])
        else:
            n = len(t.effects.rows(key))
        row.executions += n
        if n != 1:
            row.bad(f"K={k} {n} executions")
        final = await post(c, route, key, body(winner_tag))
        if not (final.replayed and final.body == winner.body):
            row.bad(f"K={k} follow-up got {classify(final)}")

    for k, n in rounds.items():
        parallel = max(1, min(n, 128 // k))
        done = 0
        while done < n:
            batch = min(parallel, n - done)
            await asyncio.gather(*(one_round(k) for _ in range(batch)))
            done += batch
    row.seconds = time.monotonic() - t0
    if lat:
        lat.sort()
        row.notes.append(f"p50 {lat[len(lat) // 2] * 1000:.0f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.0f} ms")
    await c.close()
    return row


# --- 3: kill -9 at each step ------------------------------------------------------------------

async def crash_at(c: Client, route: str, key: str, data: bytes, step: str, row: Row, what: str) -> bool:
    """Sends the request with ``x-ev-crash: step`` (the worker kills itself there with SIGKILL):
    True once the connection died as asked; a worker that answered instead is a violation."""
    try:
        r = await post(c, route, key, data, extra=[("x-ev-crash", step)], fresh=True)
    except ConnectionDied:
        return True
    row.bad(f"{what}: worker survived ({classify(r)})")
    return False


async def s_kill(t: Target, trials: int, *, transactional: bool = False) -> Row:
    """kill -9 at each step of a request, in each effect mode (``/pay/{ou,rerun,keyed}``), or of a
    transactional request (``/pay/tx``) with ``transactional``."""
    if transactional:
        return await _kill_transactional(t, trials)
    return await _kill_modes(t, trials)

EXPECT_AFTER = {
    # mode -> step -> allowed labels after the lease (second request onwards)
    "ou": {"after_complete": {"201 replay"}, "*": {"500 outcome-unknown"}},
    "rerun": {"after_complete": {"201 replay"}, "*": {"201"}},
    "keyed": {"after_complete": {"201 replay"}, "*": {"201"}},
}


async def _kill_modes(t: Target, trials: int) -> Row:
    row = t.row("3 kill -9 at each step")
    c = t.client()
    t0 = time.monotonic()
    plan = [(m, s) for _ in range(trials) for m in MODES for s in STEPS]
    done: List[Tuple[str, str, str, float, bytes, str]] = []
    window = 0
    for mode, step in plan:
        key = new_key()
        data = body(f"{mode}-{step}")
        if not await crash_at(c, f"/pay/{mode}", key, data, step, row, f"{mode}/{step}"):
            continue
        crashed = time.monotonic()
        row.trials += 1
        r = await post(c, f"/pay/{mode}", key, data, fresh=True)
        label = classify(r)
        row.outcomes[f"before lease: {label}"] += 1
        allowed_after = EXPECT_AFTER[mode].get(step, EXPECT_AFTER[mode]["*"])
        if step == "after_complete":
            ok = label == "201 replay"
        else:
            # The lease runs from the last renewal before the kill (heartbeat every third of the
            # lease, later on a loaded machine), so it may end well before crash + lease: an
            # answer less than half a lease after the kill must still be 409.
            late = time.monotonic() - crashed >= LEASE_MS / 2000
            ok = label == "409 in-flight" or (late and label in allowed_after)
        if not ok:
            row.bad(f"{mode}/{step}: before lease {label}")
        done.append((mode, step, key, crashed, data, label))
    if done:
        wait = max(d[3] for d in done) + LEASE_MS / 1000 + 0.15 - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
    for mode, step, key, _, data, before in done:
        allowed = EXPECT_AFTER[mode].get(step, EXPECT_AFTER[mode]["*"])
        if before == "201":  # the early retry came after the lease and re-ran: now a replay
            allowed = {"201 replay"}
        first = await post(c, f"/pay/{mode}", key, data, fresh=True)
        second = await post(c, f"/pay/{mode}", key, data, fresh=True)
        l1, l2 = classify(first), classify(second)
        row.outcomes[f"after lease: {l1}"] += 1
        if l1 not in allowed:
            row.bad(f"{mode}/{step}: after lease {l1}")
        if first.status == 201 and not (second.replayed and second.body == first.body):
            row.bad(f"{mode}/{step}: second retry {l2} is not the replay")
        if first.status == 500 and l2 != "500 outcome-unknown":
            row.bad(f"{mode}/{step}: second retry {l2}")
        effects = t.effects.rows(key)
        n = len(effects)
        row.executions += n
        effect_before = step in ("after_effect", "before_complete", "after_complete")
        if mode == "ou":
            if n != (1 if effect_before else 0):
                row.bad(f"ou/{step}: {n} executions")
        elif mode == "keyed":
            dkeys = {e[3] for e in effects}
            charges = sum(t.effects.downstream(d) for d in dkeys)
            if len(dkeys) != 1 or charges != 1:
                row.bad(f"keyed/{step}: {charges} downstream charges over {len(dkeys)} keys")
            if first.status == 201 and not first.replayed and effect_before:
                if first.json()["charge"] != min(e[0] for e in effects):
                    row.bad(f"keyed/{step}: re-run did not return the first charge")
        else:  # rerun, unkeyed: the documented at-least-once window
            expected = 2 if step in ("after_effect", "before_complete") else 1
            if n != expected:
                row.bad(f"rerun/{step}: {n} executions, expected {expected}")
            if n == 2:
                window += 1
    row.notes.append(f"unkeyed re_run window (spec 11): {window} double runs")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


async def _kill_transactional(t: Target, trials: int) -> Row:
    """kill -9 at each step of a transactional request (claim, handler write and completion in
    one transaction of the store's database, spec/STORAGE.md section 4.4).

    Required: before the commit a crash leaves nothing (no execution row, the key claimable at
    once: the immediate retry runs fresh, generation 1, without waiting for the lease); after
    the commit the retry replays; in every case exactly one execution row and one completed
    record per key."""
    import idempo

    row = t.row("3t kill -9, transactional")
    c = t.client()
    t0 = time.monotonic()
    retry_ms: List[float] = []
    for step in [s for _ in range(trials) for s in STEPS]:
        key = new_key()
        data = body(f"tx-{step}")
        if not await crash_at(c, "/pay/tx", key, data, step, row, f"tx/{step}"):
            continue
        row.trials += 1
        committed = step == "after_complete"
        left = store_sql(t, "SELECT count(*) FROM ev_effects_tx WHERE key = ?", (key,))[0][0]
        if left != (1 if committed else 0):
            row.bad(f"tx/{step}: {left} execution rows visible after the crash")
        r = await post(c, "/pay/tx", key, data, fresh=True, timeout=15)
        label = classify(r)
        row.outcomes[f"retry at once: {label}"] += 1
        retry_ms.append(r.elapsed * 1000)
        if committed:
            if label != "201 replay":
                row.bad(f"tx/{step}: retry {label}, expected the replay")
        elif label != "201" or r.json().get("generation") != 1:
            row.bad(f"tx/{step}: retry {label} {r.body[:60]!r}, expected a fresh run (generation 1)")
        again = await post(c, "/pay/tx", key, data, fresh=True)
        if not (again.replayed and again.body == r.body):
            row.bad(f"tx/{step}: second retry {classify(again)} is not the replay")
        n = int(store_sql(t, "SELECT count(*) FROM ev_effects_tx WHERE key = ?", (key,))[0][0])
        row.executions += n
        if n != 1:
            row.bad(f"tx/{step}: {n} executions")
        rec = store_sql(t, "SELECT state, generation FROM idempo_record WHERE scope_key = ?",
                         (idempo.scope_id("", "POST", "/pay/tx", key),))
        if [tuple(x) for x in rec] != [(2, 1)]:
            row.bad(f"tx/{step}: record (state, generation) {rec}, expected one completed, generation 1")
    if retry_ms:
        row.notes.append(f"retry right after the kill answered in max {max(retry_ms):.0f} ms (lease {LEASE_MS} ms)")
    row.notes.append("no double execution, nothing left before the commit")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


# --- 4: SIGSTOP past the lease, then SIGCONT -------------------------------------------------

@dataclass
class Frozen:
    """A request whose worker was frozen mid-handler past the lease, and the duplicate sent then."""

    first: "asyncio.Future[Reply]"
    """The frozen request (answers after SIGCONT, or dies with its worker)."""
    second: Reply
    """The duplicate sent once the lease had run out."""
    killed: bool
    """The server's supervisor killed the frozen worker (uvicorn's health check does)."""
    frozen_at: float


async def freeze_past_lease(t: Target, c: Client, route: str, key: str, data: bytes, row: Row, what: str,
                            timeout: Optional[float] = None) -> Optional[Frozen]:
    """Starts the request with ``x-ev-stop`` (its handler waits), SIGSTOPs its worker once the
    handler has started, sends the duplicate after the lease, then SIGCONTs the worker. None (and
    a violation) when the handler never started."""
    first = asyncio.ensure_future(post(c, route, key, data, extra=[("x-ev-stop", "1")], fresh=True, timeout=60))
    pid = None
    for _ in range(500):
        pid = t.effects.started_pid(key)
        if pid:
            break
        await asyncio.sleep(0.01)
    if pid is None:
        row.bad(f"{what}handler never started")
        first.cancel()
        return None
    os.kill(pid, signal.SIGSTOP)
    row.trials += 1
    frozen_at = time.monotonic()
    killed = False
    try:
        await asyncio.sleep(LEASE_MS / 1000 + 0.2)
        second = await post(c, route, key, data, fresh=True, timeout=timeout)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            killed = True
    return Frozen(first, second, killed, frozen_at)


async def s_stop(t: Target, trials: int, *, transactional: bool = False) -> Row:
    """SIGSTOP a worker mid-handler past the lease, then SIGCONT: in each effect mode, or on the
    transactional route with ``transactional``."""
    if transactional:
        return await _stop_transactional(t, trials)
    return await _stop_modes(t, trials)


async def _stop_modes(t: Target, trials: int) -> Row:
    row = t.row("4 SIGSTOP past lease, SIGCONT")
    c = t.client()
    t0 = time.monotonic()
    for mode in MODES * trials:
        key = new_key()
        data = body(f"stop-{mode}")
        route = f"/pay/{mode}"
        frozen = await freeze_past_lease(t, c, route, key, data, row, f"{mode}: ")
        if frozen is None:
            continue
        second, killed, frozen_at = frozen.second, frozen.killed, frozen.frozen_at
        if second.elapsed > 2.0:
            row.notes.append(f"{mode}: takeover request took {second.elapsed * 1000:.0f} ms")
        try:
            stale = await frozen.first
        except ConnectionDied as exc:
            if not killed:
                row.bad(f"{mode}: paused request died: {exc}")
                continue
            # The frozen owner was killed by the server's supervisor: it can no longer complete;
            # the stored response must still be the takeover's.
            row.outcomes[f"{mode}: owner killed by the supervisor after {time.monotonic() - frozen_at:.1f} s frozen"] += 1
            stale = Reply(599, {}, b"")
        third = await post(c, route, key, data, fresh=True)
        await asyncio.sleep(0.1)
        fourth = await post(c, route, key, data, fresh=True)
        labels = [classify(x) for x in (second, stale, third, fourth)]
        row.outcomes[f"{mode}: " + " / ".join(labels)] += 1
        if mode == "ou":
            if labels[0] != "500 outcome-unknown" or labels[2] != "500 outcome-unknown" or labels[3] != labels[2]:
                row.bad(f"ou: {labels}")
        else:
            if second.status != 201 or second.replayed:
                row.bad(f"{mode}: takeover answered {labels[0]}")
            elif not (third.replayed and third.body == second.body and fourth.body == second.body):
                row.bad(f"{mode}: stored response changed: {labels}")
            elif stale.status == 201 and stale.body == third.body:
                row.bad(f"{mode}: the paused owner's response was stored")
        effects = t.effects.rows(key)
        row.executions += len(effects)
        if mode == "keyed":
            charges = sum(t.effects.downstream(d) for d in {e[3] for e in effects})
            if charges != 1:
                row.bad(f"keyed: {charges} downstream charges")
    row.notes.append("stale completion rejected (token compare-and-set); replays keep the takeover's body")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


async def _stop_transactional(t: Target, trials: int) -> Row:
    """SIGSTOP a transactional request's worker mid-handler past the lease, then SIGCONT.

    The claim is uncommitted while the owner is frozen, so no lease can expire and nobody can
    take over: a duplicate waits for the row (or database) lock and is refused (409 or 503),
    never run. After SIGCONT the owner commits; its answer is the one replayed; one execution.
    If the server's supervisor kills the frozen worker meanwhile (uvicorn's health check does
    after about 5 s, which SQLite's 5 s busy wait reaches), its transaction rolls back and the
    key runs fresh exactly once."""
    row = t.row("4t SIGSTOP, transactional")
    c = t.client()
    t0 = time.monotonic()
    for _ in range(trials):
        key = new_key()
        data = body("stop-tx")
        frozen = await freeze_past_lease(t, c, "/pay/tx", key, data, row, "", timeout=30)
        if frozen is None:
            continue
        second, killed = frozen.second, frozen.killed
        row.outcomes["duplicate during the freeze: " + classify(second)] += 1
        if second.status == 201 and not killed:
            row.bad(f"a duplicate ran while the owner was frozen: {classify(second)}")
        try:
            owner: Optional[Reply] = await frozen.first
        except ConnectionDied as exc:
            if not killed:
                row.bad(f"paused request died: {exc}")
            owner = None
        third = await post(c, "/pay/tx", key, data, fresh=True)
        if owner is None:
            # Killed while frozen (uvicorn's worker health check): its transaction rolled back,
            # so the key ran fresh once, in the duplicate or in this retry.
            row.outcomes["owner killed while frozen, then: " + classify(third)] += 1
            fresh = second if second.status == 201 else third
            if fresh.status != 201 or fresh.replayed or fresh.json().get("generation") != 1:
                row.bad(f"after the frozen owner was killed: {classify(fresh)}, expected a fresh run")
            elif fresh is second and not (third.replayed and third.body == second.body):
                row.bad(f"after the frozen owner was killed: {classify(third)} is not the replay")
        elif owner.status != 201 or owner.replayed:
            row.bad(f"owner answered {classify(owner)} after SIGCONT")
        else:
            row.outcomes["owner after SIGCONT: " + classify(owner)] += 1
            if not (third.replayed and third.body == owner.body):
                row.bad(f"after SIGCONT: {classify(third)} is not the owner's replay")
        n = int(store_sql(t, "SELECT count(*) FROM ev_effects_tx WHERE key = ?", (key,))[0][0])
        row.executions += n
        if n != 1:
            row.bad(f"{n} executions")
    row.notes.append("no takeover while the claim is uncommitted; one execution per key")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


# --- 5: store outage ---------------------------------------------------------------------------

async def s_outage(t: Target, probes: int) -> Row:
    row = t.row("5 store outage")
    c = t.client()
    t0 = time.monotonic()
    svc = t.svc
    lock_conn: Optional[sqlite3.Connection] = None
    if t.name == "postgres":
        assert svc is not None
        svc.pg_stop()
        how = "server stopped (pg_ctl stop -m immediate)"
    elif t.name == "redis":
        assert svc is not None
        svc.redis_stop()
        how = "server stopped (SHUTDOWN NOSAVE)"
    else:
        lock_conn = sqlite3.connect(t.url, timeout=5, isolation_level=None)
        lock_conn.execute("BEGIN EXCLUSIVE")
        how = f"database locked by another process (busy_timeout {SQLITE_BUSY_MS} ms)"
    keys: List[str] = []  # refused during the outage
    worst = 0.0
    try:
        before = t.effects.total()
        keys = [new_key() for _ in range(probes)]

        async def refused(key: str) -> None:
            nonlocal worst
            try:
                # A fresh connection: an idle keep-alive one may have outlived the server's
                # keep-alive timeout (uvicorn: 5 s) while the slowest probe of a batch waited.
                r = await post(c, "/pay/ou", key, body("outage"), fresh=True, timeout=15)
            except (ConnectionDied, asyncio.TimeoutError) as exc:
                row.bad(f"no answer: {type(exc).__name__} {exc}")
                return
            row.trials += 1
            worst = max(worst, r.elapsed)
            label = classify(r)
            row.outcomes[label] += 1
            if label != "503 store-unavailable" or not r.headers.get("retry-after", "").isdigit():
                row.bad(f"during outage: {label} retry-after={r.headers.get('retry-after')}")

        # Concurrent probes, ten at a time (both apps' SQLite stores wait for a locked file off
        # the event loop / per request since 72326b9 and 2056b15).
        step = 10
        for i in range(0, len(keys), step):
            await asyncio.gather(*(refused(k) for k in keys[i:i + step]))
        if t.effects.total() != before:
            row.bad("the handler ran while the store was down")
    finally:
        down_at = time.monotonic()
        if t.name == "postgres":
            assert svc is not None
            svc.pg_start()
        elif t.name == "redis":
            assert svc is not None
            svc.redis_start()
        elif lock_conn is not None:
            lock_conn.execute("ROLLBACK")
            lock_conn.close()
    back_at = time.monotonic()
    recovered = None
    for _ in range(400):
        probe: Optional[Reply]
        try:
            probe = await post(c, "/pay/ou", new_key(), body("probe"), timeout=15)
        except ConnectionDied:
            probe = None
        if probe is not None and probe.status == 201:
            recovered = time.monotonic() - back_at
            break
        if probe is not None:
            row.outcomes[f"recovering: {classify(probe)}"] += 1
        await asyncio.sleep(0.05)
    if recovered is None:
        row.bad("no recovery within 20 s")
    # Connections opened before the outage are broken: each fails closed once (503) and is
    # replaced. Drive traffic until a whole concurrent batch succeeds.
    stale = 0
    died = 0

    async def warm() -> Optional[Reply]:
        nonlocal died
        try:
            return await post(c, "/pay/ou", new_key(), body("warm"), fresh=True, timeout=15)
        except (ConnectionDied, asyncio.TimeoutError):
            died += 1  # e.g. a worker its supervisor replaced while the store was locked
            return None

    for _ in range(50):
        replies = [r for r in await asyncio.gather(*(warm() for _ in range(24))) if r is not None]
        bad = [r for r in replies if r.status != 201]
        for r in bad:
            if classify(r) != "503 store-unavailable":
                row.bad(f"after recovery: {classify(r)}")
        stale += len(bad)
        if not bad:
            break
    row.notes.append(f"{stale} x 503 from connections broken by the outage, then all 201")
    if died:
        row.notes.append(f"{died} connections died after recovery")
    # The refused requests' keys. A claim the store refused at once never landed: the retry runs
    # once now. A store that keeps retrying a statement past the request's deadline (spec/PROTOCOL.md
    # 7.4: a failed claim may be applied later) can leave the key claimed by nobody until core's
    # cleanup releases it or its lease ends: 409 first, then one run (201) or 500 outcome-unknown
    # (the handler never ran), never a second execution. Waits for that, bounded by ten leases.
    late = 0
    for key in keys:
        r = await post(c, "/pay/ou", key, body("outage"))
        if classify(r) == "409 in-flight":
            late += 1
            until = time.monotonic() + 10 * LEASE_MS / 1000
            while classify(r) == "409 in-flight" and time.monotonic() < until:
                await asyncio.sleep(0.2)
                r = await post(c, "/pay/ou", key, body("outage"))
        label = classify(r)
        n = len(t.effects.rows(key))
        row.executions += n
        if label not in ("201", "500 outcome-unknown"):
            row.bad(f"retry after recovery: {label}")
        elif n != (1 if r.status == 201 else 0):
            row.bad(f"refused key: {n} executions after a {label}")
        row.outcomes[f"retry after recovery: {label}"] += 1
    unknown = row.outcomes["retry after recovery: 500 outcome-unknown"]
    if late or unknown:
        row.notes.append(f"refused keys whose claim landed after their 503 (PROTOCOL 7.4): {late} held "
                         f"(409) at the first retry, {unknown} ended outcome-unknown (the handler never ran)")
    row.notes.append(how)
    row.notes.append(f"slowest 503 {worst * 1000:.0f} ms")
    if recovered is not None:
        row.notes.append(f"recovery {recovered * 1000:.0f} ms after restart (restart took {(back_at - down_at) * 1000:.0f} ms)")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


async def s_hung_pg(t: Target, probes: int) -> Row:
    """PostgreSQL alive but not answering (SIGSTOP of every server process, connections open).

    Checks: each request gets ``503 store-unavailable`` with ``Retry-After`` within the app's
    store timeout (STORE_TIMEOUT_MS + HUNG_SLACK_MS), the handler never runs while the server is
    frozen, service recovers after SIGCONT, and each refused key then runs exactly once after the
    lease (a claim the resumed server applied late is released by core's cleanup first)."""
    row = t.row("5b store hung (SIGSTOP)")
    assert t.svc is not None
    c = t.client()
    t0 = time.monotonic()
    bound = (STORE_TIMEOUT_MS + HUNG_SLACK_MS) / 1000
    # Open connections first (a busy service), then freeze the server.
    await asyncio.gather(*(post(c, "/pay/ou", new_key(), body("warm")) for _ in range(12)))
    pids = t.svc.pg_pids()
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    keys = [new_key() for _ in range(probes)]
    worst = 0.0
    unanswered = 0
    before = t.effects.total()
    try:
        async def refused(key: str) -> None:
            nonlocal worst, unanswered
            try:
                r = await post(c, "/pay/ou", key, body("hung"), fresh=True, timeout=bound + 5)
            except (ConnectionDied, asyncio.TimeoutError) as exc:
                unanswered += 1
                row.trials += 1
                row.outcomes[f"no answer within {bound + 5:.0f} s"] += 1
                row.bad(f"no answer within {bound + 5:.0f} s ({type(exc).__name__})")
                return
            row.trials += 1
            worst = max(worst, r.elapsed)
            label = classify(r)
            row.outcomes[label] += 1
            if label != "503 store-unavailable" or not r.headers.get("retry-after", "").isdigit():
                row.bad(f"hung store answered {label} retry-after={r.headers.get('retry-after')}")
            elif r.elapsed > bound:
                row.bad(f"503 after {r.elapsed * 1000:.0f} ms, over the {STORE_TIMEOUT_MS} ms store timeout "
                        f"(+{HUNG_SLACK_MS} ms slack)")

        for i in range(0, probes, 10):
            await asyncio.gather(*(refused(k) for k in keys[i:i + 10]))
        if t.effects.total() != before:
            row.bad("the handler ran while the store was hung")
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
    resumed = time.monotonic()
    recovered = None
    for _ in range(400):
        try:
            probe: Optional[Reply] = await post(c, "/pay/ou", new_key(), body("probe"), timeout=15)
        except (ConnectionDied, asyncio.TimeoutError):
            probe = None
        if probe is not None and probe.status == 201:
            recovered = time.monotonic() - resumed
            break
        if probe is not None:
            row.outcomes[f"recovering: {classify(probe)}"] += 1
            if probe.status != 503:
                row.bad(f"after SIGCONT: {classify(probe)}")
        await asyncio.sleep(0.05)
    if recovered is None:
        row.bad("no recovery within 20 s of SIGCONT")
    # The refused keys after the lease: a claim the server applied only on resuming (its client
    # had given up) is released by core's cleanup (PROTOCOL 7.4), which keeps retrying for the
    # default cleanup budget (30 s, longer than the freeze) with at most half a lease between
    # attempts, so it is gone before its lease ends and every refused key runs once. A key
    # answered 500 outcome-unknown here had no handler run: the cleanup gave up too early.
    await asyncio.sleep(LEASE_MS / 1000 + 0.3)
    for key in keys:
        r = await post(c, "/pay/ou", key, body("hung"), timeout=15)
        row.outcomes[f"retry after lease: {classify(r)}"] += 1
        if classify(r) not in ("201", "201 replay"):  # replay: an unanswered one ran
            row.bad(f"retry of a refused key: {classify(r)}")
        n = len(t.effects.rows(key))
        row.executions += n
        if n != (1 if r.status == 201 else 0):
            row.bad(f"refused key: {n} executions after a {classify(r)}")
    unknown = row.outcomes["retry after lease: 500 outcome-unknown"]
    if unknown:
        row.notes.append(f"{unknown} refused keys outcome-unknown without a run (a late claim outlived its cleanup)")
    row.notes.append(f"all server processes SIGSTOPped; store timeout {STORE_TIMEOUT_MS} ms")
    if worst:
        row.notes.append(f"slowest 503 {worst * 1000:.0f} ms")
    if recovered is not None:
        row.notes.append(f"recovery {recovered * 1000:.0f} ms after SIGCONT")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


# --- 6: TTL and purge --------------------------------------------------------------------------

async def s_ttl(t: Target, keys: int) -> Row:
    row = t.row("6 TTL: replay, then new run")
    c = t.client()
    t0 = time.monotonic()

    async def one() -> None:
        key = new_key()
        data = body("ttl")
        r = await post(c, "/ttl", key, data)
        start = time.monotonic()
        if r.status != 201 or r.replayed:
            row.bad(f"first {classify(r)}")
            return
        row.trials += 1
        while time.monotonic() - start < (SHORT_TTL_MS - TTL_MARGIN_MS) / 1000:
            rr = await post(c, "/ttl", key, data)
            row.outcomes["before expiry: " + classify(rr)] += 1
            if not (rr.replayed and rr.body == r.body):
                row.bad(f"before expiry: {classify(rr)}")
            await asyncio.sleep(0.25)
        await asyncio.sleep(max(0.0, start + (SHORT_TTL_MS + TTL_MARGIN_MS / 2) / 1000 - time.monotonic()))
        after = await post(c, "/ttl", key, data)
        row.outcomes["after expiry: " + classify(after)] += 1
        # The memory stores sweep expired records lazily: one swept before the new claim
        # restarts at generation 1 (a purged key is absent); every other store replaces it (2).
        gens = (1, 2) if t.name == "memory" else (2,)
        if after.status != 201 or after.replayed or after.json()["generation"] not in gens:
            row.bad(f"after expiry: {classify(after)} {after.body[:80]!r}")
        effects = t.effects.rows(key)
        row.executions += len(effects)
        if sorted(e[2] for e in effects) not in ([1, g] for g in gens):
            row.bad(f"generations {[e[2] for e in effects]}")

    await asyncio.gather(*(one() for _ in range(keys)))
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


def _fill_expired(t: Target, n: int) -> None:
    """Inserts n already-expired completed records straight into the table."""
    if t.name == "postgres":
        import psycopg

        with psycopg.connect(t.url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO idempo_record (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response) "
                "SELECT sha256(int8send(g)), 'v1:' || repeat('0', 64), 2, substring(sha256(int8send(-g)) from 1 for 16), 1, NULL, "
                "1000 + g, '\\x696472010000c80000000000'::bytea FROM generate_series(1, %s) AS g",
                (n,),
            )
            conn.execute("ANALYZE idempo_record")
    else:
        lite = sqlite3.connect(t.url, timeout=30, isolation_level=None)
        try:
            import hashlib

            lite.execute("BEGIN IMMEDIATE")
            lite.executemany(
                "INSERT INTO idempo_record (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response) "
                "VALUES (?, ?, 2, ?, 1, NULL, ?, ?)",
                (
                    (hashlib.sha256(b"p%d" % g).digest(), "v1:" + "0" * 64, hashlib.md5(b"%d" % g).digest(),
                     1000 + g, bytes.fromhex("696472010000c80000000000"))
                    for g in range(n)
                ),
            )
            lite.execute("COMMIT")
        finally:
            lite.close()


def _table_size(t: Target) -> Tuple[int, int]:
    """(rows, bytes) of idempo_record."""
    if t.name == "postgres":
        import psycopg

        with psycopg.connect(t.url, autocommit=True) as conn:
            rows = conn.execute("SELECT count(*) FROM idempo_record").fetchone()
            size = conn.execute("SELECT pg_total_relation_size('idempo_record')").fetchone()
            assert rows is not None and size is not None
            return int(rows[0]), int(size[0])
    lite = sqlite3.connect(t.url, timeout=30)
    try:
        count = int(lite.execute("SELECT count(*) FROM idempo_record").fetchone()[0])
        pages = int(lite.execute("PRAGMA page_count").fetchone()[0])
        free = int(lite.execute("PRAGMA freelist_count").fetchone()[0])
        psize = int(lite.execute("PRAGMA page_size").fetchone()[0])
        return count, (pages - free) * psize
    finally:
        lite.close()


def _vacuum(t: Target) -> int:
    """VACUUM the table (outside the timed purge) and return its size after."""
    if t.name == "postgres":
        import psycopg

        with psycopg.connect(t.url, autocommit=True) as conn:
            conn.execute("VACUUM FULL idempo_record")
    else:
        lite = sqlite3.connect(t.url, timeout=30, isolation_level=None)
        try:
            lite.execute("VACUUM")
        finally:
            lite.close()
    return _table_size(t)[1]


async def s_purge(t: Target, n: int, batch: int) -> Row:
    """Purge of n expired rows in batches (the app's own binding: Python's ``purge_expired`` on a
    thread, or Node's ``purgeExpired`` in node_purge.cjs), with live requests meanwhile."""
    row = t.row(f"6 purge {n:,} expired rows")  # rows, not trials: trials stay 0
    from idempo import stores

    t0 = time.monotonic()
    _fill_expired(t, n)
    rows0, size0 = _table_size(t)
    batch_ms: List[float] = []
    deleted = Counter()  # type: Counter[str]
    stop = threading.Event()
    failure: List[str] = []
    th: Optional[threading.Thread] = None
    node_task: Optional["asyncio.Task[None]"] = None

    if t.app == "node":
        async def node_purge() -> None:
            try:
                proc = await asyncio.create_subprocess_exec(
                    "node", NODE_PURGE, t.name, t.url, str(batch),
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
                assert proc.stdout is not None and proc.stderr is not None
                async for line in proc.stdout:
                    b = json.loads(line)
                    batch_ms.append(float(b["ms"]))
                    for k in ("inProgress", "completed", "outcomeUnknown"):
                        deleted[k] += int(b[k])
                err = await proc.stderr.read()
                if await proc.wait() != 0:
                    failure.append(err.decode(errors="replace")[-300:])
            finally:
                stop.set()

        node_task = asyncio.ensure_future(node_purge())
    else:
        store: Any = stores.PostgresStore(t.url) if t.name == "postgres" else stores.SQLiteStore(t.url)

        def purge() -> None:
            try:
                while True:
                    b0 = time.monotonic()
                    counts = store.purge_expired(batch)
                    batch_ms.append((time.monotonic() - b0) * 1000)
                    deleted["completed"] += counts.completed
                    deleted["total"] += counts.total
                    if counts.total < batch:
                        break
            except Exception as exc:  # noqa: BLE001 - reported as a violation
                failure.append(f"{type(exc).__name__}: {exc}")
            finally:
                close = getattr(store, "close", None)
                if close:
                    close()
                stop.set()

        th = threading.Thread(target=purge)

    c = t.client()
    probe_lat: List[float] = []
    p0 = time.monotonic()
    if th is not None:
        th.start()
    while not stop.is_set():  # live traffic during the purge: new claims must not wait on it
        r = await post(c, "/pay/ou", new_key(), body("during-purge"))
        probe_lat.append(r.elapsed * 1000)
        if r.status != 201:
            row.bad(f"request during purge: {classify(r)}")
        await asyncio.sleep(0.005)
    if th is not None:
        th.join()
    if node_task is not None:
        await node_task
    purge_s = time.monotonic() - p0
    rows1, size1 = _table_size(t)
    vacuumed = _vacuum(t)
    total = deleted["total"] or deleted["inProgress"] + deleted["completed"] + deleted["outcomeUnknown"]
    row.outcomes[f"rows deleted {total:,} (completed {deleted['completed']:,})"] += 1
    for f in failure:
        row.bad(f"purge failed: {f}")
    if total < n:
        row.bad(f"purged {total} of {n}")
    if rows1 > rows0 - n + len(probe_lat):
        row.bad(f"table went from {rows0} to {rows1} rows")
    row.notes.append(f"{purge_s:.2f} s, {len(batch_ms)} batches of {batch}, "
                     f"batch max {max(batch_ms, default=0.0):.0f} ms")
    if probe_lat:
        probe_lat.sort()
        row.notes.append(f"{len(probe_lat)} requests during purge: max {probe_lat[-1]:.0f} ms")
    row.notes.append(f"table {rows0:,} rows {size0 / 1e6:.1f} MB -> {rows1:,} rows {size1 / 1e6:.1f} MB, "
                     f"{vacuumed / 1e6:.2f} MB after VACUUM (FULL on PostgreSQL)")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


# --- 7: soak -----------------------------------------------------------------------------------

async def s_soak(t: Target, seconds: float, kills: bool) -> Row:
    row = t.row(f"7 soak {seconds:.0f} s" + (" + kill -9" if kills else ""))
    c = t.client()
    t0 = time.monotonic()
    protected = t.server.worker_pids()[0]
    samples: List[Tuple[float, int, int]] = []  # (seconds since t0, RSS KiB, trials so far)
    gc0: Optional[Dict[str, Any]] = None
    gc1: Optional[Dict[str, Any]] = None
    keys: Dict[str, str] = {}
    killed = 0

    async def group() -> None:
        key = new_key()
        mode = random.choice(("ou", "keyed"))
        keys[key] = mode
        data = body(f"soak-{mode}")

        async def client_loop() -> None:
            for _ in range(30):  # a retrying client, bounded
                try:
                    r = await post(c, f"/pay/{mode}", key, data, fresh=False)
                except ConnectionDied:
                    row.outcomes["connection died (killed worker, or idle keep-alive closed)"] += 1
                    await asyncio.sleep(0.2)
                    continue
                label = classify(r)
                row.trials += 1
                row.outcomes[label] += 1
                if r.status in (409,) or label == "503 store-unavailable":
                    await asyncio.sleep(0.1)
                    continue
                if r.status >= 500 and label != "500 outcome-unknown":
                    row.bad(f"soak {label}")
                return

        await asyncio.gather(*(client_loop() for _ in range(random.choice((2, 3, 4)))))

    next_sample = t0
    next_kill = t0 + 1.0
    judged = seconds >= SOAK_WARMUP_S + SOAK_JUDGE_MIN_S
    while time.monotonic() - t0 < seconds:
        await asyncio.gather(*(group() for _ in range(8)))
        now = time.monotonic()
        if now >= next_sample:
            samples.append((now - t0, rss_kib(protected), row.trials))
            next_sample = now + 1.0
        if judged and gc0 is None and now - t0 >= SOAK_WARMUP_S:
            gc0 = await gc_sample(t, protected)
            if gc0 is None:
                judged = False  # asked once; the verdict says it is missing
        if kills and now >= next_kill:
            victims = [p for p in t.server.worker_pids() if p != protected]
            if victims:
                os.kill(random.choice(victims), signal.SIGKILL)
                killed += 1
            next_kill = now + 2.0
    # Keys whose owner died need the lease to run out before their final answer; check effects.
    per = t.effects.per_key(list(keys))
    for key, mode in keys.items():
        effects = per[key]
        row.executions += len(effects)
        if mode == "ou" and len(effects) > 1:
            row.bad(f"soak ou: {len(effects)} executions")
        if mode == "keyed":
            d = {e[3] for e in effects}
            if len(d) > 1:
                row.bad("soak keyed: several downstream keys")
            if d and t.effects.downstream(d.pop()) != 1:
                row.bad("soak keyed: downstream charged twice")
    samples.append((time.monotonic() - t0, rss_kib(protected), row.trials))
    if gc0 is not None:
        gc1 = await gc_sample(t, protected)
    held = (int(gc0.get("records", 0)), int(gc1.get("records", 0))) if gc0 and gc1 else (0, 0)
    judge_memory(row, t, protected, samples, seconds, gc0, gc1, held)
    row.notes.append(f"{len(keys)} keys, {killed} workers killed")
    row.seconds = time.monotonic() - t0
    await c.close()
    return row


# --- driver ------------------------------------------------------------------------------------

PROFILES = {
    "short": dict(rounds={2: 40, 16: 12, 64: 4, 256: 2}, mixed={2: 20, 16: 8, 64: 3, 256: 1},
                  kill_trials=1, stop_trials=1, probes=5, hung_probes=5, ttl_keys=8, purge=10_000, soak=6.0,
                  tx_rounds={2: 20, 16: 6, 64: 2}),
    "long": dict(rounds={2: 6000, 16: 1200, 64: 300, 256: 120}, mixed={2: 3000, 16: 600, 64: 150, 256: 60},
                 kill_trials=5, stop_trials=5, probes=50, hung_probes=30, ttl_keys=50, purge=1_000_000, soak=60.0,
                 tx_rounds={2: 600, 16: 120, 64: 30}),
    # The Node app in long mode (unless --node-full): a quarter of the rounds (the transactional
    # rounds and the soak as Python's: 15 s warm-up + 45 s judged), so the publishing run with both
    # apps stays near 30 minutes on two cores.
    "long-node": dict(rounds={2: 1500, 16: 300, 64: 75, 256: 30}, mixed={2: 750, 16: 150, 64: 38, 256: 15},
                      kill_trials=3, stop_trials=3, probes=50, hung_probes=30, ttl_keys=50, purge=200_000, soak=60.0,
                      tx_rounds={2: 600, 16: 120, 64: 30}),
}


async def run_store(app: str, name: str, svc: Optional[Services], prof: Dict[str, Any], work: Path,
                    only: Optional[set], keep_mem: Optional[Path] = None) -> List[Row]:
    effects = str(work / f"effects-{app}-{name}.sqlite3")
    url = {"memory": "", "sqlite": str(work / f"store-{app}.sqlite3"),
           "postgres": svc.pg_dsn if svc else "", "redis": svc.redis_url if svc else ""}[name]
    workers = 1 if name == "memory" else 3
    env = {"EV_STORE": name, "EV_STORE_URL": url, "EV_EFFECTS": effects, "EV_LEASE_MS": str(LEASE_MS),
           "EV_SHORT_TTL_MS": str(SHORT_TTL_MS), "EV_BUSY_MS": str(SQLITE_BUSY_MS),
           "EV_STORE_TIMEOUT_MS": str(STORE_TIMEOUT_MS)}
    if name == "postgres":
        from idempo import stores

        s = stores.PostgresStore(url)
        s.create_schema()
        s.close()
    mem_dir: Optional[Path] = None
    if app == "node":
        # Memory samples for scenario 7, and a collector the soak can trigger (SIGUSR2).
        mem_dir = (keep_mem or work) / f"mem-{app}-{name}"
        mem_dir.mkdir(parents=True, exist_ok=True)
        env["EV_MEM_DIR"] = str(mem_dir)
        env["NODE_OPTIONS"] = " ".join(x for x in (os.environ.get("NODE_OPTIONS", ""), "--expose-gc") if x)
    tx = name in TX_TABLE
    server = Server(APPS[app], env, workers=workers, node=app == "node").start()
    t = Target(name, url, workers, server, Effects(effects), svc, app, mem_dir)
    if tx:
        store_sql(t, TX_TABLE[name])
    rows: List[Row] = []

    def want(s: str) -> bool:
        return only is None or s in only

    try:
        if want("1"):
            rows.append(await s_concurrent(t, prof["rounds"], mixed=False))
        if want("2"):
            rows.append(await s_concurrent(t, prof["mixed"], mixed=True))
        if tx and want("1"):
            rows.append(await s_concurrent(t, prof["tx_rounds"], mixed=False, route="/pay/tx"))
            rows.append(await s_concurrent(t, prof["tx_rounds"], mixed=True, route="/pay/tx"))
        if name != "memory":
            if want("3"):
                rows.append(await s_kill(t, prof["kill_trials"]))
                if tx:
                    rows.append(await s_kill(t, prof["kill_trials"], transactional=True))
                # Let the replacements of the killed workers finish starting (on a loaded machine
                # a request could otherwise wait for one, and a SIGSTOP row would time it).
                server.wait_ready()
                await asyncio.sleep(1.0)
            if want("4"):
                rows.append(await s_stop(t, prof["stop_trials"]))
                if tx:
                    rows.append(await s_stop(t, prof["stop_trials"], transactional=True))
            if want("5"):
                rows.append(await s_outage(t, prof["probes"]))
                # Worker threads still hold connections the outage broke; each would fail closed
                # once (503, counted above). Later scenarios start from fresh workers.
                server.stop()
                server.start()
                if name == "postgres":
                    rows.append(await s_hung_pg(t, prof["hung_probes"]))
                    server.stop()
                    server.start()
        if want("6"):
            rows.append(await s_ttl(t, prof["ttl_keys"]))
            if name in ("sqlite", "postgres") and prof["purge"]:
                rows.append(await s_purge(t, prof["purge"], 1000))
        if want("7"):
            rows.append(await s_soak(t, prof["soak"], kills=name != "memory"))
    except Exception as exc:  # noqa: BLE001 - reported as a failed row, the suite goes on
        r = t.row("suite error")
        where = [ln.strip() for ln in traceback.format_exc().splitlines() if "run.py" in ln]
        r.bad(f"{type(exc).__name__}: {exc} at {where}")
        r.notes.append(server.log_tail(800).replace("\n", " | "))
        rows.append(r)
    finally:
        server.stop()
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("short", "long"), default="short")
    ap.add_argument("--stores", default="memory,sqlite,postgres,redis")
    ap.add_argument("--apps", default="python,node", help="comma list: python (ASGI, uvicorn), node (Express, cluster)")
    ap.add_argument("--scenarios", default="", help="comma list of scenario numbers (default all)")
    ap.add_argument("--node-full", action="store_true",
                    help="long mode: drive the Node app with the full long profile (default: a quarter of the rounds)")
    ap.add_argument("--soak", type=float, default=None, help="soak seconds per store (override)")
    ap.add_argument("--purge", type=int, default=None, help="expired rows to purge (override)")
    ap.add_argument("--keep-mem", default=None, metavar="DIR",
                    help="keep the Node workers' memory samples (one JSON line a second per worker, "
                         "<DIR>/mem-node-<store>/<pid>.jsonl) for a diagnosis")
    args = ap.parse_args(argv)
    keep_mem = Path(args.keep_mem).resolve() if args.keep_mem else None
    prof = dict(PROFILES[args.mode])
    if args.soak is not None:
        prof["soak"] = args.soak
    if args.purge is not None:
        prof["purge"] = args.purge
    if args.mode == "long":
        PROFILES["long"] = prof
    else:
        PROFILES["short"] = prof
    only = set(args.scenarios.split(",")) if args.scenarios else None
    names = [s for s in args.stores.split(",") if s]
    apps = [a for a in args.apps.split(",") if a]
    for a in apps:
        if a not in APPS:
            ap.error(f"unknown app {a!r} (python, node)")
    svc = Services.start() if {"postgres", "redis"} & set(names) else None
    rows: List[Row] = []
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="idempo-evidence.") as work:
            for app in apps:
                app_prof = prof
                if app == "node" and args.mode == "long" and not args.node_full:
                    app_prof = dict(PROFILES["long-node"])
                    if args.soak is not None:
                        app_prof["soak"] = args.soak
                for name in names:
                    t1 = time.monotonic()
                    got = asyncio.run(run_store(app, name, svc, app_prof, Path(work), only, keep_mem))
                    rows.extend(got)
                    n = sum(len(r.violations) for r in got)
                    print(f"[reliability] {app} {name}: {len(got)} scenarios, {n} violations, "
                          f"{time.monotonic() - t1:.1f} s", flush=True)
    finally:
        if svc is not None:
            svc.stop()
    print_table(rows, f"idempo reliability suite ({args.mode} mode, {time.monotonic() - t0:.0f} s, "
                      f"lease {LEASE_MS} ms, {os.cpu_count()} CPUs)")
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
