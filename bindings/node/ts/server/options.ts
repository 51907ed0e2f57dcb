/** Options shared by the Express middleware and the Fastify plugin, and the request admission. */
import native = require('../native');
import { defaultOf } from '../defaults';
import { ConfigError, fromNative, TransactionalUnsupportedError } from '../errors';
import { Fingerprinter, flatHeaders } from '../fingerprint';
import type { NumberMode } from '../core';
import type { IdempotencyStore } from '../stores/types';
import { supportsTransactions } from '../stores/types';
import { admitInMemory, gateStep, IdempotencyEvents, Session, toHttp } from './session';
import { memoryInline } from '../stores/memory';
import type { GateAdmitted, HttpResponse, SessionOptions } from './session';
import type { MemoryInline } from '../stores/memory';

/**
 * Core's `Config` options, in camelCase (core's flat option set, `spec/PROTOCOL.md`). Every omitted
 * option takes core's default (`Config::default()`, read through the native addon; none is copied
 * here).
 */
export interface ConfigOptions {
  /** Lease in ms (core's default 30 s, at least 1000). */
  leaseMs?: number;
  /** Heartbeat in ms, below the lease; `0` disables; default a third of the lease. */
  heartbeatMs?: number;
  /** Expired lease: answer outcome-unknown (`outcome_unknown`, core's default: at most one run) or re-run (`re_run`). */
  takeover?: 're_run' | 'outcome_unknown';
  /** Record retention in ms (default 24 h). */
  ttlMs?: number;
  /** Refuse requests without a key with 400 (default true); false runs them unprotected. */
  keyRequired?: boolean;
  /** Shortest key accepted, characters (default 8). */
  keyMinLen?: number;
  /** Longest key accepted, characters (default 128, at most 255). */
  keyMaxLen?: number;
  /** Accept only the draft sf-string key form (default false). */
  keyStrict?: boolean;
  /** Statuses never stored (default 401, 403, 407, 408, 409, 425, 429: the request never ran). */
  transientStatuses?: number[];
  /** Store 5xx responses (except 503) like Stripe (default false: release the key). */
  storeServerErrors?: boolean;
  /** Largest response body stored for replays (default 1 MiB). */
  maxStoredBodyBytes?: number;
  /** Response headers stored and replayed (default core's allowlist). */
  storedHeaders?: string[];
  /** `Retry-After` for 409 in ms (default 1000). */
  inFlightRetryAfterMs?: number;
  /** `Retry-After` for 503 in ms (default 1000). */
  unavailableRetryAfterMs?: number;
  /** Store rounds before 503 contention (default 3). */
  maxStoreRounds?: number;
  /**
   * How long in ms the background cleanup of a claim whose answer was lost (a store that froze
   * and applied it later) keeps retrying its token-fenced release (default 30000; the effective
   * budget is the larger of this and the lease).
   */
  cleanupBudgetMs?: number;
  /** Largest request body accepted, bytes (default 1 MiB; larger: 413 problem). */
  maxRequestBodyBytes?: number;
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

/** Options of `idempotency()` (Express) and `idempotencyPlugin` (Fastify): core's `Config`
 * options plus the host's own. An unknown or renamed option throws `ConfigError`. */
export interface IdempotencyOptions<Req = unknown> extends ConfigOptions {
  /** The record store (e.g. `new SqliteStore()` or a `PostgresStore`). */
  store: IdempotencyStore;
  /** Request header carrying the key (default `Idempotency-Key`). */
  headerName?: string;
  /** HTTP methods protected (default `['POST', 'PATCH']`); other methods pass through. */
  methods?: string[];
  /**
   * The principal (user, tenant, API client) a key belongs to. It runs before the handler: it
   * must read what exists then (`req.user` set by an earlier middleware, a header, a token). One
   * that returns `undefined`, `null`, `''` (unless `emptyScopeIsAnonymous`), a non-string, or
   * throws refuses the request with 500 `scope-unresolved` (the `scope_unresolved` event carries
   * the log line); the handler does not run.
   */
  scope?: (req: Req) => unknown;
  /** The route's keys are shared by every caller (no principal, no warning). Not with `scope`. */
  public?: boolean;
  /** An empty string from `scope` is the anonymous principal instead of a refusal. */
  emptyScopeIsAnonymous?: boolean;
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
  /** Redaction hook: the body to store instead of the live one (sets core's `redact`). */
  redact?: (res: HttpResponse) => Buffer | undefined;
  /** True when a handler error certainly had no side effect (default: errors with `noSideEffect: true`). */
  isSideEffectFree?: (err: unknown) => boolean;
  /**
   * A store call slower than this fails (fail closed, 503). Default: the store's own call bound
   * (`store.callTimeoutMs`) plus 250 ms when it declares one, so the store's own error ends a
   * call and nothing it gave up on applies later; else 5000 ms.
   */
  storeTimeoutMs?: number;
  /** Event emitter for metrics (one is created when omitted). */
  events?: IdempotencyEvents;
}

/** The host's own option names (the rest are core's `Config` options). */
const HOST_OPTIONS = [
  'store', 'headerName', 'methods', 'scope', 'public', 'emptyScopeIsAnonymous', 'route',
  'fingerprintHeaders', 'exclude', 'hmacKey', 'numbers', 'redact', 'isSideEffectFree',
  'storeTimeoutMs', 'events',
];

/** Former option names and what replaced them. */
const RENAMED: Record<string, string> = {
  required: '`required` is now `keyRequired`',
  bodyLimit: '`bodyLimit` is now `maxRequestBodyBytes`',
  replayHeaders: '`replayHeaders` is now `storedHeaders`',
  key: '`key: { minLen, maxLen, strict }` is now `keyMinLen`, `keyMaxLen`, `keyStrict`',
};

/** Refuses unknown and renamed option names (a typo must not silently take a default). */
function checkNames(o: object): void {
  const known = new Set([...HOST_OPTIONS, ...native.configOptionNames()]);
  for (const name of Object.keys(o)) {
    if (RENAMED[name] !== undefined) throw new ConfigError(`idempotency(): ${RENAMED[name]}`);
    if (!known.has(name)) {
      throw new ConfigError(`idempotency(): unknown option \`${name}\` (known: ${[...known].join(', ')})`);
    }
  }
  if ((o as { heartbeatMs?: unknown }).heartbeatMs === null) {
    throw new ConfigError('idempotency(): `heartbeatMs: null` is now `heartbeatMs: 0` (no heartbeat)');
  }
}

/** The prepared configuration of one integration. */
export class Prepared<Req> {
  readonly o: IdempotencyOptions<Req>;
  readonly config: native.FlowConfig;
  readonly fingerprinter: Fingerprinter;
  readonly scopeRule: native.ScopeRule;
  readonly events: IdempotencyEvents;
  readonly header: string;
  readonly methods: Set<string>;

  constructor(o: IdempotencyOptions<Req>) {
    if (!o || !o.store) throw new TypeError('idempotency: the `store` option is required');
    checkNames(o);
    this.o = o;
    const c: native.FlowConfigOptions = {};
    for (const name of native.configOptionNames()) {
      const v = (o as unknown as Record<string, unknown>)[name];
      if (v !== undefined && name !== 'redact') (c as Record<string, unknown>)[name] = v;
    }
    if (o.redact) c.redact = true;
    if (o.transactional && !supportsTransactions(o.store)) {
      throw new TransactionalUnsupportedError(
        `transactional: true needs a store that runs the handler in its transaction (PostgresStore or SqliteStore), not ${o.store.kind}`,
      );
    }
    try {
      this.config = new native.FlowConfig(c);
      this.scopeRule = new native.ScopeRule(o.scope !== undefined, o.public === true, o.emptyScopeIsAnonymous === true);
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
    this.header = (o.headerName ?? defaultOf<string>('host', 'headerName')).toLowerCase();
    this.methods = new Set((o.methods ?? defaultOf<readonly string[]>('host', 'methods')).map((m) => m.toUpperCase()));
  }

  #warned = new Set<string>();
  #gate: native.MemoryGate | undefined;
  /** Per route: the options of its memory-gate sessions (the flow holds the scope and the
   * fingerprint), made once. */
  #memorySessions = new Map<string, SessionOptions>();

  /** The session options of a memory-gate admission on `route` (see {@link memoryGate}). */
  memorySessionOptions(route: string): SessionOptions {
    let o = this.#memorySessions.get(route);
    if (o === undefined) {
      o = { store: this.o.store, config: this.config, scope: NO_BYTES, fingerprint: '', storeTimeoutMs: this.o.storeTimeoutMs ?? defaultStoreTimeoutMs(this.o.store), events: this.events, route };
      // Bounded: a `route` function may name many routes; past the bound, made per request.
      if (this.#memorySessions.size < 1024) this.#memorySessions.set(route, o);
    }
    return o;
  }

  /**
   * The memory gate (core's whole admission and the claim in one native call, see
   * `MemoryGate`) and the store's native core, when this request may take it: the store is
   * exactly idempo's `MemoryStore` with its own primitives, not transactional, and nothing
   * listens to `store_op` (checked per request: a listener may be added at any time). Else
   * undefined: the ordinary admission.
   */
  memoryGate(): { gate: native.MemoryGate; mem: MemoryInline } | undefined {
    if (this.o.transactional || this.events.listenerCount('store_op') !== 0) return undefined;
    const mem = memoryInline(this.o.store);
    if (mem === undefined) return undefined;
    try {
      this.#gate ??= new native.MemoryGate(this.config, this.fingerprinter.nativeHandle, this.scopeRule);
    } catch (e) {
      throw fromNative(e);
    }
    return { gate: this.#gate, mem };
  }

  /** Emits core's warning once per route. */
  warnOnce(route: string, message: string): void {
    if (this.#warned.has(route)) return;
    this.#warned.add(route);
    this.events.emit('warning', { message });
  }

  /** Core's log line for a refused scope: the `scope_unresolved` event, else stderr. */
  logScopeUnresolved(route: string, method: string, message: string): void {
    if (this.events.listenerCount('scope_unresolved') > 0) this.events.emit('scope_unresolved', { route, method, message });
    else console.error(message);
  }

  /** Core's log line for a body it could not see: the `body_unavailable` event, else stderr. */
  logBodyUnavailable(route: string, method: string, message: string): void {
    if (this.events.listenerCount('body_unavailable') > 0) this.events.emit('body_unavailable', { route, method, message });
    else console.error(message);
  }

  /** Core's log line for another refusal that points at the server's configuration: the
   * `warning` event, else stderr. */
  logError(message: string): void {
    if (this.events.listenerCount('warning') > 0) this.events.emit('warning', { message });
    else console.error(message);
  }

  isSideEffectFree(err: unknown): boolean {
    if (this.o.isSideEffectFree) return this.o.isSideEffectFree(err);
    return typeof err === 'object' && err !== null && (err as { noSideEffect?: unknown }).noSideEffect === true;
  }
}

/** Raw key field values as bytes (Node gives header values as latin1 strings). */
export function keyFields(raw: string | string[] | undefined): Buffer[] {
  if (raw === undefined) return [];
  return (Array.isArray(raw) ? raw : [raw]).map((v) => Buffer.from(v, 'latin1'));
}

/** The body length a `Content-Length` value declares (null: absent or unreadable). */
export function declaredLength(raw: string | string[] | undefined): number | null {
  const v = Array.isArray(raw) ? raw[0] : raw;
  return v !== undefined && /^\s*\d+\s*$/.test(v) ? Number(v) : null;
}

/** Stage 1 of core's admission: the key fields and the declared body length. */
export function admitKey<Req>(p: Prepared<Req>, keyHeader: string | string[] | undefined, contentLength: string | string[] | undefined): native.Admission {
  return native.Admission.start(p.config, keyFields(keyHeader), declaredLength(contentLength));
}

/** Stage 1 and its facts (`kind`, `bodyLimit`), read from one call instead of two getters. */
export interface KeyAdmission {
  a: native.Admission;
  /** `pass_through`, `refuse` or `read_body`. */
  kind: string;
  /** `read_body`: the most body bytes to read. */
  bodyLimit: number;
}

/** The stage codes `Admission.start` writes to its `facts` buffer (byte 0). */
const KEY_KINDS = ['pass_through', 'refuse', 'read_body'];
/** Size of `Admission.start`'s facts: the stage byte, padding, the body limit (f64). */
const FACTS_BYTES = 16;
/** `Admission.start`'s facts: written by the call, read before anything else runs. */
const FACTS = Buffer.alloc(FACTS_BYTES);

/** {@link admitKey} with the stage's facts. */
export function admitKeyFacts<Req>(p: Prepared<Req>, keyHeader: string | string[] | undefined, contentLength: string | string[] | undefined): KeyAdmission {
  const a = native.Admission.start(p.config, keyFields(keyHeader), declaredLength(contentLength), FACTS);
  const kind = KEY_KINDS[FACTS[0] as number];
  if (kind === undefined) throw new Error(`idempo: Admission.start wrote an unknown stage ${FACTS[0]}`);
  return { a, kind, bodyLimit: FACTS.readDoubleLE(8) };
}

/**
 * Stage 1 of core's admission through the memory gate (no object): `-1` pass through, `-2`
 * refused (then {@link admitKeyFacts} gives the problem), else the most body bytes to read.
 */
export function gateKeyStage(gate: native.MemoryGate, key: string | undefined, declared: number | null): number {
  try {
    return gate.keyStage(key ?? null, declared);
  } catch (e) {
    throw fromNative(e);
  }
}

/**
 * Core's key and body stages through the memory gate, nothing claimed (`MemoryGate.bodyStage`):
 * 0 when one refuses the request (the ordinary stages say how), else the ticket under which the
 * gate keeps the passed body stage for {@link admitThroughGate} (`GateFacts.ticket`; on the same
 * inputs the stages would pass again).
 */
export function gateBodyStage(
  gate: native.MemoryGate,
  key: string | undefined,
  declared: number | null,
  method: string,
  target: string,
  body: Buffer,
  contentType: string | null,
  headers: string[] | null,
): number {
  try {
    return gate.bodyStage(key ?? null, declared, method, target, body, contentType, headers);
  } catch (e) {
    throw fromNative(e);
  }
}

/** The request facts {@link admitThroughGate} needs: {@link RequestFacts} plus the key field
 * (one value) and the declared body length, as the key stage took them. */
export interface GateFacts<Req> extends RequestFacts<Req> {
  key: string | undefined;
  declared: number | null;
  /** {@link gateBodyStage}'s ticket for these inputs: the gate's kept body stage is admitted
   * (`MemoryGate.admitStaged`), or, when the gate no longer keeps it, the request from its
   * inputs. */
  ticket?: number;
}

/** `MemoryGate`'s code for each kind of scope function return (see `MemoryGate.admit`). */
const SCOPE_CODES: Record<string, number> = { not_called: 0, string: 1, nothing: 2, other: 3, raised: 4 };
/** `MemoryGate.admit`'s scope code for "the route has a scope function: call it now". */
const SCOPE_PENDING = 5;
/** `MemoryGate.admitStaged`'s result when the ticket's body stage is no longer kept. */
const RESTAGE = 6;
const NOT_CALLED: native.ScopeReturn = { kind: 'not_called' };

const NO_BYTES = Buffer.alloc(0);

/**
 * Stages 2 and 3 of core's admission and the claim through the memory gate (see
 * {@link Prepared.memoryGate}), for a body read whole (`f.body` not null, no `unavailableFix`):
 * one native call when the route has no scope function, two around a synchronous one. The
 * answers are the ordinary admission's: a refusal at any stage is rebuilt by the ordinary
 * admission (core's problem, log line and outcome; nothing ran on the store), and a scope
 * function that returns a promise continues on the ordinary path from the scope stage.
 */
export function admitThroughGate<Req>(p: Prepared<Req>, gate: native.MemoryGate, mem: MemoryInline, f: GateFacts<Req>): Admitted | Promise<Admitted> {
  const o = p.memorySessionOptions(f.route);
  const warn = (w: string) => p.warnOnce(f.route, w);
  const partitioned = p.o.store.partitioned === true;
  const scope = p.o.scope;
  const body = f.body as Buffer;
  const scopeCode = scope ? SCOPE_PENDING : 0;
  const ticket = f.ticket;
  const admit = (facts: Buffer) =>
    gate.admit(mem.core, mem.now(), f.key ?? null, f.declared, f.method, f.target, f.route, body, f.contentType ?? null, p.fingerprinter.usesHeaders ? flatHeaders(f.headers) : null, f.authenticated, scopeCode, null, partitioned, facts);
  let r: GateAdmitted = gateStep(
    gate,
    mem,
    ticket === undefined
      ? admit
      : (facts) => {
          const staged = gate.admitStaged(ticket, mem.core, mem.now(), f.method, f.route, f.authenticated, scopeCode, null, partitioned, facts);
          // The gate no longer keeps that body stage (nothing ran): the request from its inputs.
          return facts[0] === RESTAGE ? admit(facts) : staged;
        },
    o,
    warn,
  );
  let returned = NOT_CALLED;
  if (r.kind === 'scope' && scope) {
    const held = r;
    const v = callScope(scope, f.req);
    if (v instanceof Promise) {
      // Awaited: the request leaves the gate (nothing is held across a turn of the event loop).
      let adm: native.Admission;
      try {
        adm = gate.takeAdmission(held.slot, held.tag);
      } catch (e) {
        throw fromNative(e);
      }
      return v.then((ret) => scoped(p, adm, f, ret));
    }
    returned = v;
    r = gateStep(
      gate,
      mem,
      (facts) => gate.scope(held.slot, held.tag, mem.core, mem.now(), f.method, f.route, f.authenticated, SCOPE_CODES[v.kind] ?? 3, v.text ?? null, partitioned, facts),
      o,
      warn,
    );
  }
  if (r.kind === 'refused') return refusedAgain(p, f, returned);
  if (r.kind === 'scope') throw new Error('idempo: MemoryGate held a request without a scope function');
  return r;
}

/** The refusal the gate reported, from the ordinary admission run on the same inputs (core's
 * stages are deterministic: the same stage refuses, with its problem, outcome and log line). */
function refusedAgain<Req>(p: Prepared<Req>, f: GateFacts<Req>, returned: native.ScopeReturn): Admitted {
  const a = admitKey(p, f.key, f.declared === null ? undefined : String(f.declared));
  if (a.kind === 'refuse') return refused(p, a, f.route, f.method);
  if (a.kind === 'read_body') {
    const r = admitBody(p, a, f);
    if (r !== undefined) return r;
    if (a.scope(p.scopeRule, f.method, f.route, f.authenticated, returned) === null) return refused(p, a, f.route, f.method);
  }
  throw new Error(`idempo: the memory gate refused a request the admission admits (${a.kind})`);
}

/** The request parts admission needs after the key. */
export interface RequestFacts<Req> {
  req: Req;
  method: string;
  /** The route template: names the scope (spec/KEYS.md §2). */
  route: string;
  /** The request target as received (raw path and query): fingerprinted (spec/CANONICAL.md §2.1),
   * so one key sent to two resources under one template is a mismatch, never a replay. */
  target: string;
  contentType: string | undefined;
  headers: Record<string, string | string[] | undefined>;
  /** The body as read; `null` when the host stopped reading past `admission.bodyLimit`. */
  body: Buffer | null;
  /** The request carries credentials (an `Authorization` field or a framework user). */
  authenticated: boolean;
  /** Set when the request has a body whose bytes a parser consumed first: core refuses it (500
   * `body-unavailable`) with this sentence naming the fix. */
  unavailableFix?: string;
}

/** Admission result: a session to run, an answer to send now, or "not protected". */
export type Admitted =
  | { kind: 'session'; session: Session }
  | { kind: 'respond'; response: HttpResponse; outcome: string }
  /** Core's answer to the claim (a replay, 409, 422...), from the memory store's combined call:
   * sent as the session's admission answer is, not as a refusal. */
  | { kind: 'answered'; response: HttpResponse; outcome: string }
  | { kind: 'unprotected' };

/** How a scope function's return value looks to core (a description, never a decision). */
function describe(v: unknown): native.ScopeReturn {
  if (typeof v === 'string') return { kind: 'string', text: v };
  if (v === undefined || v === null) return { kind: 'nothing', text: String(v) };
  let text: string;
  try {
    text = `${typeof v} ${typeof v === 'object' ? JSON.stringify(v) : String(v)}`;
  } catch {
    text = typeof v;
  }
  return { kind: 'other', text };
}

function refused<Req>(p: Prepared<Req>, a: native.Admission, route: string, method: string): Admitted {
  if (a.log && a.outcome === 'body_unavailable') p.logBodyUnavailable(route, method, a.log);
  else if (a.log && a.outcome === 'scope_unresolved') p.logScopeUnresolved(route, method, a.log);
  else if (a.log) p.logError(a.log);
  return { kind: 'respond', response: toHttp(a.problem as native.HttpResponseData), outcome: a.outcome ?? 'refused' };
}

/** The request parts stage 2 of core's admission (body and fingerprint) needs. */
export type BodyFacts = Omit<RequestFacts<unknown>, 'req' | 'authenticated'>;

/** Stage 2 of core's admission (body size, then fingerprint): a refusal to send, or `undefined`
 * when the admission went on to the scope stage. */
export function admitBody<Req>(p: Prepared<Req>, a: native.Admission, f: BodyFacts): Admitted | undefined {
  const kind = a.body(
    p.fingerprinter.nativeHandle,
    f.method,
    f.target,
    f.body ?? EMPTY,
    f.contentType ?? null,
    // Headers cross into the addon only when the fingerprint reads some.
    p.fingerprinter.usesHeaders ? flatHeaders(f.headers) : null,
    f.body === null,
    f.unavailableFix ?? null,
  );
  return kind === 'refuse' ? refused(p, a, f.route, f.method) : undefined;
}

const EMPTY = Buffer.alloc(0);

/** Stages 2 and 3 of core's admission (body and fingerprint, then scope), then the session (no
 * store call yet). The order is core's; this function only gathers the inputs. */
export async function admitRest<Req>(p: Prepared<Req>, a: native.Admission, f: RequestFacts<Req>): Promise<Admitted> {
  return admitBody(p, a, f) ?? admitScope(p, a, f);
}

/** {@link admitRest} without a promise when no `scope` function has to be awaited. */
export function admitRestEager<Req>(p: Prepared<Req>, a: native.Admission, f: RequestFacts<Req>): Admitted | Promise<Admitted> {
  return admitBody(p, a, f) ?? admitScopeEager(p, a, f);
}

/** Stage 3 of core's admission (the scope function's return value), after {@link admitBody}, then
 * the session (no store call yet). */
export async function admitScope<Req>(p: Prepared<Req>, a: native.Admission, f: RequestFacts<Req>): Promise<Admitted> {
  return admitScopeEager(p, a, f);
}

/** {@link admitScope} without a promise when there is no `scope` function to await. */
export function admitScopeEager<Req>(p: Prepared<Req>, a: native.Admission, f: RequestFacts<Req>): Admitted | Promise<Admitted> {
  if (!p.o.scope) return scoped(p, a, f, { kind: 'not_called' });
  return scopeReturn(p.o.scope, f.req).then((returned) => scoped(p, a, f, returned));
}

/** {@link scopeReturn} without a promise when the scope function returns no thenable. */
function callScope<Req>(scope: (req: Req) => unknown, req: Req): native.ScopeReturn | Promise<native.ScopeReturn> {
  let v: unknown;
  let thenable = false;
  try {
    v = scope(req);
    thenable = (typeof v === 'object' || typeof v === 'function') && v !== null && typeof (v as { then?: unknown }).then === 'function';
  } catch (e) {
    return raisedBy(e);
  }
  return thenable ? scopeReturn(() => v, req) : describe(v);
}

function raisedBy(e: unknown): native.ScopeReturn {
  return { kind: 'raised', text: e instanceof Error ? `${e.name}: ${e.message}` : String(e) };
}

/** How the scope function ended, as core reads it (a description, never a decision). */
async function scopeReturn<Req>(scope: (req: Req) => unknown, req: Req): Promise<native.ScopeReturn> {
  try {
    return describe(await scope(req));
  } catch (e) {
    return raisedBy(e);
  }
}

/** Stage 3 once the scope function's return value is known, then the session. */
function scoped<Req>(p: Prepared<Req>, a: native.Admission, f: RequestFacts<Req>, returned: native.ScopeReturn): Admitted {
  const transactional = p.o.transactional && supportsTransactions(p.o.store);
  // Exactly idempo's MemoryStore and nothing listening to `store_op`: the scope stage, the flow
  // and its claim in one native call.
  const mem = transactional || p.events.listenerCount('store_op') !== 0 ? undefined : memoryInline(p.o.store);
  if (mem !== undefined) {
    const r = admitInMemory(a, mem, p.scopeRule, f, returned, {
      store: p.o.store,
      config: p.config,
      storeTimeoutMs: p.o.storeTimeoutMs ?? defaultStoreTimeoutMs(p.o.store),
      events: p.events,
      route: f.route,
    }, (w) =>
      p.warnOnce(f.route, w),
    );
    return r.kind === 'refused' ? refused(p, a, f.route, f.method) : r;
  }
  // The record key (32 bytes) and the partition (8) are written into one pooled allocation.
  const ids = Buffer.allocUnsafe(40);
  const admitted = a.scope(p.scopeRule, f.method, f.route, f.authenticated, returned, ids);
  if (admitted === null) return refused(p, a, f.route, f.method);
  if (admitted.warning) p.warnOnce(f.route, admitted.warning);
  const tx = p.o.transactional && supportsTransactions(p.o.store) ? p.o.store.transaction() : undefined;
  const session = new Session({
    store: p.o.store,
    config: p.config,
    scope: ids.subarray(0, 32),
    fingerprint: admitted.fingerprint,
    // A transactional session bounds every step itself (statement deadlines, the lock wait): an
    // outer timeout would answer while the step still runs on the transaction's connection.
    storeTimeoutMs: tx ? 0 : (p.o.storeTimeoutMs ?? defaultStoreTimeoutMs(p.o.store)),
    events: p.events,
    route: f.route,
    ...(tx ? { tx } : {}),
    // A store with per-partition quotas (the memory store) gets the principal's partition.
    ...(p.o.store.partitioned === true ? { partition: ids.subarray(32, 40) } : {}),
  });
  return { kind: 'session', session };
}

/** Headroom over a store's own call bound before the host gives up on a call, ms. */
const STORE_BOUND_HEADROOM_MS = 250;

/** The default `storeTimeoutMs`: the store's own call bound plus headroom, else 5000 ms. */
export function defaultStoreTimeoutMs(store: IdempotencyStore): number {
  const own = store.callTimeoutMs;
  return own !== undefined && Number.isFinite(own) && own >= 0 ? own + STORE_BOUND_HEADROOM_MS : 5000;
}
