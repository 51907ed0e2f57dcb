// A PostgreSQL primary that crashes and a standby that is promoted (spec/STORAGE.md §4.6), as
// bindings/python/tests/test_pg_failover.py does for Python. `scripts/test-services.sh start-pair`
// starts a primary and a synchronous streaming standby; the store gets both servers (a multi-host
// URL, `target_session_attrs=read-write`, or a list of connection strings) and opens its
// connections on the one that accepts writes. Across `promote` (the primary stopped at once, the
// standby promoted) the store fails closed while no primary answers (STORE_UNAVAILABLE, nothing
// else), then works against the new primary, and every completed record is still there: a retry
// replays, nothing runs twice.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { idempo, repoRoot } from './helpers.mjs';
import { ownServerUnavailable } from './pgserver.mjs';

const script = path.join(repoRoot, 'scripts', 'test-services.sh');
const skip = ownServerUnavailable() ?? false;
const FP = `v1:${'f'.repeat(64)}`;
const TTL_MS = 600_000;

let work;
let env;

before(() => {
  if (skip) return;
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-pgpair-'));
  const out = execFileSync('bash', [script, 'start-pair', work], { encoding: 'utf8', timeout: 180_000 });
  env = Object.fromEntries(
    out
      .split('\n')
      .filter((l) => l.includes('='))
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
});

after(() => {
  if (!work) return;
  try {
    execFileSync('bash', [script, 'stop', work], { stdio: 'pipe', timeout: 60_000 });
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
});

const promote = () => execFileSync('bash', [script, 'promote', work], { stdio: 'pipe', timeout: 120_000 });
const scope = (i) => idempo.scopeId('tenant', 'POST', '/payments', `failover-${String(i).padStart(3, '0')}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Calls `f` until it stops failing closed; every failure must be STORE_UNAVAILABLE. */
async function untilAvailable(f, deadlineMs) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    try {
      return await f();
    } catch (e) {
      assert.ok(e instanceof idempo.StoreUnavailableError, `failed with ${e?.constructor?.name}: ${e?.message}`);
      if (Date.now() > end) throw e;
      await sleep(200);
    }
  }
}

test('the standby first: the store skips a read-only server and claims on the primary', { skip, timeout: 60_000 }, async () => {
  const standby = new URL(env.IDEMPO_TEST_PG_STANDBY_DSN);
  const primary = new URL(env.IDEMPO_TEST_PG_PRIMARY_DSN);
  const url = `postgresql://postgres@127.0.0.1:${standby.port},127.0.0.1:${primary.port}/postgres?target_session_attrs=read-write`;
  const store = new idempo.PostgresStore({ connectionString: url, timeoutMs: 2000 });
  try {
    await store.createSchema();
    const r = await store.claim(scope(500), FP, randomBytes(16), 30_000, TTL_MS);
    assert.equal(r.claimed, true);
  } finally {
    await store.close();
  }
  // A standby alone: no server accepts writes, the store fails closed.
  const only = new idempo.PostgresStore({ connectionString: [env.IDEMPO_TEST_PG_STANDBY_DSN, `postgresql://postgres@127.0.0.1:1/postgres`], timeoutMs: 2000 });
  try {
    await assert.rejects(only.claim(scope(501), FP, randomBytes(16), 30_000, TTL_MS), (e) => e instanceof idempo.StoreUnavailableError && /read-only/.test(e.message));
  } finally {
    await only.close();
  }
});

test('completed records survive a promotion and retries replay (multi-host URL and a list)', { skip, timeout: 180_000 }, async () => {
  const a = new idempo.PostgresStore({ connectionString: env.IDEMPO_TEST_PG_MULTIHOST_DSN, timeoutMs: 2000 });
  const b = new idempo.PostgresStore({
    connectionString: [env.IDEMPO_TEST_PG_PRIMARY_DSN, env.IDEMPO_TEST_PG_STANDBY_DSN],
    timeoutMs: 2000,
  });
  try {
    await a.createSchema();
    const tokens = new Map();
    for (let i = 0; i < 20; i++) {
      const token = randomBytes(16);
      tokens.set(i, token);
      const store = i % 2 === 0 ? a : b;
      assert.equal((await store.claim(scope(i), FP, token, 30_000, TTL_MS)).claimed, true);
      const body = Buffer.from(`{"charge":${i}}`);
      assert.equal(await store.complete(scope(i), token, idempo.encodeResponse({ status: 201, headers: [], body }), TTL_MS), true);
    }
    promote();
    // While no primary answers, every call fails closed; then the store reaches the promoted standby.
    for (const store of [a, b]) await untilAvailable(() => store.get(scope(0)), 60_000);
    for (let i = 0; i < 20; i++) {
      const store = i % 2 === 0 ? b : a; // each record read through the other store
      const { record } = await untilAvailable(() => store.get(scope(i)), 30_000);
      assert.ok(record !== null, `record ${i} lost`);
      assert.equal(record.state, 2, `record ${i} not completed`);
      assert.deepEqual(Buffer.from(record.token), tokens.get(i));
      // A retry of the same key finds the record: it replays, the handler does not run again.
      const again = await store.claim(scope(i), FP, randomBytes(16), 30_000, TTL_MS);
      assert.equal(again.claimed, false);
      assert.equal(again.record.state, 2);
    }
    // New keys are claimed on the new primary, through both forms.
    assert.equal((await a.claim(scope(98), FP, randomBytes(16), 30_000, TTL_MS)).claimed, true);
    assert.equal((await b.claim(scope(99), FP, randomBytes(16), 30_000, TTL_MS)).claimed, true);
  } finally {
    await a.close();
    await b.close();
  }
});
