// Transactional mode (spec/STORAGE.md §4.4) on real PostgreSQL and SQLite: the claim, the
// handler's business writes and the completion commit together and the response follows the
// commit; a handler error leaves nothing; concurrent duplicates make one business row; a worker
// SIGKILLed mid-handler leaves nothing and the retry runs once; a duplicate that waits past the
// lock timeout gets 409 + Retry-After.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createRequire } from 'node:module';
import { idempo, closeShared, here, sharedPgPool, txStoreKinds } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
const Fastify = require('fastify');

after(closeShared);

const kinds = txStoreKinds;

function listen(app) {
  return new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () =>
      resolve({
        url: `http://127.0.0.1:${s.address().port}`,
        close: () =>
          new Promise((r) => {
            s.closeAllConnections();
            s.close(r);
          }),
      }),
    );
  });
}

/** An Express app whose handler writes one business row per run through its transaction. */
async function expressApp(k, extra = {}) {
  const state = { runs: 0, gate: null, seen: [] };
  const app = express();
  app.set('env', 'test');
  app.post('/orders', idempo.idempotency({ store: k.store, transactional: true, ...extra }), async (req, res) => {
    state.runs++;
    // Both ways to reach the transaction give the same connection.
    assert.equal(idempo.currentTransaction(), req.idempotency.tx);
    await k.insert(req.idempotency.tx, req.body.k);
    if (state.gate) await state.gate;
    await new Promise((r) => setImmediate(r));
    state.seen.push(idempo.currentTransaction() === req.idempotency.tx);
    if (req.body.fail) throw new Error('boom after the write');
    res.status(req.body.status ?? 201).json({ k: req.body.k, run: state.runs });
  });
  return { state, srv: await listen(app) };
}

function post(url, key, body) {
  return fetch(`${url}/orders`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  });
}

for (const [name, kind] of Object.entries(kinds)) {
  test(`${name}: the record and the business row commit together; the response follows the commit`, { skip: kind.skip }, async () => {
    const k = await kind.make();
    const { state, srv } = await expressApp(k);
    try {
      const r = await post(srv.url, 'tx-commit-0001', { k: 'a' });
      assert.equal(r.status, 201);
      // Read on another connection right after the response: already committed.
      assert.equal(await k.count('a'), 1);
      assert.equal(await k.records(), 1);
      assert.deepEqual(await r.json(), { k: 'a', run: 1 });
      const again = await post(srv.url, 'tx-commit-0001', { k: 'a' });
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.equal(state.runs, 1);
      assert.equal(await k.count('a'), 1);
      // A different body under the key is still a mismatch.
      assert.equal((await post(srv.url, 'tx-commit-0001', { k: 'b' })).status, 422);
      assert.deepEqual(state.seen, [true]);
      // Outside a handler there is no transaction.
      assert.throws(() => idempo.currentTransaction(), (e) => e instanceof idempo.NoTransactionError && e.code === 'NO_TRANSACTION');
    } finally {
      await srv.close();
      await k.cleanup();
    }
  });

  test(`${name}: a handler error or an unstored status rolls back the business row and the claim`, { skip: kind.skip }, async () => {
    const k = await kind.make();
    const { state, srv } = await expressApp(k);
    try {
      const r = await post(srv.url, 'tx-error-00001', { k: 'e', fail: true });
      assert.equal(r.status, 500);
      await r.text();
      assert.equal(await k.count('e'), 0);
      assert.equal(await k.records(), 0);
      // A 429 is not stored (transient): its writes roll back with the released claim.
      const t = await post(srv.url, 'tx-error-00002', { k: 't', status: 429 });
      assert.equal(t.status, 429);
      assert.equal(await k.count('t'), 0);
      assert.equal(await k.records(), 0);
      // The key is free at once (no lease to wait for): the retry runs and commits.
      const ok = await post(srv.url, 'tx-error-00001', { k: 'e' });
      assert.equal(ok.status, 201);
      assert.equal(await k.count('e'), 1);
      assert.equal(state.runs, 3);
    } finally {
      await srv.close();
      await k.cleanup();
    }
  });

  test(`${name}: a response too large to keep commits as response-not-retained, even under re_run`, { skip: kind.skip }, async () => {
    // Core's transactional flow: the record is completed with the response-not-retained problem
    // and committed with the write (never left in progress, where re_run would run the committed
    // write again), and the handler's response is sent after the commit.
    const k = await kind.make();
    const { state, srv } = await expressApp(k, { maxStoredBodyBytes: 4, takeover: 're_run' });
    try {
      const r = await post(srv.url, 'tx-large-00001', { k: 'l' });
      assert.equal(r.status, 201);
      assert.deepEqual(await r.json(), { k: 'l', run: 1 });
      assert.equal(await k.count('l'), 1);
      assert.equal(await k.records(), 1);
      const again = await post(srv.url, 'tx-large-00001', { k: 'l' });
      assert.equal(again.status, 500);
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.equal((await again.json()).type, 'urn:idempo:problem:response-not-retained');
      assert.equal(state.runs, 1);
      assert.equal(await k.count('l'), 1);
    } finally {
      await srv.close();
      await k.cleanup();
    }
  });

  test(`${name}: concurrent duplicates make one business row`, { skip: kind.skip }, async () => {
    const k = await kind.make({ lockTimeoutMs: 10_000 });
    const { state, srv } = await expressApp(k);
    try {
      let open;
      state.gate = new Promise((r) => {
        open = r;
      });
      const all = Array.from({ length: 8 }, () => post(srv.url, 'tx-dup-000001', { k: 'd' }));
      await new Promise((r) => setTimeout(r, 150));
      open();
      const rs = await Promise.all(all);
      const bodies = await Promise.all(rs.map((r) => r.json()));
      assert.deepEqual(
        rs.map((r) => r.status),
        Array(8).fill(201),
      );
      assert.equal(rs.filter((r) => r.headers.get('idempotent-replayed') === 'true').length, 7);
      for (const b of bodies) assert.deepEqual(b, { k: 'd', run: 1 });
      assert.equal(state.runs, 1);
      assert.equal(await k.count('d'), 1);
    } finally {
      await srv.close();
      await k.cleanup();
    }
  });

  test(`${name}: a duplicate waiting past the lock timeout gets 409 with Retry-After`, { skip: kind.skip }, async () => {
    const k = await kind.make({ lockTimeoutMs: 300 });
    const { state, srv } = await expressApp(k);
    try {
      let open;
      state.gate = new Promise((r) => {
        open = r;
      });
      const first = post(srv.url, 'tx-lock-00001', { k: 'l' });
      await new Promise((r) => setTimeout(r, 100));
      const t0 = Date.now();
      const dup = await post(srv.url, 'tx-lock-00001', { k: 'l' });
      const waited = Date.now() - t0;
      assert.equal(dup.status, 409);
      assert.equal(dup.headers.get('retry-after'), '1');
      assert.equal((await dup.json()).type, 'urn:idempo:problem:in-flight');
      assert.ok(waited >= 250, `answered after ${waited} ms, before the lock timeout`);
      open();
      assert.equal((await first).status, 201);
      assert.equal(state.runs, 1);
      assert.equal(await k.count('l'), 1);
    } finally {
      await srv.close();
      await k.cleanup();
    }
  });

  test(`${name}: a worker SIGKILLed mid-handler leaves nothing; the retry runs once`, { skip: kind.skip, timeout: 60_000 }, async () => {
    const k = await kind.make();
    const child = spawn(process.execPath, [path.join(here, 'fixtures', 'tx-worker.mjs'), name, k.where, k.schema], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const exited = new Promise((r) => child.once('exit', r));
    try {
      const lines = [];
      const waitFor = (prefix) =>
        new Promise((resolve, reject) => {
          const check = () => {
            const hit = lines.find((l) => l.startsWith(prefix));
            if (hit) return resolve(hit);
            return undefined;
          };
          child.stdout.on('data', (d) => {
            lines.push(...String(d).split('\n').filter(Boolean));
            check();
          });
          child.on('exit', (code) => reject(new Error(`worker exited (${code}) before ${prefix}`)));
          check();
        });
      const port = Number((await waitFor('LISTEN')).split(' ')[1]);
      const inFlight = post(`http://127.0.0.1:${port}`, 'tx-kill-00001', { k: 'x' }).catch((e) => e);
      await waitFor('INSERTED');
      child.kill('SIGKILL');
      assert.ok((await inFlight) instanceof Error, 'the killed worker never answered');
      await exited;
      // The worker's transaction died with it: no business row, no record.
      assert.equal(await k.count('x'), 0);
      assert.equal(await k.records(), 0);
      // The retry (another worker) runs at once, exactly once, and commits.
      const { state, srv } = await expressApp(k);
      try {
        const r = await post(srv.url, 'tx-kill-00001', { k: 'x' });
        assert.equal(r.status, 201);
        const again = await post(srv.url, 'tx-kill-00001', { k: 'x' });
        assert.equal(again.headers.get('idempotent-replayed'), 'true');
        assert.equal(state.runs, 1);
        assert.equal(await k.count('x'), 1);
      } finally {
        await srv.close();
      }
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await k.cleanup();
    }
  });

  test(`${name}: fastify plugin, request.idempotency.tx and currentTransaction()`, { skip: kind.skip }, async () => {
    const k = await kind.make();
    const app = Fastify({ forceCloseConnections: true });
    await app.register(idempo.idempotencyPlugin, { store: k.store, transactional: true });
    let runs = 0;
    app.post('/orders', async (req, reply) => {
      runs++;
      assert.equal(idempo.currentTransaction(), req.idempotency.tx);
      await k.insert(req.idempotency.tx, req.body.k);
      await new Promise((r) => setImmediate(r));
      await k.insert(idempo.currentTransaction(), `${req.body.k}-2`);
      if (req.body.fail) throw new Error('boom');
      reply.code(201);
      return { run: runs };
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const url = `http://127.0.0.1:${app.server.address().port}`;
    try {
      const bad = await post(url, 'tx-fastify-001', { k: 'f', fail: true });
      assert.equal(bad.status, 500);
      assert.equal(await k.count('f'), 0);
      assert.equal(await k.count('f-2'), 0);
      const ok = await post(url, 'tx-fastify-001', { k: 'f' });
      assert.equal(ok.status, 201);
      assert.equal(await k.count('f'), 1);
      assert.equal(await k.count('f-2'), 1);
      const replay = await post(url, 'tx-fastify-001', { k: 'f' });
      assert.equal(replay.headers.get('idempotent-replayed'), 'true');
      assert.equal(runs, 2);
    } finally {
      await app.close();
      await k.cleanup();
    }
  });
}

test('postgres: a handler that swallows a SQL error cannot commit: 503, nothing recorded, the retry runs', { skip: kinds.postgres.skip }, async () => {
  const k = await kinds.postgres.make();
  const app = express();
  let runs = 0;
  const mw = idempo.idempotency({ store: k.store, transactional: true, unavailableRetryAfterMs: 3000 });
  const errors = [];
  mw.events.on('store_error', (e) => errors.push(e.op));
  app.post('/orders', mw, async (req, res) => {
    runs++;
    await k.insert(req.idempotency.tx, req.body.k);
    if (runs === 1) {
      // The statement fails and aborts the transaction; the handler carries on regardless.
      await req.idempotency.tx.query('SELECT 1/0').catch(() => undefined);
    }
    res.status(201).json({ run: runs });
  });
  const srv = await listen(app);
  try {
    const r = await post(srv.url, 'tx-aborted-001', { k: 'z' });
    assert.equal(r.status, 503);
    assert.equal(r.headers.get('retry-after'), '3');
    assert.equal((await r.json()).type, 'urn:idempo:problem:store-unavailable');
    assert.deepEqual(errors, ['complete']);
    assert.equal(await k.count('z'), 0);
    assert.equal(await k.records(), 0);
    const ok = await post(srv.url, 'tx-aborted-001', { k: 'z' });
    assert.equal(ok.status, 201);
    assert.deepEqual(await ok.json(), { run: 2 });
    assert.equal(await k.count('z'), 1);
  } finally {
    await srv.close();
    await k.cleanup();
  }
});

test('postgres: a COMMIT that fails is 503 not_committed and nothing is stored', { skip: kinds.postgres.skip }, async () => {
  const k = await kinds.postgres.make();
  const pool = sharedPgPool();
  // A deferred unique constraint the handler violates fails only at COMMIT (core's `commit`).
  await pool.query(`CREATE TABLE "${k.schema}".deferred (id int, CONSTRAINT once UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`);
  const app = express();
  let runs = 0;
  const mw = idempo.idempotency({ store: k.store, transactional: true, unavailableRetryAfterMs: 3000 });
  const errors = [];
  const outcomes = [];
  mw.events.on('store_error', (e) => errors.push(e.op));
  mw.events.on('outcome', (e) => outcomes.push(e.outcome));
  app.post('/orders', mw, async (req, res) => {
    runs++;
    await k.insert(req.idempotency.tx, req.body.k);
    if (runs === 1) await req.idempotency.tx.query(`INSERT INTO "${k.schema}".deferred (id) VALUES (1), (1)`);
    res.status(201).json({ run: runs });
  });
  const srv = await listen(app);
  try {
    const r = await post(srv.url, 'tx-commitfail-1', { k: 'c' });
    assert.equal(r.status, 503);
    assert.equal(r.headers.get('retry-after'), '3');
    assert.equal((await r.json()).type, 'urn:idempo:problem:store-unavailable');
    assert.deepEqual(errors, ['commit']);
    assert.equal(await k.count('c'), 0);
    assert.equal(await k.records(), 0);
    const ok = await post(srv.url, 'tx-commitfail-1', { k: 'c' });
    assert.equal(ok.status, 201);
    assert.deepEqual(await ok.json(), { run: 2 });
    assert.equal(await k.count('c'), 1);
    assert.equal(await k.records(), 1);
    assert.deepEqual(outcomes, ['not_committed', 'stored']);
  } finally {
    await srv.close();
    await k.cleanup();
  }
});

for (const [name, kind] of Object.entries(kinds)) {
  test(`${name}: a refused completion, then release: ROLLBACK on the session's connection, no delete on the store`, { skip: kind.skip }, async () => {
    const k = await kind.make();
    // Anything the session sent to the store itself (outside its transaction) is recorded.
    const outside = [];
    for (const op of ['release', 'complete', 'renew', 'markUnknown']) {
      const original = k.store[op].bind(k.store);
      k.store[op] = (...args) => {
        outside.push(op);
        return original(...args);
      };
    }
    const table = name === 'postgres' ? `"${k.schema}".idempo_record` : 'idempo_record';
    const app = express();
    let runs = 0;
    app.post('/orders', idempo.idempotency({ store: k.store, transactional: true }), async (req, res) => {
      runs++;
      await k.insert(req.idempotency.tx, req.body.k);
      if (runs === 1) {
        // Inside the transaction the record's token changes: the completion will not apply.
        const sql = `UPDATE ${table} SET token = ${name === 'postgres' ? "'\\x00000000000000000000000000000000'::bytea" : 'zeroblob(16)'}`;
        if (name === 'postgres') await req.idempotency.tx.query(sql);
        else req.idempotency.tx.exec(sql);
      }
      res.status(201).json({ run: runs });
    });
    const srv = await listen(app);
    try {
      const r = await post(srv.url, 'tx-refused-0001', { k: 'r' });
      assert.equal(r.status, 503);
      assert.equal((await r.json()).type, 'urn:idempo:problem:store-unavailable');
      assert.equal(await k.count('r'), 0);
      assert.equal(await k.records(), 0);
      assert.deepEqual(outside, []);
      const ok = await post(srv.url, 'tx-refused-0001', { k: 'r' });
      assert.equal(ok.status, 201);
      assert.deepEqual(await ok.json(), { run: 2 });
      assert.equal(await k.count('r'), 1);
      assert.equal(await k.records(), 1);
    } finally {
      await srv.close();
      await k.cleanup();
    }
  });
}

test('sqlite: other requests on the store wait for an open transaction, then run', async () => {
  const k = await kinds.sqlite.make({ lockTimeoutMs: 5000 });
  const app = express();
  let open;
  const gate = new Promise((r) => {
    open = r;
  });
  app.post('/tx', idempo.idempotency({ store: k.store, transactional: true }), async (req, res) => {
    await k.insert(req.idempotency.tx, 'held');
    await gate;
    res.status(201).json({});
  });
  app.post('/plain', idempo.idempotency({ store: k.store }), (req, res) => res.status(201).json({ plain: true }));
  const srv = await listen(app);
  try {
    const held = fetch(`${srv.url}/tx`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'held-key-0001' }, body: '{}' });
    await new Promise((r) => setTimeout(r, 100));
    let plainDone = false;
    const plain = fetch(`${srv.url}/plain`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'plain-key-001' }, body: '{}' }).then((r) => {
      plainDone = true;
      return r;
    });
    await new Promise((r) => setTimeout(r, 150));
    assert.equal(plainDone, false, 'the plain request waits for the transaction');
    open();
    assert.equal((await held).status, 201);
    const p = await plain;
    assert.equal(p.status, 201);
    assert.deepEqual(await p.json(), { plain: true });
    assert.equal(await k.records(), 2);
  } finally {
    await srv.close();
    await k.cleanup();
  }
});

test('transactional: stores that cannot run the handler in their transaction are refused', () => {
  for (const store of [new idempo.MemoryStore()]) {
    assert.throws(
      () => idempo.idempotency({ store, transactional: true }),
      (e) => e instanceof idempo.TransactionalUnsupportedError && e.code === 'TRANSACTIONAL_UNSUPPORTED',
    );
  }
  assert.equal(idempo.supportsTransactions(new idempo.MemoryStore()), false);
});
