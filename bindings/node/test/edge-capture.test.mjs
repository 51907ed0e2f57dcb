// What is stored and how a response is captured (spec/PROTOCOL.md §7.5.1, §9), through Express
// and Fastify.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { Readable } from 'node:stream';
import { gzipSync, gunzipSync } from 'node:zlib';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
const Fastify = require('fastify');

const NOT_RETAINED = 'urn:idempo:problem:response-not-retained';
const LIMIT = 100;
const BIG = 'b'.repeat(LIMIT * 5);
const ZIPPED = gzipSync(Buffer.from('compress me '.repeat(100)));
const PARTS = ['aaaa', 'bbbb', 'cccc'];

async function startExpress(runs) {
  const app = express();
  const mw = idempotency();
  app.post('/pay', mw, (req, res) => {
    runs.push('pay');
    if (req.headers.authorization !== 'Bearer ok') return res.status(401).json({ error: 'unauthorized' });
    res.status(201).json({ n: runs.length });
  });
  app.post('/big', mw, (req, res) => {
    runs.push('big');
    res.type('text/plain').send(BIG);
  });
  app.post('/stream', mw, (req, res) => {
    runs.push('stream');
    const size = Number(req.query.size ?? '1');
    res.status(200).type('text/plain');
    const parts = PARTS.map((p) => p.repeat(size));
    let i = 0;
    const next = () => {
      if (i === parts.length - 1) return res.end(parts[i]);
      res.write(parts[i++]);
      setImmediate(next);
    };
    next();
  });
  app.post('/gzip', mw, (req, res) => {
    runs.push('gzip');
    res.status(200).set({ 'content-type': 'text/plain', 'content-encoding': 'gzip', vary: 'Accept-Encoding' }).end(ZIPPED);
  });
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

function idempotency() {
  return idempo.idempotency(options());
}

function options() {
  return { store: new idempo.MemoryStore(), maxStoredBodyBytes: LIMIT, scope: () => 'tenant-1' };
}

async function startFastify(runs) {
  const app = Fastify({ forceCloseConnections: true });
  await app.register(idempo.idempotencyPlugin, options());
  app.post('/pay', async (req, reply) => {
    runs.push('pay');
    if (req.headers.authorization !== 'Bearer ok') return reply.code(401).send({ error: 'unauthorized' });
    return reply.code(201).send({ n: runs.length });
  });
  app.post('/big', async (req, reply) => {
    runs.push('big');
    return reply.type('text/plain').send(BIG);
  });
  app.post('/stream', async (req, reply) => {
    runs.push('stream');
    const size = Number(req.query.size ?? '1');
    return reply.type('text/plain').send(Readable.from(PARTS.map((p) => Buffer.from(p.repeat(size)))));
  });
  app.post('/gzip', async (req, reply) => {
    runs.push('gzip');
    return reply.headers({ 'content-type': 'text/plain', 'content-encoding': 'gzip', vary: 'Accept-Encoding' }).send(ZIPPED);
  });
  app.post('/validated', { schema: { body: { type: 'object', required: ['amount'], properties: { amount: { type: 'integer' } } } } }, async (req, reply) => {
    runs.push('validated');
    return reply.code(201).send({ amount: req.body.amount });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
}

const hosts = { express: startExpress, fastify: startFastify };

function post(url, key, headers = {}, body = '{"a":1}') {
  return fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, ...headers }, body });
}

async function notRetained(r) {
  assert.equal(r.status, 500);
  assert.equal(r.headers.get('content-type'), 'application/problem+json');
  assert.equal(r.headers.get('idempotent-replayed'), 'true');
  assert.equal((await r.json()).type, NOT_RETAINED);
}

for (const [name, start] of Object.entries(hosts)) {
  test(`${name}: a 401 is released; the fixed request with the same key runs and is stored`, async () => {
    const runs = [];
    const s = await start(runs);
    try {
      assert.equal((await post(`${s.url}/pay`, 'pay-key-0001')).status, 401);
      const fixed = await post(`${s.url}/pay`, 'pay-key-0001', { authorization: 'Bearer ok' });
      assert.equal(fixed.status, 201);
      assert.equal(fixed.headers.get('idempotent-replayed'), null);
      const again = await post(`${s.url}/pay`, 'pay-key-0001', { authorization: 'Bearer ok' });
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.deepEqual(await again.json(), await fixed.json());
      assert.deepEqual(runs, ['pay', 'pay']);
    } finally {
      await s.close();
    }
  });

  test(`${name}: a body over the record limit reaches the client whole; retries get response-not-retained`, async () => {
    const runs = [];
    const s = await start(runs);
    try {
      const first = await post(`${s.url}/big`, 'big-key-0001');
      assert.equal(first.status, 200);
      assert.equal(await first.text(), BIG);
      for (let i = 0; i < 2; i++) await notRetained(await post(`${s.url}/big`, 'big-key-0001'));
      assert.deepEqual(runs, ['big']);
    } finally {
      await s.close();
    }
  });

  test(`${name}: a streamed body over the limit is teed to the client; retries get response-not-retained`, async () => {
    const runs = [];
    const s = await start(runs);
    try {
      const size = LIMIT; // 3 parts of 400 bytes: past the 100-byte record limit
      const first = await post(`${s.url}/stream?size=${size}`, 'stream-key-01');
      assert.equal(first.status, 200);
      assert.equal(await first.text(), PARTS.map((p) => p.repeat(size)).join(''));
      for (let i = 0; i < 2; i++) await notRetained(await post(`${s.url}/stream?size=${size}`, 'stream-key-01'));
      assert.deepEqual(runs, ['stream']);
    } finally {
      await s.close();
    }
  });

  test(`${name}: a streamed response is replayed exactly`, async () => {
    const runs = [];
    const s = await start(runs);
    try {
      const first = await post(`${s.url}/stream`, 'stream-key-02');
      const text = await first.text();
      assert.equal(text, PARTS.join(''));
      let second;
      // The record is written when the stream ends, which may be just after the client saw it.
      for (let i = 0; i < 50; i++) {
        second = await post(`${s.url}/stream`, 'stream-key-02');
        if (second.status !== 409) break;
        await second.arrayBuffer();
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.equal(second.status, 200);
      assert.equal(second.headers.get('idempotent-replayed'), 'true');
      assert.equal(await second.text(), text);
      assert.deepEqual(runs, ['stream']);
    } finally {
      await s.close();
    }
  });

  test(`${name}: a gzip-compressed response replays with its content-encoding`, async () => {
    const runs = [];
    const s = await start(runs);
    try {
      const raw = (r) => new Promise((resolve, reject) => {
        // node's fetch decodes gzip; read the bytes with http to see what was stored.
        const http = require('node:http');
        const u = new URL(`${s.url}/gzip`);
        const req = http.request({ hostname: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'gzip-key-001' } }, (res) => {
          const parts = [];
          res.on('data', (c) => parts.push(c));
          res.on('end', () => resolve({ headers: res.headers, body: Buffer.concat(parts) }));
        });
        req.on('error', reject);
        req.end('{"a":1}');
        void r;
      });
      const first = await raw();
      const second = await raw();
      assert.equal(second.headers['idempotent-replayed'], 'true');
      assert.equal(second.headers['content-encoding'], 'gzip');
      assert.equal(second.headers.vary, 'Accept-Encoding');
      assert.equal(gunzipSync(second.body).toString(), 'compress me '.repeat(100));
      assert.deepEqual(second.body, first.body);
      assert.deepEqual(runs, ['gzip']);
    } finally {
      await s.close();
    }
  });
}

test('fastify: a schema validation 400 is not stored; the corrected body with the same key runs', async () => {
  const runs = [];
  const s = await startFastify(runs);
  try {
    const bad = await post(`${s.url}/validated`, 'valid-key-01', {}, '{"amount":"lots"}');
    assert.equal(bad.status, 400);
    const good = await post(`${s.url}/validated`, 'valid-key-01', {}, '{"amount":7}');
    assert.equal(good.status, 201);
    assert.deepEqual(await good.json(), { amount: 7 });
    assert.deepEqual(runs, ['validated']);
  } finally {
    await s.close();
  }
});
