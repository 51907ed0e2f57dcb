// `npx idempo-purge` against real stores, scraped over HTTP (spec/STORAGE.md §4.7): each test fills
// a store with expired and live records, runs the process as users do (a child process with flags),
// reads /metrics and compares the figures with the store's own.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { idempo, pkgRoot, missing, PG_DSN, sharedPgPool, closeShared } from './helpers.mjs';

const require = createRequire(import.meta.url);
const CLI = path.join(pkgRoot, 'dist', 'purge', 'cli.js');
const EXPIRED = 10_000;
const LIVE = 50;
after(closeShared);

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function rows(nowMs, count = EXPIRED) {
  const response = idempo.encodeResponse({ status: 201, headers: [], body: Buffer.from('{}') });
  const out = [];
  for (let i = 0; i < count + LIVE; i++) {
    const expired = i < count;
    const state = expired ? (i % 3) + 1 : 2;
    const exp = expired ? nowMs - 1000 - i : nowMs + 3_600_000;
    out.push({
      scope: crypto.createHash('sha256').update(`purge-${i}`).digest(),
      fingerprint: `v1:${'a'.repeat(64)}`,
      state,
      token: crypto.randomBytes(16),
      lease: state === 1 ? exp : null,
      exp,
      response: state === 2 ? response : null,
    });
  }
  return out;
}

function expectedStates(count = EXPIRED) {
  const c = { in_progress: 0, completed: 0, outcome_unknown: 0 };
  for (let i = 0; i < count; i++) c[['in_progress', 'completed', 'outcome_unknown'][i % 3]]++;
  return c;
}

function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels = (m[2] ?? '').replace(/[{}"]/g, '');
    out[labels ? `${m[1]}{${labels}}` : m[1]] = Number(m[3]);
  }
  return out;
}

class Proc {
  constructor(port, url, ...extra) {
    this.port = port;
    this.out = '';
    this.child = spawn(process.execPath, [CLI, '--store-url', url, '--metrics-port', String(port), '--metrics-addr', '127.0.0.1', ...extra], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child.stdout.on('data', (d) => (this.out += d));
    this.child.stderr.on('data', (d) => (this.out += d));
    this.exited = new Promise((resolve) => this.child.on('exit', (code) => resolve(code)));
  }

  async metrics() {
    const r = await fetch(`http://127.0.0.1:${this.port}/metrics`);
    return parseMetrics(await r.text());
  }

  async waitFor(predicate, timeoutMs = 60_000) {
    const end = Date.now() + timeoutMs;
    let last = {};
    while (Date.now() < end) {
      if (this.child.exitCode !== null) throw new Error(`purge process exited ${this.child.exitCode}: ${this.out}`);
      try {
        last = await this.metrics();
        if (predicate(last)) return last;
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`metrics never matched: ${JSON.stringify(last)}\n${this.out}`);
  }

  async stop() {
    if (this.child.exitCode === null) this.child.kill('SIGTERM');
    return this.exited;
  }
}

const okRuns = (m) => m['idempo_purge_runs_total{result=ok}'] ?? 0;
const purged = (m) => ({
  in_progress: m['idempo_purged_records_total{state=in_progress}'] ?? 0,
  completed: m['idempo_purged_records_total{state=completed}'] ?? 0,
  outcome_unknown: m['idempo_purged_records_total{state=outcome_unknown}'] ?? 0,
});
const total = (c) => c.in_progress + c.completed + c.outcome_unknown;

function checkAfterPurge(m, started) {
  assert.deepEqual(purged(m), expectedStates());
  assert.equal(m['idempo_records{state=completed}'], LIVE);
  assert.equal(m['idempo_records{state=in_progress}'], 0);
  assert.equal(m['idempo_records_expired'], 0);
  assert.equal(m['idempo_purge_lag_seconds'], 0);
  assert.ok(m['idempo_store_size_bytes'] > 0);
  assert.ok(m['idempo_purge_last_success_timestamp_seconds'] >= started / 1000 - 1);
  assert.ok(m['idempo_purge_batch_duration_seconds_count'] >= EXPIRED / 1000);
}

async function fillPg(schema) {
  const pool = sharedPgPool();
  const store = new idempo.PostgresStore({ pool, schema });
  await store.createSchema();
  const now = Number((await pool.query('SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS n')).rows[0].n);
  const all = rows(now);
  for (let i = 0; i < all.length; i += 1000) {
    const chunk = all.slice(i, i + 1000);
    const params = [];
    const values = chunk.map((r, j) => {
      params.push(r.scope, r.fingerprint, r.state, r.token, r.lease, r.exp, r.response);
      const b = j * 7;
      return `($${b + 1}, $${b + 2}, $${b + 3}, $${b + 4}, 1, $${b + 5}, $${b + 6}, $${b + 7})`;
    });
    await pool.query(
      `INSERT INTO "${schema}".idempo_record (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response) VALUES ${values.join(', ')}`,
      params,
    );
  }
  return store;
}

// The CLI's PostgreSQL URL has no schema option: each test uses its own database search path.
function urlWithSchema(schema) {
  const u = new URL(PG_DSN);
  u.searchParams.set('options', `-c search_path=${schema}`);
  return u.toString();
}

const pgSkip = missing('postgres') ?? false;

test('PostgreSQL: store.stats() before and after a purge', { skip: pgSkip }, async () => {
  const schema = `purge_stats_${process.pid}`;
  const store = await fillPg(schema);
  try {
    const before = await store.stats();
    const e = expectedStates();
    assert.deepEqual([before.inProgress, before.completed, before.outcomeUnknown], [e.in_progress, e.completed + LIVE, e.outcome_unknown]);
    assert.equal(before.expired, EXPIRED);
    assert.ok(before.purgeLagMs >= 1000 + EXPIRED - 1);
    assert.ok(before.sizeBytes > 0);
    await idempo.purgeAllExpired(store);
    const afterStats = await store.stats();
    assert.deepEqual([afterStats.expired, afterStats.purgeLagMs, afterStats.completed], [0, null, LIVE]);
  } finally {
    await sharedPgPool().query(`DROP SCHEMA "${schema}" CASCADE`);
  }
});

test('PostgreSQL: the purge process purges and exports the figures', { skip: pgSkip }, async () => {
  const schema = `purge_proc_${process.pid}`;
  await fillPg(schema);
  const started = Date.now();
  const p = new Proc(await freePort(), urlWithSchema(schema), '--interval', '0.3');
  try {
    const m = await p.waitFor((m) => okRuns(m) >= 1 && total(purged(m)) >= EXPIRED);
    checkAfterPurge(m, started);
  } finally {
    assert.equal(await p.stop(), 0, p.out);
    await sharedPgPool().query(`DROP SCHEMA "${schema}" CASCADE`);
  }
  assert.match(p.out, /run ok: purged/);
  assert.doesNotMatch(p.out, /run failed/);
});

test('PostgreSQL: two purge processes share the work', { skip: pgSkip }, async () => {
  const schema = `purge_two_${process.pid}`;
  await fillPg(schema);
  const a = new Proc(await freePort(), urlWithSchema(schema), '--interval', '0.2', '--batch', '200');
  const b = new Proc(await freePort(), urlWithSchema(schema), '--interval', '0.2', '--batch', '200');
  try {
    const done = (m) => okRuns(m) >= 2 && m['idempo_records_expired'] === 0;
    const ma = await a.waitFor(done);
    const mb = await b.waitFor(done);
    const sum = {};
    for (const k of Object.keys(expectedStates())) sum[k] = purged(ma)[k] + purged(mb)[k];
    assert.deepEqual(sum, expectedStates());
  } finally {
    assert.equal(await a.stop(), 0, a.out);
    assert.equal(await b.stop(), 0, b.out);
    await sharedPgPool().query(`DROP SCHEMA "${schema}" CASCADE`);
  }
  assert.doesNotMatch(a.out + b.out, /run failed/);
});

test('PostgreSQL: SIGTERM mid-run stops between batches and leaves nothing locked', { skip: pgSkip }, async () => {
  const schema = `purge_term_${process.pid}`;
  await fillPg(schema);
  const p = new Proc(await freePort(), urlWithSchema(schema), '--interval', '0.1', '--batch', '10', '--max-batches', '100000');
  try {
    await p.waitFor((m) => total(purged(m)) > 0);
  } finally {
    assert.equal(await p.stop(), 0, p.out);
  }
  assert.match(p.out, /SIGTERM: stopping after the batch under way/);
  const pool = sharedPgPool();
  const left = Number((await pool.query(`SELECT count(*) AS n FROM "${schema}".idempo_record`)).rows[0].n);
  assert.ok(left > LIVE && left < EXPIRED + LIVE, `stopped mid-run: ${left} left`);
  const locks = await pool.query(
    `SELECT count(*) AS n FROM pg_locks l JOIN pg_class c ON l.relation = c.oid WHERE c.relname = 'idempo_record' AND l.pid <> pg_backend_pid()`,
  );
  assert.equal(Number(locks.rows[0].n), 0);
  await pool.query(`DROP SCHEMA "${schema}" CASCADE`);
});

test('SQLite: the purge process purges and exports the figures', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-purge-'));
  const filename = path.join(dir, 'idempo.sqlite3');
  const store = new idempo.SqliteStore({ filename });
  await store.close();
  const Database = require('better-sqlite3');
  const db = new Database(filename);
  const ins = db.prepare('INSERT INTO idempo_record VALUES (?, ?, ?, ?, 1, ?, ?, ?)');
  db.transaction(() => {
    for (const r of rows(Date.now())) ins.run(r.scope, r.fingerprint, r.state, r.token, r.lease, r.exp, r.response);
  })();
  db.close();
  const started = Date.now();
  const p = new Proc(await freePort(), `sqlite://${filename}`, '--interval', '0.3');
  try {
    const m = await p.waitFor((m) => okRuns(m) >= 1 && total(purged(m)) >= EXPIRED);
    checkAfterPurge(m, started);
  } finally {
    assert.equal(await p.stop(), 0, p.out);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

for (const [args, message] of [
  [[], /no store/],
  [['--store-url', 'mysql://db/app'], /unknown store URL scheme "mysql"/],
  [['--store-url', 'sqlite://'], /needs a path/],
  [['--store-url', 'sqlite:///tmp/x.sqlite3', '--interval', '0'], /--interval must be positive/],
  [['--store-url', 'sqlite:///tmp/x.sqlite3', '--batch', 'ten'], /is not a whole number/],
]) {
  test(`configuration error exits 2: ${args.join(' ') || '(no store)'}`, () => {
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('IDEMPO_')));
    const r = spawnSync(process.execPath, [CLI, '--once', ...args], { env, encoding: 'utf8' });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, message);
  });
}

for (const make of ['missing', 'no-table']) {
  test(`a sqlite URL that names no idempo database exits 2 (${make})`, () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-purge-wrong-'));
    const filename = path.join(dir, 'wrong.sqlite3');
    if (make === 'no-table') new (require('better-sqlite3'))(filename).close();
    const r = spawnSync(process.execPath, [CLI, '--once', '--store-url', `sqlite://${filename}`], { encoding: 'utf8' });
    assert.equal(fs.existsSync(filename), make === 'no-table', 'nothing was created');
    fs.rmSync(dir, { recursive: true, force: true });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /is this the service's file\?/);
  });
}

test('a failed run is reported and --once exits 1', async () => {
  // A PostgreSQL server that does not answer: the run fails (logged), --once exits 1.
  const port = await freePort();
  const r = spawnSync(process.execPath, [CLI, '--once', '--store-url', `postgresql://postgres@127.0.0.1:${port}/postgres`], { encoding: 'utf8' });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /run failed/);
});
