// Fastify stream replies (issue 14, finding 2): `reply.send(Readable)` follows core's capture plan
// (tee to the client, record at most the limit, response-not-retained past it) and the session
// ends, its heartbeat stopped, on every way out: the stream's end, its error, the client leaving
// mid-stream, a handler error, a hijacked reply. Afterwards the key never answers 409.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { createRequire } from 'node:module';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const Fastify = require('fastify');

const NOT_RETAINED = 'urn:idempo:problem:response-not-retained';
const IN_FLIGHT = 'urn:idempo:problem:in-flight';

/** A stream of `n` chunks of `size` bytes, one every `delayMs`; `failAt`: errors at that chunk. */
function slow({ n = 5, size = 10, delayMs = 5, failAt = -1, onDestroy } = {}) {
  let i = 0;
  return new Readable({
    read() {
      if (i === failAt) return void setTimeout(() => this.destroy(new Error('stream broke')), delayMs);
      if (i >= n) return void this.push(null);
      i++;
      setTimeout(() => this.push(Buffer.alloc(size, 97 + (i % 26))), delayMs);
    },
    destroy(err, cb) {
      onDestroy?.(err);
      cb(err);
    },
  });
}

async function start(opts = {}) {
  const app = Fastify({ forceCloseConnections: true });
  const store = new idempo.MemoryStore();
  await app.register(idempo.idempotencyPlugin, { store, scope: () => 't', leaseMs: 1500, heartbeatMs: 300, ...opts });
  const runs = [];
  const destroyed = [];
  app.post('/stream', async (req, reply) => {
    runs.push('stream');
    const q = JSON.parse(req.headers['x-shape'] ?? '{}'); // not fingerprinted: retries may differ
    return reply.type('text/plain').send(
      slow({ n: Number(q.n ?? 5), size: Number(q.size ?? 10), delayMs: Number(q.delay ?? 5), failAt: Number(q.failAt ?? -1), onDestroy: (e) => destroyed.push(e) }),
    );
  });
  app.post('/throws', async () => {
    runs.push('throws');
    throw new Error('handler broke');
  });
  app.post('/hijack', async (req, reply) => {
    runs.push('hijack');
    reply.hijack();
    reply.raw.writeHead(200, { 'content-type': 'text/plain' });
    reply.raw.end('raw');
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${app.server.address().port}`;
  return { app, runs, destroyed, url, store, close: () => app.close() };
}

function post(url, key, shape = {}) {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-shape': JSON.stringify(shape) },
    body: '{}',
  });
}

/** The key's next answer, once it is no longer 409 (fails if it stays in flight past the lease). */
async function settled(url, key, ms = 2500) {
  const until = Date.now() + ms;
  for (;;) {
    const r = await post(url, key);
    if (r.status !== 409) return r;
    assert.equal((await r.json()).type, IN_FLIGHT);
    if (Date.now() > until) assert.fail(`${key} still answers 409 after ${ms} ms`);
    await sleep(100);
  }
}

test('fastify: a streamed reply reaches the client whole and is stored within the limit; retries replay it', async () => {
  const s = await start();
  try {
    const first = await post(`${s.url}/stream`, 'stream-key-01');
    assert.equal(first.status, 200);
    const body = await first.text();
    assert.equal(body.length, 50);
    const again = await post(`${s.url}/stream`, 'stream-key-01');
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(await again.text(), body);
    assert.deepEqual(s.runs, ['stream']);
  } finally {
    await s.close();
  }
});

test('fastify: a streamed reply over the record limit reaches the client; retries get response-not-retained', async () => {
  const s = await start({ maxStoredBodyBytes: 100 });
  try {
    const first = await post(`${s.url}/stream`, 'stream-key-02', { n: 20, size: 50 });
    assert.equal(first.status, 200);
    assert.equal((await first.text()).length, 1000);
    const again = await post(`${s.url}/stream`, 'stream-key-02', { n: 20, size: 50 });
    assert.equal(again.status, 500);
    assert.equal((await again.json()).type, NOT_RETAINED);
    assert.deepEqual(s.runs, ['stream']);
  } finally {
    await s.close();
  }
});

test('fastify: a stream that errors mid-reply ends the session: the key is not left in flight', async () => {
  const s = await start();
  try {
    await post(`${s.url}/stream`, 'stream-key-03', { failAt: 2 })
      .then((r) => r.text())
      .catch((e) => e);
    const next = await settled(`${s.url}/stream`, 'stream-key-03');
    // Outcome unknown (core's default takeover): the handler may have acted.
    assert.equal(next.status, 500);
    assert.equal((await next.json()).type, 'urn:idempo:problem:outcome-unknown');
    assert.deepEqual(s.runs, ['stream']);
  } finally {
    await s.close();
  }
});

test('fastify: a client that leaves mid-stream ends the session and the source stream is destroyed', async () => {
  const s = await start();
  try {
    await new Promise((resolve, reject) => {
      const req = http.request(`${s.url}/stream`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'stream-key-04', 'x-shape': '{"n":100000,"size":1000,"delay":2}' },
      });
      req.on('response', (res) => {
        res.once('data', () => {
          req.destroy();
          resolve();
        });
      });
      req.on('error', (e) => (e.code === 'ECONNRESET' ? resolve() : reject(e)));
      req.end('{}');
    });
    const next = await settled(`${s.url}/stream`, 'stream-key-04');
    assert.equal(next.status, 500);
    assert.equal((await next.json()).type, 'urn:idempo:problem:outcome-unknown');
    assert.equal(s.destroyed.length, 1, 'the source stream was destroyed');
    assert.deepEqual(s.runs, ['stream']);
  } finally {
    await s.close();
  }
});

test('fastify: with takeover re_run, a stream abandoned by its client can run again at once', async () => {
  const s = await start({ takeover: 're_run' });
  try {
    const r = await post(`${s.url}/stream`, 'stream-key-05', { n: 100000, size: 1000, delay: 2 });
    const reader = r.body.getReader();
    await reader.read();
    await reader.cancel();
    const next = await settled(`${s.url}/stream`, 'stream-key-05');
    assert.equal(next.status, 200);
    assert.equal((await next.text()).length, 50);
    assert.deepEqual(s.runs, ['stream', 'stream']);
  } finally {
    await s.close();
  }
});

test('fastify: a handler error and a hijacked reply end the session', async () => {
  const s = await start();
  try {
    assert.equal((await post(`${s.url}/throws`, 'throw-key-001')).status, 500);
    const t = await settled(`${s.url}/throws`, 'throw-key-001', 500);
    assert.equal((await t.json()).type, 'urn:idempo:problem:outcome-unknown');
    const h = await post(`${s.url}/hijack`, 'hijack-key-01');
    assert.equal(await h.text(), 'raw');
    const again = await settled(`${s.url}/hijack`, 'hijack-key-01', 500);
    assert.equal((await again.json()).type, 'urn:idempo:problem:outcome-unknown');
    assert.deepEqual(s.runs, ['throws', 'hijack']);
  } finally {
    await s.close();
  }
});

test('fastify: transactional mode holds a streamed reply up to the limit; a longer one still reaches the client whole', async () => {
  const fs = await import('node:fs');
  const os = await import('node:os');
  const path = await import('node:path');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-fastify-tx-'));
  const store = new idempo.SqliteStore({ filename: path.join(dir, 'db.sqlite3') });
  const app = Fastify({ forceCloseConnections: true });
  await app.register(idempo.idempotencyPlugin, { store, transactional: true, public: true, maxStoredBodyBytes: 100 });
  let runs = 0;
  app.post('/tx', async (req, reply) => {
    runs++;
    const shape = JSON.parse(req.headers['x-shape'] ?? '{}');
    return reply.type('text/plain').send(slow({ n: shape.n ?? 5, size: shape.size ?? 10, delayMs: 1 }));
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${app.server.address().port}/tx`;
  try {
    const small = await post(url, 'tx-stream-key-1');
    assert.equal((await small.text()).length, 50);
    const replay = await post(url, 'tx-stream-key-1');
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.equal((await replay.text()).length, 50);
    const big = await post(url, 'tx-stream-key-2', { n: 200, size: 50 });
    assert.equal(big.status, 200);
    assert.equal((await big.text()).length, 10000);
    const again = await settled(url, 'tx-stream-key-2');
    assert.equal(again.status, 500);
    assert.equal((await again.json()).type, NOT_RETAINED);
    assert.equal(runs, 2);
  } finally {
    await app.close();
    store.close?.();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
