// Express middleware and Fastify plugin on real local servers (127.0.0.1), driven by fetch.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
const Fastify = require('fastify');

/** A store whose every call fails (fail-closed test). */
class DownStore extends idempo.MemoryStore {
  claim() {
    return Promise.reject(new Error('connection refused'));
  }
}

function makeHandlerState() {
  return { runs: 0, gate: null };
}

async function startExpress(opts, state) {
  const app = express();
  const mw = idempotency(opts);
  app.post('/payments/:id', mw, async (req, res, next) => {
    try {
      state.runs++;
      if (state.gate) await state.gate;
      if (req.body?.fail) throw Object.assign(new Error('boom'), { noSideEffect: req.body.fail === 'clean' });
      res.status(201).set('location', `/payments/${req.params.id}`).set('set-cookie', 'a=b').json({ id: req.params.id, amount: req.body.amount, run: state.runs, dk: req.idempotency?.downstreamKey });
    } catch (e) {
      next(e);
    }
  });
  app.use(idempo.idempotencyErrorHandler());
  app.use((err, _req, res, _next) => res.status(500).json({ error: err.message }));
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    events: mw.events,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(r);
      }),
  };
}

async function startFastify(opts, state) {
  const app = Fastify({ forceCloseConnections: true });
  await app.register(idempo.idempotencyPlugin, opts);
  app.post('/payments/:id', async (req, reply) => {
    state.runs++;
    if (state.gate) await state.gate;
    if (req.body?.fail) throw Object.assign(new Error('boom'), { noSideEffect: req.body.fail === 'clean' });
    reply.code(201).header('location', `/payments/${req.params.id}`).header('set-cookie', 'a=b');
    return { id: req.params.id, amount: req.body.amount, run: state.runs, dk: req.idempotency?.downstreamKey };
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: `http://127.0.0.1:${app.server.address().port}`, events: app.idempotencyEvents, close: () => app.close() };
}

const { idempotency } = idempo;
const servers = { express: startExpress, fastify: startFastify };

function post(url, key, body, headers = {}) {
  const h = { 'content-type': 'application/json', ...headers };
  if (key !== undefined) h['idempotency-key'] = key;
  return fetch(url, { method: 'POST', headers: h, body: typeof body === 'string' ? body : JSON.stringify(body) });
}

for (const [name, start] of Object.entries(servers)) {
  test(`${name}: new, replay, mismatch, missing and invalid key`, async () => {
    const state = makeHandlerState();
    const srv = await start({ store: new idempo.MemoryStore() }, state);
    const outcomes = [];
    srv.events.on('outcome', (e) => outcomes.push(e.outcome));
    try {
      const key = idempo.generateKey();
      const r1 = await post(`${srv.url}/payments/7`, key, { amount: 100, currency: 'EUR' });
      assert.equal(r1.status, 201);
      const b1 = await r1.json();
      assert.equal(b1.run, 1);
      assert.match(b1.dk, /^[0-9a-f]{64}$/);
      assert.equal(r1.headers.get('location'), '/payments/7');
      assert.equal(r1.headers.get('idempotent-replayed'), null);

      // Same request, keys reordered and number respelled: same fingerprint, replayed.
      const r2 = await post(`${srv.url}/payments/7`, key, '{"currency":"EUR","amount":1e2}');
      assert.equal(r2.status, 201);
      assert.equal(r2.headers.get('idempotent-replayed'), 'true');
      assert.equal(r2.headers.get('location'), '/payments/7');
      assert.equal(r2.headers.get('set-cookie'), null, 'Set-Cookie is never replayed');
      assert.deepEqual(await r2.json(), b1);
      assert.equal(state.runs, 1);

      const r3 = await post(`${srv.url}/payments/7`, key, { amount: 101, currency: 'EUR' });
      assert.equal(r3.status, 422);
      assert.match(r3.headers.get('content-type'), /application\/problem\+json/);
      const p3 = await r3.json();
      assert.equal(p3.status, 422);
      assert.equal(typeof p3.title, 'string');

      const r4 = await post(`${srv.url}/payments/7`, undefined, { amount: 1 });
      assert.equal(r4.status, 400);
      assert.match(r4.headers.get('content-type'), /problem\+json/);

      const r5 = await post(`${srv.url}/payments/7`, 'short', { amount: 1 });
      assert.equal(r5.status, 400);
      assert.equal((await r5.json()).code, 'too_short');

      const r6 = await post(`${srv.url}/payments/7`, idempo.generateKey(), '{"a":1,"a":2}');
      assert.equal(r6.status, 400);
      assert.equal((await r6.json()).code, 'duplicate_member');
      assert.equal(state.runs, 1);
      assert.deepEqual(outcomes.slice(0, 3), ['stored', 'replayed', 'mismatch']);
    } finally {
      await srv.close();
    }
  });

  test(`${name}: one key sent to another resource under the same route template is a mismatch`, async () => {
    const state = makeHandlerState();
    const srv = await start({ store: new idempo.MemoryStore() }, state);
    try {
      const key = idempo.generateKey();
      const body = { amount: 100, currency: 'EUR' };
      const r1 = await post(`${srv.url}/payments/7`, key, body);
      assert.equal(r1.status, 201);
      // Same scope (template /payments/:id), same body, other target: never 7's replay.
      const r2 = await post(`${srv.url}/payments/8`, key, body);
      assert.equal(r2.status, 422);
      const r3 = await post(`${srv.url}/payments/7?dry_run=1`, key, body);
      assert.equal(r3.status, 422);
      const r4 = await post(`${srv.url}/payments/7`, key, body);
      assert.equal(r4.status, 201);
      assert.equal(r4.headers.get('idempotent-replayed'), 'true');
      assert.equal(state.runs, 1);
    } finally {
      await srv.close();
    }
  });

  test(`${name}: in-flight 409 with Retry-After, then replay`, async () => {
    const state = makeHandlerState();
    let open;
    state.gate = new Promise((r) => (open = r));
    const srv = await start({ store: new idempo.MemoryStore() }, state);
    try {
      const key = idempo.generateKey();
      const first = post(`${srv.url}/payments/1`, key, { amount: 5 });
      while (state.runs === 0) await new Promise((r) => setTimeout(r, 5));
      const dup = await post(`${srv.url}/payments/1`, key, { amount: 5 });
      assert.equal(dup.status, 409);
      assert.ok(Number(dup.headers.get('retry-after')) >= 1);
      open();
      assert.equal((await first).status, 201);
      const again = await post(`${srv.url}/payments/1`, key, { amount: 5 });
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.equal(state.runs, 1);
    } finally {
      await srv.close();
    }
  });

  test(`${name}: store down fails closed (503, handler not run); body limit 413`, async () => {
    const state = makeHandlerState();
    const srv = await start({ store: new DownStore(), maxRequestBodyBytes: 64 }, state);
    try {
      const r = await post(`${srv.url}/payments/1`, idempo.generateKey(), { amount: 5 });
      assert.equal(r.status, 503);
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
      assert.equal(state.runs, 0);
      const big = await post(`${srv.url}/payments/1`, idempo.generateKey(), { pad: 'x'.repeat(200) });
      assert.equal(big.status, 413);
      assert.equal(state.runs, 0);
    } finally {
      await srv.close();
    }
  });

  test(`${name}: handler errors: clean failure releases the key, unknown outcome is terminal`, async () => {
    const state = makeHandlerState();
    const srv = await start({ store: new idempo.MemoryStore(), takeover: 'outcome_unknown' }, state);
    try {
      const k1 = idempo.generateKey();
      const a = await post(`${srv.url}/payments/1`, k1, { amount: 1, fail: 'clean' });
      assert.equal(a.status, 500);
      const a2 = await post(`${srv.url}/payments/1`, k1, { amount: 1, fail: 'clean' });
      assert.equal(a2.status, 500);
      assert.equal(state.runs, 2, 'a failure without side effect releases the key: the retry runs');

      const k2 = idempo.generateKey();
      const b = await post(`${srv.url}/payments/1`, k2, { amount: 1, fail: 'maybe' });
      assert.equal(b.status, 500);
      const b2 = await post(`${srv.url}/payments/1`, k2, { amount: 1, fail: 'maybe' });
      assert.equal(b2.status, 500);
      const p = await b2.json();
      assert.equal(p.type, 'urn:idempo:problem:outcome-unknown');
      assert.match(b2.headers.get('content-type'), /problem\+json/);
      assert.equal(state.runs, 3, 'an outcome-unknown key never runs again');
    } finally {
      await srv.close();
    }
  });
}


test('heartbeats renew the lease of a long handler; a takeover after lease expiry makes the stale owner lose', async () => {
  class CountingStore extends idempo.MemoryStore {
    renews = 0;
    renew(...a) {
      this.renews++;
      return super.renew(...a);
    }
  }
  // Long handler with heartbeats: the lease (1 s) is renewed every 200 ms, so no takeover.
  const store = new CountingStore();
  const state = makeHandlerState();
  let open;
  state.gate = new Promise((r) => (open = r));
  const srv = await startExpress({ store, leaseMs: 1000, heartbeatMs: 200 }, state);
  try {
    const key = idempo.generateKey();
    const first = post(`${srv.url}/payments/1`, key, { amount: 1 });
    await new Promise((r) => setTimeout(r, 1500));
    const dup = await post(`${srv.url}/payments/1`, key, { amount: 1 });
    assert.equal(dup.status, 409, 'the renewed lease is still live after 1.5 s');
    open();
    assert.equal((await first).status, 201);
    assert.ok(store.renews >= 5, `renewed ${store.renews} times`);
    assert.equal(state.runs, 1);
  } finally {
    open();
    await srv.close();
  }

  // No heartbeat, policy re_run: after the lease expires a retry takes over; the stale owner's
  // completion is rejected and reported as lease_lost.
  const state2 = makeHandlerState();
  let open2;
  state2.gate = new Promise((r) => (open2 = r));
  const srv2 = await startExpress({ store: new idempo.MemoryStore(), leaseMs: 1000, heartbeatMs: 0, takeover: 're_run' }, state2);
  const outcomes = [];
  srv2.events.on('outcome', (e) => outcomes.push(e.outcome));
  try {
    const key = idempo.generateKey();
    const first = post(`${srv2.url}/payments/1`, key, { amount: 1 });
    await new Promise((r) => setTimeout(r, 1200));
    const second = post(`${srv2.url}/payments/1`, key, { amount: 1 });
    for (let i = 0; state2.runs < 2 && i < 300; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(state2.runs, 2, 'the retry took the expired lease over and re-ran');
    open2();
    const [a, b] = await Promise.all([first, second]);
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.deepEqual(outcomes.sort(), ['lease_lost', 'stored']);
    const replay = await post(`${srv2.url}/payments/1`, key, { amount: 1 });
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  } finally {
    open2();
    await srv2.close();
  }
});

test('fastify: invalid JSON on routes the plugin does not protect still gets 400', async () => {
  const app = Fastify({ forceCloseConnections: true });
  await app.register(idempo.idempotencyPlugin, { store: new idempo.MemoryStore(), keyRequired: false });
  app.post('/free', async (req) => ({ got: req.body }));
  app.put('/put', async (req) => ({ got: req.body }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  try {
    const url = `http://127.0.0.1:${app.server.address().port}`;
    const h = { 'content-type': 'application/json' };
    assert.equal((await fetch(`${url}/free`, { method: 'POST', headers: h, body: '{"a":' })).status, 400);
    assert.equal((await fetch(`${url}/put`, { method: 'PUT', headers: h, body: '{"a":' })).status, 400);
    const ok = await fetch(`${url}/free`, { method: 'POST', headers: h, body: '{"a":1}' });
    assert.deepEqual(await ok.json(), { got: { a: 1 } });
  } finally {
    await app.close();
  }
});

test('express: scope separates principals; a missing scope with req.user warns once', async () => {
  const app = express();
  const store = new idempo.MemoryStore();
  const warn = idempotency({ store });
  const warnings = [];
  warn.events.on('warning', (w) => warnings.push(w.message));
  const scoped = idempotency({ store, scope: (req) => req.user.id });
  let runs = 0;
  app.use((req, _res, next) => {
    req.user = { id: req.headers['x-user'] };
    next();
  });
  app.post('/scoped', scoped, (req, res) => res.status(201).json({ user: req.user.id, run: ++runs }));
  app.post('/unscoped', warn, (req, res) => res.status(201).json({ run: ++runs }));
  const server = await new Promise((r) => {
    const s = app.listen(0, '127.0.0.1', () => r(s));
  });
  try {
    const url = `http://127.0.0.1:${server.address().port}`;
    const key = idempo.generateKey();
    const send = (path, user) =>
      fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-user': user }, body: '{}' });
    const a = await (await send('/scoped', 'alice')).json();
    const b = await (await send('/scoped', 'bob')).json();
    assert.deepEqual([a.user, b.user], ['alice', 'bob'], 'the same key under two principals is two records');
    assert.equal((await send('/scoped', 'alice')).headers.get('idempotent-replayed'), 'true');
    await send('/unscoped', 'alice');
    await send('/unscoped', 'bob');
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], /scope/);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});
