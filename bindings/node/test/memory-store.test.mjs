// Core's bounded memory store through Node: the shared memory vectors (spec/vectors/memory/),
// the cache-rule vectors (spec/vectors/cache/), and the guarantee through a real Express app:
// filling a bounded store with other principals' fresh keys never makes a completed record's
// retry run the handler again, and a full store answers 503 store-unavailable with Retry-After.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo, loadVector, vectorFiles } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
const native = require('../native');

const T0 = 1_700_000_000_000;

function checkRecord(v, got, want, ctx) {
  if (want === null) return assert.equal(got, null, ctx);
  assert.ok(got, ctx);
  assert.equal(got.fingerprint, want.fingerprint, ctx);
  assert.equal(got.state, want.state, ctx);
  assert.equal(Buffer.from(got.token).toString('hex'), v.tokens[want.token], ctx);
  assert.equal(got.generation, want.generation, ctx);
  assert.equal(got.leaseUntil === null ? null : got.leaseUntil - T0, want.lease_until_ms, ctx);
  assert.equal(got.expiresAt - T0, want.expires_at_ms, ctx);
  assert.equal(got.response === null ? null : Buffer.from(got.response).toString('hex'), want.response === null ? null : v.responses[want.response], ctx);
}

function checkRefusal(e, want, ctx) {
  assert.ok(e instanceof idempo.StoreUnavailableError, `${ctx}: ${e}`);
  assert.equal(e.reason, { full: 'store_full', quota_exceeded: 'partition_quota' }[want.error], ctx);
  assert.equal(e.retryAfterMs, want.retry_after_ms, ctx);
}

const memoryVectors = vectorFiles('memory');
test('memory vectors exist', () => assert.ok(memoryVectors.length >= 5));

for (const { file, data: v } of memoryVectors) {
  test(`memory vector ${file}`, async () => {
    let now = T0;
    const l = v.limits;
    const store = new idempo.MemoryStore({
      maxEntries: l.max_entries,
      maxBytes: l.max_bytes,
      maxEntriesPerPartition: l.max_entries_per_partition,
      maxBytesPerPartition: l.max_bytes_per_partition,
      clock: () => now,
    });
    const parts = {};
    for (const [name, p] of Object.entries(v.principals)) {
      parts[name] = idempo.memoryPartition(p.principal);
      assert.equal(parts[name].toString('hex'), p.partition, name);
    }
    const scope = (n) => Buffer.from(v.scopes[n], 'hex');
    const tok = (n) => Buffer.from(v.tokens[n], 'hex');
    for (const [i, step] of v.steps.entries()) {
      const ctx = `${v.name} step ${i}`;
      if ('advance_ms' in step) {
        now += step.advance_ms;
        continue;
      }
      const want = step.expect;
      switch (step.op) {
        case 'claim': {
          assert.equal(now - T0, want.now_ms, ctx);
          const options = step.principal ? { partition: parts[step.principal] } : undefined;
          let r;
          try {
            r = await store.claim(scope(step.scope), step.fingerprint, tok(step.token), step.lease_ms, step.ttl_ms, options);
          } catch (e) {
            assert.ok(want.refused, `${ctx}: refused ${e}`);
            checkRefusal(e, want.refused, ctx);
            break;
          }
          if (r.claimed) assert.equal(r.generation, want.claimed?.generation, ctx);
          else checkRecord(v, r.record, want.existing, ctx);
          break;
        }
        case 'get':
          checkRecord(v, (await store.get(scope(step.scope))).record, want.record, ctx);
          break;
        case 'complete': {
          const response = Buffer.from(v.responses[step.response], 'hex');
          try {
            assert.equal(await store.complete(scope(step.scope), tok(step.token), response, step.ttl_ms), want.applied, ctx);
          } catch (e) {
            assert.ok(want.refused, `${ctx}: refused ${e}`);
            checkRefusal(e, want.refused, ctx);
          }
          break;
        }
        case 'release':
          assert.equal(await store.release(scope(step.scope), tok(step.token)), want.applied, ctx);
          break;
        case 'purge_expired':
          assert.deepEqual(await store.purgeExpired({ batch: step.batch }), {
            inProgress: want.in_progress,
            completed: want.completed,
            outcomeUnknown: want.outcome_unknown,
          }, ctx);
          break;
        case 'len':
          assert.equal(store.size, want.entries, ctx);
          if ('bytes' in want) assert.equal(store.bytesUsed, want.bytes, ctx);
          break;
        default:
          assert.fail(`${ctx}: unknown op ${step.op}`);
      }
    }
  });
}

test('cache vectors: the serve rule and the fill PX are core\'s', () => {
  const serve = loadVector('cache', 'serve.json').cases;
  const fill = loadVector('cache', 'fill.json').cases;
  assert.ok(serve.length >= 5 && fill.length >= 5);
  for (const c of serve) assert.equal(native.cacheServable(c.state, c.expires_at_ms, c.cache_now_ms), c.expect, c.note);
  for (const c of fill) {
    assert.equal(native.cacheFillPx(c.state, c.expires_at_ms, c.cache_ttl_ms, c.read_now_ms, c.elapsed_ms), c.expect, c.note);
  }
});

async function startApp(store, runs) {
  const app = express();
  const mw = idempo.idempotency({ store, scope: (req) => req.headers['x-user'] });
  app.post('/pay', mw, (req, res) => {
    runs.push(req.headers['x-user']);
    res.status(201).json({ n: runs.length });
  });
  app.use(idempo.idempotencyErrorHandler());
  const server = await new Promise((r) => {
    const s = app.listen(0, '127.0.0.1', () => r(s));
  });
  const url = `http://127.0.0.1:${server.address().port}/pay`;
  const post = (user, key, body = '{"a":1}') =>
    fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-user': user }, body });
  const close = async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  };
  return { post, close };
}

test('express: a flood of other principals\' fresh keys never reruns a completed record; refusals are 503 with Retry-After', async () => {
  const runs = [];
  const store = new idempo.MemoryStore({ maxEntries: 8, maxEntriesPerPartition: 3 });
  const app = await startApp(store, runs);
  try {
    const first = await app.post('victim', 'victim-key-0001');
    assert.equal(first.status, 201);
    const firstBody = await first.text();
    const refused = [];
    for (let attacker = 0; attacker < 6; attacker++) {
      for (let n = 0; n < 4; n++) {
        const r = await app.post(`mallory-${attacker}`, `flood-${attacker}-${String(n).padStart(4, '0')}`);
        if (r.status === 503) refused.push({ retryAfter: r.headers.get('retry-after'), type: r.headers.get('content-type'), body: await r.json() });
        else await r.arrayBuffer();
      }
    }
    assert.ok(refused.length > 0);
    assert.equal(runs.length, 1 + 7, 'the quota (3 per principal) and the store (8 records) refused the rest');
    for (const r of refused) {
      assert.match(r.retryAfter ?? '', /^\d+$/);
      assert.equal(r.type, 'application/problem+json');
      assert.equal(r.body.type, 'urn:idempo:problem:store-unavailable');
    }
    const again = await app.post('victim', 'victim-key-0001');
    assert.equal(again.status, 201);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(await again.text(), firstBody);
    assert.equal(runs.filter((u) => u === 'victim').length, 1, "the victim's retry must not run the handler again");
  } finally {
    await app.close();
  }
});
