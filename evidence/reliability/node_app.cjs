// The Node service under test: Express + idempo's `idempotency()` middleware, mirroring
// evidence/reliability/app.py route for route, so run.py drives both with the same scenarios.
//
//   node evidence/reliability/node_app.cjs <port>
//
// With EV_WORKERS > 1 the process is a supervisor that starts that many worker processes sharing
// one listening socket and starts a replacement whenever one dies (kill -9 and SIGSTOP hit real
// worker processes, as with uvicorn's workers). EV_WORKERS = 1 (the memory store: one process by
// design) serves in the process itself. With EV_LISTEN_FD (set by the harness) the socket is an
// inherited, already listening file descriptor; otherwise the app listens on 127.0.0.1:<port>.
//
// Every handler execution appends a row to an `effects` table in its own SQLite file (never
// idempo's records): that table is what the suite counts. `downstream` plays a payment API that
// deduplicates on the downstream key idempo hands the handler.
//
// Configuration (environment, as app.py): EV_STORE memory|sqlite|postgres|redis|redis-cluster,
// EV_STORE_URL (a multi-host PostgreSQL URL too: the store follows the writable server),
// EV_EFFECTS, EV_LEASE_MS (1000), EV_TTL_MS (600000), EV_SHORT_TTL_MS (3000), EV_STOP_SLEEP_MS
// (400), EV_BUSY_MS (SQLite busy_timeout, 5000), EV_STORE_TIMEOUT_MS (the middleware's
// storeTimeoutMs and the PostgreSQL store's timeoutMs, 2000), EV_WORKERS (1).
//
// With the SQLite and PostgreSQL stores, `/pay/tx` runs in the middleware's transactional mode
// (`transactional: true`, spec/STORAGE.md §4.4): the claim, the handler's write and the completion
// commit in one transaction of the store's database; the handler writes its execution row into
// the `ev_effects_tx` table there (created by the harness; not idempo's records) through
// `req.idempotency.tx`, so a crash before the commit leaves neither.
//
// Fault injection, per request (headers are not part of the fingerprint): `x-ev-crash` =
// after_claim | in_handler | after_effect | before_complete | after_complete makes the worker
// SIGKILL itself at that step (transactional: `before_complete` before the completion's write,
// `after_complete` after the COMMIT); `x-ev-stop: 1` writes a `started` row and sleeps, so the
// harness can SIGSTOP the worker mid-handler; `x-ev-sleep-ms` lengthens the handler.
//
// Memory diagnostics (scenario 7): with EV_MEM_DIR set, every worker appends one JSON line of
// `process.memoryUsage()` (rss, heapTotal, heapUsed, external, arrayBuffers; bytes) plus `t` (unix
// ms) and, on the memory store, `records` (records it holds) to `<EV_MEM_DIR>/<pid>.jsonl` every
// EV_MEM_SAMPLE_MS (1000). With EV_MEM_GC=1 (and NODE_OPTIONS=--expose-gc, inherited by the
// workers) each sample is taken right after a full `global.gc()` (diagnostic runs: what stays
// reachable, without V8's lazy collection). SIGUSR2 asks a worker for one sample right after a
// full collection (`gc: true` in the line; needs NODE_OPTIONS=--expose-gc, which the harness sets):
// the soak takes one after its warm-up and one at its end.
'use strict';
const path = require('node:path');
const { spawn } = require('node:child_process');
const { AsyncLocalStorage } = require('node:async_hooks');
const { createRequire } = require('node:module');

const nodeDir = path.resolve(__dirname, '..', '..', 'bindings', 'node');
const req = createRequire(path.join(nodeDir, 'package.json'));

const env = process.env;
const int = (name, dflt) => {
  const v = Number.parseInt(env[name] ?? '', 10);
  return Number.isFinite(v) ? v : dflt;
};
const STORE = env.EV_STORE || 'memory';
const STORE_URL = env.EV_STORE_URL || '';
const EFFECTS = env.EV_EFFECTS || '/tmp/idempo-evidence-effects.sqlite3';
const LEASE_MS = int('EV_LEASE_MS', 1000);
const TTL_MS = int('EV_TTL_MS', 600000);
const SHORT_TTL_MS = int('EV_SHORT_TTL_MS', 3000);
const STOP_SLEEP_MS = int('EV_STOP_SLEEP_MS', 400);
const BUSY_MS = int('EV_BUSY_MS', 5000);
const STORE_TIMEOUT_MS = int('EV_STORE_TIMEOUT_MS', 2000);
const WORKERS = Math.max(1, int('EV_WORKERS', 1));
const MEM_DIR = env.EV_MEM_DIR || '';
const MEM_SAMPLE_MS = Math.max(50, int('EV_MEM_SAMPLE_MS', 1000));
const MEM_GC = env.EV_MEM_GC === '1';
/** Stores whose database can hold the handler's write in idempo's transaction. */
const TX_STORES = new Set(['sqlite', 'postgres']);
const port = Number(process.argv[2] || env.EV_PORT || 0);
/** An inherited, already listening socket (from the harness): workers share it. */
const LISTEN_FD = env.EV_LISTEN_FD ? Number(env.EV_LISTEN_FD) : undefined;

if (WORKERS > 1 && env.EV_ROLE !== 'worker') {
  supervise();
} else {
  serve();
}

/**
 * The supervisor: starts the workers, each listening on the same socket, and starts a new one
 * whenever one dies (as uvicorn's supervisor does). It never accepts a connection itself, so
 * while every worker is down, new connections wait in the socket's backlog instead of being
 * refused (node:cluster closes its listening handle when its last worker exits).
 */
function supervise() {
  if (LISTEN_FD === undefined) throw new Error('EV_WORKERS > 1 needs EV_LISTEN_FD (a listening socket to share)');
  let stopping = false;
  const children = new Set();
  const start = () => {
    // The shared socket becomes the worker's fd 3.
    const stdio = ['ignore', 'inherit', 'inherit', LISTEN_FD];
    const childEnv = { ...env, EV_ROLE: 'worker', EV_LISTEN_FD: '3' };
    const child = spawn(process.execPath, [__filename, String(port)], { stdio, env: childEnv });
    children.add(child);
    child.on('exit', () => {
      children.delete(child);
      if (!stopping) start();
    });
  };
  for (let i = 0; i < WORKERS; i += 1) start();
  const stop = () => {
    stopping = true;
    for (const c of children) c.kill('SIGKILL');
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

function serve() {
  const express = req('express');
  const Database = req('better-sqlite3');
  const idempo = req('./dist/index.js');

  const effects = new Database(EFFECTS);
  effects.pragma('journal_mode = WAL');
  effects.pragma('busy_timeout = 30000');
  effects.exec(
    'CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT, key TEXT, ' +
      'generation INTEGER, downstream_key TEXT, tag TEXT, pid INTEGER, at_ms INTEGER);' +
      'CREATE TABLE IF NOT EXISTS downstream (downstream_key TEXT PRIMARY KEY, effect_id INTEGER);' +
      'CREATE TABLE IF NOT EXISTS started (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, pid INTEGER);',
  );
  const insEffect = effects.prepare(
    'INSERT INTO effects (route, key, generation, downstream_key, tag, pid, at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)',
  );
  const insDown = effects.prepare('INSERT OR IGNORE INTO downstream (downstream_key, effect_id) VALUES (?, ?)');
  const getDown = effects.prepare('SELECT effect_id FROM downstream WHERE downstream_key = ?');
  const insStarted = effects.prepare('INSERT INTO started (key, pid) VALUES (?, ?)');

  /** One execution: [effect id, charge id]. Keyed: the downstream keeps the first charge. */
  const recordEffect = effects.transaction((route, key, ex, tag, keyed) => {
    const id = Number(
      insEffect.run(route, key, ex.generation, ex.downstreamKey, tag, process.pid, Date.now()).lastInsertRowid,
    );
    let charge = id;
    if (keyed) {
      insDown.run(ex.downstreamKey, id);
      charge = Number(getDown.get(ex.downstreamKey).effect_id);
    }
    return [id, charge];
  });

  const die = () => process.kill(process.pid, 'SIGKILL');
  /** The request's `x-ev-crash` step, visible to the store wrapper (it follows the async calls). */
  const crashCtx = new AsyncLocalStorage();

  function makeStore() {
    if (STORE === 'memory') return new idempo.MemoryStore();
    if (STORE === 'sqlite') return new idempo.SqliteStore({ filename: STORE_URL, busyTimeoutMs: BUSY_MS });
    if (STORE === 'postgres') return new idempo.PostgresStore({ connectionString: STORE_URL, timeoutMs: STORE_TIMEOUT_MS });
    if (STORE === 'redis') return new idempo.RedisStore({ url: STORE_URL });
    if (STORE === 'redis-cluster') return new idempo.RedisStore({ url: STORE_URL, cluster: true });
    throw new Error(`unknown EV_STORE ${STORE}`);
  }
  const inner = makeStore();

  /** Delegates to the real store; kills the worker around `complete` when asked to. */
  const store = {
    kind: inner.kind,
    claim: (...a) => inner.claim(...a),
    get: (...a) => inner.get(...a),
    takeover: (...a) => inner.takeover(...a),
    markUnknown: (...a) => inner.markUnknown(...a),
    async complete(...a) {
      const crash = crashCtx.getStore() ?? '';
      if (crash === 'before_complete') die();
      const applied = await inner.complete(...a);
      if (crash === 'after_complete') die();
      return applied;
    },
    release: (...a) => inner.release(...a),
    renew: (...a) => inner.renew(...a),
    purgeExpired: (...a) => inner.purgeExpired(...a),
    close: () => inner.close(),
  };
  if (TX_STORES.has(STORE)) {
    /**
     * The transactional session, wrapped the same way: the crash step is taken when the session
     * opens (in the request's context). In a transaction the completion is only a write that
     * becomes durable at the COMMIT, so `after_complete` kills the worker after the COMMIT.
     * Everything else (the `tx` connection getter included) is the real session's own.
     */
    store.transaction = () => {
      const session = inner.transaction();
      const crash = crashCtx.getStore() ?? '';
      return new Proxy(session, {
        get(target, prop) {
          if (prop === 'complete') {
            return (...a) => {
              if (crash === 'before_complete') die();
              return target.complete(...a);
            };
          }
          if (prop === 'commit') {
            return async () => {
              await target.commit();
              if (crash === 'after_complete') die();
            };
          }
          const v = Reflect.get(target, prop, target);
          return typeof v === 'function' ? v.bind(target) : v;
        },
      });
    };
  }

  // EV_LOG_STORE_ERRORS=1: every store error (with its time and the worker's pid) on stderr, which
  // the harness keeps in the server log (diagnosis of a row's 503s).
  const events = new idempo.IdempotencyEvents();
  if (env.EV_LOG_STORE_ERRORS === '1') {
    events.on('store_error', ({ op, error }) =>
      process.stderr.write(`${new Date().toISOString()} ${process.pid} store_error ${op}: ${error?.message ?? error}\n`),
    );
  }
  const guard = (takeover, ttlMs = TTL_MS) =>
    idempo.idempotency({
      events,
      store,
      takeover,
      leaseMs: LEASE_MS,
      ttlMs,
      storeTimeoutMs: STORE_TIMEOUT_MS,
      maxRequestBodyBytes: int('EV_MAX_BODY', 1024 * 1024),
      scope: (r) => String(r.headers['x-tenant'] || ''),
      emptyScopeIsAnonymous: true, // requests without X-Tenant share the anonymous namespace
    });

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const tagOf = (b) => (b && typeof b === 'object' && !Array.isArray(b) ? String(b.tag ?? '') : '');

  /** The harness's faults before the effect (crash, stop, sleep); returns the crash point asked. */
  const beforeEffect = async (request, key) => {
    const crash = String(request.headers['x-ev-crash'] || '');
    if (crash === 'after_claim') die();
    if (request.headers['x-ev-stop']) {
      insStarted.run(key, process.pid);
      await sleep(STOP_SLEEP_MS);
    }
    const sleepMs = Number(request.headers['x-ev-sleep-ms'] || 0) || 0;
    if (sleepMs > 0) await sleep(sleepMs);
    if (crash === 'in_handler') die();
    return crash;
  };

  const handle = (route, keyed) => async (request, response) => {
    const ex = request.idempotency;
    const key = String(request.headers['idempotency-key'] || '');
    const tag = tagOf(request.body);
    const crash = await beforeEffect(request, key);
    const [effect, charge] = recordEffect(route, key, ex, tag, keyed);
    if (crash === 'after_effect') die();
    response.status(201).json({ effect, charge, tag, generation: ex.generation, pid: process.pid });
  };

  /** Transactional mode: the execution row goes into the store's own database, in idempo's
   * transaction (a `pg` client or the better-sqlite3 database). Returns the row's id. */
  const insertTx = async (tx, key, generation, tag) => {
    if (STORE === 'postgres') {
      const r = await tx.query(
        'INSERT INTO ev_effects_tx (key, generation, tag, pid) VALUES ($1, $2, $3, $4) RETURNING id',
        [key, generation, tag, process.pid],
      );
      return Number(r.rows[0].id);
    }
    const r = tx.prepare('INSERT INTO ev_effects_tx (key, generation, tag, pid) VALUES (?, ?, ?, ?)').run(
      key,
      generation,
      tag,
      process.pid,
    );
    return Number(r.lastInsertRowid);
  };

  const handleTx = async (request, response) => {
    const ex = request.idempotency;
    const key = String(request.headers['idempotency-key'] || '');
    const tag = tagOf(request.body);
    const crash = await beforeEffect(request, key);
    const effect = await insertTx(ex.tx, key, ex.generation, tag);
    if (crash === 'after_effect') die();
    response.status(201).json({ effect, charge: effect, tag, generation: ex.generation, pid: process.pid });
  };

  if (MEM_DIR) {
    const fs = require('node:fs');
    const file = path.join(MEM_DIR, `${process.pid}.jsonl`);
    const sample = () => {
      if (MEM_GC && typeof global.gc === 'function') global.gc();
      const m = process.memoryUsage();
      const line = { t: Date.now(), rss: m.rss, heapTotal: m.heapTotal, heapUsed: m.heapUsed, external: m.external, arrayBuffers: m.arrayBuffers };
      if (typeof inner.size === 'number') line.records = inner.size; // the memory store's live records
      try {
        fs.appendFileSync(file, `${JSON.stringify(line)}\n`);
      } catch {
        // The harness removed its directory: nothing left to report to.
      }
    };
    sample();
    setInterval(sample, MEM_SAMPLE_MS).unref();
    // The harness's probe of what stays reachable: SIGUSR2 runs a full collection (with
    // NODE_OPTIONS=--expose-gc) and appends one sample marked `gc: true` (`gc: false` when the
    // collector is not exposed, so the harness can tell).
    process.on('SIGUSR2', () => {
      const collected = typeof global.gc === 'function';
      if (collected) global.gc();
      const m = process.memoryUsage();
      const line = { t: Date.now(), gc: collected, rss: m.rss, heapTotal: m.heapTotal, heapUsed: m.heapUsed, external: m.external, arrayBuffers: m.arrayBuffers };
      if (typeof inner.size === 'number') line.records = inner.size;
      try {
        fs.appendFileSync(file, `${JSON.stringify(line)}\n`);
      } catch {
        // As above.
      }
    });
  }

  const app = express();
  app.disable('x-powered-by');
  app.use((request, _response, next) => crashCtx.run(String(request.headers['x-ev-crash'] || ''), next));
  app.get('/health', (_q, s) => s.json({ pid: process.pid, store: STORE }));
  app.post('/pay/ou', guard('outcome_unknown'), handle('ou', false));
  app.post('/pay/rerun', guard('re_run'), handle('rerun', false));
  app.post('/pay/keyed', guard('re_run'), handle('keyed', true));
  app.post('/ttl', guard('outcome_unknown', SHORT_TTL_MS), handle('ttl', false));
  if (TX_STORES.has(STORE)) {
    const txGuard = idempo.idempotency({
      store,
      takeover: 'outcome_unknown',
      leaseMs: LEASE_MS,
      ttlMs: TTL_MS,
      storeTimeoutMs: STORE_TIMEOUT_MS,
      maxRequestBodyBytes: int('EV_MAX_BODY', 1024 * 1024),
      scope: (r) => String(r.headers['x-tenant'] || ''),
      emptyScopeIsAnonymous: true, // requests without X-Tenant share the anonymous namespace
      transactional: true,
    });
    app.post('/pay/tx', txGuard, handleTx);
  }
  app.use(idempo.idempotencyErrorHandler());

  const server = LISTEN_FD !== undefined ? app.listen({ fd: LISTEN_FD }) : app.listen(port, '127.0.0.1');
  server.keepAliveTimeout = 65000;
  server.requestTimeout = 120000;
  process.on('SIGTERM', () => {
    server.close(() => process.exit(0));
    setTimeout(() => process.exit(0), 2000).unref();
  });
}
