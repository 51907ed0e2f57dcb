import { performance } from 'node:perf_hooks';
import native = require('../native');
import { ConfigError, fromNative } from '../errors';
import type { CallOptions, ClaimResult, ClockOverride, GetResult, IdempotencyStore, PurgeCounts, PurgeOptions, StoreRecord } from './types';
import { defaultOf } from '../defaults';

/** Options of {@link MemoryStore}. */
export interface MemoryStoreOptions {
  /** Maximum records held (default 100000). */
  maxEntries?: number;
  /** Maximum bytes held: 160 per record plus its fingerprint and stored response (default 64 MiB). */
  maxBytes?: number;
  /**
   * Most records one partition (the principal of the request, see {@link memoryPartition}) holds
   * (default a tenth of `maxEntries`, at least 1): one principal cannot fill the store for everyone.
   */
  maxEntriesPerPartition?: number;
  /** Most bytes one partition holds (default a tenth of `maxBytes`). */
  maxBytesPerPartition?: number;
  /**
   * The memory store protects one process only; with `NODE_ENV=production` it refuses to start
   * unless this is true (several workers would each run duplicates).
   */
  allowInProduction?: boolean;
  /** Clock override for conformance runs only. */
  clock?: ClockOverride;
}

/** The store's native core and clock, for {@link memoryInline}. */
const INLINE = Symbol('idempo.memory.inline');

/** Monotonic unix-like milliseconds (nothing in this store outlives the process). */
function monotonicMs(): number {
  return Math.floor(performance.timeOrigin + performance.now());
}

export function rowToRecord(r: native.RecordRowData): StoreRecord {
  return {
    fingerprint: r.fingerprint,
    state: r.state as 1 | 2 | 3,
    token: r.token,
    generation: r.generation,
    leaseUntil: r.leaseUntil ?? null,
    expiresAt: r.expiresAt,
    response: r.response ?? null,
  };
}

/** The memory store's partition (8 bytes) of a principal: what the host passes as `partition`. */
export function memoryPartition(principal: string): Buffer {
  return native.memoryPartition(principal);
}

/**
 * In-process store for tests and one process: core's bounded memory store (`spec/STORAGE.md`
 * §8), one synchronous native call per primitive (so nothing interleaves). A full store never
 * evicts an unexpired record (completed, in progress or outcome-unknown) to make room for another
 * key: it removes expired records only, holds each partition (the request's principal, passed by
 * the middleware as `options.partition`) to its quota, and refuses a claim that does not fit with
 * `StoreUnavailableError` (reason `store_full` or `partition_quota`), which the middleware
 * answers 503 with `Retry-After` without running the handler.
 */
export class MemoryStore implements IdempotencyStore {
  readonly kind = 'memory';
  readonly partitioned = true;
  readonly #core: native.MemoryStoreCore;
  readonly #clock: () => number;

  constructor(options: MemoryStoreOptions = {}) {
    if (process.env.NODE_ENV === 'production' && options.allowInProduction !== true) {
      throw new ConfigError(
        'MemoryStore protects a single process only; pass allowInProduction: true to use it with NODE_ENV=production',
      );
    }
    try {
      this.#core = new native.MemoryStoreCore(
        options.maxEntries ?? defaultOf<number>('memory_store', 'maxEntries'),
        options.maxBytes ?? defaultOf<number>('memory_store', 'maxBytes'),
        options.maxEntriesPerPartition,
        options.maxBytesPerPartition,
      );
    } catch (e) {
      throw fromNative(e);
    }
    this.#clock = options.clock ?? monotonicMs;
    this[INLINE] = { core: this.#core, now: this.#clock };
  }

  /** @internal */
  readonly [INLINE]: MemoryInline;

  /** Records held. */
  get size(): number {
    return this.#core.size;
  }

  /** Bytes held (160 per record plus its fingerprint and stored response). */
  get bytesUsed(): number {
    return this.#core.bytesUsed;
  }

  /** The per-partition record quota in force. */
  get maxEntriesPerPartition(): number {
    return this.#core.maxEntriesPerPartition;
  }

  #call<T>(f: () => T): Promise<T> {
    try {
      return Promise.resolve(f());
    } catch (e) {
      return Promise.reject(fromNative(e));
    }
  }

  claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number, options?: CallOptions): Promise<ClaimResult> {
    return this.#call(() => {
      const now = this.#clock();
      const r = this.#core.claim(scopeKey, fingerprint, token, leaseMs, ttlMs, now, options?.partition);
      return r.claimed
        ? { claimed: true as const, generation: r.generation ?? 1, nowMs: now }
        : { claimed: false as const, record: rowToRecord(r.record as native.RecordRowData), nowMs: now };
    });
  }

  get(scopeKey: Uint8Array): Promise<GetResult> {
    return this.#call(() => {
      const now = this.#clock();
      const r = this.#core.get(scopeKey);
      return { record: r == null ? null : rowToRecord(r), nowMs: now };
    });
  }

  takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number): Promise<number | null> {
    return this.#call(() => this.#core.takeover(scopeKey, seenToken, newToken, leaseMs, this.#clock()) ?? null);
  }

  markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number): Promise<boolean> {
    return this.#call(() => this.#core.markUnknown(scopeKey, seenToken, ttlMs, this.#clock()));
  }

  complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number): Promise<boolean> {
    return this.#call(() => this.#core.complete(scopeKey, token, response, ttlMs, this.#clock()));
  }

  release(scopeKey: Uint8Array, token: Uint8Array): Promise<boolean> {
    return this.#call(() => this.#core.release(scopeKey, token));
  }

  renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number): Promise<boolean> {
    return this.#call(() => this.#core.renew(scopeKey, token, leaseMs, this.#clock()));
  }

  purgeExpired(options: PurgeOptions = {}): Promise<PurgeCounts> {
    return this.#call(() => this.#core.purgeExpired(options.batch ?? defaultOf<number>('purge', 'batch'), this.#clock()));
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}

/** What a session needs to run primitives inside the flow's native calls (internal). */
export interface MemoryInline {
  core: native.MemoryStoreCore;
  now: () => number;
}

const P = MemoryStore.prototype;

/**
 * The native store of exactly idempo's own {@link MemoryStore} (not a subclass) whose primitives
 * are its own (a subclass, or an object overriding one, gets the ordinary path, through its
 * methods), else undefined. Runs on every request (a primitive may be replaced at any time): each
 * primitive is read by name, not through a list of names, so every read is a plain property load.
 */
export function memoryInline(store: unknown): MemoryInline | undefined {
  if (!(store instanceof MemoryStore) || Object.getPrototypeOf(store) !== P) return undefined;
  const s = store as MemoryStore;
  if (
    s.claim !== P.claim ||
    s.get !== P.get ||
    s.takeover !== P.takeover ||
    s.markUnknown !== P.markUnknown ||
    s.complete !== P.complete ||
    s.release !== P.release ||
    s.renew !== P.renew
  ) {
    return undefined;
  }
  return s[INLINE];
}
