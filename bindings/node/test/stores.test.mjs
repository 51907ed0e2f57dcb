// Store behaviour beyond the shared scenarios: memory bounds and eviction, purge loops, sizes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { idempo } from './helpers.mjs';

const FP = `v1:${'ab'.repeat(32)}`;
const enc = (n) => idempo.encodeResponse({ status: 200, headers: [], body: Buffer.alloc(n, 0x61) });

test('MemoryStore is bounded: a full store reuses expired room only, never evicts a live record', async () => {
  let now = 1_000_000;
  const store = new idempo.MemoryStore({ maxEntries: 3, maxEntriesPerPartition: 3, clock: () => now });
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
  await assert.rejects(
    store.claim(k(), FP, t, 1000, 60_000),
    (e) => e instanceof idempo.StoreUnavailableError && e.reason === 'store_full' && e.retryAfterMs === 58_000,
  );
  assert.equal((await store.get(b)).record?.state, 2, 'the completed record is never evicted');
  assert.ok((await store.get(c)).record, 'in-progress records are never evicted');
});

test('MemoryStore holds each partition to its quota; purges earliest first in batches', async () => {
  let now = 5_000_000;
  const store = new idempo.MemoryStore({ maxEntries: 10, clock: () => now });
  assert.equal(store.maxEntriesPerPartition, 1, 'a tenth of maxEntries by default');
  const t = randomBytes(16);
  const alice = idempo.memoryPartition('alice');
  assert.equal(alice.length, 8);
  assert.equal((await store.claim(randomBytes(32), FP, t, 1000, 5000, { partition: alice })).claimed, true);
  await assert.rejects(
    store.claim(randomBytes(32), FP, t, 1000, 5000, { partition: alice }),
    (e) => e instanceof idempo.StoreUnavailableError && e.reason === 'partition_quota' && e.retryAfterMs === 5000,
  );
  const bob = idempo.memoryPartition('bob');
  assert.equal((await store.claim(randomBytes(32), FP, t, 1000, 5000, { partition: bob })).claimed, true);

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
  const store = new idempo.MemoryStore({ maxBytes: 400, maxBytesPerPartition: 400 });
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
