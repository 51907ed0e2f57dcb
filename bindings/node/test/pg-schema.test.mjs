// createSchema() from several stores at once against a schema without the table (a deploy where
// every worker creates the schema at start-up), on a real server: all succeed. Before the DDL ran
// in one transaction after the advisory lock of spec/STORAGE.md §4.1, two concurrent
// CREATE TABLE IF NOT EXISTS (or CREATE SCHEMA IF NOT EXISTS) failed with a unique violation.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { PG_DSN, idempo, closeShared, missing, uniqueName } from './helpers.mjs';

const require = createRequire(import.meta.url);
const pg = require('pg');

after(closeShared);

const skip = missing('postgres') ?? false;
const WORKERS = 4;
const ROUNDS = 12;

test('stores creating one schema together all succeed', { skip }, async () => {
  const admin = new pg.Client({ connectionString: PG_DSN });
  await admin.connect();
  const schemas = [];
  const failures = [];
  try {
    for (let round = 0; round < ROUNDS; round++) {
      const schema = uniqueName('race');
      schemas.push(schema);
      // Each store has a pool of its own: WORKERS connections racing, as WORKERS processes would.
      const stores = Array.from({ length: WORKERS }, () => new idempo.PostgresStore({ connectionString: PG_DSN, schema }));
      const got = await Promise.allSettled(stores.map((s) => s.createSchema()));
      await Promise.all(stores.map((s) => s.close()));
      for (const r of got) if (r.status === 'rejected') failures.push(String(r.reason?.message ?? r.reason));
      const idx = await admin.query('SELECT count(*)::int AS n FROM pg_indexes WHERE schemaname = $1', [schema]);
      assert.equal(idx.rows[0].n, 2, 'the primary key and the expiry index');
    }
  } finally {
    for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
    await admin.end();
  }
  assert.deepEqual(failures, []);
});
