// PostgresStore under faults, on a server of this file's own: a frozen server (SIGSTOP) makes
// every store call fail with STORE_UNAVAILABLE within the deadline (503 + Retry-After, the handler
// never runs) and the broken connection is discarded; after `pg_ctl restart` no request fails.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';
import { ownServerUnavailable, startOwnPg } from './pgserver.mjs';

const require = createRequire(import.meta.url);
const pg = require('pg');
const express = require('express');

const skip = ownServerUnavailable() ?? false;
const TIMEOUT = 600;
const FP = `v1:${'cd'.repeat(32)}`;
let server;

before(() => {
  if (!skip) server = startOwnPg();
});
after(() => server?.stop());

async function app(store) {
  const state = { runs: 0 };
  const a = express();
  a.post('/pay', idempo.idempotency({ store, heartbeatMs: 0, unavailableRetryAfterMs: 2000 }), (req, res) => {
    state.runs++;
    res.status(201).json({ run: state.runs });
  });
  const s = await new Promise((resolve) => {
    const srv = a.listen(0, '127.0.0.1', () => resolve(srv));
  });
  return {
    state,
    post: (key) =>
      fetch(`http://127.0.0.1:${s.address().port}/pay`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: '{"amount":5}',
      }),
    close: () =>
      new Promise((r) => {
        s.closeAllConnections();
        s.close(r);
      }),
  };
}

test('frozen PostgreSQL: STORE_UNAVAILABLE within the deadline, connection discarded, 503 + Retry-After, recovery', { skip, timeout: 60_000 }, async () => {
  const pool = new pg.Pool({ connectionString: server.dsn, max: 4 });
  const poolErrors = [];
  const store = new idempo.PostgresStore({ pool, timeoutMs: TIMEOUT, onPoolError: (e) => poolErrors.push(e) });
  await store.createSchema();
  const srv = await app(store);
  try {
    const scope = randomBytes(32);
    assert.equal((await store.claim(scope, FP, randomBytes(16), 30_000, 60_000)).claimed, true); // a warm connection
    assert.equal(pool.totalCount, 1);
    const pids = server.freeze();
    try {
      // The warm connection: the statement is sent, nothing answers.
      let t0 = Date.now();
      await assert.rejects(store.get(scope), (e) => e instanceof idempo.StoreUnavailableError && /did not answer within/.test(e.message));
      let took = Date.now() - t0;
      assert.ok(took >= TIMEOUT - 50 && took < TIMEOUT + 1500, `failed after ${took} ms`);
      assert.equal(pool.totalCount, 0, 'the broken connection was discarded, not given back');
      // A new connection: TCP is accepted, the startup never answers.
      t0 = Date.now();
      await assert.rejects(store.get(scope), (e) => e instanceof idempo.StoreUnavailableError);
      took = Date.now() - t0;
      assert.ok(took < TIMEOUT + 1500, `failed after ${took} ms`);
      // Through the middleware: 503 problem with Retry-After, within the deadline, handler not run.
      t0 = Date.now();
      const r = await srv.post('frozen-key-0001');
      took = Date.now() - t0;
      assert.equal(r.status, 503);
      assert.equal(r.headers.get('retry-after'), '2');
      assert.equal((await r.json()).type, 'urn:idempo:problem:store-unavailable');
      assert.ok(took < TIMEOUT + 1500, `503 after ${took} ms`);
      assert.equal(srv.state.runs, 0);
    } finally {
      server.thaw(pids);
    }
    // Recovery: the same key runs once, then replays.
    const a = await srv.post('frozen-key-0001');
    assert.equal(a.status, 201);
    const b = await srv.post('frozen-key-0001');
    assert.equal(b.status, 201);
    assert.equal(b.headers.get('idempotent-replayed'), 'true');
    assert.equal(srv.state.runs, 1);
  } finally {
    await srv.close();
    await pool.end();
  }
});

test('pg_ctl restart: idle connections are dropped, no request fails afterwards', { skip, timeout: 120_000 }, async () => {
  const pool = new pg.Pool({ connectionString: server.dsn, max: 8 });
  const poolErrors = [];
  const store = new idempo.PostgresStore({ pool, timeoutMs: 2000, onPoolError: (e) => poolErrors.push(e) });
  await store.createSchema();
  const srv = await app(store);
  try {
    // Several idle connections in the pool.
    const warm = await Promise.all(Array.from({ length: 6 }, (_, i) => srv.post(`warm-key-${i}-0001`)));
    assert.deepEqual(
      warm.map((r) => r.status),
      Array(6).fill(201),
    );
    assert.ok(pool.idleCount >= 2, `idle connections before the restart: ${pool.idleCount}`);
    server.restart();
    // Every request after the restart succeeds: sequential, then concurrent.
    const statuses = [];
    for (let i = 0; i < 10; i++) statuses.push((await srv.post(`after-restart-${i}-01`)).status);
    const burst = await Promise.all(Array.from({ length: 12 }, (_, i) => srv.post(`burst-key-${i}-0001`)));
    statuses.push(...burst.map((r) => r.status));
    assert.deepEqual(statuses, Array(22).fill(201));
    assert.ok(poolErrors.length >= 1, 'the pool reported the terminated idle connections');
    // Replays after the restart too.
    const replay = await srv.post('after-restart-0-01');
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.equal(srv.state.runs, 6 + 22);
  } finally {
    await srv.close();
    await pool.end();
  }
});

const ORPHAN_TRIALS = Number(process.env.IDEMPO_ORPHAN_TRIALS ?? 4);
const CLEANUP_BOUND_MS = 5000;

test('a claim refused by the deadline: how often it survives the thaw without a flow (counted, printed)', { skip, timeout: 120_000 }, async () => {
  // The deadline resets the connection (RST), which does not stop a resumed server from running
  // what its kernel already received. This calls the store directly (no flow, so no cleanup):
  // the count is a measurement, not a pass mark; asserted are the fail-closed refusal and that a
  // surviving row is exactly the refused claim.
  const pool = new pg.Pool({ connectionString: server.dsn, max: 1 });
  const store = new idempo.PostgresStore({ pool, timeoutMs: TIMEOUT, onPoolError: () => undefined });
  await store.createSchema();
  const check = new pg.Client({ connectionString: server.dsn });
  let survived = 0;
  try {
    for (let i = 0; i < ORPHAN_TRIALS; i++) {
      // A warm connection that has run the claim: the whole statement goes out at once.
      assert.equal((await store.claim(randomBytes(32), FP, randomBytes(16), 30_000, 60_000)).claimed, true);
      const scope = randomBytes(32);
      const token = randomBytes(16);
      const pids = server.freeze();
      try {
        await assert.rejects(store.claim(scope, FP, token, 30_000, 60_000), (e) => e instanceof idempo.StoreUnavailableError && /did not answer within/.test(e.message));
      } finally {
        server.thaw(pids);
      }
      await new Promise((r) => setTimeout(r, 300));
      if (i === 0) await check.connect();
      const { rows } = await check.query('SELECT state, token FROM idempo_record WHERE scope_key = $1', [scope]);
      if (rows.length) {
        assert.equal(rows[0].state, 1);
        assert.deepEqual(rows[0].token, token);
        survived++;
      }
    }
  } finally {
    await check.end();
    await pool.end();
  }
  console.log(`orphan claims after a deadline (Node PostgresStore, no flow): ${survived} of ${ORPHAN_TRIALS}`);
});

test('through the middleware, core\'s cleanup releases a claim refused by the deadline within 5 s of the thaw', { skip, timeout: 120_000 }, async () => {
  // The request is answered 503 at once (the handler never runs); the claim the resumed server
  // applies is released by the session's background cleanup (token-fenced). Counted: claims the
  // cleanup released (its `cleanup` event: proof the orphan existed) and rows left after the bound.
  const pool = new pg.Pool({ connectionString: server.dsn, max: 1 });
  const store = new idempo.PostgresStore({ pool, timeoutMs: TIMEOUT, onPoolError: () => undefined });
  await store.createSchema();
  const events = new idempo.IdempotencyEvents();
  const cleanups = [];
  events.on('cleanup', (e) => cleanups.push(e));
  const state = { runs: 0 };
  const a = express();
  a.post('/pay', idempo.idempotency({ store, heartbeatMs: 0, events, scope: () => 'orphan-test' }), (req, res) => {
    state.runs++;
    res.status(201).json({ run: state.runs });
  });
  const srv = await new Promise((resolve) => {
    const s = a.listen(0, '127.0.0.1', () => resolve(s));
  });
  const post = (key) =>
    fetch(`http://127.0.0.1:${srv.address().port}/pay`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: '{"amount":7}',
    });
  const check = new pg.Client({ connectionString: server.dsn });
  await check.connect();
  const { rows: before } = await check.query('SELECT count(*)::int AS n FROM idempo_record WHERE state = 1');
  let remaining = 0;
  try {
    for (let i = 0; i < ORPHAN_TRIALS; i++) {
      assert.equal((await post(`orphan-warm-${i}-0001`)).status, 201); // a warm connection
      const pids = server.freeze();
      let r;
      try {
        r = await post(`orphan-key-${i}-00001`);
      } finally {
        server.thaw(pids);
      }
      assert.equal(r.status, 503);
      const thawed = Date.now();
      const inProgress = async () => (await check.query('SELECT count(*)::int AS n FROM idempo_record WHERE state = 1')).rows[0].n - before[0].n;
      // The thawed backend may apply the claim after the first look, so "no row yet" is not done:
      // wait for this trial's applied cleanup (or the bound), then count what is left.
      const releasedBefore = cleanups.filter((e) => e.applied).length;
      let left = await inProgress();
      while (Date.now() - thawed < CLEANUP_BOUND_MS && (left > 0 || cleanups.filter((e) => e.applied).length === releasedBefore)) {
        await new Promise((res) => setTimeout(res, 100));
        left = await inProgress();
      }
      remaining += left;
    }
  } finally {
    await check.end();
    srv.closeAllConnections();
    await new Promise((res) => srv.close(res));
    await pool.end();
  }
  const released = cleanups.filter((e) => e.applied).length;
  console.log(`orphan claims through the middleware (Node PostgresStore): ${released} of ${ORPHAN_TRIALS} released by the cleanup, ${remaining} left after ${CLEANUP_BOUND_MS} ms`);
  assert.equal(state.runs, ORPHAN_TRIALS, 'only the warm-up requests ran the handler');
  assert.equal(remaining, 0, 'orphan claims outlived the cleanup bound');
  assert.ok(released >= 1, 'no claim survived the thaw, so the cleanup was not exercised');
  assert.ok(cleanups.every((e) => e.op === 'release' && e.route !== undefined));
});
