/** Options shared by the Express middleware and the Fastify plugin, and the request admission. */
import native = require('../native');
import { CanonicalizationError, fromNative, TransactionalUnsupportedError } from '../errors';
import { Fingerprinter } from '../fingerprint';
import type { NumberMode } from '../core';
import type { IdempotencyStore } from '../stores/types';
import { supportsTransactions } from '../stores/types';
import { IdempotencyEvents, Session, toHttp } from './session';
import type { HttpResponse } from './session';

/** Options of `idempotency()` (Express) and `idempotencyPlugin` (Fastify). */
export interface IdempotencyOptions<Req = unknown> {
  /** The record store (e.g. `new SqliteStore()` or a `PostgresStore`). */
  store: IdempotencyStore;
  /** Refuse requests without a key with 400 (default true); false runs them unprotected. */
  required?: boolean;
  /** Request header carrying the key (default `Idempotency-Key`). */
  headerName?: string;
  /** HTTP methods protected (default `['POST', 'PATCH']`); other methods pass through. */
  methods?: string[];
  /** Key syntax: lengths and strict sf-string mode. */
  key?: { minLen?: number; maxLen?: number; strict?: boolean };
  /** The principal (user, tenant, API client) a key belongs to; default `''` (shared). */
  scope?: (req: Req) => string | Promise<string>;
  /** The route template (e.g. `/payments/:id`); default the framework's matched route. */
  route?: (req: Req) => string;
  /** Request headers that take part in the fingerprint. */
  fingerprintHeaders?: string[];
  /** JSON Pointers left out of the fingerprint (e.g. `/client_timestamp`). */
  exclude?: string[];
  /** HMAC key for `h1:` fingerprints. */
  hmacKey?: Uint8Array | string;
  /** Number handling for the fingerprint (default `reject_precision_loss`). */
  numbers?: NumberMode;
  /** Record retention in ms (default 24 h). */
  ttlMs?: number;
  /** Lease in ms (default 30 s). */
  leaseMs?: number;
  /**
   * How long in ms the background cleanup of a claim whose answer was lost (a store that froze
   * and applied it later) keeps retrying its token-fenced release (default 30000; the effective
   * budget is the larger of this and the lease).
   */
  cleanupBudgetMs?: number;
  /** Heartbeat in ms (default a third of the lease); `null` disables. */
  heartbeatMs?: number | null;
  /** Expired lease: answer outcome-unknown (`outcome_unknown`, core's default: at most one run) or re-run (`re_run`). */
  takeover?: 're_run' | 'outcome_unknown';
  /** Store 5xx responses (except 503) like Stripe (default false: release the key). */
  storeServerErrors?: boolean;
  /** Statuses never stored (default 401, 403, 407, 408, 409, 425, 429: the request never ran). */
  transientStatuses?: number[];
  /** Response headers stored and replayed (default core's allowlist). */
  replayHeaders?: string[];
  /** Largest response body stored for replays (default 1 MiB). */
  maxStoredBodyBytes?: number;
  /** Largest request body accepted, bytes (default 1 MiB; larger: 413 problem). */
  bodyLimit?: number;
  /** Redaction hook: the body to store instead of the live one. */
  redact?: (res: HttpResponse) => Buffer | undefined;
  /** True when a handler error certainly had no side effect (default: errors with `noSideEffect: true`). */
  isSideEffectFree?: (err: unknown) => boolean;
  /** `Retry-After` for 409 in ms (default 1000). */
  inFlightRetryAfterMs?: number;
  /** `Retry-After` for 503 in ms (default 1000). */
  unavailableRetryAfterMs?: number;
  /**
   * A store call slower than this fails (fail closed, 503). Default: the store's own call bound
   * (`store.callTimeoutMs`) plus 250 ms when it declares one, so the store's own error ends a
   * call and nothing it gave up on applies later; else 5000 ms.
   */
  storeTimeoutMs?: number;
  /** Event emitter for metrics (one is created when omitted). */
  events?: IdempotencyEvents;
  /**
   * Transactional mode (`spec/STORAGE.md` §4.4): the claim, the handler's writes (through
   * `req.idempotency.tx` or `currentTransaction()`) and the completion commit in one database
   * transaction, and the response is sent after the commit. A handler error, or a response the
   * policy does not store, rolls everything back. Needs `PostgresStore` or `SqliteStore`
   * (`TransactionalUnsupportedError` otherwise); heartbeats are off (the claim is invisible to
   * others until it commits).
   */
  transactional?: boolean;
}

/** The prepared configuration of one integration. */
export class Prepared<Req> {
  readonly o: IdempotencyOptions<Req>;
  readonly config: native.FlowConfig;
  readonly fingerprinter: Fingerprinter;
  readonly events: IdempotencyEvents;
  readonly header: string;
  readonly methods: Set<string>;
  readonly bodyLimit: number;
  readonly keyOptions: native.ParseKeyOptions;

  constructor(o: IdempotencyOptions<Req>) {
    if (!o || !o.store) throw new TypeError('idempotency: the `store` option is required');
    this.o = o;
    const c: native.FlowConfigOptions = { keyRequired: o.required !== false };
    if (o.takeover) c.takeover = o.takeover;
    if (o.leaseMs !== undefined) c.leaseMs = o.leaseMs;
    if (o.cleanupBudgetMs !== undefined) c.cleanupBudgetMs = o.cleanupBudgetMs;
    if (o.heartbeatMs === null) c.noHeartbeat = true;
    else if (o.heartbeatMs !== undefined) c.heartbeatMs = o.heartbeatMs;
    if (o.ttlMs !== undefined) c.ttlMs = o.ttlMs;
    if (o.transientStatuses) c.transientStatuses = o.transientStatuses;
    if (o.storeServerErrors !== undefined) c.storeServerErrors = o.storeServerErrors;
    if (o.maxStoredBodyBytes !== undefined) c.maxBodyBytes = o.maxStoredBodyBytes;
    if (o.replayHeaders) c.storedHeaders = o.replayHeaders;
    if (o.redact) c.redactionHook = true;
    if (o.inFlightRetryAfterMs !== undefined) c.inFlightRetryAfterMs = o.inFlightRetryAfterMs;
    if (o.unavailableRetryAfterMs !== undefined) c.unavailableRetryAfterMs = o.unavailableRetryAfterMs;
    if (o.transactional) {
      if (!supportsTransactions(o.store)) {
        throw new TransactionalUnsupportedError(
          `transactional: true needs a store that runs the handler in its transaction (PostgresStore or SqliteStore), not ${o.store.kind}`,
        );
      }
      // Core's transactional flow: no heartbeat, rollback on errors, commit, response after it.
      c.transactional = true;
    }
    try {
      this.config = new native.FlowConfig(c);
    } catch (e) {
      throw fromNative(e);
    }
    const fo: ConstructorParameters<typeof Fingerprinter>[0] = {};
    if (o.fingerprintHeaders) fo.headers = o.fingerprintHeaders;
    if (o.exclude) fo.exclude = o.exclude;
    if (o.hmacKey !== undefined) fo.hmacKey = o.hmacKey;
    if (o.numbers) fo.numbers = o.numbers;
    this.fingerprinter = new Fingerprinter(fo);
    this.events = o.events ?? new IdempotencyEvents();
    this.header = (o.headerName ?? 'idempotency-key').toLowerCase();
    this.methods = new Set((o.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
    this.bodyLimit = o.bodyLimit ?? 1024 * 1024;
    this.keyOptions = o.key ?? {};
  }

  problem(kind: string, detail?: string, reason?: string, retryAfterMs?: number): HttpResponse {
    return toHttp(native.problemResponse(kind, detail ?? null, reason ?? null, retryAfterMs ?? null));
  }

  #warnedScope = false;

  /** The principal of a request; warns once when requests carry a user but no scope is set. */
  async principal(req: Req & { user?: unknown }): Promise<string> {
    if (this.o.scope) return this.o.scope(req);
    if (!this.#warnedScope && req.user !== undefined && req.user !== null) {
      this.#warnedScope = true;
      this.events.emit('warning', {
        message: 'requests carry req.user but no `scope` option is set: keys are shared by every user; pass scope: (req) => req.user.id',
      });
    }
    return '';
  }

  /** Core's problem for a JSON body the fingerprint refuses (null: the body is acceptable). */
  bodyProblem(body: Buffer): native.BodyProblem | null {
    const o: native.BodyCheckOptions = {};
    if (this.o.numbers) o.numbers = this.o.numbers;
    if (this.o.exclude) o.exclude = this.o.exclude;
    try {
      return native.bodyProblem(body, o);
    } catch (e) {
      throw fromNative(e);
    }
  }

  isSideEffectFree(err: unknown): boolean {
    if (this.o.isSideEffectFree) return this.o.isSideEffectFree(err);
    return typeof err === 'object' && err !== null && (err as { noSideEffect?: unknown }).noSideEffect === true;
  }
}

/** The request parts admission needs. */
export interface RequestFacts {
  method: string;
  /** The route template: names the scope (spec/KEYS.md §2). */
  route: string;
  /** The request target as received (raw path and query): fingerprinted (spec/CANONICAL.md §2.1),
   * so one key sent to two resources under one template is a mismatch, never a replay. */
  target: string;
  principal: string;
  /** Raw header values of the key header (Node gives them as latin1 strings). */
  keyHeader: string | string[] | undefined;
  contentType: string | undefined;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

/** Admission result: a session to run, an answer to send now, or "not protected". */
export type Admitted =
  | { kind: 'session'; session: Session; key: string }
  | { kind: 'respond'; response: HttpResponse; outcome: string }
  | { kind: 'unprotected' };

/** Parses the key, fingerprints the body and builds the session (no store call yet). */
export function admitRequest<Req>(p: Prepared<Req>, f: RequestFacts): Admitted {
  const raw = f.keyHeader;
  if (raw === undefined || (Array.isArray(raw) && raw.length === 0)) {
    const r = p.config.missingKeyResponse();
    return r ? { kind: 'respond', response: toHttp(r), outcome: 'missing_key' } : { kind: 'unprotected' };
  }
  // Several Idempotency-Key fields are joined with ", ", which core then rejects as invalid.
  const value = Array.isArray(raw) ? raw.join(', ') : raw;
  const k = native.admitKey(Buffer.from(value, 'latin1'), p.keyOptions);
  if (k.key === undefined) return { kind: 'respond', response: toHttp(k.response as native.HttpResponseData), outcome: 'invalid_key' };
  if (f.body.length > p.bodyLimit) {
    return { kind: 'respond', response: p.problem('body_too_large'), outcome: 'body_too_large' };
  }
  let fingerprint: string;
  try {
    fingerprint = p.fingerprinter.fingerprint({
      method: f.method,
      route: f.target,
      body: f.body,
      headers: f.headers,
      contentType: f.contentType ?? null,
    });
  } catch (e) {
    if (e instanceof CanonicalizationError) {
      // Core maps the refused body to its problem (400 invalid_body or 413), never this binding.
      const bp = p.bodyProblem(f.body);
      if (bp) return { kind: 'respond', response: toHttp(bp.response), outcome: bp.outcome };
    }
    throw e;
  }
  const scope = native.scopeId(f.principal, f.method, f.route, k.key);
  const tx = p.o.transactional && supportsTransactions(p.o.store) ? p.o.store.transaction() : undefined;
  const session = new Session({
    store: p.o.store,
    config: p.config,
    scope,
    fingerprint,
    // A transactional session bounds every step itself (statement deadlines, the lock wait): an
    // outer timeout would answer while the step still runs on the transaction's connection.
    storeTimeoutMs: tx ? 0 : (p.o.storeTimeoutMs ?? defaultStoreTimeoutMs(p.o.store)),
    events: p.events,
    route: f.route,
    ...(tx ? { tx } : {}),
    // A store with per-partition quotas (the memory store) gets the principal's partition.
    ...(p.o.store.partitioned === true ? { partition: native.memoryPartition(f.principal) } : {}),
  });
  return { kind: 'session', session, key: k.key };
}

/** Headroom over a store's own call bound before the host gives up on a call, ms. */
const STORE_BOUND_HEADROOM_MS = 250;

/** The default `storeTimeoutMs`: the store's own call bound plus headroom, else 5000 ms. */
export function defaultStoreTimeoutMs(store: IdempotencyStore): number {
  const own = store.callTimeoutMs;
  return own !== undefined && Number.isFinite(own) && own >= 0 ? own + STORE_BOUND_HEADROOM_MS : 5000;
}
