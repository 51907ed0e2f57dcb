// Fastify routes and the methods the plugin protects (issue 14, finding 8): a route that asks for
// protection (`config: { idempotency: true }`) on a method the plugin does not protect is an error
// at registration, never a silent no-op; `idempotency: false` opts a route out.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const Fastify = require('fastify');

async function withPlugin(opts = {}) {
  const app = Fastify({ forceCloseConnections: true });
  await app.register(idempo.idempotencyPlugin, { store: new idempo.MemoryStore(), public: true, heartbeatMs: 0, ...opts });
  return app;
}

test('fastify: config.idempotency on a method the plugin does not protect is a ConfigError at registration', async () => {
  const app = await withPlugin();
  try {
    assert.throws(
      () => app.put('/put', { config: { idempotency: true } }, async () => 'x'),
      (e) => e instanceof idempo.ConfigError && /PUT \/put/.test(e.message) && /methods/.test(e.message),
    );
    assert.throws(
      () => app.route({ method: ['POST', 'DELETE'], url: '/both', config: { idempotency: true }, handler: async () => 'x' }),
      (e) => e instanceof idempo.ConfigError && /DELETE/.test(e.message),
    );
    assert.throws(() => app.post('/odd', { config: { idempotency: 'yes' } }, async () => 'x'), idempo.ConfigError);
  } finally {
    await app.close();
  }
});

test('fastify: config.idempotency true on a protected method, false to opt out, methods option honoured', async () => {
  const app = await withPlugin({ methods: ['POST', 'PUT'] });
  let runs = 0;
  app.put('/put', { config: { idempotency: true } }, async () => ({ run: ++runs }));
  app.post('/out', { config: { idempotency: false } }, async () => ({ run: ++runs }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${app.server.address().port}`;
  try {
    const missing = await fetch(`${url}/put`, { method: 'PUT' });
    assert.equal(missing.status, 400);
    assert.equal((await missing.json()).type, 'urn:idempo:problem:missing-key');
    const h = { 'idempotency-key': 'put-key-00001' };
    assert.deepEqual(await (await fetch(`${url}/put`, { method: 'PUT', headers: h })).json(), { run: 1 });
    const again = await fetch(`${url}/put`, { method: 'PUT', headers: h });
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    // Opted out: no key needed, runs every time.
    assert.equal((await fetch(`${url}/out`, { method: 'POST' })).status, 200);
    assert.equal((await fetch(`${url}/out`, { method: 'POST', headers: h })).status, 200);
    assert.equal(runs, 3);
  } finally {
    await app.close();
  }
});
