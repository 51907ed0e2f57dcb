// Store behaviour beyond the shared scenarios: memory bounds and eviction, purge loops, sizes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { idempo } from './helpers.mjs';

const FP = `v1:${'ab'.repeat(32)}`;
const enc = (n) => idempo.encodeResponse({ status: 200, headers: [], body: Buffer.alloc(n, 0x61) });

test('MemoryStore is bounded: evicts expired, then completed (counted), never in-progress', async () => {
  let now = 1_000_000;
  const store = new idempo.MemoryStore({ maxEntries: 3, clock: () => now });
  const k = () => randomBytes(32);
  const [a, b, c] = [k(), k(), k()];
  const t = randomBytes(16);
  await store.claim(a, FP, t, 1000, 1000); // expires at now + 1000
  await store.claim(b, FP, t, 1000, 60_000);
  await store.complete(b, t, enc(10), 60_000);
  await store.claim(c, FP, t, 1000, 60_000); // in progress
  assert.equal(store.size, 3);
  now += 2000; // a expired
  assert.equal((await store.claim(k(), FP, t, 1000, 60_000)).claimed, true, 'the expired record made room');
  assert.equal(store.evictedLive, 0);
  assert.equal((await store.claim(k(), FP, t, 1000, 60_000)).claimed, true, 'the completed record was evicted');
  assert.equal(store.evictedLive, 1);
  assert.equal((await store.get(b)).record, null);
  assert.ok((await store.get(c)).record, 'in-progress records are never evicted');
  await assert.rejects(store.claim(k(), FP, t, 1000, 60_000), (e) => e instanceof idempo.StoreUnavailableError && e.reason === 'store_full');
});

test('MemoryStore evicts completed records earliest expiry first; purges earliest first in batches', async () => {
  let now = 5_000_000;
  const store = new idempo.MemoryStore({ maxEntries: 5, clock: () => now });
  const t = randomBytes(16);
  const done = {};
  for (const [name, ttl] of [['late', 50_000], ['early', 10_000], ['middle', 30_000]]) {
    done[name] = randomBytes(32);
    await store.claim(done[name], FP, t, 1000, ttl);
    assert.equal(await store.complete(done[name], t, enc(10), ttl), true);
  }
  const busy = [randomBytes(32), randomBytes(32)];
  for (const b of busy) await store.claim(b, FP, t, 1000, 5_000); // in progress, earliest expiry of all
  const alive = async (key) => (await store.get(key)).record !== null;
  for (const gone of ['early', 'middle', 'late']) {
    assert.equal((await store.claim(randomBytes(32), FP, t, 1000, 60_000)).claimed, true);
    assert.equal(await alive(done[gone]), false, `${gone} should be the one evicted`);
  }
  assert.equal(store.evictedLive, 3);
  for (const b of busy) assert.equal(await alive(b), true, 'in-progress records are never evicted');

  const purging = new idempo.MemoryStore({ clock: () => now });
  const keys = [];
  for (const ttl of [3000, 1000, 2000]) {
    const key = randomBytes(32);
    keys.push(key);
    await purging.claim(key, FP, t, 500, ttl);
  }
  now += 10_000;
  assert.deepEqual(await purging.purgeExpired({ batch: 2 }), { inProgress: 2, completed: 0, outcomeUnknown: 0 });
  assert.equal((await purging.get(keys[0])).record !== null, true, 'the latest expiry is purged last');
  assert.equal((await purging.get(keys[1])).record, null);
  assert.deepEqual(await purging.purgeExpired({ batch: 2 }), { inProgress: 1, completed: 0, outcomeUnknown: 0 });
  assert.equal(purging.size, 0);
});

test('MemoryStore bounds stored bytes', async () => {
  const store = new idempo.MemoryStore({ maxBytes: 100 });
  const t = randomBytes(16);
  const a = randomBytes(32);
  await store.claim(a, FP, t, 1000, 60_000);
  await assert.rejects(store.complete(a, t, enc(200), 60_000), (e) => e.code === 'STORE_UNAVAILABLE');
  assert.equal(await store.complete(a, t, enc(50), 60_000), true);
});

test('MemoryStore refuses NODE_ENV=production without an explicit flag', () => {
  const before = process.env.NODE_ENV;
  process.env.NODE_ENV = 'production';
  try {
    assert.throws(() => new idempo.MemoryStore(), (e) => e instanceof idempo.ConfigError);
    assert.ok(new idempo.MemoryStore({ allowInProduction: true }));
  } finally {
    if (before === undefined) delete process.env.NODE_ENV;
    else process.env.NODE_ENV = before;
  }
});

test('purgeAllExpired loops over full batches and returns the totals', async () => {
  let now = 5_000_000;
  const store = new idempo.MemoryStore({ clock: () => now });
  for (let i = 0; i < 25; i++) await store.claim(randomBytes(32), FP, randomBytes(16), 1000, 1000);
  now += 5000;
  assert.deepEqual(await idempo.purgeAllExpired(store, { batch: 10 }), { inProgress: 25, completed: 0, outcomeUnknown: 0 });
  assert.equal(store.size, 0);
});

test('stores reject malformed scope keys and tokens', async () => {
  const s = new idempo.SqliteStore({ filename: ':memory:' });
  await assert.rejects(s.claim(Buffer.alloc(31), FP, Buffer.alloc(16), 1000, 1000), RangeError);
  await assert.rejects(s.release(Buffer.alloc(32), Buffer.alloc(15)), RangeError);
  await s.close();
  const m = new idempo.MemoryStore();
  await assert.rejects(m.claim(Buffer.alloc(31), FP, Buffer.alloc(16), 1000, 1000), (e) => e.code === 'INVALID_ARGUMENT');
});

test('MemoryStore sweeps expired records lazily as claims arrive', async () => {
  let now = 9_000_000;
  const store = new idempo.MemoryStore({ clock: () => now });
  for (let i = 0; i < 60; i++) await store.claim(randomBytes(32), FP, randomBytes(16), 1000, 1000);
  now += 5000;
  for (let i = 0; i < 200; i++) await store.claim(randomBytes(32), FP, randomBytes(16), 1000, 60_000);
  assert.ok(store.size < 260, `expired records were swept (size ${store.size})`);
});
