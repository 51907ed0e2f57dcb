/**
 * The purge process's work, without its command line: one run over a store (batches, then the
 * store's figures) and the Prometheus metrics it exports (`spec/STORAGE.md` §4.7).
 */
import type { IdempotencyStore, PurgeCounts, StoreStats } from '../stores/types';

/** What one run did. */
export interface PurgeRunResult {
  purged: PurgeCounts;
  batches: number;
  seconds: number;
  stats: StoreStats | null;
}

/** Receives what a run observes (the metrics implement it). */
export interface PurgeObserver {
  batch(seconds: number, counts: PurgeCounts): void;
  stats(stats: StoreStats): void;
}

/** Options of {@link purgeRun}. */
export interface PurgeRunOptions {
  /** Records per batch (default 1000). */
  batch?: number;
  /** Batches per run at most (default 100). */
  maxBatches?: number;
  /** Checked between batches, never inside one: the run ends after the batch under way. */
  signal?: AbortSignal;
  observer?: PurgeObserver;
}

/** One run: batches until one comes back short, `maxBatches` ran or `signal` aborted; then stats. */
export async function purgeRun(store: IdempotencyStore, options: PurgeRunOptions = {}): Promise<PurgeRunResult> {
  const batch = options.batch ?? 1000;
  const maxBatches = options.maxBatches ?? 100;
  const started = performance.now();
  const purged: PurgeCounts = { inProgress: 0, completed: 0, outcomeUnknown: 0 };
  let batches = 0;
  while (batches < maxBatches && !options.signal?.aborted) {
    const t0 = performance.now();
    const c = await store.purgeExpired({ batch });
    batches++;
    purged.inProgress += c.inProgress;
    purged.completed += c.completed;
    purged.outcomeUnknown += c.outcomeUnknown;
    options.observer?.batch((performance.now() - t0) / 1000, c);
    if (c.inProgress + c.completed + c.outcomeUnknown < batch) break;
  }
  const stats = store.stats ? await store.stats() : null;
  if (stats) options.observer?.stats(stats);
  return { purged, batches, seconds: (performance.now() - started) / 1000, stats };
}

/** One line describing a run (the process logs it). */
export function describeRun(r: PurgeRunResult): string {
  const p = r.purged;
  let line = `purged ${p.inProgress + p.completed + p.outcomeUnknown} (in_progress ${p.inProgress}, completed ${p.completed}, outcome_unknown ${p.outcomeUnknown}) in ${r.batches} batch(es), ${r.seconds.toFixed(3)} s`;
  const s = r.stats;
  if (s) {
    const lag = s.purgeLagMs === null ? 'none' : `${(s.purgeLagMs / 1000).toFixed(1)} s`;
    const size = s.sizeBytes === null ? 'n/a' : `${s.sizeBytes} B`;
    line += `; records ${s.inProgress + s.completed + s.outcomeUnknown}, expired ${s.expired}, lag ${lag}, size ${size}`;
  }
  return line;
}

type PromClient = typeof import('prom-client');

/** The process's metrics in a registry of their own (prom-client). */
export class PurgeMetrics implements PurgeObserver {
  readonly registry: import('prom-client').Registry;
  readonly #records: import('prom-client').Gauge<'state'>;
  readonly #expired: import('prom-client').Gauge;
  readonly #lag: import('prom-client').Gauge;
  readonly #size: import('prom-client').Gauge;
  readonly #purged: import('prom-client').Counter<'state'>;
  readonly #batch: import('prom-client').Histogram;
  readonly lastSuccess: import('prom-client').Gauge;
  readonly runs: import('prom-client').Counter<'result'>;

  constructor(prom: PromClient) {
    const registers = [(this.registry = new prom.Registry())];
    this.#records = new prom.Gauge({ name: 'idempo_records', help: 'Records by state', labelNames: ['state'], registers });
    this.#expired = new prom.Gauge({ name: 'idempo_records_expired', help: 'Records past expires_at, not purged yet', registers });
    this.#lag = new prom.Gauge({ name: 'idempo_purge_lag_seconds', help: 'Age of the oldest expired record not purged yet (0 when none)', registers });
    this.#size = new prom.Gauge({ name: 'idempo_store_size_bytes', help: 'Table and indexes, or the database file', registers });
    this.#purged = new prom.Counter({ name: 'idempo_purged_records_total', help: 'Records deleted by this process', labelNames: ['state'], registers });
    this.#batch = new prom.Histogram({ name: 'idempo_purge_batch_duration_seconds', help: 'Duration of one purge batch', registers });
    this.lastSuccess = new prom.Gauge({ name: 'idempo_purge_last_success_timestamp_seconds', help: 'Unix time of the last run that ended without error', registers });
    this.runs = new prom.Counter({ name: 'idempo_purge_runs_total', help: 'Purge runs by result', labelNames: ['result'], registers });
    for (const state of ['in_progress', 'completed', 'outcome_unknown']) this.#purged.labels(state).inc(0);
    for (const result of ['ok', 'error']) this.runs.labels(result).inc(0);
  }

  batch(seconds: number, c: PurgeCounts): void {
    this.#batch.observe(seconds);
    this.#purged.labels('in_progress').inc(c.inProgress);
    this.#purged.labels('completed').inc(c.completed);
    this.#purged.labels('outcome_unknown').inc(c.outcomeUnknown);
  }

  stats(s: StoreStats): void {
    this.#records.labels('in_progress').set(s.inProgress);
    this.#records.labels('completed').set(s.completed);
    this.#records.labels('outcome_unknown').set(s.outcomeUnknown);
    this.#expired.set(s.expired);
    this.#lag.set((s.purgeLagMs ?? 0) / 1000);
    if (s.sizeBytes !== null) this.#size.set(s.sizeBytes);
  }
}
