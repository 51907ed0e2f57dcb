// Fastify request bodies (issue 14, findings 1, 3, 4, 7): the plugin fingerprints the raw bytes of
// every content type on protected routes (captured in `preParsing`), and leaves the app's parsers,
// poisoning settings, body limits and 415 answers alone. Real Fastify over a real socket.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import querystring from 'node:querystring';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const Fastify = require('fastify');

const KEY_REUSED = 'urn:idempo:problem:key-reused';

/** A Fastify app with the plugin and a few routes; `setup(app)` adds the app's own parts first. */
async function start(opts = {}, setup = () => undefined, fastifyOpts = {}) {
  const app = Fastify({ forceCloseConnections: true, ...fastifyOpts });
  const runs = [];
  await setup(app);
  await app.register(idempo.idempotencyPlugin, { store: new idempo.MemoryStore(), scope: () => 'tenant-1', heartbeatMs: 0, ...opts });
  const echo = (name) => async (req, reply) => {
    runs.push(name);
    reply.code(201);
    return { run: runs.length, body: req.body ?? null, proto: Object.getPrototypeOf(req.body ?? {}) === Object.prototype };
  };
  app.post('/pay', echo('pay'));
  app.post('/free', { config: { idempotency: false } }, echo('free'));
  app.put('/put', echo('put'));
  app.post('/small', { config: { idempotency: false }, bodyLimit: 10 }, echo('small'));
  app.route({ method: ['POST', 'PUT'], url: '/both', handler: echo('both') });
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { app, runs, url: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
}

function post(url, key, body, contentType, method = 'POST') {
  const headers = { 'content-type': contentType };
  if (key) headers['idempotency-key'] = key;
  return fetch(url, { method, headers, body });
}

async function reused(r) {
  assert.equal(r.status, 422);
  assert.equal((await r.json()).type, KEY_REUSED);
}

const formParser = (app) =>
  app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' }, (_req, body, done) => done(null, querystring.parse(body)));
const customParser = (app) =>
  app.addContentTypeParser('application/vnd.amounts', { parseAs: 'buffer' }, (_req, body, done) => done(null, { text: body.toString() }));

for (const [ct, setup, a, b] of [
  ['text/plain', () => undefined, 'amount=10', 'amount=9999'],
  ['text/plain; charset=utf-8', () => undefined, 'amount=10', 'amount=9999'],
  ['application/x-www-form-urlencoded', formParser, 'amount=10', 'amount=9999'],
  ['application/vnd.amounts', customParser, 'amount=10', 'amount=9999'],
  ['application/json', () => undefined, '{"amount":10}', '{"amount":9999}'],
]) {
  test(`fastify: ${ct}: the same key with another body is 422 key-reused, never the first response`, async () => {
    const s = await start({}, setup);
    try {
      const first = await post(`${s.url}/pay`, 'amount-key-0001', a, ct);
      assert.equal(first.status, 201);
      const firstBody = await first.json();
      assert.notEqual(firstBody.body, null, 'the app parser still parsed the body');
      await reused(await post(`${s.url}/pay`, 'amount-key-0001', b, ct));
      const again = await post(`${s.url}/pay`, 'amount-key-0001', a, ct);
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.deepEqual(await again.json(), firstBody);
      assert.deepEqual(s.runs, ['pay']);
    } finally {
      await s.close();
    }
  });
}

test('fastify: a protected request whose body was read by another hook first is refused 500 body-unavailable', async () => {
  const s = await start({}, (app) => {
    // An app hook that drains the request stream before idempo's preParsing sees it.
    app.addHook('onRequest', (req, _reply, done) => {
      if (req.headers['x-drain'] !== 'yes') return done();
      req.raw.on('data', () => undefined);
      req.raw.once('end', () => done());
    });
  });
  const logs = [];
  s.app.idempotencyEvents.on('body_unavailable', (e) => logs.push(e.message));
  try {
    const r = await fetch(`${s.url}/pay`, {
      method: 'POST',
      headers: { 'content-type': 'text/plain', 'idempotency-key': 'drained-key-01', 'x-drain': 'yes' },
      body: 'amount=10',
    });
    assert.equal(r.status, 500);
    assert.equal(r.headers.get('content-type'), 'application/problem+json');
    const p = await r.json();
    assert.equal(p.type, 'urn:idempo:problem:body-unavailable');
    assert.equal(logs.length, 1);
    assert.match(logs[0], /already read/);
    assert.deepEqual(s.runs, []);
    // The same key with its body readable runs once.
    assert.equal((await post(`${s.url}/pay`, 'drained-key-01', 'amount=10', 'text/plain')).status, 201);
  } finally {
    await s.close();
  }
});

for (const route of ['/pay', '/free']) {
  test(`fastify: the app's prototype-poisoning setting applies on ${route}`, async () => {
    const body = '{"__proto__":{"admin":true},"amount":1}';
    const strict = await start();
    try {
      const r = await post(`${strict.url}${route}`, 'proto-key-0001', body, 'application/json');
      assert.equal(r.status, 400, 'Fastify default onProtoPoisoning: error');
      assert.deepEqual(strict.runs, []);
      const c = await post(`${strict.url}${route}`, 'proto-key-0002', '{"constructor":{"prototype":{"admin":true}}}', 'application/json');
      assert.equal(c.status, 400, 'Fastify default onConstructorPoisoning: error');
    } finally {
      await strict.close();
    }
    const removing = await start({}, () => undefined, { onProtoPoisoning: 'remove' });
    try {
      const r = await post(`${removing.url}${route}`, 'proto-key-0003', body, 'application/json');
      assert.equal(r.status, 201);
      const got = await r.json();
      assert.deepEqual(got.body, { amount: 1 });
      assert.equal(got.proto, true);
    } finally {
      await removing.close();
    }
  });
}

test("fastify: the app's bodyLimit applies on unprotected routes", async () => {
  const big = 'x'.repeat(1536 * 1024); // over the plugin's 1 MiB default, under the app's 2 MiB
  const s = await start({}, () => undefined, { bodyLimit: 2 * 1024 * 1024 });
  try {
    const free = await post(`${s.url}/free`, undefined, big, 'text/plain');
    assert.equal(free.status, 201);
    assert.equal((await free.json()).body.length, big.length);
    const put = await post(`${s.url}/put`, undefined, big, 'text/plain', 'PUT');
    assert.equal(put.status, 201);
    // A route's own bodyLimit too.
    const small = await post(`${s.url}/small`, undefined, 'more than ten bytes', 'text/plain');
    assert.equal(small.status, 413);
    assert.equal((await small.json()).code, 'FST_ERR_CTP_BODY_TOO_LARGE');
    assert.deepEqual(s.runs, ['free', 'put']);
  } finally {
    await s.close();
  }
});

test('fastify: on protected routes core maxRequestBodyBytes is the admission rule (413 problem)', async () => {
  const s = await start({ maxRequestBodyBytes: 1000 }, () => undefined, { bodyLimit: 100 });
  try {
    const ok = await post(`${s.url}/pay`, 'limit-key-0001', 'y'.repeat(500), 'text/plain');
    assert.equal(ok.status, 201, 'under core limit, over the app limit: core decides');
    const over = await post(`${s.url}/pay`, 'limit-key-0002', 'y'.repeat(2000), 'text/plain');
    assert.equal(over.status, 413);
    assert.equal(over.headers.get('content-type'), 'application/problem+json');
    assert.equal((await over.json()).type, 'urn:idempo:problem:body-too-large');
    // A chunked body (no Content-Length) over the limit: the same problem.
    const chunked = await fetch(`${s.url}/pay`, {
      method: 'POST',
      headers: { 'content-type': 'text/plain', 'idempotency-key': 'limit-key-0003' },
      body: new Blob(['z'.repeat(3000)]).stream(),
      duplex: 'half',
    });
    assert.equal(chunked.status, 413);
    assert.equal((await chunked.json()).type, 'urn:idempo:problem:body-too-large');
    // Unprotected routes keep the app's limit.
    assert.equal((await post(`${s.url}/free`, undefined, 'y'.repeat(500), 'text/plain')).status, 413);
    assert.deepEqual(s.runs, ['pay']);
  } finally {
    await s.close();
  }
});

test('fastify: content types the app has no parser for still get 415', async () => {
  const s = await start();
  try {
    for (const [route, key] of [['/pay', 'media-key-0001'], ['/free', undefined]]) {
      const r = await post(`${s.url}${route}`, key, '<a/>', 'application/x-unknown');
      assert.equal(r.status, 415, route);
      assert.equal((await r.json()).code, 'FST_ERR_CTP_INVALID_MEDIA_TYPE');
    }
    assert.deepEqual(s.runs, []);
    // The key was not used up by the refused request.
    assert.equal((await post(`${s.url}/pay`, 'media-key-0001', 'a', 'text/plain')).status, 201);
  } finally {
    await s.close();
  }
});

test("fastify: on a protected route, requests core does not read keep the app's bodyLimit", async () => {
  const s = await start({ maxRequestBodyBytes: 1000, keyRequired: false }, () => undefined, { bodyLimit: 100 });
  try {
    const keyed = await post(`${s.url}/pay`, 'limit-key-0010', 'y'.repeat(500), 'text/plain');
    assert.equal(keyed.status, 201);
    for (const [route, method, body] of [['/pay', 'POST', 'y'.repeat(500)], ['/both', 'PUT', 'y'.repeat(500)]]) {
      const r = await post(`${s.url}${route}`, undefined, body, 'text/plain', method);
      assert.equal(r.status, 413, `${method} ${route}`);
      assert.equal((await r.json()).code, 'FST_ERR_CTP_BODY_TOO_LARGE');
      const chunked = await fetch(`${s.url}${route}`, { method, headers: { 'content-type': 'text/plain' }, body: new Blob([body]).stream(), duplex: 'half' });
      assert.equal(chunked.status, 413, `${method} ${route} chunked`);
    }
    assert.equal((await post(`${s.url}/pay`, undefined, 'small', 'text/plain')).status, 201);
  } finally {
    await s.close();
  }
});
