// A record written by the Python package is readable here and the other way round (same table,
// same Redis layout, same response encoding). Runs when the repository's .venv has the Python
// package (make test sets it up); skipped otherwise.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { idempo, repoRoot, PG_DSN, REDIS_URL, uniqueName, sharedPgPool, sharedRedis, closeShared } from './helpers.mjs';

after(closeShared);

const python = path.join(repoRoot, '.venv', 'bin', 'python');
const havePython = fs.existsSync(python) && spawnSync(python, ['-c', 'import idempo.stores'], { encoding: 'utf8' }).status === 0;
const skip = havePython ? false : 'the Python package is not installed in .venv';

/** Runs Python code that prints one JSON line; returns it parsed. */
function py(code, env = {}) {
  const r = spawnSync(python, ['-c', code], { encoding: 'utf8', env: { ...process.env, ...env } });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout.trim().split('\n').pop());
}

const PY_WRITE = (storeExpr) => `
import json, idempo
${storeExpr}
scope = bytes([1] * 32); tok = bytes([2] * 16)
c = s.claim(scope, 'v1:' + 'ab' * 32, tok, 30000, 60000)
ok = s.complete(scope, tok, idempo.encode_response(201, [('location', '/from-python')], b'py-body'), 60000)
print(json.dumps({'ok': ok}))`;

const PY_READ = (storeExpr) => `
import json, idempo
${storeExpr}
r, now = s.get(bytes([3] * 32))
status, headers, body = idempo.decode_response(r.response)
print(json.dumps({'state': r.state, 'generation': r.generation, 'fp': r.fingerprint, 'status': status, 'headers': headers, 'body': body.decode()}))`;

async function nodeSide(store) {
  const got = await store.get(Buffer.alloc(32, 1));
  assert.equal(got.record.state, 2);
  assert.equal(got.record.fingerprint, `v1:${'ab'.repeat(32)}`);
  assert.equal(got.record.token.toString('hex'), '02'.repeat(16));
  const r = idempo.decodeResponse(got.record.response);
  assert.deepEqual([r.status, r.headers, r.body.toString()], [201, [['location', '/from-python']], 'py-body']);
  // A claim by Node on Python's live record sees it as existing.
  const c = await store.claim(Buffer.alloc(32, 1), `v1:${'ab'.repeat(32)}`, Buffer.alloc(16, 9), 30_000, 60_000);
  assert.equal(c.claimed, false);
  // Node writes; Python reads.
  const scope = Buffer.alloc(32, 3);
  const tok = Buffer.alloc(16, 4);
  assert.equal((await store.claim(scope, `v1:${'cd'.repeat(32)}`, tok, 30_000, 60_000)).claimed, true);
  assert.equal(await store.complete(scope, tok, idempo.encodeResponse({ status: 200, headers: [['etag', '"n"']], body: Buffer.from('node-body') }), 60_000), true);
}

function checkPythonRead(out) {
  assert.deepEqual(out, { state: 2, generation: 1, fp: `v1:${'cd'.repeat(32)}`, status: 200, headers: [['etag', '"n"']], body: 'node-body' });
}

test('SQLite: Python and Node share one database file', { skip }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-xlang-'));
  const file = path.join(dir, 'shared.sqlite3');
  try {
    const storeExpr = `from idempo.stores.sqlite import SQLiteStore\ns = SQLiteStore(${JSON.stringify(file)})`;
    assert.deepEqual(py(PY_WRITE(storeExpr)), { ok: true });
    const store = new idempo.SqliteStore({ filename: file });
    await nodeSide(store);
    await store.close();
    checkPythonRead(py(PY_READ(storeExpr)));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('PostgreSQL: Python and Node share one table', { skip: skip || (PG_DSN ? false : 'IDEMPO_TEST_PG_DSN is not set') }, async () => {
  const schema = uniqueName('x');
  const pool = sharedPgPool();
  const store = new idempo.PostgresStore({ pool, schema });
  await store.createSchema();
  try {
    const storeExpr = `import os, psycopg\nfrom idempo.stores.postgres import PostgresStore\nconn = psycopg.connect(os.environ['IDEMPO_TEST_PG_DSN'], autocommit=True)\nconn.execute('SET search_path TO ${schema}')\ns = PostgresStore(conn)`;
    assert.deepEqual(py(PY_WRITE(storeExpr)), { ok: true });
    await nodeSide(store);
    checkPythonRead(py(PY_READ(storeExpr)));
  } finally {
    await pool.query(`DROP SCHEMA "${schema}" CASCADE`);
  }
});

test('Redis: Python and Node share one key layout', { skip: skip || (REDIS_URL ? false : 'IDEMPO_TEST_REDIS_URL is not set') }, async () => {
  const prefix = `${uniqueName('x')}:`;
  const client = sharedRedis();
  try {
    const storeExpr = `import os, redis\nfrom idempo.stores.redis import RedisStore\ns = RedisStore(redis.Redis.from_url(os.environ['IDEMPO_TEST_REDIS_URL']), prefix=${JSON.stringify(prefix)}.encode())`;
    assert.deepEqual(py(PY_WRITE(storeExpr)), { ok: true });
    await nodeSide(new idempo.RedisStore({ client, prefix }));
    checkPythonRead(py(PY_READ(storeExpr)));
  } finally {
    const keys = await client.keys(`${prefix}*`);
    if (keys.length) await client.del(...keys);
  }
});
