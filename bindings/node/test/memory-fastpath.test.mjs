// The memory store's fast path (its primitives run inside the flow's native calls): taken only
// for exactly idempo's MemoryStore with its own primitives and no `store_op` listener, and
// equivalent to the ordinary host loop through the store's methods (Express and Fastify).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
const Fastify = require('fastify');

const native = require('../dist/native.js');

/** Counts the combined admissions during `f`: `Admission.scopeInMemory` (scope stage, flow and
 * claim in one native call), `MemoryGate.admit` (the whole admission and the claim: Express) and
 * `MemoryGate.admitStaged` (Fastify's scope stage and claim after `preParsing` passed the key and
 * body stages on the gate), wrapped on their prototypes. */
async function countingCombined(f) {
  const wrap = [
    [native.Admission.prototype, 'scopeInMemory'],
    [native.MemoryGate.prototype, 'admit'],
    [native.MemoryGate.prototype, 'admitStaged'],
  ];
  const orig = wrap.map(([proto, name]) => proto[name]);
  let n = 0;
  for (const [proto, name] of wrap) {
    const own = proto[name];
    proto[name] = function (...args) {
      const r = own.apply(this, args);
      // A gate whose random bytes ran out answers 4 (nothing ran) and is called again; one that
      // no longer keeps a staged body stage answers 6 (nothing ran) and `admit` runs instead.
      if (args.at(-1)[0] !== 4 && args.at(-1)[0] !== 6) n++;
      return r;
    };
  }
  try {
    await f();
  } finally {
    wrap.forEach(([proto, name], i) => {
      proto[name] = orig[i];
    });
  }
  return n;
}

const PRIMITIVES = ['claim', 'get', 'takeover', 'markUnknown', 'complete', 'release', 'renew'];

/** Counts the calls to MemoryStore's primitive methods (wrapped on its prototype) during `f`. */
async function countingMethods(f) {
  const proto = idempo.MemoryStore.prototype;
  const orig = {};
  const calls = {};
  for (const name of PRIMITIVES) {
    orig[name] = proto[name];
    proto[name] = function (...args) {
      calls[name] = (calls[name] ?? 0) + 1;
      return orig[name].apply(this, args);
    };
  }
  try {
    await f();
  } finally {
    for (const name of PRIMITIVES) proto[name] = orig[name];
  }
  return calls;
}

function handler(state) {
  return (body) => {
    state.runs++;
    if (body?.fail) throw Object.assign(new Error('boom'), { noSideEffect: body.fail === 'clean' });
    return { status: body?.status ?? 201, body: { amount: body?.amount, run: state.runs, big: body?.big ? 'x'.repeat(4096) : undefined } };
  };
}

async function startExpress(opts, state) {
  const app = express();
  const mw = idempo.idempotency(opts);
  const run = handler(state);
  app.post('/pay/:id', mw, (req, res, next) => {
    let r;
    try {
      r = run(req.body);
    } catch (e) {
      next(e);
      return;
    }
    res.status(r.status).set('location', `/pay/${req.params.id}`).json({ ...r.body, dk: req.idempotency?.downstreamKey });
  });
  app.use((err, _req, res, _next) => res.status(500).json({ error: err.message }));
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
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
  const run = handler(state);
  app.post('/pay/:id', async (req, reply) => {
    const r = run(req.body);
    reply.code(r.status).header('location', `/pay/${req.params.id}`);
    return { ...r.body, dk: req.idempotency?.downstreamKey };
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
}

const FRAMEWORKS = { express: startExpress, fastify: startFastify };

/** The requests of the equivalence scenario: [key, body]. */
const SCENARIO = [
  ['fast-key-fresh-1', { amount: 1 }], // stored
  ['fast-key-fresh-1', { amount: 1 }], // replayed
  ['fast-key-fresh-1', { amount: 2 }], // 422 mismatch
  ['fast-key-err500-1', { amount: 3, status: 500 }], // not stored: released
  ['fast-key-err500-1', { amount: 3, status: 500 }], // runs again
  ['fast-key-transient', { amount: 4, status: 429 }], // transient: released
  ['fast-key-transient', { amount: 4 }], // runs, stored
  ['fast-key-transient', { amount: 4 }], // replayed
  ['fast-key-big-body1', { amount: 5, big: true }], // over maxStoredBodyBytes: not retained
  ['fast-key-big-body1', { amount: 5, big: true }], // response-not-retained problem
  ['fast-key-clean-err', { amount: 6, fail: 'clean' }], // side-effect free error: released
  ['fast-key-clean-err', { amount: 6 }], // runs, stored
  ['fast-key-dirty-err', { amount: 7, fail: 'dirty' }], // may have acted: outcome unknown
  ['fast-key-dirty-err', { amount: 7, fail: 'dirty' }], // outcome-unknown problem, no run
];

/** Runs the scenario; returns every answer (status, headers but the date, body) and the outcomes. */
async function runScenario(framework, store, extra = {}, scenario = SCENARIO) {
  const state = { runs: 0 };
  const events = new idempo.IdempotencyEvents();
  const outcomes = [];
  events.on('outcome', (o) => outcomes.push(o.outcome));
  const srv = await FRAMEWORKS[framework]({ store, public: true, events, maxStoredBodyBytes: 1024, ...extra }, state);
  const answers = [];
  try {
    for (const [key, body] of scenario) {
      const r = await fetch(`${srv.url}/pay/1`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify(body),
      });
      const headers = {};
      for (const [n, v] of r.headers) if (n !== 'date' && n !== 'keep-alive' && n !== 'connection') headers[n] = v;
      answers.push({ status: r.status, headers, body: await r.text() });
    }
  } finally {
    await srv.close();
  }
  return { answers, outcomes, runs: state.runs };
}

class SubclassedStore extends idempo.MemoryStore {}

for (const framework of Object.keys(FRAMEWORKS)) {
  test(`${framework}: the fast path answers as the ordinary host loop does`, async () => {
    const fast = await runScenario(framework, new idempo.MemoryStore());
    const slow = await runScenario(framework, new SubclassedStore());
    assert.deepEqual(fast, slow);
    // The scenario exercised what it says (stored, replayed, mismatch, released, not retained,
    // outcome unknown).
    assert.deepEqual(
      fast.answers.map((a) => a.status),
      [201, 201, 422, 500, 500, 429, 201, 201, 201, 500, 500, 201, 500, 500],
    );
    assert.equal(fast.answers[1].headers['idempotent-replayed'], 'true');
    assert.ok(fast.outcomes.includes('replayed') && fast.outcomes.includes('not_retained'), fast.outcomes.join());
  });

  test(`${framework}: the fast path is taken for exactly MemoryStore and no store_op listener`, async () => {
    let combined = 0;
    const calls = await countingMethods(async () => {
      combined = await countingCombined(() => runScenario(framework, new idempo.MemoryStore()));
    });
    // Every admission took the combined native call (scope, flow and claim at once).
    assert.equal(combined, SCENARIO.length);
    // Claims and completions ran inside the native calls; only the handler errors' release and
    // mark-unknown go through the store's methods.
    assert.equal(calls.claim, undefined);
    assert.equal(calls.complete, undefined);
    assert.ok((calls.release ?? 0) + (calls.markUnknown ?? 0) <= 3, JSON.stringify(calls));
  });

  test(`${framework}: not taken for a subclass, an overridden primitive or a store_op listener`, async () => {
    assert.equal(await countingCombined(() => runScenario(framework, new SubclassedStore())), 0);
    const sub = await countingMethods(() => runScenario(framework, new SubclassedStore()));
    assert.ok(sub.claim > 0 && sub.complete > 0, JSON.stringify(sub));

    const own = new idempo.MemoryStore();
    let ownClaims = 0;
    own.claim = function (...args) {
      ownClaims++;
      return idempo.MemoryStore.prototype.claim.apply(this, args);
    };
    const overridden = await countingMethods(() => runScenario(framework, own));
    assert.equal(ownClaims, SCENARIO.length);
    assert.ok(overridden.complete > 0, JSON.stringify(overridden));

    const ops = [];
    const events = new idempo.IdempotencyEvents();
    events.on('store_op', ({ op, failed }) => ops.push(`${op}${failed ? '!' : ''}`));
    const listened = await countingMethods(() => runScenario(framework, new idempo.MemoryStore(), { events }));
    assert.equal(listened.claim, SCENARIO.length);
    assert.deepEqual(ops.slice(0, 3), ['claim', 'complete', 'claim']);
    assert.equal(ops.filter((o) => o === 'claim').length, SCENARIO.length);
  });
}

// After every test above: the refused claims leave background cleanups that call the store's
// methods for a while (the counting tests above would see them).
for (const framework of Object.keys(FRAMEWORKS)) {
  test(`${framework}: the combined admission answers as the ordinary one for a full store and a scope function`, async () => {
    // A full store refuses the second key's claim (503 store_full, through the store's own
    // method); a scope function names the principal (the scope and the partition).
    const scenario = [
      ['fast-full-key-1', { amount: 1 }],
      ['fast-full-key-2', { amount: 2 }],
      ['fast-full-key-1', { amount: 1 }],
      ['fast-full-key-1', { amount: 9 }],
    ];
    const limits = { maxEntries: 1, maxEntriesPerPartition: 1 };
    for (const extra of [{}, { public: false, scope: () => 'alice' }]) {
      const fast = await runScenario(framework, new idempo.MemoryStore(limits), extra, scenario);
      const slow = await runScenario(framework, new SubclassedStore(limits), extra, scenario);
      assert.deepEqual(fast, slow);
      assert.deepEqual(
        fast.answers.map((a) => a.status),
        [201, 503, 201, 422],
      );
      assert.equal(fast.answers[2].headers['idempotent-replayed'], 'true');
    }
    assert.equal(await countingCombined(() => runScenario(framework, new idempo.MemoryStore(limits), {}, scenario)), scenario.length);
  });
}

/** Runs `f` with every `MemoryGate` made meanwhile collected (`gates`). */
async function collectingGates(f) {
  const proto = native.MemoryGate.prototype;
  const names = ['admit', 'admitStaged'];
  const orig = names.map((name) => proto[name]);
  const gates = new Set();
  names.forEach((name, i) => {
    proto[name] = function (...args) {
      gates.add(this);
      return orig[i].apply(this, args);
    };
  });
  try {
    await f();
  } finally {
    names.forEach((name, i) => {
      proto[name] = orig[i];
    });
  }
  return [...gates];
}

for (const framework of Object.keys(FRAMEWORKS)) test(`${framework}: the memory gate answers refusals as the ordinary admission, and holds no slot afterwards`, async () => {
  // Missing and invalid keys, a body over the limit, a body the fingerprint refuses, a scope
  // that does not resolve, then the ordinary outcomes; sync and async scope functions.
  const send = async (url, key, body, type = 'application/json') => {
    const headers = { 'content-type': type };
    if (key !== null) headers['idempotency-key'] = key;
    const r = await fetch(url, { method: 'POST', headers, body });
    const h = {};
    for (const [n, v] of r.headers) if (n !== 'date' && n !== 'keep-alive' && n !== 'connection') h[n] = v;
    return { status: r.status, headers: h, body: await r.text() };
  };
  const requests = [
    [null, '{"amount":1}'],
    ['short', '{"amount":1}'],
    ['gate-key-000001', JSON.stringify({ amount: 1, pad: 'x'.repeat(300) })],
    ['gate-key-000002', '{"amount":'],
    ['gate-key-000003', '{"amount":1,"amount":2}'],
    ['gate-key-000004', '{"amount":1}'],
    ['gate-key-000004', '{"amount":1}'],
    ['gate-key-000004', '{"amount":2}'],
    ['gate-key-000005', ''],
  ];
  const run = async (store, extra) => {
    const state = { runs: 0 };
    const events = new idempo.IdempotencyEvents();
    const seen = [];
    for (const name of ['outcome', 'scope_unresolved', 'warning', 'body_unavailable']) {
      events.on(name, (e) => seen.push([name, e.outcome ?? e.message ?? '']));
    }
    const srv = await FRAMEWORKS[framework]({ store, events, maxRequestBodyBytes: 256, maxStoredBodyBytes: 1024, ...extra }, state);
    const answers = [];
    try {
      for (const [key, body] of requests) answers.push(await send(`${srv.url}/pay/1`, key, body));
    } finally {
      await srv.close();
    }
    return { answers, seen, runs: state.runs };
  };
  const scopes = [
    { public: true },
    { scope: () => 'alice' },
    { scope: async () => 'alice' },
    { scope: (req) => (req.body?.amount === 2 ? undefined : 'bob') },
    { scope: async () => { throw new Error('no user'); } },
  ];
  for (const extra of scopes) {
    let fast;
    const gates = await collectingGates(async () => {
      fast = await run(new idempo.MemoryStore(), extra);
    });
    const slow = await run(new SubclassedStore(), extra);
    assert.deepEqual(fast, slow, JSON.stringify(extra));
    assert.ok(gates.length >= 1);
    for (const g of gates) assert.equal(g.held, 0);
  }
});

test('express: a memory gate that throws: the handler does not run, the error handlers see the body as sent', async () => {
  const proto = native.MemoryGate.prototype;
  const orig = proto.admit;
  proto.admit = () => {
    throw new Error('gate broke');
  };
  const app = express();
  let runs = 0;
  app.post('/pay', idempo.idempotency({ store: new idempo.MemoryStore(), public: true }), (_req, res) => {
    runs++;
    res.json({ ok: true });
  });
  app.use((err, req, res, _next) => {
    let raw = '';
    req.setEncoding('utf8');
    req.on('data', (c) => {
      raw += c;
    });
    req.on('end', () => res.status(500).json({ error: err.message, raw, parsed: req.body }));
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  try {
    const body = JSON.stringify({ amount: 7 });
    const r = await fetch(`http://127.0.0.1:${server.address().port}/pay`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'gate-throws-0001' },
      body,
    });
    assert.equal(r.status, 500);
    assert.deepEqual(await r.json(), { error: 'gate broke', raw: body, parsed: { amount: 7 } });
    assert.equal(runs, 0);
  } finally {
    proto.admit = orig;
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

for (const framework of Object.keys(FRAMEWORKS)) test(`${framework}: gate slots are given up on every way out (errors, no heartbeat, replays)`, async () => {
  for (const extra of [{}, { heartbeatMs: 0 }]) {
    const gates = await collectingGates(() => runScenario(framework, new idempo.MemoryStore(), extra));
    assert.ok(gates.length >= 1);
    for (const g of gates) assert.equal(g.held, 0, JSON.stringify(extra));
  }
});

test('fastify: a store_op listener added between preParsing and the scope stage: the ordinary admission on the same bytes', async () => {
  // preParsing passes the key and body stages on the memory gate; a listener added before the
  // scope stage sends the claim through the store's methods (every primitive reported).
  const run = async (store) => {
    const state = { runs: 0 };
    const events = new idempo.IdempotencyEvents();
    const ops = [];
    const app = Fastify({ forceCloseConnections: true });
    app.addHook('preValidation', async () => {
      if (events.listenerCount('store_op') === 0) events.on('store_op', ({ op }) => ops.push(op));
    });
    await app.register(idempo.idempotencyPlugin, { store, public: true, events });
    app.post('/pay', async (req, reply) => {
      state.runs++;
      return reply.code(201).send({ amount: req.body.amount, run: state.runs });
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const answers = [];
    try {
      for (const [key, amount] of [['listen-key-0001', 1], ['listen-key-0001', 1], ['listen-key-0001', 2]]) {
        const r = await fetch(`http://127.0.0.1:${app.server.address().port}/pay`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          body: JSON.stringify({ amount }),
        });
        answers.push([r.status, r.headers.get('idempotent-replayed'), await r.text()]);
      }
    } finally {
      await app.close();
    }
    return { answers, ops, runs: state.runs };
  };
  let fast;
  let bodyStages = 0;
  const proto = native.MemoryGate.prototype;
  const bodyStage = proto.bodyStage;
  proto.bodyStage = function (...args) {
    bodyStages++;
    return bodyStage.apply(this, args);
  };
  let gates;
  try {
    gates = await collectingGates(async () => {
      fast = await run(new idempo.MemoryStore());
    });
  } finally {
    proto.bodyStage = bodyStage;
  }
  // Only the first request's preParsing ran before the listener was added.
  assert.equal(bodyStages, 1);
  const slow = await run(new SubclassedStore());
  assert.deepEqual(fast, slow);
  assert.deepEqual(fast.answers.map((a) => a[0]), [201, 201, 422]);
  assert.deepEqual(fast.ops, ['claim', 'complete', 'claim', 'claim']);
  // The gate never admitted: the listener was there before every scope stage.
  assert.equal(gates.length, 0);
});

test('express: the handler runs in the async context the middlewares before idempo entered (memory gate and ordinary path)', async () => {
  const { AsyncLocalStorage } = await import('node:async_hooks');
  const als = new AsyncLocalStorage();
  for (const store of [new idempo.MemoryStore(), new SubclassedStore()]) {
    const app = express();
    app.use((req, _res, next) => als.run({ request: req.headers['x-request'] }, next));
    app.post('/pay', idempo.idempotency({ store, public: true }), (_req, res) => {
      res.status(201).json({ seen: als.getStore()?.request ?? null });
    });
    const server = await new Promise((resolve) => {
      const s = app.listen(0, '127.0.0.1', () => resolve(s));
    });
    try {
      const r = await fetch(`http://127.0.0.1:${server.address().port}/pay`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'als-key-000001', 'x-request': 'r-1' },
        body: '{"amount":1}',
      });
      assert.equal(r.status, 201);
      assert.deepEqual(await r.json(), { seen: 'r-1' });
    } finally {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  }
});

test('fastify: more requests between preParsing and the scope stage than the gate keeps body stages for: the oldest are admitted from their inputs, as the ordinary path', async () => {
  // 70 requests held in a preValidation hook until all arrived: the gate keeps the last 64
  // body stages; the 6 oldest answer 6 from admitStaged and go through admit on the same bytes.
  const COUNT = 70;
  const run = async (store) => {
    const app = Fastify({ forceCloseConnections: true });
    await app.register(idempo.idempotencyPlugin, { store, public: true });
    let arrived = 0;
    let release;
    const all = new Promise((r) => {
      release = r;
    });
    app.addHook('preValidation', async () => {
      if (++arrived === COUNT) release();
      await all;
    });
    let runs = 0;
    app.post('/pay', async (req, reply) => {
      runs++;
      return reply.code(201).send({ amount: req.body.amount });
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const url = `http://127.0.0.1:${app.server.address().port}/pay`;
    const send = (i, amount = i) =>
      fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': `restage-key-${String(i).padStart(3, '0')}` },
        body: JSON.stringify({ amount }),
      }).then(async (r) => [r.status, r.headers.get('idempotent-replayed'), await r.text()]);
    try {
      const first = await Promise.all(Array.from({ length: COUNT }, (_, i) => send(i)));
      arrived = -Infinity;
      // Every key again (replays) and one with another body (422).
      const again = await Promise.all(Array.from({ length: COUNT }, (_, i) => send(i)));
      const mismatch = await send(0, 999);
      return { first, again, mismatch, runs };
    } finally {
      await app.close();
    }
  };
  const proto = native.MemoryGate.prototype;
  const admitStaged = proto.admitStaged;
  let restaged = 0;
  proto.admitStaged = function (...args) {
    const r = admitStaged.apply(this, args);
    if (args.at(-1)[0] === 6) restaged++;
    return r;
  };
  let fast;
  try {
    fast = await run(new idempo.MemoryStore());
  } finally {
    proto.admitStaged = admitStaged;
  }
  assert.ok(restaged >= COUNT - 64, `restaged ${restaged}`);
  const slow = await run(new SubclassedStore());
  assert.deepEqual(fast, slow);
  assert.equal(fast.runs, COUNT);
  assert.ok(fast.first.every(([s]) => s === 201));
  assert.ok(fast.again.every(([s, replayed]) => s === 201 && replayed === 'true'));
  assert.equal(fast.mismatch[0], 422);
});
