#!/usr/bin/env node
/**
 * `npx idempo-purge`: deletes expired records beside your services and exports the figures.
 *
 *     npx idempo-purge --store-url postgresql://app@db/app --interval 60 --metrics-port 9464
 *
 * Every `--interval` seconds it deletes expired records in batches of `--batch` (at most
 * `--max-batches` per run), reads the store's figures and logs one line; with `--metrics-port` it
 * serves Prometheus metrics on `/metrics` (needs `prom-client`). Several replicas may run at once
 * on PostgreSQL (`FOR UPDATE SKIP LOCKED`). SIGTERM or SIGINT ends it after the batch under way
 * (exit 0); a configuration error exits 2 before anything runs; a failed run is logged, counted and
 * retried at the next interval (`--once`: exit 1). Options also come from `IDEMPO_STORE_URL`,
 * `IDEMPO_PURGE_INTERVAL_S`, `IDEMPO_PURGE_BATCH`, `IDEMPO_PURGE_MAX_BATCHES`,
 * `IDEMPO_METRICS_PORT`, `IDEMPO_METRICS_ADDR`. Store URLs: `sqlite:///absolute/path`,
 * `postgresql://...`, `redis://...`, `redis+cluster://node:port` (Redis expires records itself:
 * the process then only reports figures).
 */
import { existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';
import { ConfigError } from '../errors';
import type { IdempotencyStore } from '../stores/types';
import { describeRun, purgeRun, PurgeMetrics } from './run';

const USAGE = `usage: idempo-purge --store-url URL [--interval S] [--batch N] [--max-batches N] [--metrics-port P] [--metrics-addr A] [--once]`;

function log(line: string): void {
  process.stderr.write(`${new Date().toISOString()} idempo-purge ${line}\n`);
}

function number(name: string, flag: string | undefined, env: string, fallback: number | undefined, integer: boolean): number | undefined {
  const raw = flag ?? process.env[env];
  if (raw === undefined || raw === '') return fallback;
  const v = Number(raw);
  if (!Number.isFinite(v) || (integer && !Number.isInteger(v))) throw new ConfigError(`${name} ${JSON.stringify(raw)} is not a ${integer ? 'whole ' : ''}number`);
  return v;
}

/** A store for `url` (see the module docs for the schemes). */
export function storeFromUrl(url: string): IdempotencyStore {
  /* eslint-disable @typescript-eslint/no-require-imports */
  if (!url) throw new ConfigError('no store: pass --store-url or set IDEMPO_STORE_URL');
  if (url.startsWith('sqlite://')) {
    const filename = url.slice('sqlite://'.length);
    if (!filename) throw new ConfigError('a sqlite URL needs a path: sqlite:///var/lib/app/idempo.sqlite3');
    // A wrong path would silently create an empty database: the file and its table must exist.
    if (!existsSync(filename)) throw new ConfigError(`no SQLite database at ${JSON.stringify(filename)} (is this the service's file?)`);
    const { SqliteStore } = require('../stores/sqlite') as typeof import('../stores/sqlite');
    try {
      return new SqliteStore({ filename, createSchema: false });
    } catch (e) {
      if (/no such table/.test((e as Error).message)) {
        throw new ConfigError(`${JSON.stringify(filename)} has no idempo_record table (is this the service's file?)`);
      }
      throw e;
    }
  }
  if (url.startsWith('postgresql://') || url.startsWith('postgres://')) {
    const { PostgresStore } = require('../stores/postgres') as typeof import('../stores/postgres');
    return new PostgresStore({ connectionString: url });
  }
  if (url.startsWith('redis+cluster://')) {
    const { RedisStore } = require('../stores/redis') as typeof import('../stores/redis');
    return new RedisStore({ url: `redis://${url.slice('redis+cluster://'.length)}`, cluster: true });
  }
  if (url.startsWith('redis://') || url.startsWith('rediss://')) {
    const { RedisStore } = require('../stores/redis') as typeof import('../stores/redis');
    return new RedisStore({ url });
  }
  throw new ConfigError(`unknown store URL scheme ${JSON.stringify(url.split(':')[0])}: use sqlite://, postgresql://, redis:// or redis+cluster://`);
}

async function main(): Promise<number> {
  let store: IdempotencyStore;
  let interval: number;
  let batch: number;
  let maxBatches: number;
  let port: number | undefined;
  let metrics: PurgeMetrics | undefined;
  let once: boolean;
  let addr: string;
  try {
    const { values } = parseArgs({
      options: {
        'store-url': { type: 'string' },
        interval: { type: 'string' },
        batch: { type: 'string' },
        'max-batches': { type: 'string' },
        'metrics-port': { type: 'string' },
        'metrics-addr': { type: 'string' },
        once: { type: 'boolean' },
        help: { type: 'boolean' },
      },
    });
    if (values.help) {
      process.stdout.write(`${USAGE}\n`);
      return 0;
    }
    interval = number('--interval', values.interval, 'IDEMPO_PURGE_INTERVAL_S', 60, false) as number;
    batch = number('--batch', values.batch, 'IDEMPO_PURGE_BATCH', 1000, true) as number;
    maxBatches = number('--max-batches', values['max-batches'], 'IDEMPO_PURGE_MAX_BATCHES', 100, true) as number;
    port = number('--metrics-port', values['metrics-port'], 'IDEMPO_METRICS_PORT', undefined, true);
    addr = values['metrics-addr'] ?? process.env.IDEMPO_METRICS_ADDR ?? '0.0.0.0';
    once = values.once === true;
    if (!(interval > 0)) throw new ConfigError(`--interval must be positive, got ${interval}`);
    if (batch < 1 || maxBatches < 1) throw new ConfigError('--batch and --max-batches must be at least 1');
    if (port !== undefined && !(port > 0 && port < 65536)) throw new ConfigError(`--metrics-port must be 1..65535, got ${port}`);
    if (port !== undefined) {
      let prom: typeof import('prom-client');
      try {
        // eslint-disable-next-line @typescript-eslint/no-require-imports
        prom = require('prom-client') as typeof import('prom-client');
      } catch {
        throw new ConfigError('--metrics-port needs prom-client: npm install prom-client');
      }
      metrics = new PurgeMetrics(prom);
    }
    store = storeFromUrl(values['store-url'] ?? process.env.IDEMPO_STORE_URL ?? '');
  } catch (e) {
    process.stderr.write(`idempo-purge: configuration error: ${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }

  const stop = new AbortController();
  let wake: (() => void) | undefined;
  for (const sig of ['SIGTERM', 'SIGINT'] as const) {
    process.on(sig, () => {
      log(`${sig}: stopping after the batch under way`);
      stop.abort();
      wake?.();
    });
  }
  const server = metrics
    ? createServer((req, res) => {
        if (req.url !== '/metrics') {
          res.statusCode = 404;
          res.end();
          return;
        }
        metrics!.registry.metrics().then(
          (text) => {
            res.setHeader('content-type', metrics!.registry.contentType);
            res.end(text);
          },
          (e: unknown) => {
            res.statusCode = 500;
            res.end(String(e));
          },
        );
      })
    : undefined;
  if (server && port !== undefined) {
    await new Promise<void>((resolve) => server.listen(port, addr, resolve));
    log(`metrics on http://${addr}:${port}/metrics`);
  }
  log(`purging every ${interval} s, batches of ${batch}`);
  let status = 0;
  try {
    while (!stop.signal.aborted) {
      try {
        const r = await purgeRun(store, { batch, maxBatches, signal: stop.signal, ...(metrics ? { observer: metrics } : {}) });
        log(`run ok: ${describeRun(r)}`);
        metrics?.runs.labels('ok').inc();
        metrics?.lastSuccess.set(Date.now() / 1000);
        if (once) break;
      } catch (e) {
        log(`run failed: ${(e as Error).message}`);
        metrics?.runs.labels('error').inc();
        if (once) {
          status = 1;
          break;
        }
      }
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, interval * 1000);
        wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
  } finally {
    await store.close().catch(() => undefined);
    server?.close();
  }
  log('stopped');
  return status;
}

if (require.main === module) {
  main().then(
    (code) => process.exit(code),
    (e: unknown) => {
      process.stderr.write(`idempo-purge: ${(e as Error).stack ?? String(e)}\n`);
      process.exit(1);
    },
  );
}
