// The retrying fetch client against a real local HTTP server (127.0.0.1).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { idempo } from './helpers.mjs';

const keyHeaderValueOf = (key) => idempo.keyHeaderValue(key);

/** A server answering from a script of responses; records the key of every attempt. */
async function scripted(script) {
  const seen = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ key: req.headers['idempotency-key'], body });
      const step = script[Math.min(seen.length - 1, script.length - 1)];
      if (step.hang) return; // never answers: the attempt times out
      if (step.destroy) return req.socket.destroy();
      res.writeHead(step.status, step.headers ?? {});
      res.end(step.body ?? '');
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}/op`,
    seen,
    close: () => new Promise((r) => {
      server.closeAllConnections();
      server.close(r);
    }),
  };
}

const fast = { baseDelayMs: 1, maxDelayMs: 20, maxAttempts: 5 };
const IN_FLIGHT = '{"type":"urn:idempo:problem:in-flight","title":"Request in progress","status":409,"detail":"busy"}';
const KEY_REUSED = '{"type":"urn:idempo:problem:key-reused","title":"Idempotency-Key reused","status":422,"detail":"x"}';

test("an application's 422 is its answer, idempo's 422 is key reuse, an application's 409 is not retried", async () => {
  const cases = [
    [{ status: 422, headers: { 'content-type': 'application/json' }, body: '{"detail":[{"loc":["body","amount"],"msg":"Field required"}]}' }, { reason: 'client_error', status: 422 }],
    [{ status: 422, headers: { 'content-type': 'application/problem+json' }, body: KEY_REUSED }, { reason: 'key_reused_with_different_request', status: null }],
    [{ status: 409, headers: { 'content-type': 'application/json', 'retry-after': '0' }, body: '{"error":"already shipped"}' }, { reason: 'client_error', status: 409 }],
  ];
  for (const [step, want] of cases) {
    const srv = await scripted([step, { status: 201, body: '{}' }]);
    try {
      const stops = [];
      const r = await idempo.idempotentFetch(srv.url, { method: 'POST', body: 'x', retry: fast, onStop: (i) => stops.push(i) });
      assert.equal(r.status, step.status);
      assert.equal(srv.seen.length, 1, 'stopped at once');
      assert.deepEqual(stops.map((s) => ({ reason: s.reason, status: s.status })), [want]);
    } finally {
      await srv.close();
    }
  }
});

test('retries 503 and 409 with the same key, then returns the success', async () => {
  const srv = await scripted([
    { status: 503, headers: { 'retry-after': '0' } },
    { status: 409, headers: { 'retry-after': '0', 'content-type': 'application/problem+json' }, body: IN_FLIGHT },
    { status: 201, body: '{"ok":true}' },
  ]);
  try {
    const retries = [];
    const r = await idempo.idempotentFetch(srv.url, { method: 'POST', body: '{"a":1}', retry: fast, onRetry: (i) => retries.push(i.outcome) });
    assert.equal(r.status, 201);
    assert.deepEqual(await r.json(), { ok: true });
    assert.equal(srv.seen.length, 3);
    assert.equal(new Set(srv.seen.map((s) => s.key)).size, 1, 'one key for the whole operation');
    assert.match(srv.seen[0].key, /^"[0-9a-f-]{36}"$/, 'sent as an sf-string');
    assert.ok(srv.seen.every((s) => s.body === '{"a":1}'));
    assert.deepEqual(retries.map((o) => o.status), [503, 409]);
  } finally {
    await srv.close();
  }
});

test('stops at once on 422 and on other 4xx; a given key is used as is', async () => {
  const srv = await scripted([{ status: 422, body: 'reused' }]);
  try {
    const r = await idempo.idempotentFetch(srv.url, { method: 'POST', body: 'x', key: 'order-12345', retry: fast });
    assert.equal(r.status, 422);
    assert.equal(srv.seen.length, 1);
    assert.equal(srv.seen[0].key, '"order-12345"');
  } finally {
    await srv.close();
  }
});

test('timeouts and connection errors are retried; exhaustion rejects with the reason', async () => {
  const srv = await scripted([{ hang: true }, { destroy: true }, { status: 200, body: 'done' }]);
  try {
    const r = await idempo.idempotentFetch(srv.url, { method: 'POST', body: 'x', retry: fast, attemptTimeoutMs: 100 });
    assert.equal(r.status, 200);
    assert.equal(srv.seen.length, 3);
  } finally {
    await srv.close();
  }
  const down = await scripted([{ destroy: true }]);
  try {
    await assert.rejects(
      idempo.idempotentFetch(down.url, { method: 'POST', body: 'x', retry: { ...fast, maxAttempts: 2 } }),
      (e) => e instanceof idempo.RetriesExhaustedError && e.attempts === 2 && e.reason === 'attempts_exhausted',
    );
    assert.equal(down.seen.length, 2);
  } finally {
    await down.close();
  }
});

test('Retry-After is honoured and an AbortSignal cancels the wait', async () => {
  const srv = await scripted([{ status: 429, headers: { 'retry-after': '30' } }]);
  try {
    const ctrl = new AbortController();
    const t0 = Date.now();
    const p = idempo.idempotentFetch(srv.url, { method: 'POST', body: 'x', signal: ctrl.signal, retry: { ...fast, maxElapsedMs: 60_000 } });
    setTimeout(() => ctrl.abort(new Error('user cancelled')), 150);
    await assert.rejects(p, /user cancelled/);
    assert.ok(Date.now() - t0 < 5000, 'the 30 s Retry-After wait was cancelled');
    assert.equal(srv.seen.length, 1);
  } finally {
    await srv.close();
  }
});

test("idempo's outcome-unknown 500 stops at once with a typed error; a plain 500 is retried", async () => {
  const problem = JSON.stringify({
    detail: 'An earlier attempt with this Idempotency-Key may have taken effect and its outcome was not recorded.',
    status: 500,
    title: 'Outcome unknown',
    type: 'urn:idempo:problem:outcome-unknown',
  });
  const srv = await scripted([
    { status: 500, headers: { 'content-type': 'text/plain' }, body: 'Internal Server Error' },
    { status: 500, headers: { 'content-type': 'application/problem+json' }, body: problem },
    { status: 201, body: '{"ok":true}' },
  ]);
  try {
    const retries = [];
    await assert.rejects(
      idempo.idempotentFetch(srv.url, { method: 'POST', body: '{"a":1}', retry: fast, onRetry: (i) => retries.push(i.outcome.status) }),
      (e) => {
        assert.ok(e instanceof idempo.FetchOutcomeUnknownError);
        assert.ok(e instanceof idempo.OutcomeUnknownError);
        assert.equal(e.code, 'OUTCOME_UNKNOWN');
        assert.equal(e.attempts, 2);
        assert.equal(e.response.status, 500);
        assert.equal(keyHeaderValueOf(e.key), srv.seen[0].key);
        return true;
      },
    );
    // Exactly two attempts: the third (which would have "succeeded") was never sent.
    assert.equal(srv.seen.length, 2);
    assert.equal(new Set(srv.seen.map((s) => s.key)).size, 1);
    assert.deepEqual(retries, [500]);
  } finally {
    await srv.close();
  }
});

test('core classifies the outcome-unknown answer for the policy', () => {
  const p = new idempo.RetryPolicy();
  const body = new TextEncoder().encode('{"type":"urn:idempo:problem:outcome-unknown"}');
  const ct = 'application/problem+json; charset=utf-8';
  assert.equal(idempo.responseBodyNeeded(500, ct), true);
  assert.equal(idempo.responseBodyNeeded(503, ct), false);
  assert.equal(idempo.responseBodyNeeded(500, null), false);
  assert.deepEqual(p.decide(1, 0, { kind: 'response', status: 500, contentType: ct, body }, 0.5), { retry: false, reason: 'outcome_unknown', settlesIntent: false });
  assert.equal(p.decide(1, 0, { kind: 'response', status: 500, contentType: 'text/plain', body }, 0.5).retry, true);
  assert.deepEqual(p.decide(2, 0, { kind: 'outcome_unknown' }, 0.5), { retry: false, reason: 'outcome_unknown', settlesIntent: false });
});

test('end to end: a retried operation (same key) against the Express middleware runs the handler once', async () => {
  const { createRequire } = await import('node:module');
  const require = createRequire(import.meta.url);
  const express = require('express');
  let runs = 0;
  const app = express();
  app.post('/charge', idempo.idempotency({ store: new idempo.MemoryStore() }), (req, res) => {
    runs++;
    res.status(201).json({ charged: req.body.amount });
  });
  const server = await new Promise((r) => {
    const s = app.listen(0, '127.0.0.1', () => r(s));
  });
  try {
    const url = `http://127.0.0.1:${server.address().port}/charge`;
    const key = idempo.generateKey();
    const a = await idempo.idempotentFetch(url, { method: 'POST', key, body: '{"amount":5}', headers: { 'content-type': 'application/json' } });
    const b = await idempo.idempotentFetch(url, { method: 'POST', key, body: '{"amount":5}', headers: { 'content-type': 'application/json' } });
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.equal(b.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(await b.json(), { charged: 5 });
    assert.equal(runs, 1);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

test('idempo problem responses map to the typed errors', async () => {
  const { createRequire } = await import('node:module');
  const require = createRequire(import.meta.url);
  const express = require('express');
  const app = express();
  let release;
  const gate = new Promise((r) => (release = r));
  app.post('/x', idempo.idempotency({ store: new idempo.MemoryStore() }), async (_req, res) => {
    await gate;
    res.status(200).json({ ok: true });
  });
  const server = await new Promise((r) => {
    const s = app.listen(0, '127.0.0.1', () => r(s));
  });
  try {
    const url = `http://127.0.0.1:${server.address().port}/x`;
    const key = idempo.keyHeaderValue(idempo.generateKey());
    const h = { 'content-type': 'application/json', 'idempotency-key': key };
    const first = fetch(url, { method: 'POST', headers: h, body: '{"a":1}' });
    await new Promise((r) => setTimeout(r, 100));
    const busy = await fetch(url, { method: 'POST', headers: h, body: '{"a":1}' });
    const e1 = await idempo.idempotencyErrorFromResponse(busy);
    assert.ok(e1 instanceof idempo.IdempotencyKeyInUseError && e1.code === 'IDEMPOTENCY_KEY_IN_USE' && e1.retryAfterMs >= 1000);
    release();
    const ok = await first;
    assert.equal(await idempo.idempotencyErrorFromResponse(ok), null);
    const reused = await fetch(url, { method: 'POST', headers: h, body: '{"a":2}' });
    assert.ok((await idempo.idempotencyErrorFromResponse(reused)) instanceof idempo.IdempotencyKeyReusedError);
    const missing = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    assert.equal((await idempo.idempotencyErrorFromResponse(missing))?.code, 'IDEMPOTENCY_KEY_MISSING');
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});
