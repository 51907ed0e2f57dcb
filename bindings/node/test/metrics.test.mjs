// Request-path metrics (spec/METRICS.md): prometheusMetrics and openTelemetryMetrics count what
// really happened to requests through the Express middleware on a real local server, with the
// names and labels of spec/vectors/metrics/request.json (prom-client scraped as text; the
// OpenTelemetry SDK read through its in-memory reader).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { idempo, vectorsDir } from './helpers.mjs';

const require = createRequire(import.meta.url);
const express = require('express');
const prom = require('prom-client');
const Database = require('better-sqlite3');
const { MeterProvider, MetricReader, AggregationTemporality } = require('@opentelemetry/sdk-metrics');

const VECTORS = JSON.parse(fs.readFileSync(path.join(vectorsDir, 'metrics', 'request.json'), 'utf8'));
const nameOf = (adapter, id) => VECTORS.metrics.find((m) => m.id === id)[adapter];
const ROUTE = '/payments/:id';

const dirs = [];
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** prom-client: a fresh registry, read back from its text exposition. */
function promReader() {
  const registry = new prom.Registry();
  return {
    adapter: 'prometheus',
    attach: (events) => idempo.prometheusMetrics(events, { registry }),
    async read() {
      const out = new Map();
      const text = await registry.metrics();
      for (const line of text.split('\n')) {
        const m = /^([a-z_]+)(?:\{([^}]*)\})? ([0-9.e+-]+)$/.exec(line);
        if (!m) continue;
        let [, name, labels = '', value] = m;
        if (name.endsWith('_bucket') || name.endsWith('_sum')) continue;
        if (name.endsWith('_count')) name = name.slice(0, -'_count'.length);
        const l = Object.fromEntries([...labels.matchAll(/([a-z_]+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
        if (!out.has(name)) out.set(name, []);
        out.get(name).push({ labels: l, value: Number(value) });
      }
      return out;
    },
  };
}

class Collect extends MetricReader {
  constructor() {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE });
  }
  onForceFlush() {
    return Promise.resolve();
  }
  onShutdown() {
    return Promise.resolve();
  }
}

/** The OpenTelemetry SDK: a MeterProvider with a reader collected on demand. */
function otelReader() {
  const reader = new Collect();
  const provider = new MeterProvider({ readers: [reader] });
  return {
    adapter: 'opentelemetry',
    attach: (events) => idempo.openTelemetryMetrics(events, provider.getMeter('idempo-test')),
    async read() {
      const out = new Map();
      const { resourceMetrics } = await reader.collect();
      for (const sm of resourceMetrics.scopeMetrics) {
        for (const metric of sm.metrics) {
          const points = metric.dataPoints.map((p) => ({
            labels: p.attributes,
            value: typeof p.value === 'number' ? p.value : p.value.count,
          }));
          out.set(metric.descriptor.name, points);
        }
      }
      return out;
    },
  };
}

const READERS = [promReader, otelReader];

async function value(reader, metric, labels = {}) {
  const points = (await reader.read()).get(metric) ?? [];
  return points.filter((p) => Object.entries(labels).every(([k, v]) => p.labels[k] === v)).reduce((a, p) => a + p.value, 0);
}

async function start(opts) {
  const state = { runs: 0, firstDelay: 0, delay: 0 };
  const app = express();
  app.post(ROUTE, idempotencyWith(opts), async (req, res) => {
    state.runs++;
    const wait = state.runs === 1 ? state.firstDelay : state.delay;
    if (wait) await new Promise((r) => setTimeout(r, wait));
    res.status(201).json({ run: state.runs });
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    state,
    post: (key, body) => fetch(`${url}/payments/7`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: JSON.stringify(body) }),
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  };
}

function idempotencyWith(opts) {
  return idempo.idempotency(opts);
}

for (const make of READERS) {
  test(`${make().adapter}: outcomes by route template and store latency by primitive`, async () => {
    const reader = make();
    const events = new idempo.IdempotencyEvents();
    const stop = reader.attach(events);
    const srv = await start({ store: new idempo.MemoryStore(), events });
    try {
      assert.equal((await srv.post('key-metrics-1', { a: 1 })).status, 201);
      assert.equal((await srv.post('key-metrics-1', { a: 1 })).status, 201); // replay
      assert.equal((await srv.post('key-metrics-1', { a: 2 })).status, 422);
      srv.state.delay = 300;
      const slow = srv.post('key-metrics-2', { a: 1 });
      await new Promise((r) => setTimeout(r, 100));
      assert.equal((await srv.post('key-metrics-2', { a: 1 })).status, 409);
      assert.equal((await slow).status, 201);
    } finally {
      await srv.close();
    }
    const requests = nameOf(reader.adapter, 'requests');
    assert.equal(await value(reader, requests, { route: ROUTE, outcome: 'stored' }), 2);
    assert.equal(await value(reader, requests, { route: ROUTE, outcome: 'replayed' }), 1);
    assert.equal(await value(reader, requests, { route: ROUTE, outcome: 'mismatch' }), 1);
    assert.equal(await value(reader, requests, { route: ROUTE, outcome: 'in_flight' }), 1);
    assert.equal(await value(reader, requests, { route: '/payments/7' }), 0, 'the concrete path is never a label');
    const latency = nameOf(reader.adapter, 'store_latency');
    assert.equal(await value(reader, latency, { op: 'complete' }), 2);
    assert.ok((await value(reader, latency)) >= 5);
    assert.equal(srv.state.runs, 2);
    stop();
  });

  test(`${make().adapter}: a takeover and the lease it took are counted once each`, async () => {
    const reader = make();
    const events = new idempo.IdempotencyEvents();
    reader.attach(events);
    const srv = await start({ store: new idempo.MemoryStore(), events, leaseMs: 1000, heartbeatMs: 0, takeover: 're_run' });
    try {
      srv.state.firstDelay = 1600;
      const first = srv.post('key-metrics-3', { a: 1 });
      await new Promise((r) => setTimeout(r, 1200)); // the first lease expired (no heartbeat)
      assert.equal((await srv.post('key-metrics-3', { a: 1 })).status, 201);
      await first;
    } finally {
      await srv.close();
    }
    assert.equal(await value(reader, nameOf(reader.adapter, 'takeovers'), { route: ROUTE }), 1);
    assert.equal(await value(reader, nameOf(reader.adapter, 'lease_lost'), { route: ROUTE }), 1);
    assert.equal(await value(reader, nameOf(reader.adapter, 'requests'), { outcome: 'lease_lost' }), 1);
  });

  test(`${make().adapter}: a store failure is counted by primitive, and the request fails closed`, async () => {
    const reader = make();
    const events = new idempo.IdempotencyEvents();
    reader.attach(events);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-metrics-'));
    dirs.push(dir);
    const filename = path.join(dir, 'db.sqlite3');
    const store = new idempo.SqliteStore({ filename, busyTimeoutMs: 200 });
    const srv = await start({ store, events });
    try {
      assert.equal((await srv.post('key-metrics-4', { a: 1 })).status, 201);
      const locker = new Database(filename);
      locker.exec('BEGIN IMMEDIATE');
      let r;
      try {
        r = await srv.post('key-metrics-5', { a: 1 });
      } finally {
        locker.exec('ROLLBACK');
        locker.close();
      }
      assert.equal(r.status, 503);
    } finally {
      await srv.close();
      store.close();
    }
    assert.equal(await value(reader, nameOf(reader.adapter, 'store_errors'), { route: ROUTE, op: 'claim' }), 1);
    assert.equal(await value(reader, nameOf(reader.adapter, 'requests'), { outcome: 'store_unavailable' }), 1);
  });

  test(`${make().adapter}: the exported series are spec/vectors/metrics/request.json's`, async () => {
    const reader = make();
    const events = new idempo.IdempotencyEvents();
    reader.attach(events);
    events.emit('outcome', { outcome: 'stored', route: '/r', method: 'POST', status: 201, durationMs: 1 });
    events.emit('lease_lost', { route: '/r' });
    events.emit('takeover', { route: '/r' });
    events.emit('store_op', { route: '/r', op: 'claim', durationMs: 1, failed: true });
    const names = [...(await reader.read()).keys()].sort();
    assert.deepEqual(names, VECTORS.metrics.map((m) => m[reader.adapter]).sort());
  });
}

test('prometheusMetrics refuses a second registration in one registry; openTelemetryMetrics refuses a non-meter', () => {
  const registry = new prom.Registry();
  idempo.prometheusMetrics(new idempo.IdempotencyEvents(), { registry });
  assert.throws(() => idempo.prometheusMetrics(new idempo.IdempotencyEvents(), { registry }), (e) => e instanceof idempo.ConfigError && /already registered/.test(e.message));
  assert.throws(() => idempo.openTelemetryMetrics(new idempo.IdempotencyEvents(), {}), (e) => e instanceof idempo.ConfigError && /getMeter/.test(e.message));
});

test('the latency histogram bounds are core\'s and the vector\'s', () => {
  const spec = VECTORS.metrics.find((m) => m.id === 'store_latency');
  assert.deepEqual([...idempo.STORE_LATENCY_BUCKETS], spec.buckets);
  assert.ok(Object.isFrozen(idempo.STORE_LATENCY_BUCKETS));
});
