import type IORedis from 'ioredis';
import native = require('../native');
import type { CallOptions, ClaimResult, ClockOverride, GetResult, IdempotencyStore, PurgeCounts, PurgeOptions, StoreRecord } from './types';
import { asBuffer } from './types';
import { hashToRecord } from './redis';
import { recipe } from './recipes';
import type { StoreStats } from './types';
import { defaultOf } from '../defaults';

/** The cache scripts (from core, shared with the Python binding): read with the clock, fill. */
const CACHE_SCRIPTS = {
  idempoCacheGet: recipe('redis_cache_get'),
  idempoCachePut: recipe('redis_cache_put'),
} as const;

type ScriptFn = (key: string, ...args: Array<string | Buffer>) => Promise<unknown>;

/** Options of {@link CachedStore}. */
export interface CachedStoreOptions {
  /** The authority (normally a `PostgresStore`). */
  authority: IdempotencyStore;
  /** The ioredis client of the cache (not quit by the store). */
  redis: IORedis;
  /** Cache key prefix (default `idempo:cache:`). */
  prefix?: string;
  /** Longest time a completed record stays cached, ms (default 60000). */
  cacheTtlMs?: number;
  /** Clock override for conformance runs only (a cache hit's `now`; default Redis `TIME`). */
  clock?: ClockOverride;
  /** Called with cache errors (they never fail a request). */
  onCacheError?: (err: unknown) => void;
  /** The host's monotonic clock in ms that times a fill (default `performance.now`; tests only). */
  monotonic?: () => number;
}

/**
 * Redis in front of an authority (`spec/STORAGE.md` §9): only completed records are cached, with
 * their fingerprint and generation (so another body still gets 422), for at most
 * `min(cacheTtlMs, expires_at - now)` as computed from the authority's own clock, less the time
 * elapsed (host monotonic clock) from when that read was sent to when the cache `SET` is sent (no
 * `SET` when nothing is left), so the cache never outlives the record, even after a delayed fill. The cache is filled when a completion succeeds (write-through)
 * and on reads that miss. A miss or any Redis error falls through to the authority. Every write
 * primitive goes to the authority (they only touch in-progress records, which are never cached).
 */
export class CachedStore implements IdempotencyStore {
  readonly kind = 'cached';
  /** The authority's call bound (the cache's own calls are best effort). */
  get callTimeoutMs(): number | undefined {
    return this.authority.callTimeoutMs;
  }
  /** The authority's partitioning (see `IdempotencyStore.partitioned`). */
  get partitioned(): boolean {
    return this.authority.partitioned === true;
  }
  readonly authority: IdempotencyStore;
  readonly #redis: IORedis;
  readonly #prefix: string;
  readonly #cacheTtl: number;
  readonly #onError: (err: unknown) => void;
  readonly #clock: ClockOverride | undefined;
  readonly #mono: () => number;
  /** Cache hits, misses, errors and fills, for metrics (`stats()` gives the records' figures). */
  readonly cacheStats = { hits: 0, misses: 0, errors: 0, fills: 0 };

  constructor(options: CachedStoreOptions) {
    this.authority = options.authority;
    this.#redis = options.redis;
    this.#prefix = options.prefix ?? defaultOf<string>('cached_store', 'prefix');
    this.#cacheTtl = options.cacheTtlMs ?? defaultOf<number>('cached_store', 'cacheTtlMs');
    this.#onError = options.onCacheError ?? (() => undefined);
    this.#clock = options.clock;
    this.#mono = options.monotonic ?? (() => performance.now());
    for (const [name, lua] of Object.entries(CACHE_SCRIPTS)) {
      if (!(name in this.#redis)) this.#redis.defineCommand(name, { numberOfKeys: 1, lua });
    }
  }

  /** Runs a cache script on the entry of `scopeKey` (buffers in the reply). */
  #script(name: keyof typeof CACHE_SCRIPTS, scopeKey: Uint8Array, ...args: Array<string | Buffer>): Promise<unknown> {
    const fn = (this.#redis as unknown as Record<string, ScriptFn>)[`${name}Buffer`] as ScriptFn;
    return fn.call(this.#redis, this.#key(scopeKey), ...args);
  }

  #key(scopeKey: Uint8Array): string {
    return this.#prefix + asBuffer(scopeKey).toString('hex');
  }

  async #lookup(scopeKey: Uint8Array): Promise<{ record: StoreRecord; nowMs: number } | null> {
    try {
      const override = this.#clock ? String(Math.floor(this.#clock())) : '';
      const [time, flat] = (await this.#script('idempoCacheGet', scopeKey, override)) as [Buffer, Buffer[]];
      const record = hashToRecord(flat);
      // Core's serve rule: only a completed record, unexpired on the cache's clock (whatever the
      // two clocks say); anything else falls through to the authority.
      const nowMs = Number(time.toString('latin1'));
      if (record === null || !native.cacheServable(record.state, record.expiresAt, nowMs)) {
        this.cacheStats.misses++;
        return null;
      }
      this.cacheStats.hits++;
      return { record, nowMs };
    } catch (e) {
      this.cacheStats.errors++;
      this.#onError(e);
      return null;
    }
  }

  /**
   * Caches a completed record read at `nowMs` (the authority's clock) by a request sent at `asked`
   * (host monotonic ms), with core's `PX` (`spec/STORAGE.md` §9): `min(cacheTtl, expiresAt -
   * nowMs)` less the time since `asked`, rounded up (none left: no `SET`).
   */
  async #fill(scopeKey: Uint8Array, record: StoreRecord, nowMs: number, asked: number): Promise<void> {
    if (record.response === null) return;
    try {
      // Core's fill rule: min(cacheTtl, expiresAt - nowMs) shrunk by this fill's own delay.
      const px = native.cacheFillPx(record.state, record.expiresAt, this.#cacheTtl, nowMs, Math.max(0, Math.ceil(this.#mono() - asked)));
      if (px === null) return;
      await this.#script(
        'idempoCachePut',
        scopeKey,
        record.fingerprint,
        '2',
        asBuffer(record.token),
        String(record.generation),
        String(record.expiresAt),
        asBuffer(record.response),
        String(px),
      );
      this.cacheStats.fills++;
    } catch (e) {
      this.cacheStats.errors++;
      this.#onError(e);
    }
  }

  async claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number, options?: CallOptions): Promise<ClaimResult> {
    const hit = await this.#lookup(scopeKey);
    if (hit) return { claimed: false, record: hit.record, nowMs: hit.nowMs };
    const asked = this.#mono();
    const r = await this.authority.claim(scopeKey, fingerprint, token, leaseMs, ttlMs, options);
    if (!r.claimed && 'record' in r) await this.#fill(scopeKey, r.record, r.nowMs, asked);
    return r;
  }

  async get(scopeKey: Uint8Array, options?: CallOptions): Promise<GetResult> {
    const hit = await this.#lookup(scopeKey);
    if (hit) return hit;
    const asked = this.#mono();
    const r = await this.authority.get(scopeKey, options);
    if (r.record) await this.#fill(scopeKey, r.record, r.nowMs, asked);
    return r;
  }

  takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number, options?: CallOptions): Promise<number | null> {
    return this.authority.takeover(scopeKey, seenToken, newToken, leaseMs, options);
  }

  markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number, options?: CallOptions): Promise<boolean> {
    return this.authority.markUnknown(scopeKey, seenToken, ttlMs, options);
  }

  /**
   * Completes on the authority, then writes the completed record through to the cache (so the
   * first replay is already a hit), with the TTL computed from the authority's clock at
   * completion. The fill never fails the completion: a cache error is reported and ignored.
   */
  async complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number, options?: CallOptions): Promise<boolean> {
    if (this.authority.completeRecord) {
      const asked = this.#mono();
      const done = await this.authority.completeRecord(scopeKey, token, response, ttlMs, options);
      if (done === null) return false;
      if (done.record) await this.#fill(scopeKey, done.record, done.nowMs, asked);
      return true;
    }
    const ok = await this.authority.complete(scopeKey, token, response, ttlMs, options);
    if (!ok) return false;
    // Without a returning completion, read the committed row back; a failed read only skips the fill.
    try {
      const asked = this.#mono();
      const r = await this.authority.get(scopeKey);
      if (r.record && asBuffer(token).equals(r.record.token)) await this.#fill(scopeKey, r.record, r.nowMs, asked);
    } catch (e) {
      this.cacheStats.errors++;
      this.#onError(e);
    }
    return true;
  }

  release(scopeKey: Uint8Array, token: Uint8Array, options?: CallOptions): Promise<boolean> {
    return this.authority.release(scopeKey, token, options);
  }

  renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number, options?: CallOptions): Promise<boolean> {
    return this.authority.renew(scopeKey, token, leaseMs, options);
  }

  purgeExpired(options?: PurgeOptions): Promise<PurgeCounts> {
    return this.authority.purgeExpired(options);
  }

  /** The authority's figures (cache entries expire no later than their records). */
  stats(): Promise<StoreStats> {
    if (!this.authority.stats) return Promise.reject(new TypeError(`the ${this.authority.kind} authority has no stats()`));
    return this.authority.stats();
  }

  close(): Promise<void> {
    return this.authority.close();
  }
}
