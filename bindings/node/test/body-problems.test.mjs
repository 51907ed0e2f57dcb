// Request bodies the fingerprint refuses are answered with core's problem (invalid_body: 400, or
// 413 for the canonicalizer's size limits), byte for byte, by the Express middleware and the
// Fastify plugin; the handler never runs and nothing is stored.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
const Fastify = require('fastify');
const native = require('../native/index.js');

const deep = '['.repeat(200) + ']'.repeat(200);
const cases = [
  { name: 'duplicate member', body: '{"a":1,"a":2}', status: 400, code: 'duplicate_member', outcome: 'invalid_body' },
  { name: 'precision loss', body: '{"n":9007199254740993}', status: 400, code: 'precision_loss', outcome: 'invalid_body' },
  { name: 'lone surrogate', body: '{"s":"\\ud800"}', status: 400, code: 'lone_surrogate', outcome: 'invalid_body' },
  { name: 'syntax error', body: '{"a":}', status: 400, outcome: 'invalid_body' },
  { name: 'nesting deeper than the limit', body: deep, status: 413, code: 'depth_limit', outcome: 'body_too_large' },
];

async function startExpress(opts, runs) {
  const app = express();
  const mw = idempo.idempotency(opts);
  app.post('/p', mw, (_req, res) => {
    runs.n++;
    res.status(201).json({ ok: true });
  });
  const s = await new Promise((resolve) => {
    const srv = app.listen(0, '127.0.0.1', () => resolve(srv));
  });
  return {
    url: `http://127.0.0.1:${s.address().port}/p`,
    events: mw.events,
    close: () =>
      new Promise((r) => {
        s.closeAllConnections();
        s.close(r);
      }),
  };
}

async function startFastify(opts, runs) {
  const app = Fastify({ forceCloseConnections: true });
  await app.register(idempo.idempotencyPlugin, opts);
  app.post('/p', async (_req, reply) => {
    runs.n++;
    reply.code(201);
    return { ok: true };
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: `http://127.0.0.1:${app.server.address().port}/p`, events: app.idempotencyEvents, close: () => app.close() };
}

for (const [name, start] of Object.entries({ express: startExpress, fastify: startFastify })) {
  test(`${name}: refused bodies get core's invalid_body problem`, async () => {
    const runs = { n: 0 };
    const store = new idempo.MemoryStore();
    const srv = await start({ store, heartbeatMs: 0 }, runs);
    const outcomes = [];
    srv.events.on('outcome', (e) => outcomes.push(e.outcome));
    try {
      const keys = [];
      for (const c of cases) {
        const key = idempo.generateKey();
        keys.push(key);
        const r = await fetch(srv.url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          body: c.body,
        });
        const body = Buffer.from(await r.arrayBuffer());
        const expected = native.bodyProblem(Buffer.from(c.body), {});
        assert.ok(expected, c.name);
        assert.equal(r.status, c.status, c.name);
        assert.equal(expected.response.status, c.status, c.name);
        assert.equal(r.headers.get('content-type'), 'application/problem+json', c.name);
        assert.deepEqual(body, expected.response.body, c.name);
        const problem = JSON.parse(body.toString('utf8'));
        assert.equal(problem.type, c.status === 413 ? 'urn:idempo:problem:body-too-large' : 'urn:idempo:problem:invalid-body');
        if (c.code) assert.equal(problem.code, c.code, c.name);
        assert.match(problem.detail, /cannot be fingerprinted: .*at byte \d+/, c.name);
        assert.equal(expected.outcome, c.outcome);
      }
      assert.equal(runs.n, 0);
      assert.deepEqual(outcomes, cases.map((c) => c.outcome));
      // Nothing was claimed: the same keys with a valid body run the handler.
      for (const key of keys) {
        const r = await fetch(srv.url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          body: '{"ok":1}',
        });
        assert.equal(r.status, 201);
        assert.equal(r.headers.get('idempotent-replayed'), null);
        await r.arrayBuffer();
      }
      assert.equal(runs.n, cases.length);
    } finally {
      await srv.close();
    }
  });
}

test('bodyProblem: null for an acceptable body; the route settings apply (numbers, exclude)', () => {
  assert.equal(native.bodyProblem(Buffer.from('{"a":[1,2,{"b":null}]}'), {}), null);
  // Precision loss is refused by the default mode only.
  assert.equal(native.bodyProblem(Buffer.from('{"n":9007199254740993}'), { numbers: 'rfc' }), null);
  // The JSON Pointer of the offending value is in core's detail.
  const p = native.bodyProblem(Buffer.from('{"x":{"n":1.00000000000000001}}'), {});
  assert.match(JSON.parse(p.response.body.toString()).detail, /JSON Pointer "\/x\/n"/);
  assert.throws(() => native.bodyProblem(Buffer.from('{}'), { exclude: ['no-slash'] }), { code: 'FINGERPRINT_ERROR' });
  assert.throws(() => native.bodyProblem(Buffer.from('{}'), { numbers: 'loose' }), { code: 'INVALID_ARGUMENT' });
});
