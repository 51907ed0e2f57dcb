// PostgreSQL's claim statement (spec/STORAGE.md §4.3) through the Node store on a real server: a
// duplicate is answered by the claim itself (one statement), the record it reports is the newest
// committed version (a completion that commits while the claim waits is a replay, not in flight),
// and a row the claim's snapshot cannot see is read by the next round.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { PG_DSN, idempo, closeShared, missing, uniqueName } from './helpers.mjs';

const require = createRequire(import.meta.url);
const pg = require('pg');

after(closeShared);

const skip = missing('postgres') ?? false;
const FP = `v1:${'ab'.repeat(32)}`;
const OTHER = `v1:${'cd'.repeat(32)}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A store on its own schema whose pool counts the statements it is sent. */
async function countingStore() {
  const schema = uniqueName('c');
  const pool = new pg.Pool({ connectionString: PG_DSN, max: 2 }); // its own clients: counted once
  const sent = [];
  const clients = new Set();
  const counted = new Proxy(pool, {
    get(target, prop) {
      const v = Reflect.get(target, prop, target);
      if (prop === 'query') {
        return (...args) => {
          sent.push(typeof args[0] === 'string' ? args[0] : args[0].text);
          return v.apply(target, args);
        };
      }
      if (prop === 'connect') {
        return async (...args) => {
          const client = await v.apply(target, args);
          const query = client.query.bind(client);
          if (!clients.has(client)) {
            clients.add(client);
            client.query = (...q) => {
              sent.push(typeof q[0] === 'string' ? q[0] : q[0].text);
              return query(...q);
            };
          }
          return client;
        };
      }
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
  const store = new idempo.PostgresStore({ pool: counted, schema });
  await store.createSchema();
  const drop = async () => {
    await pool.query(`DROP SCHEMA "${schema}" CASCADE`);
    await pool.end();
  };
  return { store, schema, sent, drop };
}

const claims = (sent) => sent.filter((s) => s.includes('INSERT INTO')).length;

test('PostgreSQL claim: a duplicate and a replay are answered by one statement', { skip }, async () => {
  const { store, sent, drop } = await countingStore();
  try {
    const scope = randomBytes(32);
    const token = randomBytes(16);
    assert.equal((await store.claim(scope, FP, token, 30_000, 60_000)).claimed, true);
    sent.length = 0;
    const dup = await store.claim(scope, OTHER, randomBytes(16), 30_000, 60_000);
    assert.equal(dup.claimed, false);
    assert.equal(dup.record.fingerprint, FP);
    assert.equal(dup.record.state, 1);
    assert.equal(claims(sent), 1);
    assert.equal(sent.filter((s) => s.trimStart().startsWith('SELECT fingerprint')).length, 0, 'no get statement');
    assert.equal(await store.complete(scope, token, Buffer.from('stored'), 60_000), true);
    sent.length = 0;
    const replay = await store.claim(scope, FP, randomBytes(16), 30_000, 60_000);
    assert.equal(replay.claimed, false);
    assert.equal(replay.record.state, 2);
    assert.deepEqual(replay.record.response, Buffer.from('stored'));
    assert.equal(claims(sent), 1);
  } finally {
    await drop();
  }
});

test('PostgreSQL claim: a completion committed while the claim waits is what it reports', { skip }, async () => {
  const { store, schema, drop } = await countingStore();
  const owner = new pg.Client({ connectionString: PG_DSN });
  await owner.connect();
  try {
    const scope = randomBytes(32);
    const token = randomBytes(16);
    assert.equal((await store.claim(scope, FP, token, 30_000, 60_000)).claimed, true);
    await owner.query('BEGIN');
    await owner.query(
      `UPDATE "${schema}".idempo_record SET state = 2, response = $3, lease_until = NULL WHERE scope_key = $1 AND token = $2`,
      [scope, token, Buffer.from('done')],
    );
    let settled = false;
    const waiting = store.claim(scope, FP, randomBytes(16), 30_000, 60_000).finally(() => {
      settled = true;
    });
    await sleep(300);
    assert.equal(settled, false, 'the claim waits on the owner row lock');
    await owner.query('COMMIT');
    const got = await waiting;
    assert.equal(got.claimed, false);
    assert.equal(got.record.state, 2, 'the committed completion, not the in-progress snapshot');
    assert.deepEqual(got.record.response, Buffer.from('done'));
  } finally {
    await owner.end();
    await drop();
  }
});

test('PostgreSQL claim: a row committed after the claim began is read by the next round', { skip }, async () => {
  const { store, schema, sent, drop } = await countingStore();
  const other = new pg.Client({ connectionString: PG_DSN });
  await other.connect();
  try {
    const scope = randomBytes(32);
    await other.query('BEGIN');
    await other.query(`INSERT INTO "${schema}".idempo_record VALUES ($1, $2, 1, $3, 1, $4, $4, NULL)`, [
      scope,
      OTHER,
      randomBytes(16),
      2 ** 52,
    ]);
    sent.length = 0;
    const waiting = store.claim(scope, FP, randomBytes(16), 30_000, 60_000);
    await sleep(300);
    await other.query('COMMIT');
    const got = await waiting;
    assert.equal(got.claimed, false);
    assert.equal(got.record.fingerprint, OTHER);
    assert.equal(claims(sent), 2);
  } finally {
    await other.end();
    await drop();
  }
});
