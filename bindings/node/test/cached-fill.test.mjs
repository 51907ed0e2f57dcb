// CachedStore fills Redis when a completion succeeds (write-through), not only on a later read:
// after `complete` the hash exists before any get, and a replay is served from Redis without
// touching the authority. Real PostgreSQL and Redis (make test-node starts them).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { idempo, closeShared, missing, sharedPgPool, sharedRedis, storeKinds, uniqueName } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');

after(closeShared);

const skip = missing('postgres') ?? missing('redis') ?? false;
const FP = `v1:${'ab'.repeat(32)}`;

/** Wraps a store, counting the calls each primitive gets. */
function counting(inner) {
  const calls = {};
  const proxy = new Proxy(inner, {
    get(target, prop) {
      const v = Reflect.get(target, prop, target);
      if (typeof v !== 'function') return v;
      return (...args) => {
        calls[prop] = (calls[prop] ?? 0) + 1;
        return v.apply(target, args);
      };
    },
  });
  return { proxy, calls };
}

test('cached: complete writes the record through to Redis (returning completion of PostgreSQL)', { skip }, async () => {
  const { store, cleanup } = await storeKinds.cached.make();
  const redis = sharedRedis();
  try {
    const scope = randomBytes(32);
    const token = randomBytes(16);
    const claimed = await store.claim(scope, FP, token, 30_000, 60_000);
    assert.equal(claimed.claimed, true);
    const key = [...(await redis.keys('*'))].find((k) => k.endsWith(scope.toString('hex')));
    assert.equal(key, undefined, 'an in-progress record is never cached');
    const response = idempo.encodeResponse({ status: 201, headers: [['content-type', 'application/json']], body: Buffer.from('{"id":1}') });
    assert.equal(await store.complete(scope, token, response, 60_000), true);
    assert.equal(store.cacheStats.fills, 1);
    // The hash exists before any get, with the authority's fields.
    const cachedKey = (await redis.keys(`*${scope.toString('hex')}`))[0];
    assert.ok(cachedKey, 'filled at completion');
    const h = await redis.hgetallBuffer(cachedKey);
    assert.equal(h.state.toString(), '2');
    assert.equal(h.fingerprint.toString(), FP);
    assert.equal(h.generation.toString(), '1');
    assert.deepEqual(h.token, token);
    assert.deepEqual(h.response, response);
    const pttl = await redis.pttl(cachedKey);
    assert.ok(pttl > 0 && pttl <= 60_000, `cache TTL ${pttl} within min(cacheTtl, expires_at - now)`);
    const authorityRow = await store.authority.get(scope);
    assert.equal(h.expires_at.toString(), String(authorityRow.record.expiresAt));
    // A completion that does not apply (wrong token) fills nothing.
    assert.equal(await store.complete(scope, randomBytes(16), response, 60_000), false);
    assert.equal(store.cacheStats.fills, 1);
    // The first read is already a hit.
    const misses = store.cacheStats.misses;
    const got = await store.get(scope);
    assert.equal(got.record.state, 2);
    assert.equal(store.cacheStats.hits, 1);
    assert.equal(store.cacheStats.misses, misses);
  } finally {
    await cleanup();
  }
});

test('cached: an authority without a returning completion is read back once to fill', { skip }, async () => {
  const redis = sharedRedis();
  const prefix = `${uniqueName('idempo_fill')}:`;
  const { proxy: authority, calls } = counting(new idempo.MemoryStore());
  // The memory store has no completeRecord: the cache reads the committed row back.
  assert.equal(authority.completeRecord, undefined);
  const store = new idempo.CachedStore({ authority, redis, prefix });
  try {
    const scope = randomBytes(32);
    const token = randomBytes(16);
    await store.claim(scope, FP, token, 30_000, 60_000);
    const response = idempo.encodeResponse({ status: 200, headers: [], body: Buffer.from('ok') });
    assert.equal(await store.complete(scope, token, response, 60_000), true);
    assert.equal(calls.get, 1);
    assert.equal(await redis.exists(`${prefix}${scope.toString('hex')}`), 1);
  } finally {
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length) await redis.del(...keys);
  }
});

test('cached: behind Express, the first replay is served from Redis (the authority is not asked)', { skip }, async () => {
  const { store: cached, cleanup } = await storeKinds.cached.make();
  const { proxy: authority, calls } = counting(cached.authority);
  const redis = sharedRedis();
  const prefix = `${uniqueName('idempo_fill')}:`;
  const store = new idempo.CachedStore({ authority, redis, prefix });
  const app = express();
  let runs = 0;
  app.post('/orders', idempo.idempotency({ store, heartbeatMs: 0 }), (req, res) => {
    runs++;
    res.status(201).json({ order: req.body.n, run: runs });
  });
  const srv = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const url = `http://127.0.0.1:${srv.address().port}/orders`;
  const post = () =>
    fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'order-key-0001' }, body: '{"n":7}' });
  try {
    const a = await post();
    assert.equal(a.status, 201);
    const first = await a.json();
    assert.equal(store.cacheStats.fills, 1);
    assert.equal((await redis.keys(`${prefix}*`)).length, 1, 'the hash exists before any replay');
    const before = { ...calls };
    const b = await post();
    assert.equal(b.status, 201);
    assert.equal(b.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(await b.json(), first);
    assert.equal(runs, 1);
    assert.equal(store.cacheStats.hits, 1);
    assert.deepEqual(calls, before, 'the replay never reached PostgreSQL');
  } finally {
    srv.closeAllConnections();
    await new Promise((r) => srv.close(r));
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length) await redis.del(...keys);
    await cleanup();
  }
});

test('cached: a delayed fill gets a shorter PX; nothing left, no SET (spec/STORAGE.md §9)', { skip }, async () => {
  const schema = uniqueName('cd');
  const pool = sharedPgPool();
  const pg = new idempo.PostgresStore({ pool, schema });
  await pg.createSchema();
  // The host's monotonic clock moves on by `delay` each time the authority answers.
  let now = 5_000_000;
  let delay = 0;
  const authority = new Proxy(pg, {
    get(target, prop) {
      const v = Reflect.get(target, prop, target);
      if (typeof v !== 'function') return v;
      return async (...args) => {
        const r = await v.apply(target, args);
        now += delay;
        return r;
      };
    },
  });
  const prefix = `${uniqueName('idempo_cache')}:`;
  const redis = sharedRedis();
  const store = new idempo.CachedStore({ authority, redis, prefix, monotonic: () => now });
  try {
    const scope = randomBytes(32);
    const token = randomBytes(16);
    const entry = prefix + scope.toString('hex');
    assert.equal((await store.claim(scope, FP, token, 30_000, 3_600_000)).claimed, true);
    const response = idempo.encodeResponse({ status: 201, headers: [], body: Buffer.from('{}') });
    // The completion's fill comes 45 s after its read: 60 s - 45 s are left.
    delay = 45_000;
    assert.equal(await store.complete(scope, token, response, 3_600_000), true);
    let pttl = await redis.pttl(entry);
    assert.ok(pttl > 14_000 && pttl <= 15_000, `PX ${pttl} after a 45 s delay`);
    // A read that misses fills again: 10 s late, about 50 s are left.
    await redis.del(entry);
    delay = 10_000;
    assert.equal((await store.get(scope)).record.state, 2);
    pttl = await redis.pttl(entry);
    assert.ok(pttl > 49_000 && pttl <= 50_000, `PX ${pttl} after a 10 s delay`);
    // Later than the whole cache TTL: no SET at all.
    await redis.del(entry);
    delay = 60_000;
    const fills = store.cacheStats.fills;
    assert.equal((await store.get(scope)).record.state, 2);
    assert.equal(await redis.exists(entry), 0);
    assert.equal(store.cacheStats.fills, fills);
  } finally {
    await pool.query(`DROP SCHEMA "${schema}" CASCADE`);
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length) await redis.del(...keys);
  }
});
