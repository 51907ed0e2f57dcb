/**
 * Idempotent functions and message consumers: `idempotent(fn, options)` runs `fn` at most once
 * per key through core's own server flow (`spec/PROTOCOL.md` §13). A duplicate while the first
 * runs rejects with {@link CallInFlightError} (or waits, `waitMs`), a completed call resolves to
 * the stored result without running, and the same key with another payload rejects with
 * {@link PayloadMismatchError}. Without `key` the key is the payload's fingerprint.
 *
 * Nothing here decides anything: core frames the scope and fingerprint, says what to feed the
 * flow for a result or an error, and what the flow's end means for the caller.
 */
import { randomBytes } from 'node:crypto';
import { AsyncLocalStorage } from 'node:async_hooks';
import native = require('./native');
import {
  IdempoError,
  TransactionalUnsupportedError,
  IdempotencyKeyInUseError,
  IdempotencyKeyReusedError,
  OutcomeUnknownError,
  StoreUnavailableError,
  fromNative,
} from './errors';
import { Fingerprinter } from './fingerprint';
import { IdempotencyEvents, Session } from './server/session';
import type { FlowEnd } from './server/session';
import { defaultStoreTimeoutMs } from './server/options';
import type { IdempotencyStore, TransactionSession } from './stores/types';
import { supportsTransactions } from './stores/types';
import { txStorage } from './server/tx';
import type { TxHolder } from './server/tx';

/** The key was already used with a different payload. */
export class PayloadMismatchError extends IdempotencyKeyReusedError {
  readonly key: string;
  constructor(message: string, key: string) {
    super(message);
    this.key = key;
  }
}

/** Another call with this key is running: nack / redeliver after `retryAfterMs`, or pass `waitMs`. */
export class CallInFlightError extends IdempotencyKeyInUseError {
  readonly key: string;
  constructor(message: string, key: string, retryAfterMs: number) {
    super(message, { retryAfterMs });
    this.key = key;
  }
}

/** A call with this key may have acted but never finished; it is not run again. */
export class CallOutcomeUnknownError extends OutcomeUnknownError {
  readonly key: string;
  constructor(message: string, key: string) {
    super(message);
    this.key = key;
  }
}

/** The store failed or is contended: nothing this call did was recorded. */
export class CallStoreUnavailableError extends StoreUnavailableError {
  readonly key: string;
  constructor(message: string, key: string, retryAfterMs: number) {
    super(message, { retryAfterMs });
    this.key = key;
  }
}

/** The replay of an error stored under `onError: 'store'`. */
export class StoredCallError extends IdempoError {
  readonly key: string;
  readonly errorName: string;
  readonly errorMessage: string;
  constructor(key: string, errorName: string, errorMessage: string) {
    super('FLOW_ERROR', `${errorName}: ${errorMessage}`);
    this.key = key;
    this.errorName = errorName;
    this.errorMessage = errorMessage;
  }
}

/** Encodes a result into the record and back; `name` is stored with the bytes. */
export interface Serializer<T = unknown> {
  name: string;
  dumps(value: T): Buffer;
  loads(data: Buffer): T;
}

/** JSON (`undefined` is stored as `null`). */
export const jsonSerializer: Serializer = {
  name: 'json',
  dumps: (value) => Buffer.from(JSON.stringify(value === undefined ? null : value)),
  loads: (data) => JSON.parse(data.toString('utf8')) as unknown,
};

/** `'store'`, `'release'` or `'unknown'` (see `spec/PROTOCOL.md` §13). */
export type ErrorDisposition = 'store' | 'release' | 'unknown';

/** The running call (from {@link currentCall}). */
export interface CallContext {
  name: string;
  key: string;
  generation: number;
  /** Pass to the services the function calls: the same across a takeover re-run. */
  downstreamKey: string;
  /** Aborted when another call took the key over. */
  signal: AbortSignal;
  /**
   * Transactional mode: the store's open transaction (a `pg` client for `PostgresStore`, the
   * better-sqlite3 database for `SqliteStore`; also `currentTransaction()`). Write the job's rows
   * through it and never commit it: idempo commits them with the stored result, or rolls back.
   */
  tx?: unknown;
}

const current = new AsyncLocalStorage<CallContext>();

/** The idempotent call running in this async context, if any. */
export function currentCall(): CallContext | undefined {
  return current.getStore();
}

/** Options of {@link idempotent}. */
export interface IdempotentOptions<A extends unknown[], R> {
  store: IdempotencyStore;
  /** The record namespace; keep it stable across deploys. Default: the function's name. */
  name?: string;
  /** The call's key (a message or job id). Default: the payload's fingerprint. */
  key?: (...args: A) => string;
  /** The JSON value fingerprinted. Default: the only argument, else `{ args }`. */
  payload?: (...args: A) => unknown;
  /** The tenant: a string or a function of the arguments. */
  scope?: string | ((...args: A) => string);
  /** RFC 6901 pointers left out of the payload's fingerprint. */
  exclude?: string[];
  hmacKey?: Buffer | string;
  serializer?: Serializer<R>;
  /** What a thrown error does (default `'unknown'`). */
  onError?: ErrorDisposition | ((error: unknown) => ErrorDisposition);
  /** Milliseconds to poll a call in flight (bounded, jittered) before rejecting. Default 0. */
  waitMs?: number;
  leaseMs?: number;
  heartbeatMs?: number;
  ttlMs?: number;
  takeover?: 'outcome_unknown' | 're_run';
  /**
   * Run the function inside the store's transaction (`PostgresStore`, `SqliteStore`): its writes
   * through `currentCall().tx` commit with the stored result, or roll back with the claim, so a
   * crash or a failure leaves nothing and a redelivery runs it again (`spec/PROTOCOL.md` §7.6).
   */
  transactional?: boolean;
  events?: IdempotencyEvents;
}

interface Prepared<A extends unknown[], R> {
  o: IdempotentOptions<A, R>;
  name: string;
  config: native.FlowConfig;
  fingerprinter: Fingerprinter;
  serializer: Serializer<R>;
  events: IdempotencyEvents;
}

function wrapNative<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw fromNative(e);
  }
}

function prepare<A extends unknown[], R>(name: string, o: IdempotentOptions<A, R>): Prepared<A, R> {
  if (!o || !o.store) throw new TypeError('idempotent: the `store` option is required');
  const c: native.FlowConfigOptions = {};
  if (o.leaseMs !== undefined) c.leaseMs = o.leaseMs;
  if (o.heartbeatMs !== undefined) c.heartbeatMs = o.heartbeatMs;
  if (o.ttlMs !== undefined) c.ttlMs = o.ttlMs;
  if (o.takeover !== undefined) c.takeover = o.takeover;
  if (o.transactional) {
    if (!supportsTransactions(o.store)) {
      throw new TransactionalUnsupportedError(
        `idempotent(): transactional: true needs a store that runs the function in its transaction (PostgresStore or SqliteStore), not ${o.store.kind}`,
      );
    }
    c.transactional = true;
  }
  wrapNative(() => native.callFraming(name));
  const fo: ConstructorParameters<typeof Fingerprinter>[0] = {};
  if (o.exclude) fo.exclude = o.exclude;
  if (o.hmacKey !== undefined) fo.hmacKey = o.hmacKey;
  return {
    o,
    name,
    config: wrapNative(() => new native.FlowConfig(c)),
    fingerprinter: new Fingerprinter(fo),
    serializer: o.serializer ?? (jsonSerializer as Serializer<R>),
    events: o.events ?? new IdempotencyEvents(),
  };
}

function errorBody(error: unknown): Buffer {
  const e = error instanceof Error ? error : new Error(String(error));
  return Buffer.from(JSON.stringify({ type: e.name, message: e.message }));
}

function answerOf(end: FlowEnd): native.CallAnswerData {
  return wrapNative(() =>
    end.kind === 'respond'
      ? native.callAnswer(end.outcome, end.response.status, end.response.headers, end.response.body)
      : native.callAnswer(end.outcome, null, null, null),
  );
}

const readers: Record<string, (p: Prepared<never, unknown>, a: native.CallAnswerData, key: string) => unknown> = {
  returned: (p, a, key) => {
    if (a.serializer !== p.serializer.name) {
      throw new IdempoError('FLOW_ERROR', `the result of ${p.name} key ${key} was stored by serializer ${a.serializer}, not ${p.serializer.name}`);
    }
    return p.serializer.loads(a.body as Buffer);
  },
  stored_error: (_p, a, key) => {
    const data = JSON.parse((a.body as Buffer).toString('utf8') || '{}') as { type?: string; message?: string };
    throw new StoredCallError(key, String(data.type ?? ''), String(data.message ?? ''));
  },
  in_flight: (p, a, key) => {
    throw new CallInFlightError(`${p.name}: key ${key} is in flight`, key, a.retryAfterMs ?? 1000);
  },
  mismatch: (p, _a, key) => {
    throw new PayloadMismatchError(`${p.name}: key ${key} was used with a different payload`, key);
  },
  outcome_unknown: (p, _a, key) => {
    throw new CallOutcomeUnknownError(`${p.name}: key ${key}: outcome unknown`, key);
  },
  not_retained: (p, _a, key) => {
    throw new IdempoError('FLOW_ERROR', `${p.name}: key ${key}: result not retained`);
  },
  unavailable: (p, a, key) => {
    throw new CallStoreUnavailableError(`${p.name}: key ${key}: store unavailable`, key, a.retryAfterMs ?? 1000);
  },
};

function read<A extends unknown[], R>(p: Prepared<A, R>, a: native.CallAnswerData, key: string): R {
  const reader = readers[a.kind];
  if (!reader) throw new IdempoError('FLOW_ERROR', `${p.name}: key ${key}: unexpected record (${a.kind})`);
  return reader(p as unknown as Prepared<never, unknown>, a, key) as R;
}

async function once<A extends unknown[], R>(p: Prepared<A, R>, run: () => Promise<R> | R, scope: Buffer, fingerprint: string, key: string): Promise<R> {
  const tx: TransactionSession | undefined =
    p.o.transactional && supportsTransactions(p.o.store) ? p.o.store.transaction() : undefined;
  const session = new Session({
    store: p.o.store,
    config: p.config,
    scope,
    fingerprint,
    // A transactional session bounds every step itself (statement deadlines, the lock wait).
    storeTimeoutMs: tx ? 0 : defaultStoreTimeoutMs(p.o.store),
    events: p.events,
    route: p.name,
    ...(tx ? { tx } : {}),
  });
  const admitted = await session.admit();
  if (admitted.kind === 'respond') return read(p, answerOf(admitted), key);
  const ctx: CallContext = {
    name: p.name,
    key,
    generation: admitted.context.generation,
    downstreamKey: admitted.context.downstreamKey,
    signal: admitted.context.signal,
  };
  const holder: TxHolder = { tx: admitted.context.tx ?? null };
  if (admitted.context.tx !== undefined) ctx.tx = admitted.context.tx;
  let value: R | undefined;
  let failed = false;
  let error: unknown;
  try {
    value = await txStorage.run(holder, () => current.run(ctx, run));
  } catch (e) {
    failed = true;
    error = e;
  } finally {
    holder.tx = null; // the transaction ends with the flow: no write through it after this
  }
  let end: FlowEnd;
  if (!failed) {
    const feed = wrapNative(() => native.callReturned(p.serializer.name, p.serializer.dumps(value as R)));
    end = await session.finish({ status: feed.status as number, headers: feed.headers as Array<[string, string]>, body: feed.body as Buffer });
  } else {
    const onError = p.o.onError ?? 'unknown';
    const disposition = typeof onError === 'function' ? onError(error) : onError;
    const feed = wrapNative(() => native.callRaised(disposition, errorBody(error)));
    end = feed.kind === 'finished'
      ? await session.finish({ status: feed.status as number, headers: feed.headers as Array<[string, string]>, body: feed.body as Buffer })
      : await session.fail(feed.maybeSideEffect ?? true);
  }
  const a = answerOf(end);
  if ((a.kind === 'returned' || a.kind === 'stored_error') && !a.replayed) {
    if (failed) throw error;
    return value as R;
  }
  if (a.kind === 'propagate') throw error;
  return read(p, a, key);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function runCall<A extends unknown[], R>(p: Prepared<A, R>, run: () => Promise<R> | R, scope: Buffer, fingerprint: string, key: string): Promise<R> {
  const started = Date.now();
  for (let attempt = 0; ; attempt++) {
    try {
      return await once(p, run, scope, fingerprint, key);
    } catch (e) {
      if (!(e instanceof CallInFlightError) || !(p.o.waitMs && p.o.waitMs > 0)) throw e;
      const delay = native.callWaitDelay(attempt, e.retryAfterMs ?? 1000, Date.now() - started, p.o.waitMs, randomBytes(2).readUInt16BE(0));
      if (delay === null || delay === undefined) throw e;
      await sleep(delay);
    }
  }
}

/**
 * `fn` made idempotent per key: the returned function has `fn`'s parameters and resolves to its
 * (awaited) result, replayed from the record for a key already done.
 */
// biome-ignore lint/suspicious/noExplicitAny: the wrapped function's own parameter types are kept through F
export function idempotent<F extends (...args: any[]) => unknown>(
  fn: F,
  options: IdempotentOptions<Parameters<F>, Awaited<ReturnType<F>>>,
): (...args: Parameters<F>) => Promise<Awaited<ReturnType<F>>> {
  type A = Parameters<F>;
  type R = Awaited<ReturnType<F>>;
  const p = prepare(options.name ?? fn.name, options);
  return async (...args: A): Promise<R> => {
    const payload = options.payload ? options.payload(...args) : args.length === 1 ? args[0] : { args };
    const body = Buffer.isBuffer(payload) ? payload : Buffer.from(JSON.stringify(payload ?? null));
    const framing = wrapNative(() => native.callFraming(p.name));
    const fingerprint = p.fingerprinter.fingerprint({ method: framing.method, route: framing.route, body, contentType: framing.contentType });
    const key = options.key ? String(options.key(...args)) : fingerprint;
    const principal = typeof options.scope === 'function' ? options.scope(...args) : (options.scope ?? '');
    const scope = wrapNative(() => native.callScope(p.name, principal, key));
    return runCall(p, () => fn(...args) as R | Promise<R>, scope, fingerprint, key);
  };
}

/**
 * The method form: `idempotentMethod(options)` decorates a class method (TypeScript 5
 * decorators, `@idempotentMethod({ store, key: (order) => order.id })`) or wraps one
 * (`idempotentMethod(options)(Class.prototype.method)`); `this` is passed through, and `key`,
 * `payload` and `scope` see the method's own arguments.
 */
export function idempotentMethod<A extends unknown[], R>(options: IdempotentOptions<A, R>) {
  return function decorate<This>(
    method: (this: This, ...args: A) => R | Promise<R>,
    context?: { name?: string | symbol },
  ): (this: This, ...args: A) => Promise<R> {
    const name = options.name ?? (typeof context?.name === 'string' ? context.name : method.name);
    const { key, payload, scope, ...rest } = options;
    const o: IdempotentOptions<[This, ...A], R> = {
      ...rest,
      name,
      payload: (_self: This, ...args: A) => (payload ? payload(...args) : args.length === 1 ? args[0] : { args }),
    };
    if (key) o.key = (_self: This, ...args: A) => key(...args);
    if (typeof scope === 'function') o.scope = (_self: This, ...args: A) => scope(...args);
    else if (scope !== undefined) o.scope = scope;
    const wrapped = idempotent(
      (self: This, ...args: A) => method.apply(self, args),
      o as unknown as IdempotentOptions<[self: This, ...args: A], Awaited<R>>,
    ) as (self: This, ...args: A) => Promise<R>;
    return function (this: This, ...args: A): Promise<R> {
      return wrapped(this, ...args);
    };
  };
}
