// Admission (spec/PROTOCOL.md §7.2.1) through Express and Fastify over real HTTP: the vectors of
// spec/vectors/admission/ (format: spec/vectors/README.md, "Admission vectors"), the scope rule
// (a scope function that gives nothing usable refuses the request; the handler never runs) and the
// renamed options.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { createRequire } from 'node:module';
import { idempo, loadVector } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
const Fastify = require('fastify');

const { cases } = loadVector('admission', 'admission.json');

const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

function scopeFn(spec) {
  if (!spec.function) return undefined;
  const r = spec.returns;
  return () => {
    if (r.raises !== undefined) throw new Error(r.raises);
    if (r.number !== undefined) return r.number;
    if (r.nothing) return undefined;
    return r.principal;
  };
}

function options(c, events) {
  const o = { store: new idempo.MemoryStore(), events, route: () => c.request.route };
  for (const [k, v] of Object.entries(c.config)) o[camel(k)] = v;
  const fn = scopeFn(c.scope);
  if (fn) o.scope = fn;
  if (c.scope.public) o.public = true;
  if (c.scope.empty_is_anonymous) o.emptyScopeIsAnonymous = true;
  return o;
}

async function listen(server) {
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server.address().port;
}

async function startExpress(o, ran) {
  const app = express();
  app.post('/payments/:id', idempo.idempotency(o), (req, res) => {
    ran.push(true);
    res.status(201).json({ ok: true });
  });
  const server = http.createServer(app);
  return { port: await listen(server), close: () => new Promise((r) => server.close(r)) };
}

async function startFastify(o, ran) {
  const app = Fastify();
  await app.register(idempo.idempotencyPlugin, o);
  app.post('/payments/:id', async (req, reply) => {
    ran.push(true);
    reply.code(201);
    return { ok: true };
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  return { port: app.server.address().port, close: () => app.close() };
}

/** Sends the vector's request: repeated key fields as separate lines; chunked when no length. */
function send(port, req) {
  return new Promise((resolve, reject) => {
    // An array value is sent as repeated field lines.
    const headers = { 'content-type': req.content_type };
    if (req.key_fields.length > 0) headers['idempotency-key'] = req.key_fields.length === 1 ? req.key_fields[0] : req.key_fields;
    if (req.declared_length !== null) headers['content-length'] = String(req.declared_length);
    else headers['transfer-encoding'] = 'chunked';
    if (req.authenticated) headers.authorization = 'Bearer test';
    const r = http.request({ port, host: '127.0.0.1', method: req.method, path: req.target, headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    r.on('error', (e) => (e.code === 'ECONNRESET' || e.code === 'EPIPE' ? null : reject(e)));
    const body = Buffer.from(req.body);
    if (req.declared_length === null) {
      for (let i = 0; i < body.length; i += 8) r.write(body.subarray(i, i + 8));
      r.end();
    } else {
      r.end(body);
    }
  });
}

async function run(start, c) {
  const events = new idempo.IdempotencyEvents();
  const warnings = [];
  const logs = [];
  events.on('warning', (w) => warnings.push(w.message));
  events.on('scope_unresolved', (e) => logs.push(e.message));
  const ran = [];
  const srv = await start(options(c, events), ran);
  try {
    const res = await send(srv.port, c.request);
    return { ...res, ran: ran.length > 0, warnings, logs };
  } finally {
    await srv.close();
  }
}

for (const [host, start] of [['express', startExpress], ['fastify', startFastify]]) {
  for (const c of cases) {
    test(`${host}: admission vector ${c.name}`, async () => {
      const got = await run(start, c);
      const e = c.expect;
      if (e.result === 'refuse') {
        assert.equal(got.status, e.status, got.body.toString());
        assert.match(String(got.headers['content-type']), /^application\/problem\+json/);
        const problem = JSON.parse(got.body.toString());
        assert.equal(problem.type, e.type);
        if (e.code !== undefined) assert.equal(problem.code, e.code);
        assert.equal(got.ran, false, 'the handler must not run');
        assert.equal(got.logs.length > 0, e.log, got.logs.join('\n'));
        if (e.log) assert.ok(got.logs[0].includes(c.request.route), got.logs[0]);
      } else {
        assert.equal(got.status, 201, got.body.toString());
        assert.equal(got.ran, true);
        if (e.result === 'admitted') {
          assert.equal(got.warnings.length > 0, e.warning, got.warnings.join('\n'));
          if (e.warning) {
            assert.match(got.warnings[0], /no scope function configured/);
            assert.ok(got.warnings[0].includes(c.request.route));
          }
        }
      }
    });
  }

  for (const [label, value] of [['undefined', undefined], ['null', null], ['empty string', ''], ['a number', 7]]) {
    test(`${host}: a scope function returning ${label} refuses with 500 scope-unresolved, the handler never runs`, async () => {
      const c = {
        config: {},
        request: {
          method: 'POST', route: '/payments/:id', target: '/payments/1', key_fields: ['scope-key-0001'],
          content_type: 'application/json', body: '{}', declared_length: 2, authenticated: true,
        },
        scope: { function: false, public: false, empty_is_anonymous: false },
      };
      const events = new idempo.IdempotencyEvents();
      const logs = [];
      events.on('scope_unresolved', (e) => logs.push(e.message));
      const ran = [];
      const srv = await start({ ...options(c, events), scope: () => value }, ran);
      try {
        const res = await send(srv.port, c.request);
        assert.equal(res.status, 500);
        assert.equal(JSON.parse(res.body.toString()).type, 'urn:idempo:problem:scope-unresolved');
        assert.equal(ran.length, 0);
        assert.equal(logs.length, 1);
        assert.ok(logs[0].includes('POST /payments/:id'), logs[0]);
      } finally {
        await srv.close();
      }
    });
  }
}

test('renamed and unknown options throw a ConfigError naming the new name', () => {
  const store = new idempo.MemoryStore();
  for (const [o, re] of [
    [{ bodyLimit: 10 }, /`bodyLimit` is now `maxRequestBodyBytes`/],
    [{ required: false }, /`required` is now `keyRequired`/],
    [{ replayHeaders: [] }, /`replayHeaders` is now `storedHeaders`/],
    [{ key: { minLen: 4 } }, /keyMinLen/],
    [{ heartbeatMs: null }, /heartbeatMs: 0/],
    [{ leaseMS: 5000 }, /unknown option `leaseMS`/],
    [{ public: true, scope: () => 'u' }, /public/],
  ]) {
    assert.throws(() => idempo.idempotency({ store, ...o }), (e) => e instanceof idempo.ConfigError && re.test(e.message), JSON.stringify(o));
  }
  // Core's defaults, read through the addon (none is copied into the TypeScript layer).
  const config = new (require('../native/index.js').FlowConfig)({});
  assert.equal(config.maxRequestBodyBytes, 1024 * 1024);
  assert.equal(config.takeover, 'outcome_unknown');
});

test('Admission.start facts (kind, bodyLimit) agree with its getters', () => {
  const native = require('../dist/native.js');
  const config = new native.FlowConfig({ maxRequestBodyBytes: 4096 });
  const cases = [
    [[], null], // no key: refused (keyRequired)
    [[Buffer.from('short')], 10], // too short: refused
    [[Buffer.from('a-valid-key-123')], 10], // read the body
    [[Buffer.from('a-valid-key-123')], 1e9], // declared over the limit: refused
  ];
  const optional = new native.FlowConfig({ keyRequired: false });
  const kinds = ['pass_through', 'refuse', 'read_body'];
  for (const [cfg, fields, declared] of [...cases.map(([f, d]) => [config, f, d]), [optional, [], null]]) {
    const facts = Buffer.alloc(16, 0xff);
    const a = native.Admission.start(cfg, fields, declared, facts);
    const plain = native.Admission.start(cfg, fields, declared);
    assert.equal(kinds[facts[0]], a.kind);
    assert.equal(a.kind, plain.kind);
    const limit = facts.readDoubleLE(8);
    if (a.bodyLimit === undefined || a.bodyLimit === null) assert.ok(Number.isNaN(limit));
    else assert.equal(limit, a.bodyLimit);
  }
  assert.throws(() => native.Admission.start(config, [], null, Buffer.alloc(8)), /16 bytes/);
});
