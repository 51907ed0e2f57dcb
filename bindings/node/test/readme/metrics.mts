// The README's metrics example (test/types.test.mjs checks it is the README's text and compiles).
// ---- README ----
import express from 'express';
import { Registry } from 'prom-client';
import { IdempotencyEvents, idempotency, prometheusMetrics, SqliteStore } from 'idempo';

const registry = new Registry();
const events = new IdempotencyEvents();
prometheusMetrics(events, { registry }); // returns a function that detaches it
const app = express();
app.post('/payments', idempotency({ store: new SqliteStore({ filename: 'idempo.sqlite3' }), events }), (_req, res) => {
  res.status(201).json({ ok: true });
});
app.get('/metrics', async (_req, res) => {
  res.type(registry.contentType).send(await registry.metrics());
});
