// The Node apps of `make bench-e2e`: one trivial JSON handler behind the variant under test.
//
//   E2E_VARIANT=<framework>-<variant> node evidence/bench/e2e/node_app.cjs <port>
//     express-bare | express-idempo-memory | express-idempo-sqlite | express-idempo-postgres |
//     express-idempo-redis | express-express-idempotency | express-node-idempotency |
//     fastify-bare | fastify-idempo-memory | fastify-idempo-sqlite
//   E2E_STORE_URL (SQLite path, PostgreSQL URL or Redis URL), E2E_COUNT=1 (count store primitives
//   from the middleware's `store_op` events), EV_LISTEN_FD (an inherited listening socket, set by
//   the harness's Server).
//
// Routes as evidence/bench/e2e/py_app.py: POST /pay, GET /count, GET /rtt?n=, GET /health.
// express, fastify, pg, ioredis come from bindings/node's node_modules; the two peers
// (express-idempotency, @node-idempotency/core + its memory adapter) from the bench-only folder
// evidence/bench/e2e/.peers/node, installed by the harness.
'use strict';
const path = require('node:path');
const { createRequire } = require('node:module');

const nodeDir = path.resolve(__dirname, '..', '..', '..', 'bindings', 'node');
const req = createRequire(path.join(nodeDir, 'package.json'));
const peerReq = createRequire(path.join(__dirname, '.peers', 'node', 'package.json'));

const VARIANT = process.env.E2E_VARIANT || 'express-bare';
const STORE_URL = process.env.E2E_STORE_URL || '';
const COUNT = process.env.E2E_COUNT === '1';
const port = Number(process.argv[2] || 0);
const LISTEN_FD = process.env.EV_LISTEN_FD ? Number(process.env.EV_LISTEN_FD) : undefined;
const [framework, ...rest] = VARIANT.split('-');
const variant = rest.join('-');

let invocations = 0;
const storeOps = {};
let rtt = async () => 0;

function handle(body) {
  invocations += 1;
  return { status: 'succeeded', id: invocations, amount: body && body.amount };
}

/** idempo's middleware options for this variant (null: not an idempo variant). */
function idempoOptions() {
  if (!variant.startsWith('idempo-')) return null;
  const idempo = req('./dist/index.js');
  const kind = variant.slice('idempo-'.length);
  let store;
  if (kind === 'memory') {
    store = new idempo.MemoryStore({ maxEntries: 2_000_000, maxEntriesPerPartition: 2_000_000,
      maxBytes: 2 ** 31, maxBytesPerPartition: 2 ** 31 });
  } else if (kind === 'sqlite') {
    store = new idempo.SqliteStore({ filename: STORE_URL });
  } else if (kind === 'postgres') {
    const pg = req('pg');
    const pool = new pg.Pool({ connectionString: STORE_URL });
    store = new idempo.PostgresStore({ pool });
    rtt = async (n) => {
      await pool.query('SELECT 1');
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i += 1) await pool.query('SELECT 1');
      return Number(process.hrtime.bigint() - t0) / 1e3 / n;
    };
  } else if (kind === 'redis') {
    const Redis = req('ioredis');
    const client = new Redis(STORE_URL);
    store = new idempo.RedisStore({ client });
    rtt = async (n) => {
      await client.ping();
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i += 1) await client.ping();
      return Number(process.hrtime.bigint() - t0) / 1e3 / n;
    };
  } else {
    throw new Error(`unknown variant ${VARIANT}`);
  }
  const events = new idempo.IdempotencyEvents();
  if (COUNT) events.on('store_op', ({ op }) => { storeOps[op] = (storeOps[op] || 0) + 1; });
  return { idempo, options: { store, public: true, events } };
}

function listen(server) {
  if (LISTEN_FD !== undefined) server.listen({ fd: LISTEN_FD });
  else server.listen(port, '127.0.0.1');
}

function express() {
  const express = req('express');
  const app = express();
  app.get('/health', (_req, res) => res.json({ ok: true }));
  app.get('/count', (_req, res) => res.json({ handler: invocations, store_ops: storeOps }));
  app.get('/rtt', async (r, res) => res.json({ us: await rtt(Number(r.query.n || 1000)) }));
  const id = idempoOptions();
  if (id) {
    app.post('/pay', id.idempo.idempotency(id.options), (r, res) => res.status(201).json(handle(r.body)));
  } else if (variant === 'bare') {
    app.post('/pay', express.json(), (r, res) => res.status(201).json(handle(r.body)));
  } else if (variant === 'express-idempotency') {
    // The package's documented use: its middleware, then the handler asks whether it was a hit
    // (the middleware already answered) before doing anything.
    const peer = peerReq('express-idempotency');
    app.post('/pay', express.json(), peer.idempotency(), (r, res) => {
      if (peer.getSharedIdempotencyService().isHit(r)) return;
      res.status(201).json(handle(r.body));
    });
  } else if (variant === 'node-idempotency') {
    // @node-idempotency/core with its memory adapter, wired into Express: onRequest before the
    // handler (a stored answer is sent as is), onResponse with the handler's answer.
    const { Idempotency } = peerReq('@node-idempotency/core');
    const { MemoryStorageAdapter } = peerReq('@node-idempotency/storage-adapter-memory');
    const idem = new Idempotency(new MemoryStorageAdapter());
    app.post('/pay', express.json(), async (r, res) => {
      const call = { method: r.method, headers: r.headers, body: r.body, path: r.path };
      let stored;
      try {
        stored = await idem.onRequest(call);
      } catch (err) {
        res.status(409).json({ error: String(err && err.message) });
        return;
      }
      if (stored) {
        res.status(stored.additional.status).set('idempotent-replayed', 'true').json(stored.body);
        return;
      }
      const body = handle(r.body);
      await idem.onResponse(call, { body, additional: { status: 201 } });
      res.status(201).json(body);
    });
  } else {
    throw new Error(`unknown variant ${VARIANT}`);
  }
  listen(app);
}

async function fastify() {
  const Fastify = req('fastify');
  const app = Fastify();
  app.get('/health', async () => ({ ok: true }));
  app.get('/count', async () => ({ handler: invocations, store_ops: storeOps }));
  app.get('/rtt', async (r) => ({ us: await rtt(Number(r.query.n || 1000)) }));
  const id = idempoOptions();
  if (id) await app.register(id.idempo.idempotencyPlugin, id.options);
  else if (variant !== 'bare') throw new Error(`unknown variant ${VARIANT}`);
  app.post('/pay', async (r, reply) => reply.code(201).send(handle(r.body)));
  await app.ready();
  listen(app.server);
}

if (framework === 'express') express();
else if (framework === 'fastify') fastify().catch((err) => { console.error(err); process.exit(1); });
else throw new Error(`unknown framework in ${VARIANT}`);
