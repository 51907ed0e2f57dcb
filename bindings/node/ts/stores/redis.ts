import type IORedis from 'ioredis';
import { ConfigError, StoreUnavailableError } from '../errors';
import type { ClaimResult, ClockOverride, GetResult, IdempotencyStore, PurgeCounts, StoreRecord } from './types';
import { asBuffer, checkKeyAndToken } from './types';
import { recipe } from './recipes';

/** The scripts of `spec/STORAGE.md` §5.2 from core (each is the prelude followed by its body). */
export const REDIS_SCRIPTS = {
  idempoClaim: recipe('redis_claim'),
  idempoGet: recipe('redis_get'),
  idempoTakeover: recipe('redis_takeover'),
  idempoMarkUnknown: recipe('redis_mark_unknown'),
  idempoComplete: recipe('redis_complete'),
  idempoRelease: recipe('redis_release'),
  idempoRenew: recipe('redis_renew'),
} as const;

type ScriptName = keyof typeof REDIS_SCRIPTS;
type ScriptFn = (key: string, ...args: Array<string | Buffer | number>) => Promise<unknown>;

/** Options of {@link RedisStore}. */
export interface RedisStoreOptions {
  /** An ioredis client (the store defines its scripts on it and does not quit it). */
  client?: IORedis;
  /** A Redis URL; the store creates and owns a client. */
  url?: string;
  /** Key prefix (default `idempo:`). */
  prefix?: string;
  /**
   * Skip the start-up check that `maxmemory-policy` is `noeviction` (only for managed services
   * that block `CONFIG`, and only when eviction is otherwise ruled out).
   */
  skipEvictionCheck?: boolean;
  /** Clock override for conformance runs only. */
  clock?: ClockOverride;
}

/** Parses an HGETALL reply (buffers) into a record. */
export function hashToRecord(flat: Buffer[]): StoreRecord | null {
  if (flat.length === 0) return null;
  const m = new Map<string, Buffer>();
  for (let i = 0; i + 1 < flat.length; i += 2) m.set((flat[i] as Buffer).toString('latin1'), flat[i + 1] as Buffer);
  const num = (k: string): number | null => {
    const v = m.get(k);
    return v === undefined ? null : Number(v.toString('latin1'));
  };
  return {
    fingerprint: m.get('fingerprint')?.toString('latin1') ?? '',
    state: (num('state') ?? 0) as 1 | 2 | 3,
    token: m.get('token') ?? Buffer.alloc(0),
    generation: num('generation') ?? 0,
    leaseUntil: num('lease_until'),
    expiresAt: num('expires_at') ?? 0,
    response: m.get('response') ?? null,
  };
}

/**
 * Redis store (ioredis): one hash per record, each primitive one Lua script over that key, the
 * clock from `TIME`, logical expiry with physical cleanup a minute later. Requires
 * `maxmemory-policy noeviction`. Not the authority for money on its own (see `spec/STORAGE.md` §5).
 */
export class RedisStore implements IdempotencyStore {
  readonly kind = 'redis';
  readonly client: IORedis;
  readonly #owned: boolean;
  readonly #prefix: string;
  readonly #clock: ClockOverride | undefined;
  #checked: Promise<void> | undefined;
  readonly #skipCheck: boolean;

  constructor(options: RedisStoreOptions) {
    if (options.client) {
      this.client = options.client;
      this.#owned = false;
    } else if (options.url) {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const Redis = require('ioredis') as typeof IORedis;
      this.client = new Redis(options.url, { maxRetriesPerRequest: 1, enableOfflineQueue: true });
      this.#owned = true;
    } else {
      throw new TypeError('RedisStore needs a client or a url');
    }
    this.#prefix = options.prefix ?? 'idempo:';
    this.#clock = options.clock;
    this.#skipCheck = options.skipEvictionCheck === true;
    for (const [name, lua] of Object.entries(REDIS_SCRIPTS)) {
      if (!(name in this.client)) this.client.defineCommand(name, { numberOfKeys: 1, lua });
    }
  }

  /** Verifies `maxmemory-policy noeviction` (once). Throws `ConfigError` otherwise. */
  ready(): Promise<void> {
    this.#checked ??= (async () => {
      if (this.#skipCheck) return;
      const r = (await this.client.config('GET', 'maxmemory-policy')) as string[];
      const policy = r[1];
      if (policy !== 'noeviction') {
        throw new ConfigError(
          `Redis maxmemory-policy is ${String(policy)}; idempo requires noeviction (evicting a claim is a double execution)`,
        );
      }
    })();
    return this.#checked;
  }

  /** The Redis key of a record. */
  keyOf(scopeKey: Uint8Array): string {
    return this.#prefix + asBuffer(scopeKey).toString('hex');
  }

  #now(): string {
    return this.#clock ? String(Math.floor(this.#clock())) : '';
  }

  async #run(name: ScriptName, scopeKey: Uint8Array, ...args: Array<string | Buffer | number>): Promise<unknown> {
    try {
      await this.ready();
      const fn = (this.client as unknown as Record<string, ScriptFn>)[`${name}Buffer`] as ScriptFn;
      return await fn.call(this.client, this.keyOf(scopeKey), ...args, this.#now());
    } catch (e) {
      if (e instanceof ConfigError) throw e;
      throw new StoreUnavailableError(`Redis error: ${(e as Error).message}`, { cause: e });
    }
  }

  async claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number): Promise<ClaimResult> {
    checkKeyAndToken(scopeKey, token);
    const r = (await this.#run('idempoClaim', scopeKey, fingerprint, asBuffer(token), String(leaseMs), String(ttlMs))) as [
      number,
      Buffer,
      Buffer | Buffer[],
    ];
    const nowMs = Number(r[1].toString('latin1'));
    if (r[0] === 1) return { claimed: true, generation: Number((r[2] as Buffer).toString('latin1')), nowMs };
    const record = hashToRecord(r[2] as Buffer[]);
    if (record === null) throw new StoreUnavailableError('claim found a record but HGETALL was empty');
    return { claimed: false, record, nowMs };
  }

  async get(scopeKey: Uint8Array): Promise<GetResult> {
    checkKeyAndToken(scopeKey);
    const r = (await this.#run('idempoGet', scopeKey)) as [Buffer, Buffer[]];
    return { record: hashToRecord(r[1]), nowMs: Number(r[0].toString('latin1')) };
  }

  async takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number): Promise<number | null> {
    checkKeyAndToken(scopeKey, seenToken, newToken);
    const r = (await this.#run('idempoTakeover', scopeKey, asBuffer(seenToken), asBuffer(newToken), String(leaseMs))) as
      | Buffer
      | null;
    return r === null ? null : Number(r.toString('latin1'));
  }

  async markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number): Promise<boolean> {
    checkKeyAndToken(scopeKey, seenToken);
    return (await this.#run('idempoMarkUnknown', scopeKey, asBuffer(seenToken), String(ttlMs))) === 1;
  }

  async complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number): Promise<boolean> {
    checkKeyAndToken(scopeKey, token);
    return (await this.#run('idempoComplete', scopeKey, asBuffer(token), asBuffer(response), String(ttlMs))) === 1;
  }

  async release(scopeKey: Uint8Array, token: Uint8Array): Promise<boolean> {
    checkKeyAndToken(scopeKey, token);
    return (await this.#run('idempoRelease', scopeKey, asBuffer(token))) === 1;
  }

  async renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number): Promise<boolean> {
    checkKeyAndToken(scopeKey, token);
    return (await this.#run('idempoRenew', scopeKey, asBuffer(token), String(leaseMs))) === 1;
  }

  /** Redis expires records itself (`PEXPIRE`); nothing to purge. */
  purgeExpired(): Promise<PurgeCounts> {
    return Promise.resolve({ inProgress: 0, completed: 0, outcomeUnknown: 0 });
  }

  async close(): Promise<void> {
    if (this.#owned) await this.client.quit();
  }
}
