/**
 * The storage contract (`spec/STORAGE.md` §3): eight atomic primitives, each answered with the
 * store's own clock. Every store in this package implements it exactly.
 */
import { defaultOf } from '../defaults';

/** 1 in progress, 2 completed, 3 outcome unknown. */
export type RecordStateCode = 1 | 2 | 3;

/** One `idempo_record` row (every column but `scope_key`). */
export interface StoreRecord {
  /** `v1:<hex>` or `h1:<hex>`. */
  fingerprint: string;
  state: RecordStateCode;
  /** The 16-byte fencing token. */
  token: Buffer;
  generation: number;
  /** Lease deadline, unix ms (store clock); non-null exactly while in progress. */
  leaseUntil: number | null;
  /** Expiry, unix ms (store clock). */
  expiresAt: number;
  /** The core-encoded response column; non-null exactly when completed. */
  response: Buffer | null;
}

/**
 * Claim's answer. `locked`: a transactional claim waited for the record's row lock past the lock
 * timeout (another request's uncommitted claim holds it, so it is in flight; nothing was written
 * or read); core answers 409 `in-flight` with `Retry-After` (`spec/PROTOCOL.md` §7.6).
 */
export type ClaimResult =
  | { claimed: true; generation: number; nowMs: number }
  | { claimed: false; record: StoreRecord; nowMs: number }
  | { claimed: false; locked: true; nowMs: number };

/** Get's answer (an expired record may be returned; core treats it as absent). */
export interface GetResult {
  record: StoreRecord | null;
  nowMs: number;
}

/** Rows deleted by one purge batch, per state. */
export interface PurgeCounts {
  inProgress: number;
  completed: number;
  outcomeUnknown: number;
}

/**
 * A store's figures for operations (`store.stats()`, `spec/STORAGE.md` §4.7): records by state,
 * records past their expiry not purged yet, the age of the oldest of those, the size in bytes
 * where the store can tell, and the store's clock.
 */
export interface StoreStats {
  inProgress: number;
  completed: number;
  outcomeUnknown: number;
  /** Records past `expires_at`, not purged yet. */
  expired: number;
  /** Age of the oldest expired record not purged yet, ms; null when there is none. */
  purgeLagMs: number | null;
  /** Table and indexes (PostgreSQL), database file (SQLite); null where not measurable. */
  sizeBytes: number | null;
  nowMs: number;
}

/** The row of core's `postgres_stats` / `sqlite_stats` recipe as a {@link StoreStats}. */
export function statsFromRow(row: Record<string, unknown>): StoreStats {
  const n = (v: unknown): number => Number(v ?? 0);
  const maybe = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));
  const lag = maybe(row.purge_lag_ms);
  return {
    inProgress: n(row.in_progress),
    completed: n(row.completed),
    outcomeUnknown: n(row.outcome_unknown),
    expired: n(row.expired),
    purgeLagMs: lag === null ? null : Math.max(0, lag),
    sizeBytes: maybe(row.size_bytes),
    nowMs: n(row.now_ms),
  };
}

/** Options of `purgeExpired`. */
export interface PurgeOptions {
  /** Rows per batch (default 1000). */
  batch?: number;
}

/**
 * A store adapter. Scope keys are 32 bytes, tokens 16 bytes; `response` bytes are opaque.
 * Every method is one atomic step on the store's clock; errors reject the promise (the flow then
 * fails closed with 503).
 */
/** Per-call options the host passes to a store primitive. */
export interface CallOptions {
  /**
   * Aborted when the host gave up on the call (its `storeTimeoutMs`). A store that retries on
   * its own (SQLite waiting for a locked file) stops at once and starts no further attempt, so a
   * call the host answered `503` for never applies afterwards.
   */
  signal?: AbortSignal;
  /**
   * `claim` only: the request's partition (8 bytes, {@link memoryPartition} of the principal),
   * set by the middleware; the memory store holds each partition to its quota, other stores
   * ignore it.
   */
  partition?: Uint8Array;
}

export interface IdempotencyStore {
  /** Adapter name for logs and metrics (`memory`, `sqlite`, `postgres`, `redis`, `cached`). */
  readonly kind: string;
  /**
   * Optional: the longest one call of this store can take before it fails by itself (its own
   * deadline, in ms). The middleware's default `storeTimeoutMs` waits a little longer than this,
   * so a call the host gave up on can never still apply afterwards (for stores whose calls are
   * atomic on the client side, as SQLite's are).
   */
  readonly callTimeoutMs?: number;
  /**
   * True for a store that holds each partition (principal) to a quota and takes
   * `options.partition` on `claim` (the memory store); the middleware then passes it.
   */
  readonly partitioned?: boolean;
  /** Primitive 1: insert-if-absent (an expired row counts as absent and is replaced). */
  claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number, options?: CallOptions): Promise<ClaimResult>;
  /** Primitive 2. */
  get(scopeKey: Uint8Array, options?: CallOptions): Promise<GetResult>;
  /** Primitive 3: the generation when applied, else null. */
  takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number, options?: CallOptions): Promise<number | null>;
  /** Primitive 4. */
  markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number, options?: CallOptions): Promise<boolean>;
  /** Primitive 5. */
  complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number, options?: CallOptions): Promise<boolean>;
  /**
   * Optional: primitive 5 answering the completed record and the store's `now` (null when it did
   * not apply) in the same atomic step, so a cache in front can be filled at completion without
   * another read.
   */
  completeRecord?(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number, options?: CallOptions): Promise<GetResult | null>;
  /** Primitive 6. */
  release(scopeKey: Uint8Array, token: Uint8Array, options?: CallOptions): Promise<boolean>;
  /** Primitive 7 (`leaseMs` may be 0). */
  renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number, options?: CallOptions): Promise<boolean>;
  /** Primitive 8: one batch, earliest expiry first. */
  purgeExpired(options?: PurgeOptions): Promise<PurgeCounts>;
  /** Optional: the figures the purge process exports (`spec/STORAGE.md` §4.7). */
  stats?(): Promise<StoreStats>;
  /** Releases connections the store opened itself. */
  close(): Promise<void>;
}

/**
 * One request's transactional session (`spec/STORAGE.md` §4.4): the same primitives, bound to one
 * connection and one database transaction. `claim` opens it (`BEGIN`, then the claim), the
 * handler writes through {@link TransactionSession.tx}, the later primitives (`complete` included)
 * only write inside the transaction, and it ends where core's transactional flow says
 * (`spec/PROTOCOL.md` §7.6): `commit()` runs `COMMIT` for core's `commit` operation, `release` is
 * `ROLLBACK` (never a delete outside the transaction). A claim that waits on a duplicate's
 * uncommitted row longer than the lock timeout reports `{ claimed: false, locked: true }` (core
 * answers 409 with `Retry-After`). The host calls `close()` in every case (rolls back what is still open
 * and gives the connection back).
 */
export interface TransactionSession extends IdempotencyStore {
  /** The connection with the transaction open (a `pg` client, a better-sqlite3 database); null
   * before the claim and after the transaction ended. Write through it; never commit it. */
  readonly tx: unknown;
  /** True once this session's transaction committed. */
  readonly committed: boolean;
  /** `COMMIT` (core's `commit`): rejects with a `StoreUnavailableError` when the `COMMIT` failed
   * or no transaction is open (core answers 503, outcome `not_committed`). */
  commit(): Promise<void>;
}

/** A store that can run a handler inside its own transaction. */
export interface TransactionalStore extends IdempotencyStore {
  /** A new session for one request. */
  transaction(): TransactionSession;
}

/** True when `store` supports transactional mode. */
export function supportsTransactions(store: IdempotencyStore): store is TransactionalStore {
  return typeof (store as Partial<TransactionalStore>).transaction === 'function';
}

/**
 * Clock override for conformance runs (`spec/STORAGE.md` §6): returns the virtual unix-ms `now`
 * the store must use instead of its own clock. Never wire this to request input.
 */
export type ClockOverride = () => number;

/** Loops `purgeExpired` while batches come back full; returns the totals. */
export async function purgeAllExpired(store: IdempotencyStore, options: PurgeOptions = {}): Promise<PurgeCounts> {
  const batch = options.batch ?? defaultOf<number>('purge', 'batch');
  const total: PurgeCounts = { inProgress: 0, completed: 0, outcomeUnknown: 0 };
  for (;;) {
    const c = await store.purgeExpired({ batch });
    total.inProgress += c.inProgress;
    total.completed += c.completed;
    total.outcomeUnknown += c.outcomeUnknown;
    if (c.inProgress + c.completed + c.outcomeUnknown < batch) return total;
  }
}

/** Checks the fixed sizes of the contract. */
export function checkKeyAndToken(scopeKey: Uint8Array, ...tokens: Uint8Array[]): void {
  if (scopeKey.length !== 32) throw new RangeError(`a scope key is 32 bytes, got ${scopeKey.length}`);
  for (const t of tokens) if (t.length !== 16) throw new RangeError(`a fencing token is 16 bytes, got ${t.length}`);
}

/** A `Buffer` view of bytes (no copy). */
export function asBuffer(u: Uint8Array): Buffer {
  return Buffer.isBuffer(u) ? u : Buffer.from(u.buffer, u.byteOffset, u.byteLength);
}
