import type IORedis from 'ioredis';
import { ConfigError, StoreUnavailableError } from '../errors';
import type { ClaimResult, ClockOverride, GetResult, IdempotencyStore, PurgeCounts, StoreRecord } from './types';
import { asBuffer, checkKeyAndToken } from './types';

/** The scripts of `spec/STORAGE.md` §5.2 (each is the prelude followed by its body). */
const PRELUDE = `
local function clock()
  local o = ARGV[#ARGV]
  if o ~= '' then return tonumber(o) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%d', n) end
`;

export const REDIS_SCRIPTS = {
  idempoClaim: `${PRELUDE}
local now = clock()
local lease, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('HMGET', KEYS[1], 'expires_at', 'generation')
local gen = 1
if cur[1] then
  if tonumber(cur[1]) > now then
    return {0, int(now), redis.call('HGETALL', KEYS[1])}
  end
  gen = math.min(tonumber(cur[2]) + 1, 2147483647)
  redis.call('DEL', KEYS[1])
end
local exp = now + math.max(ttl, lease)
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'state', '1', 'token', ARGV[2],
           'generation', int(gen), 'lease_until', int(now + lease), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return {1, int(now), int(gen)}`,
  idempoGet: `${PRELUDE}
return {int(clock()), redis.call('HGETALL', KEYS[1])}`,
  idempoTakeover: `${PRELUDE}
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'expires_at', 'generation')
if r[1] ~= '1' or r[2] ~= ARGV[1] or tonumber(r[3]) > now then return false end
local lease_until = now + tonumber(ARGV[3])
local exp = math.max(tonumber(r[4]), lease_until)
redis.call('HSET', KEYS[1], 'token', ARGV[2], 'lease_until', int(lease_until), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return r[5]`,
  idempoMarkUnknown: `${PRELUDE}
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until')
if r[1] ~= '1' or r[2] ~= ARGV[1] or tonumber(r[3]) > now then return 0 end
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'state', '3', 'expires_at', int(exp))
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return 1`,
  idempoComplete: `${PRELUDE}
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
local exp = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'state', '2', 'response', ARGV[2], 'expires_at', int(exp))
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return 1`,
  idempoRelease: `${PRELUDE}
local r = redis.call('HMGET', KEYS[1], 'state', 'token')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1`,
  idempoRenew: `${PRELUDE}
local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'expires_at')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
local lease_until = now + tonumber(ARGV[2])
local exp = math.max(tonumber(r[3]), lease_until)
redis.call('HSET', KEYS[1], 'lease_until', int(lease_until), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return 1`,
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
