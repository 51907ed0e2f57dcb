// Idempotent functions and message consumers (ts/functions.ts) against real stores: one
// execution per key across many concurrent deliveries, replays of the stored result, the typed
// mismatch and in-flight errors, error dispositions, and the method form.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { idempo, storeKinds, closeShared, vectorsDir } from './helpers.mjs';
import fs from 'node:fs';
import path from 'node:path';

after(closeShared);

const kinds = ['memory', 'sqlite', 'postgres', 'redis'];

for (const kind of kinds) {
  const k = storeKinds[kind];
  test(`${kind}: many deliveries to concurrent consumers run the function once`, { skip: k.skip() ?? false }, async () => {
    const { store, cleanup } = await k.make();
    try {
      let runs = 0;
      const downstream = [];
      const consumers = Array.from({ length: 4 }, () =>
        idempo.idempotent(
          async (msg) => {
            runs++;
            downstream.push(idempo.currentCall().downstreamKey);
            await new Promise((r) => setTimeout(r, 100));
            return { charged: msg.order };
          },
          { store, name: 'billing.charge', key: (msg) => msg.id, waitMs: 10_000 },
        ),
      );
      const deliveries = [];
      for (let i = 0; i < 5; i++) for (const c of consumers) deliveries.push(c({ id: 'm-1', order: 'o-1' }));
      const results = await Promise.all(deliveries);
      assert.equal(runs, 1);
      assert.equal(downstream[0].length, 64);
      for (const r of results) assert.deepEqual(r, { charged: 'o-1' });
      // Changed payload under the same key: the typed mismatch.
      await assert.rejects(consumers[0]({ id: 'm-1', order: 'o-2' }), (e) => e instanceof idempo.PayloadMismatchError && e instanceof idempo.IdempotencyKeyReusedError && e.key === 'm-1');
      assert.equal(runs, 1);
    } finally {
      await cleanup();
    }
  });
}

test('in flight rejects with CallInFlightError unless waiting', async () => {
  const store = new idempo.MemoryStore();
  let release;
  const gate = new Promise((r) => { release = r; });
  const slow = idempo.idempotent(async () => { await gate; return 'ok'; }, { store, name: 'slow', key: (k) => k });
  const first = slow('a');
  await new Promise((r) => setTimeout(r, 50));
  await assert.rejects(slow('a'), (e) => e instanceof idempo.CallInFlightError && e.retryAfterMs > 0);
  release();
  assert.equal(await first, 'ok');
  assert.equal(await slow('a'), 'ok');
});

test('payload-derived keys leave excluded pointers out', async () => {
  const store = new idempo.MemoryStore();
  const seen = [];
  const ingest = idempo.idempotent((e) => { seen.push(e.id); }, { store, name: 'ingest', exclude: ['/sent_at'] });
  await ingest({ id: 1, sent_at: '10:00' });
  await ingest({ id: 1, sent_at: '10:05' });
  await ingest({ id: 2, sent_at: '10:05' });
  assert.deepEqual(seen, [1, 2]);
});

test('error dispositions: store, release, unknown', async () => {
  const store = new idempo.MemoryStore();
  const runs = [];
  class Declined extends Error { constructor(m) { super(m); this.name = 'Declined'; } }
  const act = idempo.idempotent(
    (k) => {
      runs.push(k);
      if (k.startsWith('store')) throw new Declined('card declined');
      if (k.startsWith('release')) throw new TypeError('bad input');
      throw new Error('crashed midway');
    },
    { store, name: 'dispo', key: (k) => k, onError: (e) => (e instanceof Declined ? 'store' : e instanceof TypeError ? 'release' : 'unknown') },
  );
  await assert.rejects(act('store-1'), Declined);
  await assert.rejects(act('store-1'), (e) => e instanceof idempo.StoredCallError && e.errorName === 'Declined' && e.errorMessage === 'card declined');
  await assert.rejects(act('release-1'), TypeError);
  await assert.rejects(act('release-1'), TypeError);
  await assert.rejects(act('unknown-1'), /crashed midway/);
  await assert.rejects(act('unknown-1'), idempo.CallOutcomeUnknownError);
  assert.deepEqual(runs, ['store-1', 'release-1', 'release-1', 'unknown-1']);
});

test('the method form passes this through and keys by the method arguments', async () => {
  const store = new idempo.MemoryStore();
  class Billing {
    constructor(name) { this.name = name; this.calls = 0; }
    charge(order) { this.calls++; return `${this.name}:${order.id}`; }
  }
  Billing.prototype.charge = idempo.idempotentMethod({ store, name: 'billing.method', key: (order) => order.id })(Billing.prototype.charge);
  const a = new Billing('a');
  const b = new Billing('b');
  assert.equal(await a.charge({ id: 'x' }), 'a:x');
  assert.equal(await b.charge({ id: 'x' }), 'a:x');
  assert.equal(a.calls + b.calls, 1);
});

test('call vectors: scope and fingerprint framing', () => {
  const doc = JSON.parse(fs.readFileSync(path.join(vectorsDir, 'call', 'call.json'), 'utf8'));
  for (const c of doc.cases) {
    const framing = require_native().callFraming(c.function);
    const fp = new idempo.Fingerprinter({ exclude: c.exclude, ...(c.hmac_key ? { hmacKey: c.hmac_key } : {}) });
    assert.equal(fp.fingerprint({ method: framing.method, route: framing.route, body: c.payload, contentType: framing.contentType }), c.fingerprint, c.name);
    assert.equal(require_native().callScope(c.function, c.principal, c.key).toString('hex'), c.scope_hex, c.name);
  }
});

import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
function require_native() {
  return require('../dist/native.js');
}
