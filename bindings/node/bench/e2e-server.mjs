// One server of `bench/e2e-overhead.mjs`: node e2e-server.mjs <express|fastify> <bare|memory|sqlite> <port>.
// A trivial JSON handler behind the framework's JSON parsing (bare) or behind idempo (which reads
// and parses the body itself). Prints "ready" once listening.
import { createRequire } from 'node:module';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'package.json'));
const [framework, variant, port] = process.argv.slice(2);
process.on('SIGINT', () => process.exit(0));
// `<store>@<dir>`: idempo compiled into another directory of this package (a before/after run).
const [storeName, distDir] = variant.split('@');
const idempo = require(`./${distDir ?? 'dist'}/index.js`);

function store() {
  if (storeName === 'memory') return new idempo.MemoryStore({ maxEntries: 10_000_000, maxBytes: 8 * 1024 * 1024 * 1024, maxEntriesPerPartition: 10_000_000, maxBytesPerPartition: 8 * 1024 * 1024 * 1024 });
  if (storeName === 'sqlite') return new idempo.SqliteStore({ filename: path.join(mkdtempSync(path.join(os.tmpdir(), 'idempo-e2e-')), 'keys.db') });
  if (storeName === 'sqlite-nockpt') {
    // Experiment: no automatic WAL checkpoint (how much of the tail the checkpoints are).
    const Database = require('better-sqlite3');
    const db = new Database(path.join(mkdtempSync(path.join(os.tmpdir(), 'idempo-e2e-')), 'keys.db'));
    db.pragma('wal_autocheckpoint = 0');
    return new idempo.SqliteStore({ database: db });
  }
  return null;
}

let n = 0;
const handler = (body) => ({ ok: true, n: ++n, amount: body?.amount ?? null });

if (framework === 'express') {
  const express = require('express');
  const app = express();
  const s = store();
  if (s) app.post('/payments', idempo.idempotency({ store: s, public: true }), (req, res) => res.json(handler(req.body)));
  else app.post('/payments', express.json(), (req, res) => res.json(handler(req.body)));
  app.listen(Number(port), '127.0.0.1', () => console.log('ready'));
} else {
  const fastify = require('fastify');
  const app = fastify();
  const s = store();
  if (s) await app.register(idempo.idempotencyPlugin, { store: s, public: true });
  app.post('/payments', async (req) => handler(req.body));
  await app.listen({ port: Number(port), host: '127.0.0.1' });
  console.log('ready');
}
