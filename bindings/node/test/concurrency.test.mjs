// Many concurrent requests on one key: exactly one execution, against every store (real
// PostgreSQL and Redis; SQLite also from several threads with their own connections).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { idempo, storeKinds, closeShared, pkgRoot } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
after(closeShared);

const N = 40;
const FP = `v1:${'ab'.repeat(32)}`;

for (const kind of Object.keys(storeKinds)) {
  test(`${kind}: ${N} concurrent claims on one key yield exactly one Claimed`, { skip: storeKinds[kind].skip() ?? false }, async () => {
    const { store, cleanup } = await storeKinds[kind].make(undefined);
    try {
      const scope = randomBytes(32);
      const results = await Promise.all(Array.from({ length: N }, () => store.claim(scope, FP, randomBytes(16), 30_000, 60_000)));
      assert.equal(results.filter((r) => r.claimed).length, 1);
      const winner = results.find((r) => r.claimed);
      for (const r of results.filter((x) => !x.claimed)) {
        assert.equal(r.record.generation, winner.generation);
        assert.equal(r.record.state, 1);
      }
    } finally {
      await cleanup();
    }
  });

  test(`${kind}: ${N} concurrent HTTP requests with one key run the handler once`, { skip: storeKinds[kind].skip() ?? false }, async () => {
    const { store, cleanup } = await storeKinds[kind].make(undefined);
    let runs = 0;
    const app = express();
    app.post('/orders', idempo.idempotency({ store }), async (req, res) => {
      runs++;
      await new Promise((r) => setTimeout(r, 50));
      res.status(201).json({ order: req.body.item, run: runs });
    });
    const server = await new Promise((r) => {
      const s = app.listen(0, '127.0.0.1', () => r(s));
    });
    try {
      const url = `http://127.0.0.1:${server.address().port}/orders`;
      const key = idempo.generateKey();
      const send = () => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: '{"item":"book"}' });
      const rs = await Promise.all(Array.from({ length: N }, send));
      const statuses = rs.map((r) => r.status);
      await Promise.all(rs.map((r) => r.arrayBuffer()));
      assert.equal(runs, 1, `exactly one execution (statuses ${statuses.join(',')})`);
      assert.ok(statuses.every((s) => s === 201 || s === 409), `only 201 or 409: ${statuses.join(',')}`);
      const again = await send();
      assert.equal(again.status, 201);
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
      assert.deepEqual(await again.json(), { order: 'book', run: 1 });
      assert.equal(runs, 1);
    } finally {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
      await cleanup();
    }
  });
}

test('sqlite: claims from 4 threads, each with its own connection, yield exactly one Claimed', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-threads-'));
  const file = path.join(dir, 'db.sqlite3');
  new idempo.SqliteStore({ filename: file }).close();
  const scope = randomBytes(32).toString('hex');
  const code = `
    const { parentPort, workerData } = require('node:worker_threads');
    const { randomBytes } = require('node:crypto');
    const idempo = require(${JSON.stringify(path.join(pkgRoot, 'dist', 'index.js'))});
    const store = new idempo.SqliteStore({ filename: workerData.file });
    (async () => {
      let claimed = 0;
      for (let i = 0; i < 25; i++) {
        const scope = Buffer.from(workerData.scope, 'hex');
        const r = await store.claim(scope, ${JSON.stringify(FP)}, randomBytes(16), 30000, 60000);
        if (r.claimed) claimed++;
      }
      await store.close();
      parentPort.postMessage(claimed);
    })().catch((e) => parentPort.postMessage('error: ' + e.message));`;
  try {
    const counts = await Promise.all(
      Array.from({ length: 4 }, () =>
        new Promise((resolve, reject) => {
          const w = new Worker(code, { eval: true, workerData: { file, scope } });
          w.once('message', resolve);
          w.once('error', reject);
        }),
      ),
    );
    assert.ok(counts.every((c) => typeof c === 'number'), `workers: ${counts.join(',')}`);
    assert.equal(counts.reduce((a, b) => a + b, 0), 1);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
