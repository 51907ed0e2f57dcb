import type IORedis from 'ioredis';
import type { Cluster } from 'ioredis';
import { ConfigError, InvalidArgumentError, StoreUnavailableError, fromNative } from '../errors';
import type { ClaimResult, ClockOverride, GetResult, IdempotencyStore, PurgeCounts, StoreRecord } from './types';
import { asBuffer, checkKeyAndToken } from './types';
import { recipe } from './recipes';
import { redisClusterNodeRefusal, redisConfigGetRefusal, redisHashRow, redisPolicyRefusal } from '../native';
import type { StoreStats } from './types';
import { defaultOf } from '../defaults';

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
  /**
   * An ioredis client, single node (`Redis`) or `Cluster` (the store defines its scripts on it
   * and does not quit it).
   */
  client?: IORedis | Cluster;
  /** A Redis URL; the store creates and owns a client (a `Cluster` seeded by it with `cluster`). */
  url?: string;
  /**
   * The URL names a node of a Redis Cluster: the store creates an ioredis `Cluster` client
   * (`spec/STORAGE.md` §5.3). A single-node client pointed at a cluster node is refused by
   * {@link RedisStore.ready} (it would get MOVED for most keys).
   */
  cluster?: boolean;
  /** Key prefix (default `idempo:`). */
  prefix?: string;
  /**
   * Skip the start-up check that `maxmemory-policy` is `noeviction` (only for managed services
   * that block `CONFIG`, and only when eviction is otherwise ruled out). Python: `assume_noeviction`.
   */
  assumeNoeviction?: boolean;
  /** @deprecated the former name of {@link RedisStoreOptions.assumeNoeviction}. */
  skipEvictionCheck?: boolean;
  /** Clock override for conformance runs only. */
  clock?: ClockOverride;
}

/**
 * Parses an HGETALL reply (buffers) into a record, with core's decoder (a hash that lacks a field
 * or holds a number that is not one throws `RECORD_CORRUPT`).
 */
export function hashToRecord(flat: Buffer[]): StoreRecord | null {
  let row: ReturnType<typeof redisHashRow>;
  try {
    row = redisHashRow(flat);
  } catch (e) {
    throw fromNative(e);
  }
  if (row === null) return null;
  return {
    fingerprint: row.fingerprint,
    state: row.state as 1 | 2 | 3,
    token: row.token,
    generation: row.generation,
    leaseUntil: row.leaseUntil ?? null,
    expiresAt: row.expiresAt,
    response: row.response ?? null,
  };
}

/** True for an ioredis `Cluster` client. */
function isCluster(client: IORedis | Cluster): client is Cluster {
  return (client as { isCluster?: unknown }).isCluster === true;
}

/** The `host:port` names of a cluster client's primaries, sorted. */
function primaries(client: Cluster): string {
  return client
    .nodes('master')
    .map((n) => `${String(n.options.host)}:${String(n.options.port)}`)
    .sort()
    .join(',');
}

/** Refuses the policies that are not `noeviction` (`node` names the node; core's rule). */
function refusePolicies(policies: Array<[string, unknown]>): void {
  const refusal = redisPolicyRefusal(
    policies.map(([node, p]) => ({ node, policy: p == null ? undefined : String(p) })),
  );
  if (refusal !== null) throw new ConfigError(refusal);
}

async function policyOf(client: IORedis): Promise<unknown> {
  let r: string[];
  try {
    r = (await client.config('GET', 'maxmemory-policy')) as string[];
  } catch (e) {
    const refusal = redisConfigGetRefusal(String((e as Error).message));
    if (refusal !== null) throw new ConfigError(refusal, { cause: e });
    throw e;
  }
  return r[1];
}

/**
 * Redis store (ioredis): one hash per record, each primitive one Lua script over that key, the
 * clock from `TIME`, logical expiry with physical cleanup a minute later. Requires
 * `maxmemory-policy noeviction` (on every primary of a cluster). Redis Cluster is supported by
 * design: each script touches its record's one key, so a record lives in one slot and records
 * spread over the slots by scope key (`spec/STORAGE.md` §5.3). Not the authority for money on its
 * own (see `spec/STORAGE.md` §5).
 */
export class RedisStore implements IdempotencyStore {
  readonly kind = 'redis';
  readonly client: IORedis | Cluster;
  readonly #owned: boolean;
  readonly #prefix: string;
  readonly #clock: ClockOverride | undefined;
  #checking: Promise<void> | undefined;
  /** The primaries the last check covered (`''` for a single node); undefined before it. */
  #checkedNodes: string | undefined;
  readonly #skipCheck: boolean;

  constructor(options: RedisStoreOptions) {
    if (options.cluster !== undefined && typeof options.cluster !== 'boolean') {
      throw new InvalidArgumentError('RedisStore: `cluster` must be true or false');
    }
    if (options.client) {
      if (options.cluster === true && !isCluster(options.client)) {
        throw new InvalidArgumentError('RedisStore: `cluster: true` needs a url or an ioredis Cluster client');
      }
      this.client = options.client;
      this.#owned = false;
    } else if (options.url) {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const Redis = require('ioredis') as typeof IORedis;
      this.client = options.cluster
        ? new Redis.Cluster([options.url], { redisOptions: { maxRetriesPerRequest: 1 }, enableOfflineQueue: true })
        : new Redis(options.url, { maxRetriesPerRequest: 1, enableOfflineQueue: true });
      this.#owned = true;
    } else {
      throw new TypeError('RedisStore needs a client or a url');
    }
    const keyPrefix = (this.client.options as { keyPrefix?: unknown }).keyPrefix;
    if (typeof keyPrefix === 'string' && keyPrefix !== '') {
      throw new InvalidArgumentError(
        "RedisStore: the client's keyPrefix would move records away from the names every binding reads (spec/STORAGE.md §5.1); use the store's `prefix` option instead",
      );
    }
    this.#prefix = options.prefix ?? defaultOf<string>('redis_store', 'prefix');
    this.#clock = options.clock;
    this.#skipCheck = options.assumeNoeviction === true || options.skipEvictionCheck === true;
    for (const [name, lua] of Object.entries(REDIS_SCRIPTS)) {
      if (!(name in this.client)) this.client.defineCommand(name, { numberOfKeys: 1, lua });
    }
  }

  /** Whether the client is a Redis Cluster client. */
  get cluster(): boolean {
    return isCluster(this.client);
  }

  /**
   * Checks the server (call it at start-up; every primitive runs it first): a single-node client
   * must not point at a cluster node, and `maxmemory-policy` must be `noeviction` on the server or
   * on every primary of a cluster (checked again whenever the cluster's primaries change). Throws
   * `ConfigError` otherwise.
   */
  ready(): Promise<void> {
    if (this.#checkedNodes !== undefined) {
      const client = this.client;
      if (!isCluster(client) || primaries(client) === this.#checkedNodes) return Promise.resolve();
      this.#checking = undefined;
    }
    this.#checking ??= this.#check().catch((e: unknown) => {
      this.#checking = undefined;
      throw e;
    });
    return this.#checking;
  }

  async #check(): Promise<void> {
    const client = this.client;
    if (isCluster(client)) {
      await client.ping();
      const nodes = client.nodes('master');
      if (!this.#skipCheck) {
        const policies = await Promise.all(
          nodes.map(async (n): Promise<[string, unknown]> => [`${String(n.options.host)}:${String(n.options.port)}`, await policyOf(n)]),
        );
        refusePolicies(policies);
      }
      this.#checkedNodes = primaries(client);
      return;
    }
    let info = '';
    try {
      info = await client.info('cluster');
    } catch {
      // INFO disabled: nothing to learn.
    }
    const clusterRefusal = redisClusterNodeRefusal(info);
    if (clusterRefusal !== null) throw new ConfigError(clusterRefusal);
    if (!this.#skipCheck) refusePolicies([['the server', await policyOf(client)]]);
    this.#checkedNodes = '';
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

  /**
   * The keyspace's figures for metrics (`spec/STORAGE.md` §4.7): a `SCAN` of the prefix on the
   * server (on every primary of a cluster) reading two fields per record, O(records). Redis keeps
   * no size per prefix: `sizeBytes` is null.
   */
  async stats(): Promise<StoreStats> {
    try {
      await this.ready();
      const client = this.client;
      const nodes: IORedis[] = isCluster(client) ? client.nodes('master') : [client];
      const time = (await nodes[0]!.time()) as unknown as [string, string];
      const now = this.#clock ? Math.floor(this.#clock()) : Number(time[0]) * 1000 + Math.floor(Number(time[1]) / 1000);
      const s: StoreStats = { inProgress: 0, completed: 0, outcomeUnknown: 0, expired: 0, purgeLagMs: null, sizeBytes: null, nowMs: now };
      let oldest = Infinity;
      const record = new RegExp(`^${this.#prefix.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}[0-9a-f]{64}$`);
      for (const node of nodes) {
        let cursor = '0';
        do {
          const [next, keys] = await node.scan(cursor, 'MATCH', `${this.#prefix}*`, 'COUNT', 1000);
          cursor = next;
          const mine = keys.filter((k) => record.test(k));
          const fields = await Promise.all(mine.map((k) => node.hmget(k, 'state', 'expires_at')));
          for (const [state, exp] of fields) {
            if (state === null || exp === null) continue;
            if (state === '1') s.inProgress++;
            else if (state === '2') s.completed++;
            else if (state === '3') s.outcomeUnknown++;
            const e = Number(exp);
            if (e <= now) {
              s.expired++;
              oldest = Math.min(oldest, e);
            }
          }
        } while (cursor !== '0');
      }
      if (s.expired > 0) s.purgeLagMs = now - oldest;
      return s;
    } catch (e) {
      if (e instanceof ConfigError) throw e;
      throw new StoreUnavailableError(`Redis error: ${(e as Error).message}`, { cause: e });
    }
  }

  /** Redis expires records itself (`PEXPIRE`); nothing to purge. */
  purgeExpired(): Promise<PurgeCounts> {
    return Promise.resolve({ inProgress: 0, completed: 0, outcomeUnknown: 0 });
  }

  async close(): Promise<void> {
    if (this.#owned) await this.client.quit();
  }
}
