/**
 * Request-path metrics in the formats operators already scrape (`spec/METRICS.md`): adapters
 * that listen on an integration's {@link IdempotencyEvents} and record into prom-client or an
 * OpenTelemetry `Meter`.
 *
 * ```ts
 * const events = new IdempotencyEvents();
 * prometheusMetrics(events, { registry });          // or openTelemetryMetrics(events, meter)
 * app.use(idempotency({ store, events }));
 * ```
 *
 * Series: every answered request by route template and core's outcome, leases lost, takeovers,
 * store failures by primitive, and a histogram of store primitive latency. Labels are the route
 * template, the outcome and the primitive's name only (never a key, body or principal).
 */
import { ConfigError } from './errors';
import native = require('./native');
import type { IdempotencyEvents } from './server/session';

/** Histogram bounds (seconds) of `idempo_store_operation_duration_seconds`, from core (the same in every binding). */
export const STORE_LATENCY_BUCKETS: readonly number[] = Object.freeze(native.storeLatencyBuckets());

/** A prom-client `Registry` (typed structurally: the package's declarations do not need prom-client). */
export interface PrometheusRegistryLike {
  registerMetric(metric: unknown): void;
  getSingleMetric(name: string): unknown;
}

/** Options of {@link prometheusMetrics}. */
export interface PrometheusMetricsOptions {
  /** The registry to register into (default: prom-client's global `register`). */
  registry?: PrometheusRegistryLike;
  /** Name prefix (default `idempo`). */
  prefix?: string;
}

/** Detaches the adapter's listeners from the events. */
export type StopMetrics = () => void;

type Prom = typeof import('prom-client');

function loadProm(): Prom {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    return require('prom-client') as Prom;
  } catch {
    throw new ConfigError('prometheusMetrics needs prom-client: npm install prom-client');
  }
}

/**
 * Records the request-path series of `spec/METRICS.md` into prom-client collectors:
 * `idempo_requests_total{route,outcome}`, `idempo_lease_lost_total{route}`,
 * `idempo_takeovers_total{route}`, `idempo_store_errors_total{route,op}` and the histogram
 * `idempo_store_operation_duration_seconds{op}`. Returns a function that detaches it.
 */
export function prometheusMetrics(events: IdempotencyEvents, options: PrometheusMetricsOptions = {}): StopMetrics {
  const prom = loadProm();
  const registry = (options.registry ?? prom.register) as import('prom-client').Registry;
  const p = options.prefix ?? 'idempo';
  for (const name of ['requests_total', 'lease_lost_total', 'takeovers_total', 'store_errors_total', 'store_operation_duration_seconds']) {
    if (registry.getSingleMetric(`${p}_${name}`) !== undefined) {
      throw new ConfigError(`prometheusMetrics: ${p}_${name} is already registered in this registry; call prometheusMetrics once per registry and share its events`);
    }
  }
  const registers = [registry];
  const requests = new prom.Counter({ name: `${p}_requests_total`, help: "Requests idempo answered, by route template and core's outcome", labelNames: ['route', 'outcome'], registers });
  const leaseLost = new prom.Counter({ name: `${p}_lease_lost_total`, help: 'Handlers whose lease another request took over while they ran', labelNames: ['route'], registers });
  const takeovers = new prom.Counter({ name: `${p}_takeovers_total`, help: 'Requests that took over an expired lease and ran the handler again', labelNames: ['route'], registers });
  const storeErrors = new prom.Counter({ name: `${p}_store_errors_total`, help: 'Store primitives that failed (the request failed closed)', labelNames: ['route', 'op'], registers });
  const latency = new prom.Histogram({
    name: `${p}_store_operation_duration_seconds`,
    help: 'Duration of one store primitive, as the request saw it',
    labelNames: ['op'],
    buckets: [...STORE_LATENCY_BUCKETS],
    registers,
  });
  return listen(events, {
    outcome: (route, outcome) => requests.labels(route, outcome).inc(),
    leaseLost: (route) => leaseLost.labels(route).inc(),
    takeover: (route) => takeovers.labels(route).inc(),
    storeOp: (route, op, seconds, failed) => {
      latency.labels(op).observe(seconds);
      if (failed) storeErrors.labels(route, op).inc();
    },
  });
}

/** The parts of an OpenTelemetry `Meter` the adapter uses (structural: no dependency). */
export interface MeterLike {
  createCounter(name: string, options?: { description?: string; unit?: string }): { add(value: number, attributes?: Record<string, string>): void };
  createHistogram(name: string, options?: { description?: string; unit?: string }): { record(value: number, attributes?: Record<string, string>): void };
}

/**
 * Records the request-path series of `spec/METRICS.md` as OpenTelemetry instruments on `meter`
 * (`metrics.getMeter('idempo')` of `@opentelemetry/api`): counters `idempo.requests`
 * (`route`, `outcome`), `idempo.lease_lost`, `idempo.takeovers` (`route`), `idempo.store.errors`
 * (`route`, `op`) and the histogram `idempo.store.operation.duration` in seconds (`op`).
 * Returns a function that detaches it.
 */
export function openTelemetryMetrics(events: IdempotencyEvents, meter: MeterLike, options: { prefix?: string } = {}): StopMetrics {
  if (typeof meter?.createCounter !== 'function' || typeof meter?.createHistogram !== 'function') {
    throw new ConfigError("openTelemetryMetrics expects an OpenTelemetry Meter: pass metrics.getMeter('idempo') from @opentelemetry/api");
  }
  const p = options.prefix === '' ? '' : `${options.prefix ?? 'idempo'}.`;
  const requests = meter.createCounter(`${p}requests`, { unit: '{request}', description: 'Requests idempo answered' });
  const leaseLost = meter.createCounter(`${p}lease_lost`, { unit: '{handler}', description: 'Handlers whose lease was taken over' });
  const takeovers = meter.createCounter(`${p}takeovers`, { unit: '{request}', description: 'Takeovers of an expired lease' });
  const storeErrors = meter.createCounter(`${p}store.errors`, { unit: '{operation}', description: 'Store primitives that failed' });
  const latency = meter.createHistogram(`${p}store.operation.duration`, { unit: 's', description: 'Duration of one store primitive' });
  return listen(events, {
    outcome: (route, outcome) => requests.add(1, { route, outcome }),
    leaseLost: (route) => leaseLost.add(1, { route }),
    takeover: (route) => takeovers.add(1, { route }),
    storeOp: (route, op, seconds, failed) => {
      latency.record(seconds, { op });
      if (failed) storeErrors.add(1, { route, op });
    },
  });
}

interface Sink {
  outcome(route: string, outcome: string): void;
  leaseLost(route: string): void;
  takeover(route: string): void;
  storeOp(route: string, op: string, seconds: number, failed: boolean): void;
}

/** Attaches listeners that never throw into the request (a failing exporter changes no answer). */
function listen(events: IdempotencyEvents, sink: Sink): StopMetrics {
  const safe =
    <A extends unknown[]>(f: (...a: A) => void) =>
    (...a: A): void => {
      try {
        f(...a);
      } catch {
        // Metrics never change an answer.
      }
    };
  const onOutcome = safe((e: { route: string; outcome: string }) => sink.outcome(e.route, e.outcome));
  const onLost = safe((e: { route: string }) => sink.leaseLost(e.route));
  const onTakeover = safe((e: { route: string }) => sink.takeover(e.route));
  const onStoreOp = safe((e: { route: string; op: string; durationMs: number; failed: boolean }) => sink.storeOp(e.route, e.op, e.durationMs / 1000, e.failed));
  events.on('outcome', onOutcome);
  events.on('lease_lost', onLost);
  events.on('takeover', onTakeover);
  events.on('store_op', onStoreOp);
  return () => {
    events.off('outcome', onOutcome);
    events.off('lease_lost', onLost);
    events.off('takeover', onTakeover);
    events.off('store_op', onStoreOp);
  };
}
