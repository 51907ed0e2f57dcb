// Client intents (spec/KEYS.md §3.6) against a real local server: Express behind idempo's own
// middleware on 127.0.0.1. Single flight per intent, the file store shared by two stores (two
// processes), the request bound to its pending key, an application's 422 as its answer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { idempo, loadVector } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');

const fast = { baseDelayMs: 5, maxDelayMs: 50, maxAttempts: 5, maxElapsedMs: 20_000 };

async function startPayments() {
  const ledger = { charges: [], requests: {} };
  const app = express();
  app.use((req, _res, next) => {
    (ledger.requests[req.path] ??= []).push(req.headers['idempotency-key']);
    next();
  });
  const mw = idempo.idempotency({ store: new idempo.MemoryStore() });
  app.post('/charge', mw, async (req, res) => {
    await new Promise((r) => setTimeout(r, 200)); // concurrent clicks overlap the charge
    ledger.charges.push(req.body);
    res.status(201).json({ charge: ledger.charges.length, amount: req.body.amount });
  });
  app.post('/down', mw, (_req, res) => res.status(503).set('retry-after', '0').json({ error: 'down' }));
  app.post('/validate', mw, (_req, res) =>
    res.status(422).json({ detail: [{ loc: ['body', 'amount'], msg: 'must be positive' }] }),
  );
  app.use(idempo.idempotencyErrorHandler());
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    ledger,
    sent: (p) => ledger.requests[p] ?? [],
    close: () => new Promise((r) => {
      server.closeAllConnections();
      server.close(r);
    }),
  };
}

const post = (url, body, opts) =>
  idempo.idempotentFetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), retry: fast, ...opts });

function tempDir() {
  return mkdtempSync(path.join(tmpdir(), 'idempo-intents-'));
}

test('100 concurrent sends of one intent: one charge, one key, one answer (file store)', async () => {
  const srv = await startPayments();
  const dir = tempDir();
  try {
    const store = new idempo.FilePendingKeyStore(path.join(dir, 'pending.json'));
    const keys = [];
    const answers = await Promise.all(
      Array.from({ length: 100 }, () =>
        post(`${srv.url}/charge`, { amount: 100, currency: 'EUR' }, { intent: 'checkout-1', store, onStop: (i) => keys.push(i.key) }),
      ),
    );
    assert.deepEqual(new Set(answers.map((r) => r.status)), new Set([201]));
    const bodies = await Promise.all(answers.map((r) => r.text()));
    assert.equal(new Set(bodies).size, 1, 'every caller gets the same answer');
    assert.equal(new Set(keys).size, 1, 'one key');
    assert.equal(srv.ledger.charges.length, 1, 'charged once');
    assert.equal(srv.sent('/charge').length, 1, 'one attempt sequence: one request');
    assert.deepEqual(await store.all(), {}, 'settled: nothing pending');
  } finally {
    await srv.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('two stores on one file (two processes) mint one key; their clients charge once', async () => {
  const srv = await startPayments();
  const dir = tempDir();
  try {
    const file = path.join(dir, 'shared.json');
    const stores = [new idempo.FilePendingKeyStore(file), new idempo.FilePendingKeyStore(file)];
    const fp = 'v1:' + 'ab'.repeat(32);
    const got = await Promise.all(
      Array.from({ length: 40 }, (_, i) => stores[i % 2].getOrCreate('x', { key: idempo.generateKey(), fingerprint: fp, createdMs: i })),
    );
    assert.equal(new Set(got.map((r) => r.key)).size, 1);
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) => post(`${srv.url}/charge`, { amount: 7 }, { intent: 'checkout-shared', store: stores[i % 2] })),
    );
    assert.deepEqual(new Set(answers.map((r) => r.status)), new Set([201]));
    assert.equal(srv.ledger.charges.length, 1);
    assert.equal(new Set(srv.sent('/charge')).size, 1, 'one key on the wire');
  } finally {
    await srv.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a changed request under a pending intent rejects and sends nothing', async () => {
  const srv = await startPayments();
  const dir = tempDir();
  try {
    const store = new idempo.FilePendingKeyStore(path.join(dir, 'pending.json'));
    const two = { ...fast, maxAttempts: 2 };
    const first = await post(`${srv.url}/down`, { amount: 100 }, { intent: 'checkout-change', store, retry: two });
    assert.equal(first.status, 503);
    const pending = await store.get('checkout-change');
    assert.ok(pending, 'the key stays pending after the budget ran out');
    const sent = srv.sent('/down').length;

    await assert.rejects(
      post(`${srv.url}/down`, { amount: 250 }, { intent: 'checkout-change', store, retry: two }),
      (e) => e instanceof idempo.IntentChangedWhilePendingError && e.code === 'INTENT_CHANGED_WHILE_PENDING' && e.key === pending.key,
    );
    assert.equal(srv.sent('/down').length, sent, 'nothing was sent');
    assert.deepEqual(await store.get('checkout-change'), pending, 'kept for reconciliation');

    // The same request (member order and whitespace aside) reuses the pending key.
    await idempo.idempotentFetch(`${srv.url}/down`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: '{ "amount" : 100 }', retry: two, intent: 'checkout-change', store,
    });
    assert.deepEqual(new Set(srv.sent('/down')), new Set([idempo.keyHeaderValue(pending.key)]));
  } finally {
    await srv.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a changed request while the first is in flight rejects; only the first is sent', async () => {
  const srv = await startPayments();
  try {
    const store = new idempo.MemoryPendingKeyStore();
    const first = post(`${srv.url}/charge`, { amount: 100 }, { intent: 'checkout-race', store });
    while (srv.sent('/charge').length === 0) await new Promise((r) => setTimeout(r, 5));
    await assert.rejects(post(`${srv.url}/charge`, { amount: 250 }, { intent: 'checkout-race', store }), idempo.IntentChangedWhilePendingError);
    assert.equal((await first).status, 201);
    assert.equal(srv.sent('/charge').length, 1);
    assert.equal(srv.ledger.charges.length, 1);
  } finally {
    await srv.close();
  }
});

test("an application's 422 under an intent is its answer for every caller and settles it", async () => {
  const srv = await startPayments();
  try {
    const store = new idempo.MemoryPendingKeyStore();
    const stops = [];
    const answers = await Promise.all(
      Array.from({ length: 10 }, () => post(`${srv.url}/validate`, { amount: -1 }, { intent: 'checkout-422', store, onStop: (i) => stops.push(i) })),
    );
    for (const r of answers) assert.equal(r.status, 422);
    assert.deepEqual(stops.map((s) => s.reason), ['client_error'], 'one attempt sequence; not key reuse');
    assert.equal(await store.get('checkout-422'), null);
  } finally {
    await srv.close();
  }
});

test('without an intent every call has its own key', async () => {
  const srv = await startPayments();
  try {
    await post(`${srv.url}/charge`, { amount: 1 });
    await post(`${srv.url}/charge`, { amount: 1 });
    assert.equal(new Set(srv.sent('/charge')).size, 2);
    assert.equal(srv.ledger.charges.length, 2);
  } finally {
    await srv.close();
  }
});

test('spec/vectors/intent', () => {
  const fp = (r) => idempo.intentRequestFingerprint(r.method, r.target, r.content_type, new TextEncoder().encode(r.body));
  for (const c of loadVector('intent', 'fingerprint.json').cases) {
    if (c.error) {
      assert.throws(() => fp(c.a), (e) => e.reason === c.error || e.code === c.error, c.name);
      continue;
    }
    assert.equal(fp(c.a) === fp(c.b), c.same, c.name);
  }
  for (const c of loadVector('intent', 'send.json').cases) {
    const pending = c.pending && { key: c.pending.key, fingerprint: c.pending.fingerprint, createdMs: c.pending.created_ms };
    if (c.error) {
      assert.throws(() => idempo.intentDecideSend(pending, c.request, c.explicit_key), (e) => e.reason === c.error, c.name);
    } else {
      assert.equal(idempo.intentDecideSend(pending, c.request, c.explicit_key), c.expect, c.name);
    }
  }
  const policy = new idempo.RetryPolicy();
  for (const c of loadVector('intent', 'settle.json').cases) {
    const o = c.outcome;
    const d = policy.decide(c.attempt, c.elapsed_ms, o.kind === 'response' ? { kind: 'response', status: o.status } : { kind: o.kind, retryAfterMs: o.retry_after_ms ?? null }, 0.5);
    assert.equal(d.retry, false, c.name);
    assert.equal(d.reason, c.reason, c.name);
    assert.equal(d.settlesIntent, c.settles_intent, c.name);
  }
});
