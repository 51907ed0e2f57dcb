// SqliteStore opened at the same moment on one fresh file by several workers (worker threads, each
// with its own connection, as cluster workers or a restart storm open it): every open succeeds and
// every worker can claim afterwards. Before the schema ran in one BEGIN IMMEDIATE transaction, a
// worker's CREATE ... IF NOT EXISTS failed at once with "database is locked".
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from 'node:worker_threads';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pkgRoot } from './helpers.mjs';

const dirs = [];
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

const WORKER = `
const { workerData, parentPort } = require('node:worker_threads');
const idempo = require(workerData.pkg);
const sab = new Int32Array(workerData.gate);
Atomics.wait(sab, 0, 0);
try {
  const store = new idempo.SqliteStore({ filename: workerData.filename });
  store.close();
  parentPort.postMessage({ ok: true });
} catch (e) {
  parentPort.postMessage({ ok: false, error: String(e && e.message), code: e && e.code });
}
`;

function openTogether(filename, n) {
  const gate = new SharedArrayBuffer(4);
  const workers = [];
  const results = [];
  for (let i = 0; i < n; i++) {
    const w = new Worker(WORKER, { eval: true, workerData: { pkg: pkgRoot, filename, gate } });
    workers.push(
      new Promise((resolve, reject) => {
        w.once('message', (m) => {
          results.push(m);
          resolve();
        });
        w.once('error', reject);
      }),
    );
  }
  return { gate, done: Promise.all(workers).then(() => results) };
}

test('workers opening one fresh SQLite file together all succeed', async () => {
  const failures = [];
  for (let round = 0; round < 40; round++) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-open-'));
    dirs.push(dir);
    const { gate, done } = openTogether(path.join(dir, 'db.sqlite3'), 4);
    // Let the workers load the addon and park on the gate, then release them at once.
    await new Promise((r) => setTimeout(r, 150));
    const view = new Int32Array(gate);
    Atomics.store(view, 0, 1);
    Atomics.notify(view, 0);
    for (const r of await done) if (!r.ok) failures.push(r);
  }
  assert.deepEqual(failures, []);
});

test('a file another connection holds past busyTimeoutMs fails the open with STORE_UNAVAILABLE', async () => {
  const { createRequire } = await import('node:module');
  const Database = createRequire(import.meta.url)('better-sqlite3');
  const idempo = createRequire(import.meta.url)(pkgRoot);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-open-'));
  dirs.push(dir);
  const filename = path.join(dir, 'db.sqlite3');
  const holder = new Database(filename);
  holder.exec('BEGIN EXCLUSIVE; CREATE TABLE held (x); ');
  try {
    const started = performance.now();
    assert.throws(
      () => new idempo.SqliteStore({ filename, busyTimeoutMs: 120 }),
      (e) => e instanceof idempo.StoreUnavailableError && e.code === 'STORE_UNAVAILABLE' && /busyTimeoutMs 120/.test(e.message),
    );
    assert.ok(performance.now() - started >= 100, 'the open waited for the lock');
  } finally {
    holder.exec('ROLLBACK');
    holder.close();
  }
  // Released, the same file opens.
  new idempo.SqliteStore({ filename }).close();
});

test('a missing directory is STORE_UNAVAILABLE naming the path (not a TypeError)', async () => {
  const { createRequire } = await import('node:module');
  const idempo = createRequire(import.meta.url)(pkgRoot);
  const filename = path.join(os.tmpdir(), `idempo-missing-${process.pid}`, 'db.sqlite3');
  assert.throws(
    () => new idempo.SqliteStore({ filename }),
    (e) => e instanceof idempo.StoreUnavailableError && e.code === 'STORE_UNAVAILABLE' && e.message.includes(filename) && /directory exist/.test(e.message),
  );
});
