// Transactional mode on a PostgreSQL server of this file's own (issue 16, item 3): the server
// shuts down (pg_ctl restart -m fast) while the handler's own INSERT runs. Nothing was committed,
// so the client gets 503 + Retry-After (core's not_committed), never the framework's plain 500,
// and the retry with the same key runs once the server is back.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';
import { ownServerUnavailable, startOwnPg } from './pgserver.mjs';

const require = createRequire(import.meta.url);
const pg = require('pg');
const express = require('express');

const skip = ownServerUnavailable() ?? false;
let server;
before(() => {
  if (!skip) server = startOwnPg();
});
after(() => server?.stop());

for (const style of ['throws', 'answers 500 itself']) {
  test(`transactional Express: PostgreSQL shut down during the handler's INSERT (handler ${style}) answers 503 + Retry-After`, { skip, timeout: 180_000 }, async () => {
    const pool = new pg.Pool({ connectionString: server.dsn, max: 4 });
    pool.on('error', () => undefined);
    const schema = `txfail_${process.pid}_${style.length}`;
    const store = new idempo.PostgresStore({ pool, schema, timeoutMs: 5000 });
    await store.createSchema();
    await pool.query(`CREATE TABLE "${schema}".business (k text NOT NULL)`);
    const app = express();
    let runs = 0;
    let slow = true;
    let started;
    const inHandler = new Promise((r) => (started = r));
    app.post('/orders', express.json({ verify: idempo.keepRawBody }), idempo.idempotency({ store, transactional: true, unavailableRetryAfterMs: 2000 }), async (req, res, next) => {
      runs++;
      try {
        const sql = slow
          ? `INSERT INTO "${schema}".business (k) SELECT $1 FROM pg_sleep(5)`
          : `INSERT INTO "${schema}".business (k) VALUES ($1)`;
        const q = req.idempotency.tx.query(sql, [req.body.k]);
        started();
        await q;
        res.status(201).json({ k: req.body.k, run: runs });
      } catch (e) {
        if (style === 'throws') return next(e);
        res.status(500).json({ error: String(e) });
      }
    });
    // Express's default error handler would answer the plain 500 the issue saw.
    const srv = await new Promise((resolve) => {
      const s = app.listen(0, '127.0.0.1', () => resolve(s));
    });
    const url = `http://127.0.0.1:${srv.address().port}/orders`;
    const key = idempo.generateKey();
    const post = () =>
      fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: '{"k":"a"}' });
    try {
      const pending = post();
      await inHandler;
      await new Promise((r) => setTimeout(r, 300));
      // Synchronous: the event loop resumes once the server is back, the INSERT's connection gone.
      server.restart();
      const r = await pending;
      const text = await r.text();
      assert.equal(r.status, 503, text);
      assert.equal(r.headers.get('retry-after'), '2');
      assert.equal(JSON.parse(text).type, 'urn:idempo:problem:store-unavailable');
      slow = false;
      let again;
      for (let i = 0; i < 20; i++) {
        again = await post();
        if (again.status !== 503) break;
        await again.arrayBuffer();
        await new Promise((res) => setTimeout(res, 250));
      }
      assert.equal(again.status, 201, await again.clone().text());
      assert.equal((await again.json()).k, 'a');
      const n = Number((await pool.query(`SELECT count(*) AS n FROM "${schema}".business`)).rows[0].n);
      assert.equal(n, 1, 'the interrupted INSERT left nothing; the retry wrote once');
      const replay = await post();
      assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    } finally {
      srv.closeAllConnections();
      await new Promise((r) => srv.close(r));
      await pool.query(`DROP SCHEMA "${schema}" CASCADE`).catch(() => undefined);
      await pool.end();
    }
  });
}
