// Shared test helpers: repository paths, vector loading, store factories on real servers.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
export const here = path.dirname(fileURLToPath(import.meta.url));
export const pkgRoot = path.resolve(here, '..');
export const repoRoot = path.resolve(pkgRoot, '..', '..');
export const vectorsDir = path.join(repoRoot, 'spec', 'vectors');

export const idempo = require('../dist/index.js');

/** The JSON files of spec/vectors/<kind>/ (sorted), or [] when the folder does not exist yet. */
export function vectorFiles(kind) {
  const dir = path.join(vectorsDir, kind);
  if (!fs.existsSync(dir)) return [];
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => ({ file: f, data: JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) }));
}

export function loadVector(kind, file) {
  return JSON.parse(fs.readFileSync(path.join(vectorsDir, kind, file), 'utf8'));
}

export const PG_DSN = process.env.IDEMPO_TEST_PG_DSN;
export const REDIS_URL = process.env.IDEMPO_TEST_REDIS_URL;
/** PgBouncer in transaction pooling mode in front of PG_DSN's server (scripts/test-services.sh). */
export const PGBOUNCER_DSN = process.env.IDEMPO_TEST_PGBOUNCER_DSN;
/** A three-primary Redis Cluster: `host:port,host:port,host:port` (scripts/test-services.sh). */
export const REDIS_CLUSTER_NODES = process.env.IDEMPO_TEST_REDIS_CLUSTER_NODES;

/** The cluster's nodes as `{ host, port }`. */
export function clusterNodes() {
  return (REDIS_CLUSTER_NODES ?? '').split(',').filter(Boolean).map((n) => {
    const [host, port] = n.split(':');
    return { host, port: Number(port) };
  });
}

const SERVICE_ENV = {
  postgres: ['IDEMPO_TEST_PG_DSN', PG_DSN],
  redis: ['IDEMPO_TEST_REDIS_URL', REDIS_URL],
  pgbouncer: ['IDEMPO_TEST_PGBOUNCER_DSN', PGBOUNCER_DSN],
  'redis-cluster': ['IDEMPO_TEST_REDIS_CLUSTER_NODES', REDIS_CLUSTER_NODES],
};

/** Why a server-backed store cannot run, or null. In CI (`CI` set) missing servers fail the run. */
export function missing(what) {
  const [name, v] = SERVICE_ENV[what];
  // make check runs the suite in parallel without servers (IDEMPO_SKIP_SERVICES=1).
  if (process.env.IDEMPO_SKIP_SERVICES) return `${what}: skipped (IDEMPO_SKIP_SERVICES is set)`;
  if (v) return null;
  const msg = `${what}: ${name} is not set (make test-node starts the servers)`;
  if (process.env.CI) throw new Error(msg);
  return msg;
}

let uniq = 0;
export function uniqueName(prefix) {
  uniq += 1;
  return `${prefix}_${process.pid}_${Date.now().toString(36)}_${uniq}`;
}

let pgPool;
export function sharedPgPool() {
  const pg = require('pg');
  pgPool ??= new pg.Pool({ connectionString: PG_DSN, max: 20 });
  return pgPool;
}

let redisClient;
export function sharedRedis() {
  const Redis = require('ioredis');
  redisClient ??= new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  return redisClient;
}

let bouncerPool;
/** A pool of connections to PgBouncer (transaction mode): each query may use another server connection. */
export function sharedBouncerPool() {
  const pg = require('pg');
  bouncerPool ??= new pg.Pool({ connectionString: PGBOUNCER_DSN, max: 20 });
  return bouncerPool;
}

let clusterClient;
/** One ioredis Cluster client for the test cluster. */
export function sharedCluster() {
  const Redis = require('ioredis');
  clusterClient ??= new Redis.Cluster(clusterNodes(), { redisOptions: { maxRetriesPerRequest: 1 } });
  return clusterClient;
}

export async function closeShared() {
  if (clusterClient) await clusterClient.quit();
  clusterClient = undefined;
  if (pgPool) await pgPool.end();
  if (bouncerPool) await bouncerPool.end();
  bouncerPool = undefined;
  if (redisClient) await redisClient.quit();
  pgPool = undefined;
  redisClient = undefined;
}

/**
 * Store factories: each returns a fresh, empty store (`clock` optional, for the conformance
 * clock override) plus a cleanup function.
 */
export const storeKinds = {
  memory: {
    skip: () => null,
    async make(clock) {
      return { store: new idempo.MemoryStore({ clock }), cleanup: async () => {} };
    },
  },
  sqlite: {
    skip: () => null,
    async make(clock) {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-sqlite-'));
      const store = new idempo.SqliteStore({ filename: path.join(dir, 'db.sqlite3'), clock });
      return {
        store,
        cleanup: async () => {
          await store.close();
          fs.rmSync(dir, { recursive: true, force: true });
        },
      };
    },
  },
  postgres: {
    skip: () => missing('postgres'),
    async make(clock) {
      const schema = uniqueName('t');
      const pool = sharedPgPool();
      const store = new idempo.PostgresStore({ pool, schema, clock });
      await store.createSchema();
      return { store, cleanup: async () => pool.query(`DROP SCHEMA "${schema}" CASCADE`) };
    },
  },
  pgbouncer: {
    skip: () => missing('pgbouncer'),
    async make(clock) {
      const schema = uniqueName('b');
      const pool = sharedBouncerPool();
      const store = new idempo.PostgresStore({ pool, schema, clock });
      await store.createSchema();
      return { store, cleanup: async () => pool.query(`DROP SCHEMA "${schema}" CASCADE`) };
    },
  },
  redis: {
    skip: () => missing('redis'),
    noPurge: true,
    async make(clock) {
      const prefix = `${uniqueName('idempo_test')}:`;
      const client = sharedRedis();
      const store = new idempo.RedisStore({ client, prefix, clock });
      return {
        store,
        cleanup: async () => {
          const keys = await client.keys(`${prefix}*`);
          if (keys.length) await client.del(...keys);
        },
      };
    },
  },
  'redis-cluster': {
    skip: () => missing('redis-cluster'),
    noPurge: true,
    async make(clock) {
      const prefix = `${uniqueName('idempo_cluster')}:`;
      const client = sharedCluster();
      const store = new idempo.RedisStore({ client, prefix, clock });
      return {
        store,
        cleanup: async () => {
          for (const node of client.nodes('master')) {
            // One DEL per key: keys of different slots cannot share a command (CROSSSLOT).
            for (const key of await node.keys(`${prefix}*`)) await node.del(key);
          }
        },
      };
    },
  },
  cached: {
    skip: () => missing('postgres') ?? missing('redis'),
    async make(clock) {
      const schema = uniqueName('c');
      const pool = sharedPgPool();
      const authority = new idempo.PostgresStore({ pool, schema, clock });
      await authority.createSchema();
      const prefix = `${uniqueName('idempo_cache')}:`;
      const redis = sharedRedis();
      const store = new idempo.CachedStore({ authority, redis, prefix, clock });
      return {
        store,
        cleanup: async () => {
          await pool.query(`DROP SCHEMA "${schema}" CASCADE`);
          const keys = await redis.keys(`${prefix}*`);
          if (keys.length) await redis.del(...keys);
        },
      };
    },
  },
};

/** Per store: a fresh store, how the handler writes through its transaction, and how to count. */
export const txStoreKinds = {
  sqlite: {
    skip: false,
    async make(opts = {}) {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-tx-'));
      const filename = path.join(dir, 'db.sqlite3');
      const store = new idempo.SqliteStore({ filename, ...opts });
      store.db.exec('CREATE TABLE business (id INTEGER PRIMARY KEY, k TEXT NOT NULL)');
      const Database = require('better-sqlite3');
      const reader = new Database(filename, { readonly: true });
      return {
        store,
        where: filename,
        schema: '-',
        insert: async (tx, k) => tx.prepare('INSERT INTO business (k) VALUES (?)').run(k),
        count: async (k) => reader.prepare('SELECT count(*) AS n FROM business WHERE k = ?').get(k).n,
        records: async () => reader.prepare('SELECT count(*) AS n FROM idempo_record').get().n,
        cleanup: async () => {
          reader.close();
          await store.close();
          fs.rmSync(dir, { recursive: true, force: true });
        },
      };
    },
  },
  postgres: {
    skip: missing('postgres') ?? false,
    async make(opts = {}) {
      const schema = uniqueName('tx');
      const pool = sharedPgPool();
      const store = new idempo.PostgresStore({ pool, schema, ...opts });
      await store.createSchema();
      await pool.query(`CREATE TABLE "${schema}".business (id serial PRIMARY KEY, k text NOT NULL)`);
      return {
        store,
        where: PG_DSN,
        schema,
        insert: (tx, k) => tx.query(`INSERT INTO "${schema}".business (k) VALUES ($1)`, [k]),
        count: async (k) => Number((await pool.query(`SELECT count(*) AS n FROM "${schema}".business WHERE k = $1`, [k])).rows[0].n),
        records: async () => Number((await pool.query(`SELECT count(*) AS n FROM "${schema}".idempo_record`)).rows[0].n),
        cleanup: async () => pool.query(`DROP SCHEMA "${schema}" CASCADE`),
      };
    },
  },
};
