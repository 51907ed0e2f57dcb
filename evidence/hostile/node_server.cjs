// The Node service under hostile input: Express + idempo's middleware on a SQLite store.
// Usage: node node_server.cjs <port> <store.sqlite3> <effects.sqlite3>
// Prints "ready <pid>" when listening (127.0.0.1 only). Every handler execution inserts a row
// into its own `effects` table; the response header x-ev-body-read reports how many request
// body bytes the server had received when it answered (for the 413 bound).
'use strict';
const path = require('node:path');
const { createRequire } = require('node:module');

const nodeDir = path.resolve(__dirname, '..', '..', 'bindings', 'node');
const req = createRequire(path.join(nodeDir, 'package.json'));
const express = req('express');
const Database = req('better-sqlite3');
const idempo = req('./dist/index.js');

const [port, storePath, effectsPath] = process.argv.slice(2);
const effects = new Database(effectsPath);
effects.pragma('journal_mode = WAL');
effects.pragma('busy_timeout = 30000');
effects.exec(
  'CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT, key TEXT, ' +
    'generation INTEGER, downstream_key TEXT, tag TEXT, pid INTEGER, at_ms INTEGER)',
);
const insert = effects.prepare(
  'INSERT INTO effects (route, key, generation, downstream_key, tag, pid, at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)',
);

const store = new idempo.SqliteStore({ filename: storePath, busyTimeoutMs: 500 });
const app = express();

// Counts body bytes as they arrive and reports the count in a header when the answer starts.
app.use((request, response, next) => {
  let read = 0;
  request.on('data', (c) => {
    read += c.length;
  });
  const writeHead = response.writeHead;
  response.writeHead = function patched(...args) {
    if (!response.headersSent) response.setHeader('x-ev-body-read', String(read));
    return writeHead.apply(this, args);
  };
  next();
});

app.get('/health', (_q, s) => s.json({ pid: process.pid }));

const guard = idempo.idempotency({
  store,
  takeover: 'outcome_unknown',
  leaseMs: 1000,
  maxRequestBodyBytes: 1024 * 1024,
  scope: (r) => String(r.headers['x-tenant'] || ''),
  emptyScopeIsAnonymous: true, // requests without X-Tenant share the anonymous namespace
});

app.post('/pay/ou', guard, (request, response) => {
  const ex = request.idempotency;
  const tag = request.body && typeof request.body === 'object' ? String(request.body.tag || '') : '';
  const info = insert.run('ou', String(request.headers['idempotency-key'] || ''), ex.generation, ex.downstreamKey, tag,
    process.pid, Date.now());
  response.status(201).json({ effect: Number(info.lastInsertRowid), tag, generation: ex.generation, pid: process.pid });
});
app.use(idempo.idempotencyErrorHandler());

const server = app.listen(Number(port), '127.0.0.1', () => {
  process.stdout.write(`ready ${process.pid}\n`);
});
server.requestTimeout = 60000;
process.on('SIGTERM', () => server.close(() => process.exit(0)));
