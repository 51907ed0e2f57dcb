// SqliteStore on a database file write-locked by another connection (real SQLite files, no mocks):
// the wait for the lock never blocks the event loop (a 10 ms interval keeps ticking), a lock held
// past busyTimeoutMs rejects with STORE_UNAVAILABLE, a lock released in time lets the call run
// whole, and the transactional session's BEGIN IMMEDIATE waits the same way.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { idempo, pkgRoot } from './helpers.mjs';

const require = createRequire(import.meta.url);
const Database = require('better-sqlite3');

const FP = `v1:${'ab'.repeat(32)}`;
const dirs = [];
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** A fresh database file with the schema (made by a first store, closed). */
function freshFile() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-busy-'));
  dirs.push(dir);
  const filename = path.join(dir, 'db.sqlite3');
  new idempo.SqliteStore({ filename }).close();
  return filename;
}

/** Another connection on `filename` holding the write lock (`BEGIN IMMEDIATE`) until `release()`. */
function lockInProcess(filename) {
  const db = new Database(filename);
  db.exec('BEGIN IMMEDIATE');
  let released = false;
  return {
    get released() {
      return released;
    },
    release() {
      if (released) return;
      released = true;
      db.exec('ROLLBACK');
      db.close();
    },
  };
}

/** Counts the ticks of a 10 ms interval (each one proves the event loop turned). */
function ticker() {
  let ticks = 0;
  const t = setInterval(() => {
    ticks++;
  }, 10);
  return {
    get ticks() {
      return ticks;
    },
    stop: () => clearInterval(t),
  };
}

/** Whether `p` is still pending after the event loop's current turn. */
async function pending(p) {
  const marker = Symbol('pending');
  const r = await Promise.race([p.then(() => 'settled', () => 'settled'), new Promise((res) => setImmediate(() => res(marker)))]);
  return r === marker;
}

test('a lock held past busyTimeoutMs rejects with STORE_UNAVAILABLE, the event loop running meanwhile', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 300 });
  const lock = lockInProcess(filename);
  const tick = ticker();
  try {
    const t0 = performance.now();
    const err = await store.claim(randomBytes(32), FP, randomBytes(16), 1000, 60_000).then(
      () => null,
      (e) => e,
    );
    const waited = performance.now() - t0;
    tick.stop();
    assert.ok(err instanceof idempo.StoreUnavailableError, `expected StoreUnavailableError, got ${err}`);
    assert.equal(err.code, 'STORE_UNAVAILABLE');
    assert.match(err.message, /stayed locked for \d+ ms/);
    assert.equal(err.cause?.code, 'SQLITE_BUSY');
    assert.ok(waited >= 250, `rejected after ${waited.toFixed(0)} ms, before the bound`);
    assert.ok(waited < 2000, `rejected after ${waited.toFixed(0)} ms`);
    assert.ok(tick.ticks >= 5, `the event loop ticked only ${tick.ticks} times during the wait`);
    // The connection's own busy_timeout is back to busyTimeoutMs after the store's statements.
    assert.equal(store.db.pragma('busy_timeout', { simple: true }), 300);
    // Nothing was written: the lock is released, the table is empty.
    lock.release();
    const reader = new Database(filename, { readonly: true });
    assert.equal(reader.prepare('SELECT count(*) AS n FROM idempo_record').get().n, 0);
    reader.close();
  } finally {
    tick.stop();
    lock.release();
    await store.close();
  }
});

test('every primitive waits off the event loop and runs once the lock is released', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 10_000 });
  try {
    const scope = randomBytes(32);
    const token = randomBytes(16);
    const other = randomBytes(16);
    // Each step: lock the file, start the call, release the lock from a timer 100 ms later
    // (which only fires if the loop is free), then the call settles after the release.
    const underLock = async (call) => {
      const lock = lockInProcess(filename);
      const tick = ticker();
      const timer = setTimeout(() => lock.release(), 100);
      try {
        const r = await call();
        assert.ok(lock.released, 'the call settled while the lock was still held');
        assert.ok(tick.ticks >= 5, `the event loop ticked only ${tick.ticks} times during the wait`);
        return r;
      } finally {
        clearTimeout(timer);
        tick.stop();
        lock.release();
      }
    };
    const claim = await underLock(() => store.claim(scope, FP, token, 60_000, 60_000));
    assert.equal(claim.claimed, true);
    assert.equal(claim.generation, 1);
    const dup = await underLock(() => store.claim(scope, FP, other, 60_000, 60_000));
    assert.equal(dup.claimed, false);
    assert.equal(dup.record.state, 1);
    assert.ok(Buffer.from(dup.record.token).equals(token));
    assert.equal(await underLock(() => store.renew(scope, token, 60_000)), true);
    assert.equal(await underLock(() => store.takeover(scope, token, other, 1000)), null, 'the lease is live: no takeover');
    assert.equal(await underLock(() => store.markUnknown(scope, token, 1000)), false, 'the lease is live');
    assert.equal(await underLock(() => store.complete(scope, token, Buffer.from('stored'), 60_000)), true);
    // A read takes no write lock (WAL): it answers at once, while the lock is still held.
    const lock = lockInProcess(filename);
    let got;
    try {
      got = await store.get(scope);
      assert.equal(lock.released, false);
    } finally {
      lock.release();
    }
    assert.equal(got.record.state, 2);
    assert.equal(Buffer.from(got.record.response).toString(), 'stored');
    assert.equal(await underLock(() => store.release(scope, token)), false, 'a completed record is not released');
    assert.deepEqual(await underLock(() => store.purgeExpired({ batch: 10 })), { inProgress: 0, completed: 0, outcomeUnknown: 0 });
    // A claim released under the lock is gone.
    const scope2 = randomBytes(32);
    assert.equal((await underLock(() => store.claim(scope2, FP, token, 60_000, 60_000))).claimed, true);
    assert.equal(await underLock(() => store.release(scope2, token)), true);
    // Another connection sees exactly what the calls wrote.
    const reader = new Database(filename, { readonly: true });
    const rows = reader.prepare('SELECT state, response FROM idempo_record').all();
    reader.close();
    assert.deepEqual(
      rows.map((r) => [r.state, Buffer.from(r.response).toString()]),
      [[2, 'stored']],
    );
  } finally {
    await store.close();
  }
});

test('a lock held by another process: the claim waits without blocking, then succeeds once it ends', { timeout: 30_000 }, async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 10_000 });
  const script = `
    const db = new (require('better-sqlite3'))(process.argv[1]);
    db.exec('BEGIN IMMEDIATE');
    process.stdout.write('LOCKED\\n');
    process.stdin.on('data', () => { db.exec('COMMIT'); db.close(); process.stdout.write('RELEASED\\n'); process.exit(0); });
  `;
  const child = spawn(process.execPath, ['-e', script, filename], { cwd: pkgRoot, stdio: ['pipe', 'pipe', 'inherit'] });
  const exited = new Promise((r) => child.once('exit', r));
  let out = '';
  const waitFor = (word) =>
    new Promise((resolve, reject) => {
      const check = () => out.includes(word) && resolve();
      child.stdout.on('data', (d) => {
        out += String(d);
        check();
      });
      child.once('exit', (code) => (out.includes(word) ? resolve() : reject(new Error(`locker exited (${code}) before ${word}`))));
      check();
    });
  const tick = ticker();
  try {
    await waitFor('LOCKED');
    const scope = randomBytes(32);
    const claim = store.claim(scope, FP, randomBytes(16), 60_000, 60_000);
    // The loop runs while the claim waits: 10 ticks pass and the claim is still pending.
    const ticksAt = tick.ticks;
    while (tick.ticks < ticksAt + 10) await new Promise((r) => setTimeout(r, 10));
    assert.equal(await pending(claim), true, 'the claim did not wait for the other process');
    const released = waitFor('RELEASED');
    child.stdin.write('go\n');
    await released;
    const r = await claim;
    assert.equal(r.claimed, true);
    assert.equal((await store.get(scope)).record.state, 1);
  } finally {
    tick.stop();
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
    await store.close();
  }
});

test('busyTimeoutMs 0 fails at once on a held lock; a bad busyTimeoutMs is refused', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 0 });
  const lock = lockInProcess(filename);
  try {
    await assert.rejects(store.claim(randomBytes(32), FP, randomBytes(16), 1000, 1000), (e) => e.code === 'STORE_UNAVAILABLE' && /stayed locked/.test(e.message));
    lock.release();
    assert.equal((await store.claim(randomBytes(32), FP, randomBytes(16), 1000, 1000)).claimed, true);
  } finally {
    lock.release();
    await store.close();
  }
  for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
    assert.throws(() => new idempo.SqliteStore({ filename, busyTimeoutMs: bad }), RangeError);
  }
});

test('transactional session: BEGIN IMMEDIATE waits off the loop, leaving the connection to other requests', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 10_000 });
  const lock = lockInProcess(filename);
  const tick = ticker();
  const session = store.transaction();
  try {
    const seen = randomBytes(32);
    const scope = randomBytes(32);
    const token = randomBytes(16);
    const claim = session.claim(scope, FP, token, 60_000, 60_000);
    // While the session waits for the other connection's lock, the store's reads still run.
    const got = await store.get(seen);
    assert.equal(got.record, null);
    assert.equal(await pending(claim), true, 'the session did not wait for the lock');
    assert.equal(session.tx, null, 'no transaction is open while waiting');
    const ticksAt = tick.ticks;
    while (tick.ticks < ticksAt + 5) await new Promise((r) => setTimeout(r, 10));
    lock.release();
    const r = await claim;
    assert.equal(r.claimed, true);
    assert.ok(session.tx !== null, 'the transaction is open');
    assert.equal(await session.complete(scope, token, Buffer.from('done'), 60_000), true);
    await session.commit();
    assert.equal(session.committed, true);
    const after = await store.get(scope);
    assert.equal(after.record.state, 2);
    assert.equal(Buffer.from(after.record.response).toString(), 'done');
  } finally {
    tick.stop();
    lock.release();
    await session.close();
    await store.close();
  }
});

test('transactional session: a lock held past busyTimeoutMs answers in flight, not blocking the loop', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 300 });
  const lock = lockInProcess(filename);
  const tick = ticker();
  const session = store.transaction();
  try {
    const t0 = performance.now();
    const r = await session.claim(randomBytes(32), FP, randomBytes(16), 60_000, 60_000);
    const waited = performance.now() - t0;
    tick.stop();
    assert.equal(r.claimed, false);
    assert.equal(r.locked, true, 'answered as a lock wait (core answers it 409 in flight)');
    assert.equal(r.record, undefined, 'no invented record');
    assert.ok(waited >= 250, `answered after ${waited.toFixed(0)} ms, before the bound`);
    assert.ok(waited < 2000, `answered after ${waited.toFixed(0)} ms`);
    assert.ok(tick.ticks >= 5, `the event loop ticked only ${tick.ticks} times during the wait`);
    assert.equal(session.tx, null);
    // The session gave the connection back: the store's calls run once the lock is gone.
    lock.release();
    assert.equal((await store.claim(randomBytes(32), FP, randomBytes(16), 1000, 1000)).claimed, true);
  } finally {
    tick.stop();
    lock.release();
    await session.close();
    await store.close();
  }
});

/** An Express app with one idempotent route on `store` and a plain `GET /ping`. */
async function app(store, options = {}) {
  const express = require('express');
  const state = { runs: 0 };
  const a = express();
  a.set('env', 'test');
  a.get('/ping', (_req, res) => res.send('pong'));
  a.post('/orders', idempo.idempotency({ store, ...options }), (req, res) => {
    state.runs++;
    res.status(201).json({ run: state.runs });
  });
  const srv = await new Promise((resolve) => {
    const s = a.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    state,
    url: `http://127.0.0.1:${srv.address().port}`,
    close: () =>
      new Promise((r) => {
        srv.closeAllConnections();
        srv.close(r);
      }),
  };
}

const order = (url, key) =>
  fetch(`${url}/orders`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: '{"n":1}' });

test('middleware: other requests are served while a POST waits for the lock; the POST then runs once', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 10_000 });
  const lock = lockInProcess(filename);
  const srv = await app(store);
  try {
    const post = order(srv.url, 'busy-mw-000001');
    // Served during the POST's wait (the POST has up to 10 s; the ping takes milliseconds).
    const ping = await fetch(`${srv.url}/ping`);
    assert.equal(await ping.text(), 'pong');
    assert.equal(await pending(post), true, 'the POST did not wait for the lock');
    lock.release();
    const r = await post;
    assert.equal(r.status, 201);
    assert.deepEqual(await r.json(), { run: 1 });
    const again = await order(srv.url, 'busy-mw-000001');
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(srv.state.runs, 1);
  } finally {
    lock.release();
    await srv.close();
    await store.close();
  }
});

test('middleware: a lock held past busyTimeoutMs answers 503 + Retry-After, the handler never runs', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 300 });
  const lock = lockInProcess(filename);
  const srv = await app(store);
  try {
    const r = await order(srv.url, 'busy-mw-000002');
    assert.equal(r.status, 503);
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
    assert.match(r.headers.get('content-type') ?? '', /application\/problem\+json/);
    await r.text();
    assert.equal(srv.state.runs, 0);
    lock.release();
    const ok = await order(srv.url, 'busy-mw-000002');
    assert.equal(ok.status, 201);
    assert.equal(srv.state.runs, 1);
  } finally {
    lock.release();
    await srv.close();
    await store.close();
  }
});

test('no attempt starts past busyTimeoutMs, even when the retry timer fires late (the lock free by then)', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 200 });
  const lock = lockInProcess(filename);
  const scope = randomBytes(32);
  // Near the bound, the event loop is blocked for 150 ms and the lock is released at its end:
  // the store's pending retry timer can only fire after that, past the bound, with the lock free.
  setTimeout(() => {
    const until = performance.now() + 150;
    while (performance.now() < until);
    lock.release();
  }, 150);
  try {
    const err = await store.claim(scope, FP, randomBytes(16), 1000, 60_000).then(
      () => null,
      (e) => e,
    );
    assert.ok(err instanceof idempo.StoreUnavailableError, `a claim past the bound applied: ${err}`);
    assert.equal((await store.get(scope)).record, null, 'nothing was written after the bound');
  } finally {
    lock.release();
    store.close();
  }
});

test('the middleware waits a little longer than the store bounds itself (default storeTimeoutMs)', async () => {
  const { defaultStoreTimeoutMs } = require('../dist/server/options.js');
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 1200, lockTimeoutMs: 800 });
  try {
    assert.equal(store.callTimeoutMs, 2000);
    assert.equal(defaultStoreTimeoutMs(store), 2250);
    assert.equal(defaultStoreTimeoutMs(new idempo.MemoryStore()), 5000);
  } finally {
    store.close();
  }
});

test('a call whose caller gave up (aborted signal) starts no further attempt: nothing applies later', async () => {
  const filename = freshFile();
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 5000 });
  const lock = lockInProcess(filename);
  const scope = randomBytes(32);
  const giveUp = new AbortController();
  setTimeout(() => giveUp.abort(new Error('host deadline')), 150);
  setTimeout(() => lock.release(), 300);
  try {
    const err = await store.claim(scope, FP, randomBytes(16), 60_000, 60_000, { signal: giveUp.signal }).then(
      () => null,
      (e) => e,
    );
    assert.ok(err instanceof idempo.StoreUnavailableError && /gave up/.test(err.message), `claim applied after the abort: ${err}`);
    await new Promise((r) => setTimeout(r, 300)); // the lock is free by now
    assert.equal((await store.get(scope)).record, null, 'the abandoned claim applied later');
  } finally {
    lock.release();
    store.close();
  }
});

test('middleware: storeTimeoutMs below the store bound: the 503 comes at storeTimeoutMs, and once the lock is free the key runs once', async () => {
  const filename = freshFile();
  // The store would wait 5 s for the lock; the middleware gives up after 300 ms.
  const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 5000 });
  const lock = lockInProcess(filename);
  // A 1 s lease (core's cleanup of the refused claim retries for 1 s); the lock is freed at
  // 1.6 s. The store-level test above shows the abandoned call itself never applies.
  const srv = await app(store, { storeTimeoutMs: 300, leaseMs: 1000 });
  try {
    const t0 = performance.now();
    const r = await order(srv.url, 'busy-mw-000003');
    assert.equal(r.status, 503);
    await r.text();
    assert.ok(performance.now() - t0 < 2000);
    await new Promise((res) => setTimeout(res, Math.max(0, 1600 - (performance.now() - t0))));
    lock.release();
    await new Promise((res) => setTimeout(res, 300));
    // Nothing holds the key: the request runs at once, exactly once.
    const ok = await order(srv.url, 'busy-mw-000003');
    assert.equal(ok.status, 201);
    assert.equal(srv.state.runs, 1);
  } finally {
    lock.release();
    await srv.close();
    await store.close();
  }
});
